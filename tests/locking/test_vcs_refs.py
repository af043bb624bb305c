"""git requirements as the matrix file or the project's file names them: only a plain http(s) repository URL and a
commit, branch or tag that cannot be read as a git option; the lock builds a commit and refuses the rest."""

from __future__ import annotations

import pytest

from imagekit.errors import UsageError
from imagekit.locking import vcs_refs
from imagekit.locking.direct_wheels import requirement

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_a_commit_is_pinned_and_written_canonically():
    ref = vcs_refs.parse("x", f"git+https://github.com/org/repo.git@{COMMIT}#egg=x&subdirectory=python/pkg")
    assert ref.pinned and ref.repo == "https://github.com/org/repo.git" and ref.subdirectory == "python/pkg"
    assert ref.url == f"git+https://github.com/org/repo.git@{COMMIT}#subdirectory=python/pkg"
    assert (
        requirement(f"My.Pkg[a] @ git+https://h.example/o/r@{COMMIT}")
        == f"my-pkg[a] @ git+https://h.example/o/r@{COMMIT}"
    )


def test_a_branch_parses_but_is_not_pinned_and_its_refusal_names_todays_commit():
    ref = vcs_refs.parse("x", "git+https://h.example/o/r@v1.2.3")
    assert not ref.pinned
    refusal = vcs_refs.unpinned("x", ref, COMMIT)
    assert COMMIT in str(refusal) and refusal.hint == f"pin it: `x @ git+https://h.example/o/r@{COMMIT}`"
    assert "names no such ref" in str(vcs_refs.unpinned("x", ref, None))


@pytest.mark.parametrize(
    "url, said",
    [
        ("git+ssh://git@github.com/o/r@main", "only git over http(s)"),
        ("git+file:///etc/o@main", "only git over http(s)"),
        ("git+ext::sh -c touch% /tmp/pwned@main", "only git over http(s)"),
        ("git+https://user:token@github.com/o/r@main", "credential"),
        ("git+https://github.com/o/r?x=1@main", "credential or a query"),
        ("git+https://github.com@main", "credential"),
        ("git+https://github.com/o/r@--upload-pack=touch", "not a commit, branch or tag"),
        ("git+https://github.com/o/r@a..b", "not a commit, branch or tag"),
        ("git+https://github.com/o/r@main#subdirectory=../../etc", "not understood"),
        ("git+https://github.com/o/r@main#autoinstall=1", "not understood"),
        ("git+https://github.com/o/r;id@main", "not a plain repository URL"),
        ("hg+https://h/r@1", "only git references"),
    ],
)
def test_what_git_could_misread_is_refused_before_git_runs(url, said):
    with pytest.raises(vcs_refs.NotARef) as caught:
        vcs_refs.parse("x", url)
    assert said in str(caught.value)


def test_the_matrix_file_refuses_a_bad_git_requirement_with_the_fix():
    with pytest.raises(UsageError) as caught:
        requirement("x @ git+ssh://git@github.com/o/r@main")
    assert "https URL" in caught.value.hint


def test_no_ref_is_the_default_branch_refused_like_a_branch_with_todays_commit():
    ref = vcs_refs.parse("peft", "git+https://github.com/huggingface/peft.git")
    assert ref.ref == "HEAD" and not ref.pinned and ref.repo == "https://github.com/huggingface/peft.git"
    refusal = vcs_refs.unpinned("peft", ref, COMMIT)
    assert "default branch" in str(refusal) and f"today it names commit {COMMIT}" in str(refusal)
    assert refusal.hint == f"pin it: `peft @ git+https://github.com/huggingface/peft.git@{COMMIT}`"
