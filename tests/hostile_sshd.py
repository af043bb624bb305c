"""A malicious pod for the tests of every remote feature: the real OpenSSH servers of tests/sshd.py (a full one with
exec and SFTP, and a RunPod-like terminal-only gateway), each with a folder first on the remote PATH where a test
plants scripts that replace `tar`, `cat`, `dd`, `wc`, `sha256sum`, ... and send crafted data; and builders of the
crafted data (tar archives that try to write outside the destination).

Usage::

    with hostile_sshd.serve(tmp / "full", "full") as pod:
        pod.plant("tar", hostile_sshd.tar_sending(archive))
        ...  # imagekit pod cp root@127.0.0.1:PORT:/some/dir ./out
        pod.clear()
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests import sshd


@dataclass
class HostilePod:
    server: sshd.Server
    bin: Path  # first on the pod's PATH, for exec and the terminal alike

    @property
    def home(self) -> Path:
        return self.server.root / "home"

    @property
    def target(self) -> str:
        return self.server.target

    @property
    def key(self) -> Path:
        return self.server.key

    @property
    def root(self) -> Path:
        return self.server.root

    def known_hosts_line(self) -> str:
        return self.server.known_hosts_line()

    def plant(self, name: str, script: str) -> Path:
        """Replace the command ``name`` on the pod by ``script`` (a shell script's text)."""
        path = self.bin / name
        path.write_text(script)
        path.chmod(0o755)
        return path

    def clear(self) -> None:
        for path in self.bin.iterdir():
            path.unlink()


FULL_WRAPPER = """#!/bin/sh
export PATH={path}
cd {home}
case "$SSH_ORIGINAL_COMMAND" in
  internal-sftp|sftp) exec /usr/lib/openssh/sftp-server ;;
  "") exec /bin/sh -i ;;
esac
exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"
"""


SILENT = "#!/bin/sh\nexec cat >/dev/null\n"


@contextlib.contextmanager
def serve(root: Path, kind: str) -> Iterator[HostilePod]:
    """A real sshd of ``kind`` ("full" or "gateway") whose PATH starts with ``root/bin`` and whose sessions start
    in ``root/home`` (so relative remote paths, ``-n`` included, land there and not in the real home); or
    "silent": a server that logs in and then never prints anything, on a terminal or not."""
    bin_dir, home = root / "bin", root / "home"
    bin_dir.mkdir(parents=True, exist_ok=True)
    home.mkdir(exist_ok=True)
    path = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    extra: list[str] = []
    if kind in ("full", "silent"):
        wrapper = root / "session.sh"
        wrapper.write_text(
            SILENT if kind == "silent" else FULL_WRAPPER.format(path=shlex.quote(path), home=shlex.quote(str(home)))
        )
        wrapper.chmod(0o755)
        extra.append(f"ForceCommand {wrapper}")
    with sshd.serve(
        root,
        "full" if kind == "silent" else kind,
        rc_extra=f"export PATH={path}; cd {shlex.quote(str(home))}",
        extra_config=extra,
    ) as server:
        yield HostilePod(server, bin_dir)


# ---- scripts a hostile pod runs in place of the real tools ----------------------------------------------------
def tar_sending(archive: Path) -> str:
    """A `tar` that, asked to create an archive (``tar -cf FILE ...``), writes ``archive`` there instead; any other
    use goes to the real tar."""
    return f"""#!/bin/sh
if [ "$1" = "-cf" ] || [ "$1" = "-chf" ]; then /bin/cp {shlex.quote(str(archive))} "$2"; exit 0; fi
exec /bin/tar "$@"
"""


def printing_forever(line: str = "A" * 4096) -> str:
    """A command that prints one endless line (``yes`` without newlines) whatever it is asked."""
    return f"#!/bin/sh\nwhile :; do printf %s {shlex.quote(line)}; done\n"


def failing(message: str = "No space left on device", code: int = 1) -> str:
    """A command that fails at once, as a full or read-only disk makes `cat >>` fail."""
    return f"#!/bin/sh\ncat >/dev/null 2>&1\necho {shlex.quote(message)} >&2\nexit {code}\n"


# ---- crafted archives ----------------------------------------------------------------------------------------
def _add(
    tar: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, *, data: bytes = b"", link: str = "", mode=0o644
) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def archive(path: Path, *members: tuple) -> Path:
    """A tar at ``path`` of ``(name, kind, keyword arguments)`` members (see :func:`_add`)."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        _add(tar, "ok.txt", data=b"an ordinary file\n")
        for name, kind, kwargs in members:
            _add(tar, name, kind, **kwargs)
    return path


def cve_2025_4517(path: Path, dest: Path, payload: bytes = b"written outside\n") -> Path:
    """The symlink chain of CVE-2025-4517 (as in CPython's own regression test): links whose expansion passes
    PATH_MAX, so ``os.path.realpath`` (which ``filter="data"`` relies on before 3.11.13 / 3.12.11 / 3.13.4) stops
    expanding them, while the kernel does; ``escape`` then points at ``dest``'s parent, and ``escape/newfile``
    lands there. ``dest`` is where the archive will be extracted: the component length is computed from it."""
    steps = "abcdefghijklmnop"
    max_path = os.pathconf(str(dest.parent), "PC_PATH_MAX")
    component = "d" * ((max_path - len(str(dest)) - 1) // (len(steps) + 1))
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        prefix = ""
        for step in steps:
            _add(tar, os.path.join(prefix, component), tarfile.DIRTYPE, mode=0o777)
            _add(tar, os.path.join(prefix, step), tarfile.SYMTYPE, link=component)
            prefix = os.path.join(prefix, component)
        linkpath = os.path.join(*steps, "l" * 254)
        _add(tar, linkpath, tarfile.SYMTYPE, link=os.path.join(*[".."] * len(steps)))
        _add(tar, "escape", tarfile.SYMTYPE, link=os.path.join(linkpath, ".."))
        _add(tar, "escape/newfile", data=payload)
    return path


@contextlib.contextmanager
def mute_port(greeting: bytes = b"") -> Iterator[int]:
    """A TCP port on loopback that accepts connections and sends ``greeting`` (nothing: no SSH banner ever) and
    then nothing more, keeping them open until the end."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            if greeting:
                conn.sendall(greeting)
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        listener.close()
