"""One file copied to or from a pod, verified: through ``NAME.imkpart``, renamed only once its sha256 matches the other
end's. Also the checks on the pod it relies on: a command's output, a file's sha256."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

from imagekit.clouds.podwire import q
from imagekit.effects.ssh.ssh_errors import Sink
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.trust import untrusted

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


class Captures(Protocol):
    """What the checks below ask of a transport: a command's exit code and output."""

    def capture(self, command: str, timeout: float = 300.0) -> tuple[int, str]: ...


def checked(t: Captures, command: str, what: str, timeout: float = 300.0) -> str:
    """The output of ``command``; a non-zero exit is :class:`EnvironmentFailure` with the pod's last words."""
    code, out = t.capture(command, timeout)
    if code != 0:
        said = untrusted.printable(out.strip()[-2000:], 300)
        raise EnvironmentFailure(
            f"{what} failed on the pod (exit {code})" + (f": {said}" if said else ""), "check the path"
        )
    return out


def sha256_file(path: Path, limit: int | None = None) -> str:
    """sha256 of a local file (of its first ``limit`` bytes)."""
    h, left = hashlib.sha256(), limit
    with path.open("rb") as fh:
        while left is None or left > 0:
            block = fh.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


def remote_sha256(t: Captures, path: str, limit: int | None = None) -> str:
    """sha256 of a file on the pod (of its first ``limit`` bytes); '' when the pod's answer is not one."""
    source = f"head -c {limit} {q(path)}" if limit is not None else f"cat {q(path)}"
    # a FIFO or a device (one swapped in since the last look) is never opened: reading it would never end
    out = checked(t, f"[ -f {q(path)} ] || exit 0; {source} | sha256sum | cut -c1-64", f"sha256 of {path}", 3600)
    last = out.strip().splitlines()[-1].lower() if out.strip() else ""
    return last if len(last) == 64 and all(c in "0123456789abcdef" for c in last) else ""


def open_part(part: Path, keep: bool) -> tuple[int, int]:
    """Open the partial download ``part`` (created if missing): (fd, bytes already there, 0 unless ``keep``).
    Never through a link: a symlink, a hardlink or anything but a plain file planted there is refused."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(part, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(
                f"{part} is a symlink, not a partial download: nothing was written", "remove it, then copy again"
            ) from None
        raise EnvironmentFailure(f"cannot write {part}: {exc.strerror}", "check the destination folder") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = "a hardlink to another file" if stat.S_ISREG(st.st_mode) else "not a plain file"
        raise UsageError(f"{part} is {what}, not a partial download: nothing was written", "remove it, then copy again")
    if not keep:
        os.ftruncate(fd, 0)
    return fd, st.st_size if keep else 0


class Copies:
    """What both transports do around the bytes: a file goes to ``NAME.imkpart`` (on the pod for an upload, here
    for a download), is renamed only once its sha256 matches the other end's, and is removed when it does not.
    A subclass moves the bytes: ``_send`` (to the pod's part) and ``_receive`` (into the local part, ``fh``)."""

    mode: str

    def capture(self, command: str, timeout: float = 300.0) -> tuple[int, str]:
        raise NotImplementedError

    def _send(self, local: Path, part: str, parent: str, total: int, progress: Progress, log: Sink) -> int:
        raise NotImplementedError

    def _receive(
        self, remote: str, part: Path, fh: BinaryIO, have: int, total: int, progress: Progress, log: Sink
    ) -> int:
        raise NotImplementedError

    def _resumes(self) -> bool:
        """Whether a local partial download is kept to resume from (the chunked protocol), or started anew."""
        raise NotImplementedError

    def put(self, local: Path, remote: str, progress: Progress, log: Sink) -> int:
        """Upload one file to ``remote`` (through ``remote.imkpart``, renamed only once its sha256 matches); the
        payload bytes sent. The chunked protocol resumes from an earlier partial upload."""
        total, sha = local.stat().st_size, sha256_file(local)
        part = remote + ".imkpart"
        sent = self._send(local, part, str(PurePosixPath(remote).parent), total, progress, log)
        got = remote_sha256(self, part)
        if got != sha:
            self.capture(f"rm -f {q(part)}", 30)
            raise CheckFailed(
                f"{remote}: sha256 on the pod is {got or 'unreadable'}, here {sha}: the copy is corrupt and was "
                "removed",
                "run the copy again",
            )
        checked(self, f"mv -f {q(part)} {q(remote)}", f"rename {part}")
        return sent

    def get(self, remote: str, local: Path, progress: Progress, log: Sink) -> int:
        """Download one file to ``local`` (through ``local.imkpart``); the payload bytes received."""
        p = q(remote)
        out = checked(self, f"if [ -f {p} ]; then wc -c < {p}; else echo special; fi", f"size of {remote}").split()
        if out and out[-1] == "special":  # never opened: a FIFO or a device would never end
            raise UsageError(
                f"{remote} on the pod is not a regular file (a FIFO, a device or a socket): nothing was copied",
                "copy regular files and folders only",
            )
        if not out or not out[-1].isdigit() or len(out[-1]) > 18:
            raise EnvironmentFailure(f"cannot read the size of {remote} on the pod", "check the path")
        total = int(out[-1])
        sha = remote_sha256(self, remote)
        if not sha:
            raise EnvironmentFailure(
                f"the pod gave no sha256 of {remote} (it is not a regular file any more, or sha256sum failed there): "
                "nothing was copied",
                "check the file on the pod; only regular files are copied",
            )
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(local.name + ".imkpart")
        fd, have = open_part(part, keep=self._resumes())
        try:
            with os.fdopen(fd, "r+b") as fh:
                received = self._receive(remote, part, fh, have, total, progress, log)
        except UsageError:  # it is no regular file any more: nothing to resume from
            part.unlink(missing_ok=True)
            raise
        got = sha256_file(part)
        if got != sha:
            part.unlink(missing_ok=True)
            raise CheckFailed(
                f"{remote}: sha256 here is {got}, on the pod {sha or 'unreadable'}: the copy is "
                "corrupt and was removed (did the file change during the copy?)",
                "run the copy again",
            )
        os.replace(part, local)
        return received
