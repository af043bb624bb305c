"""VCS requirements (``name @ git+https://host/org/repo@<commit>``): what the wheel-build stage builds from a git
commit, checked before any git runs. Pure.

A commit names one tree forever; a branch or tag may move, so a lock never follows one: the lock refuses it with the
commit it names today (``git ls-remote``), for the user to pin. Only git over http(s) is read: no ssh (keys), no
``file:`` (the host's own folders), no other transport (``ext::`` runs commands). The URL is a single word of safe
characters that cannot be read as a git option.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from imagekit.trust import untrusted

COMMIT = re.compile(r"[0-9a-f]{40}", re.ASCII)
_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}", re.ASCII)
_URL = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%+-]+)+/?", re.ASCII)
_SUBDIR = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*", re.ASCII)
HINT = "name a commit: `name @ git+https://host/org/repo@<40-hex commit>`"


class NotARef(ValueError):
    """A VCS reference the lock cannot build as it is; ``hint`` names the fix."""

    def __init__(self, message: str, hint: str = HINT) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class GitRef:
    repo: str  # https://host/org/repo (what git clones)
    ref: str  # a commit (40 hex), or a branch or tag the lock resolves to one and refuses
    subdirectory: str | None = None

    @property
    def pinned(self) -> bool:
        return COMMIT.fullmatch(self.ref) is not None

    @property
    def url(self) -> str:
        """As a requirement names it: ``git+https://host/org/repo@ref[#subdirectory=...]``."""
        tail = f"#subdirectory={self.subdirectory}" if self.subdirectory else ""
        return f"git+{self.repo}@{self.ref}{tail}"

    def at(self, commit: str) -> GitRef:
        return GitRef(self.repo, commit, self.subdirectory)


def is_vcs(url: str) -> bool:
    return url.startswith(("git+", "hg+", "svn+", "bzr+"))


def parse(name: str, url: str) -> GitRef:
    """``url`` of ``name @ url`` as a git reference: git over http(s), a ref after ``@`` (none: ``HEAD``, the default
    branch, which a lock refuses with the commit it names today, as any branch), optionally
    ``#subdirectory=`` (``#egg=`` is pip's old way of naming the package: ignored)."""
    shown = untrusted.printable(url, 120)
    if not url.startswith("git+"):
        raise NotARef(f"{name} @ {shown}: only git references are built (no Mercurial, Subversion or Bazaar)")
    rest, _, fragment = url[4:].partition("#")
    parts = urlsplit(rest)
    if parts.scheme not in ("http", "https"):
        raise NotARef(
            f"{name} @ {shown}: only git over http(s) is read (no ssh keys, no local folders, no other transports)",
            "use the repository's https URL",
        )
    if parts.username is not None or parts.password is not None or parts.query:
        raise NotARef(
            f"{name} @ git+{parts.scheme}://...: the URL carries a credential or a query, which a lock would keep",
            "use a public https URL (a private repository: build its wheel and serve it from your own index)",
        )
    repo, at, ref = rest.rpartition("@")
    if not at or "/" not in repo.split("://", 1)[1]:  # no ref: the default branch, refused with its commit
        repo, ref = rest, "HEAD"
    if "/" not in repo.split("://", 1)[1]:
        raise NotARef(f"{name} @ {shown}: no repository path", HINT)
    if not _URL.fullmatch(repo):
        raise NotARef(f"{name} @ {shown}: not a plain repository URL (letters, digits and ._~%+- in its path)")
    if not _REF.fullmatch(ref) or ".." in ref:
        raise NotARef(f"{name} @ {shown}: {untrusted.printable(ref, 60)!r} is not a commit, branch or tag name")
    subdirectory = None
    for item in fragment.split("&") if fragment else ():
        key, _, value = item.partition("=")
        if key == "subdirectory" and _SUBDIR.fullmatch(value) and ".." not in value.split("/"):
            subdirectory = value
        elif key != "egg":
            raise NotARef(f"{name} @ {shown}: #{untrusted.printable(item, 60)} is not understood",
                          "only #subdirectory=PATH (inside the repository) is read")  # fmt: skip
    return GitRef(repo, ref, subdirectory)


def unpinned(name: str, ref: GitRef, commit: str | None) -> NotARef:
    """The refusal of a branch or tag, with the commit it names today when ``git ls-remote`` said."""
    if commit is None:
        return NotARef(
            f"{name} @ {ref.url}: {ref.ref!r} is a branch, tag or short commit, which may move; the repository names "
            "no such ref",
            HINT,
        )
    what = "names no commit: the default branch (HEAD)" if ref.ref == "HEAD" else f"{ref.ref!r} is a branch or tag"
    return NotARef(
        f"{name} @ {ref.url}: {what}, which may move; today it names commit {commit}",
        f"pin it: `{name} @ {ref.at(commit).url}`",
    )
