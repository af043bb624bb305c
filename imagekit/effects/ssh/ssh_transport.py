"""What a use case drives to reach a pod (:class:`Transport`) and the two real ones, chosen once per connection by
:func:`open_transport`. :class:`ExecTransport`: commands on exec channels, files over SFTP;
:class:`TerminalTransport`: everything through one terminal, files in verified chunks."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import BinaryIO, Protocol

from imagekit.clouds.podwire import q
from imagekit.effects.ssh import ssh_terminal
from imagekit.effects.ssh.ssh_connection import Connection
from imagekit.effects.ssh.ssh_copies import Copies, Progress, checked
from imagekit.effects.ssh.ssh_errors import MAX_CAPTURE, ConnectionLost, Sink
from imagekit.errors import UsageError
from imagekit.trust import untrusted


class Transport(Protocol):
    """A pod as a use case sees it (fabric's ``Remote``/``RemoteShell`` split): run or capture a command, put or get
    one file, verified by sha256 on both ends and resumable. ``mode`` is how commands run (``exec`` | ``pty``),
    ``copy_mode`` how files travel (``sftp`` | ``pty``). Real ones: :class:`ExecTransport`,
    :class:`TerminalTransport`; ``tests/fakes.py`` has a recording fake."""

    mode: str

    @property
    def copy_mode(self) -> str: ...
    def run(self, command: str, timeout: float, out: Sink, err: Sink) -> int: ...
    def capture(self, command: str, timeout: float = 300.0) -> tuple[int, str]: ...
    def put(self, local: Path, remote: str, progress: Progress, log: Sink) -> int: ...
    def get(self, remote: str, local: Path, progress: Progress, log: Sink) -> int: ...


def open_transport(conn: Connection, force_pty: bool = False) -> ExecTransport | TerminalTransport:
    """The one place exec-vs-terminal is decided: exec where the server runs commands on exec channels (unless
    ``force_pty``: tests, benchmarks), else the terminal (RunPod's gateway)."""
    return ExecTransport(conn) if not force_pty and conn.exec_works else TerminalTransport(conn)


class ExecTransport(Copies):
    """A full SSH server: each command on its own exec channel (stdout and stderr apart); files over SFTP, opened
    on the first copy. A server without the SFTP subsystem gets the terminal's chunked protocol for files."""

    mode = "exec"

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    @property
    def copy_mode(self) -> str:
        return "sftp" if self.conn.sftp() is not None else "pty"

    def run(self, command: str, timeout: float, out: Sink, err: Sink) -> int:
        code, _, _ = self.conn.exec_run(command, timeout, out, err)
        return code

    def capture(self, command: str, timeout: float = 300.0) -> tuple[int, str]:
        code, out, _ = self.conn.exec_run(command, timeout, None, None, keep=MAX_CAPTURE)
        return code, out

    def _resumes(self) -> bool:
        return self.conn.sftp() is None

    def _send(self, local: Path, part: str, parent: str, total: int, progress: Progress, log: Sink) -> int:
        sftp = self.conn.sftp()
        if sftp is None:
            return ssh_terminal.put_chunks(self, self.conn.shell(), local, part, parent, total, progress, log)
        checked(self, f"mkdir -p {q(parent)}", f"mkdir {parent}")
        try:
            sftp.put(str(local), part, callback=progress, confirm=True)
        except (OSError, EOFError) as exc:
            raise ConnectionLost(f"SFTP upload of {local} failed: {exc}", "run the copy again") from None
        return total

    def _receive(
        self, remote: str, part: Path, fh: BinaryIO, have: int, total: int, progress: Progress, log: Sink
    ) -> int:
        sftp = self.conn.sftp()
        if sftp is None:
            return ssh_terminal.get_chunks(self, self.conn.shell(), remote, part, fh, have, total, progress, log)
        try:
            if not stat.S_ISREG(sftp.stat(remote).st_mode or 0):  # swapped since the size was read
                raise UsageError(
                    f"{remote} on the pod is not a regular file (a FIFO, a device or a socket): nothing was copied",
                    "copy regular files and folders only",
                )
            with sftp.open(remote, "rb") as fr:
                fr.prefetch(total)
                done = 0
                while done < total:  # never more than the size the pod gave: a file that grows stops here
                    data = fr.read(min(1 << 15, total - done))
                    if not data:
                        break
                    fh.write(data)
                    done += len(data)
                    progress(done, total)
        except (OSError, EOFError) as exc:
            raise ConnectionLost(
                f"SFTP download of {remote} failed: {untrusted.printable(exc)}", "run the copy again"
            ) from None
        return total


class TerminalTransport(Copies):
    """A terminal-only gateway (RunPod's proxy): one shell session, commands framed by sentinels, files in verified
    chunks. The command's errors arrive mixed into its output (a terminal has one stream)."""

    mode = "pty"
    copy_mode = "pty"

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def run(self, command: str, timeout: float, out: Sink, err: Sink) -> int:
        return self.conn.shell().run(command, timeout, out)

    def capture(self, command: str, timeout: float = 300.0) -> tuple[int, str]:
        return self.conn.shell().capture(command, timeout)

    def _resumes(self) -> bool:
        return True

    def _send(self, local: Path, part: str, parent: str, total: int, progress: Progress, log: Sink) -> int:
        return ssh_terminal.put_chunks(self, self.conn.shell(), local, part, parent, total, progress, log)

    def _receive(
        self, remote: str, part: Path, fh: BinaryIO, have: int, total: int, progress: Progress, log: Sink
    ) -> int:
        return ssh_terminal.get_chunks(self, self.conn.shell(), remote, part, fh, have, total, progress, log)
