"""Real OpenSSH servers on loopback for the pod tests: a full one (exec, SFTP) and a gateway-like one that, like
RunPod's proxy, refuses anything but a terminal, prints a banner and a colored prompt, and has no SFTP."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"

GATEWAY = """#!/bin/bash
if [ -z "$SSH_TTY" ]; then echo "Your SSH client doesn't support PTY"; exit 1; fi
printf '\\033[1;33m-- Welcome to the pod gateway --\\033[0m\\r\\n\\033]0;pod-title\\007'
exec bash --rcfile {rc} -i
"""
RC = r"""PS1='\[\e[1;32m\]root@pod\[\e[0m\]:\[\e[1;34m\]\w\[\e[0m\]\$ '
{extra}
"""


@dataclass
class Server:
    port: int
    root: Path
    key: Path  # the client's private key
    host_pub: str  # "ssh-ed25519 AAAA..."
    proc: subprocess.Popen

    @property
    def target(self) -> str:
        return f"root@127.0.0.1:{self.port}"

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_pub}\n"

    def drop_sessions(self) -> None:
        """Kill the per-connection sshd processes and everything under them (the listener stays): a dropped
        connection, for real. A process that left its session (setsid, re-parented away) is not under them."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        doomed, todo = [], list(children.get(self.proc.pid, []))
        while todo:
            pid = todo.pop()
            doomed.append(pid)
            todo.extend(children.get(pid, []))
        for pid in doomed:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def available() -> bool:
    return Path(SSHD).exists() and shutil.which("ssh-keygen") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(root: Path, kind: str, rc_extra: str = "", extra_config: Sequence[str] = ()) -> Iterator[Server]:
    """``kind``: "full" (exec + SFTP) or "gateway" (terminal only); ``extra_config``: more sshd_config lines."""
    root.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "host")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "client")], check=True)
    (root / "authorized_keys").write_text((root / "client.pub").read_text())
    port = _free_port()
    lines = [
        f"Port {port}",
        "ListenAddress 127.0.0.1",
        f"HostKey {root / 'host'}",
        f"PidFile {root / 'sshd.pid'}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}",
        "StrictModes no",
        "UsePAM no",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PrintMotd no",
        "LogLevel ERROR",
        "MaxSessions 50",
    ]
    if kind == "full":
        lines.append("Subsystem sftp internal-sftp")
    else:
        (root / "rc").write_text(RC.format(extra=rc_extra))
        gateway = root / "gateway.sh"
        gateway.write_text(GATEWAY.format(rc=root / "rc"))
        gateway.chmod(0o755)
        lines.append(f"ForceCommand {gateway}")
    lines.extend(extra_config)
    (root / "sshd_config").write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")], stderr=subprocess.PIPE)
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {proc.stderr.read().decode() if proc.stderr else ''}")
            time.sleep(0.05)
        host_pub = " ".join((root / "host.pub").read_text().split()[:2])
        yield Server(port, root, root / "client", host_pub, proc)
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        subprocess.run(["pkill", "-KILL", "-P", str(proc.pid)], check=False)
