"""Every form pip accepts in a requirements file, read into what imagekit does with it (imagekit.matrix.line_forms;
docs/your-project.md has the table): name-less VCS lines and URLs, the project's own folder, index lines."""

from __future__ import annotations

import pytest

from imagekit.errors import UsageError
from imagekit.matrix.line_forms import Index, Local, Nameless
from tests.matrix.test_project_deps import _reqs

COMMIT = "0123456789abcdef0123456789abcdef01234567"
WHEEL = "https://files.example.org/p/foo_bar-1.0-py3-none-any.whl"


@pytest.mark.parametrize(
    ("line", "becomes"),
    [
        (f"git+https://github.com/huggingface/peft.git@{COMMIT}#egg=peft",
         f"peft @ git+https://github.com/huggingface/peft.git@{COMMIT}"),
        (f"git+https://github.com/o/r@{COMMIT}#egg=My_Pkg&subdirectory=pkg",
         f"my-pkg @ git+https://github.com/o/r@{COMMIT}#subdirectory=pkg"),
        ("git+https://github.com/huggingface/peft.git@main#egg=peft",  # a branch: refused by the lock, as when named
         "peft @ git+https://github.com/huggingface/peft.git@main"),
        ("git+https://github.com/huggingface/peft.git#egg=peft", "peft @ git+https://github.com/huggingface/peft.git@HEAD"),
        (f'git+https://github.com/o/r@{COMMIT}#egg=r ; python_version >= "3.10"',
         f'r @ git+https://github.com/o/r@{COMMIT} ; python_version >= "3.10"'),
        (WHEEL, f"foo-bar @ {WHEEL}"),
        (f"{WHEEL}#sha256={'a' * 64}", f"foo-bar @ {WHEEL}#sha256={'a' * 64}"),
        ("./wheels/foo_bar-1.0-py3-none-any.whl", "foo-bar @ file:wheels/foo_bar-1.0-py3-none-any.whl"),
        ("wheels/foo_bar-1.0-py3-none-any.whl", "foo-bar @ file:wheels/foo_bar-1.0-py3-none-any.whl"),
        (f"-e git+https://github.com/o/r@{COMMIT}#egg=r", f"r @ git+https://github.com/o/r@{COMMIT}"),
    ],
)  # fmt: skip
def test_a_nameless_line_becomes_a_named_requirement(line, becomes):
    deps = _reqs({"requirements.txt": f"numpy\n{line}\n"})
    assert [d.requirement for d in deps.declared] == ["numpy", becomes]
    assert deps.declared[1].where == "requirements.txt:2"


def test_a_vcs_line_without_a_name_is_left_for_its_metadata_to_name():
    deps = _reqs({"requirements.txt": f"git+https://github.com/huggingface/peft.git@{COMMIT}\n"
                  "git+https://github.com/o/r ; python_version < '3.12'\n"})  # fmt: skip
    assert deps.declared == ()
    assert deps.nameless == (
        Nameless(f"git+https://github.com/huggingface/peft.git@{COMMIT}", "", "requirements.txt:1"),
        Nameless("git+https://github.com/o/r", "python_version < '3.12'", "requirements.txt:2"),
    )


@pytest.mark.parametrize(
    ("line", "folder", "editable"),
    [(".", ".", False), ("-e .", ".", True), ("./sub", "sub", False), ("-e ./sub/", "sub", True),
     ("--editable=./a/../sub", "sub", True), ("-e./sub", "sub", True), ("src/pkg", "src/pkg", False)],
)  # fmt: skip
def test_the_projects_own_folder_is_a_folder_to_install(line, folder, editable):
    deps = _reqs({"requirements.txt": f"numpy\n{line}\n"})
    assert [d.requirement for d in deps.declared] == ["numpy"]
    assert deps.local == (Local(folder, "requirements.txt:2", editable),)


def test_index_lines_are_indexes_the_lock_uses():
    deps = _reqs({
        "requirements.txt": "-i https://mirror.example/simple\n--extra-index-url https://pkgs.acme.example/simple\n"
        "--extra-index-url=https://pkgs.acme.example/simple\n-r more.txt\nnumpy\n",
        "more.txt": "--index-url https://mirror.example/simple\n--extra-index-url https://download.pytorch.org/whl\n",
    })  # fmt: skip
    assert deps.indexes == (
        Index("https://mirror.example/simple", True, "requirements.txt:1"),
        Index("https://pkgs.acme.example/simple", False, "requirements.txt:2"),
        Index("https://pkgs.acme.example/simple", False, "requirements.txt:3"),
        Index("https://mirror.example/simple", True, "more.txt:1"),
    )
    assert any("download.pytorch.org" in n and "ignored" in n for n in deps.notes)


def test_find_links_is_refused_with_the_ways_to_do_it():
    with pytest.raises(UsageError) as info:
        _reqs({"requirements.txt": "numpy\n-f https://example.org/links.html\n"})
    assert info.value.message == "requirements.txt:2: -f is not honoured"
    assert "--extra-index-url" in info.value.hint and "#sha256=" in info.value.hint and "file:wheels" in info.value.hint


def test_joined_lines_are_read_as_pip_joins_them():
    """pip's req_file.join_lines: a line that is only a comment is never continued, whatever it ends with; a line
    with a comment after a requirement that ends in a backslash takes the next line into its comment (pip 26.3,
    checked with pip._internal.req.req_file.parse_requirements: numpy, requests and idna, not six)."""
    deps = _reqs({"requirements.txt": "# pinned below \\\nnumpy\nrequests # the client \\\nsix\nidna\n"
                  "accel\\\nerate\n  # indented comment \\\nfilelock\n"})  # fmt: skip
    assert [d.requirement for d in deps.declared] == ["numpy", "requests", "idna", "accelerate", "filelock"]
    assert any("requirements.txt:4" in n and "comment of line 3" in n for n in deps.notes), deps.notes


def test_a_requirement_whose_marker_holds_a_slash_is_no_path():
    deps = _reqs({"requirements.txt": 'numpy ; platform_release == "5.15/x"\n'})
    assert [d.requirement for d in deps.declared] == ['numpy ; platform_release == "5.15/x"'] and not deps.local
