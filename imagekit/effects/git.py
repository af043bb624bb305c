"""git, run for VCS requirements (imagekit.locking.vcs_refs): what a ref names today, and one commit's tree as a
source archive. Only http(s) transports, no prompt, no hooks, no system or user configuration; the URL and the ref
were checked before they get here, and each is passed after ``--`` where git takes one."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from imagekit.effects import process
from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.locking.vcs_refs import COMMIT, GitRef
from imagekit.trust import untrusted

TIMEOUT = 600
ARCHIVE_LIMIT = 1 << 30
_SAFE = [
    "-c", "protocol.allow=never", "-c", "protocol.https.allow=always", "-c", "protocol.http.allow=always",
    "-c", "core.hooksPath=/dev/null", "-c", "advice.detachedHead=false", "-c", "credential.helper=",
]  # fmt: skip


def _env(home: Path) -> dict[str, str]:
    return {
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "HOME": str(home),
        "GIT_ASKPASS": "/bin/false",
        "SSH_ASKPASS": "/bin/false",
        "LC_ALL": "C",
    }


def _git(args: list[str], cwd: Path, what: str) -> str:
    git = shutil.which("git")
    if git is None:
        raise EnvironmentFailure("git is not installed", "install git (apt install git) to lock VCS requirements")
    res = process.run([git, *_SAFE, *args], cwd=cwd, env=_env(cwd), timeout=TIMEOUT)
    if not res.ok:
        said = untrusted.printable(res.stderr.strip()[-1200:], 1200, lines=True)
        raise CheckFailed(f"{what} failed:\n{said}", "check the repository URL and that it is reachable from here")
    return res.stdout


def ls_remote(ref: GitRef) -> str | None:
    """The commit ``ref.ref`` names in the repository today (a branch, or a tag peeled to its commit); None when it
    names none."""
    with tempfile.TemporaryDirectory(prefix="imagekit-git-") as tmp:
        out = _git(["ls-remote", "--", ref.repo, ref.ref, f"{ref.ref}^{{}}"], Path(tmp), f"git ls-remote {ref.repo}")
    found: dict[str, str] = {}
    for line in out.splitlines()[:1000]:
        commit, _, name = line.partition("\t")
        if COMMIT.fullmatch(commit):
            found[name] = commit
    for name in (f"refs/tags/{ref.ref}^{{}}", f"refs/tags/{ref.ref}", f"refs/heads/{ref.ref}", ref.ref):
        if name in found:
            return found[name]
    return None


def archive(ref: GitRef, name: str, dest: Path) -> Path:
    """The tree of commit ``ref.ref`` (or of its subdirectory) as ``dest/<name>-<commit>.tar.gz``, one top folder,
    byte-for-byte the same on every machine (git's tar of a commit, gzip without a date or name)."""
    if not ref.pinned:
        raise CheckFailed(f"{ref.url}: not a commit", "pin the commit")
    with tempfile.TemporaryDirectory(prefix="imagekit-git-") as tmp:
        work = Path(tmp)
        _git(["init", "--quiet", "--bare", "repo.git"], work, "git init")
        repo = work / "repo.git"
        try:  # a server that serves any commit (GitHub does): that commit alone
            _git(["fetch", "--quiet", "--depth", "1", "--", ref.repo, ref.ref], repo, f"git fetch {ref.repo}")
        except CheckFailed:  # else the whole history, then the commit from it
            _git(["fetch", "--quiet", "--", ref.repo, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"], repo,
                 f"git fetch {ref.repo}")  # fmt: skip
        kind = _git(["cat-file", "-t", ref.ref], repo, f"git cat-file {ref.ref}").strip()
        if kind != "commit":
            raise CheckFailed(f"{ref.url}: {ref.ref} is not a commit of {ref.repo}", "check the commit id")
        tree = f"{ref.ref}:{ref.subdirectory}" if ref.subdirectory else ref.ref
        top = f"{name}-{ref.ref[:12]}"
        tar = work / "tree.tar"
        _git(["archive", "--format=tar", f"--prefix={top}/", f"--output={tar}", tree], repo, "git archive")
        if tar.stat().st_size > ARCHIVE_LIMIT:
            raise CheckFailed(f"{ref.url}: its tree is over {ARCHIVE_LIMIT >> 20} MB", "build its wheel elsewhere")
        _refuse_links_out(tar)
        dest.mkdir(parents=True, exist_ok=True)
        out = dest / f"{top}.tar.gz"
        raw = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, tar.open("rb") as fh:
            shutil.copyfileobj(fh, gz)
        out.write_bytes(raw.getvalue())
    return out


def _refuse_links_out(tar: Path) -> None:
    """A tree whose links lead out of it (an absolute target, or ``..`` past its top) is refused before any build
    unpacks it."""
    with tarfile.open(tar) as tf:
        for member in tf:
            if member.issym() or member.islnk():
                target = member.linkname
                depth = member.name.count("/") - 1
                ups = sum(1 for part in target.split("/") if part == "..")
                if target.startswith("/") or ups > depth:
                    raise CheckFailed(
                        f"{untrusted.printable(member.name, 120)} links out of the repository's tree "
                        f"({untrusted.printable(target, 80)})",
                        "a source tree's links must stay inside it",
                    )
