"""Throughput of `imagekit pod cp` for 100 MB of random bytes, both directions, on loopback:

- through a PTY-only server (OpenSSH with a ForceCommand that refuses anything but a terminal and offers no SFTP,
  as RunPod's gateway does): imagekit's chunked, checksum-verified copy;
- through a full sshd: imagekit's SFTP path (also verified), and the peer, OpenSSH's `scp`.

Every imagekit copy compares sha256 on both ends (it fails otherwise); the bench checks the bytes again itself.
Goal: the PTY path at 10 MB/s or more. Needs openssh-server and openssh-client (`make setup`).
Run: .venv/bin/python bench/pod_cp.py [MB]
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.services.pods import pod  # noqa: E402
from tests import sshd  # noqa: E402


def _timed(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def main() -> None:
    size = int(float(sys.argv[1]) * 1e6) if len(sys.argv) > 1 else 100_000_000
    with tempfile.TemporaryDirectory(prefix="imagekit-bench-") as tmp:
        root = Path(tmp)
        src = root / "payload.bin"
        with src.open("wb") as fh:
            for _ in range(0, size, 1 << 20):
                fh.write(os.urandom(min(1 << 20, size - fh.tell())))
        want = hashlib.sha256(src.read_bytes()).hexdigest()
        os.environ["HOME"] = str(root / "home")
        rows: list[tuple[str, float]] = []
        with sshd.serve(root / "gw", "gateway") as gw, sshd.serve(root / "full", "full") as full:
            (root / "home" / ".ssh").mkdir(parents=True)
            (root / "home" / ".ssh" / "known_hosts").write_text(gw.known_hosts_line() + full.known_hosts_line())
            quiet = lambda *a: None  # noqa: E731
            for label, server in (
                ("imagekit pod cp, PTY-only gateway", gw),
                ("imagekit pod cp, full sshd (SFTP)", full),
            ):
                opts = pod.PodOptions(key=server.key)
                remote = server.root / "up.bin"
                rows.append(
                    (
                        f"{label}, upload",
                        _timed(pod.copy, str(src), f"{server.target}:{remote}", opts, quiet, quiet),
                    )
                )
                back = root / f"back-{server.port}.bin"
                rows.append(
                    (
                        f"{label}, download",
                        _timed(pod.copy, f"{server.target}:{remote}", str(back), opts, quiet, quiet),
                    )
                )
                for path in (remote, back):
                    assert hashlib.sha256(path.read_bytes()).hexdigest() == want, path
            known = root / "home" / ".ssh" / "known_hosts"  # ssh reads the passwd home, not $HOME: name it
            scp = ["scp", "-q", "-i", str(full.key), "-P", str(full.port), "-o", "BatchMode=yes"]
            scp += ["-o", f"UserKnownHostsFile={known}"]
            remote = full.root / "scp.bin"
            rows.append(
                (
                    "scp (peer), full sshd, upload",
                    _timed(subprocess.run, [*scp, str(src), f"root@127.0.0.1:{remote}"], check=True),
                )
            )
            back = root / "scp-back.bin"
            rows.append(
                (
                    "scp (peer), full sshd, download",
                    _timed(subprocess.run, [*scp, f"root@127.0.0.1:{remote}", str(back)], check=True),
                )
            )
            for path in (remote, back):
                assert hashlib.sha256(path.read_bytes()).hexdigest() == want, path
    peer = {d: t for name, t in rows if name.startswith("scp") for d in ("upload", "download") if name.endswith(d)}
    print(f"{size / 1e6:.0f} MB of random bytes, loopback, {os.cpu_count()} CPUs; sha256 verified on both ends")
    print(f"{'':44} {'seconds':>8} {'MB/s':>7} {'vs scp':>7}")
    for name, seconds in rows:
        direction = "upload" if name.endswith("upload") else "download"
        print(f"{name:44} {seconds:8.2f} {size / seconds / 1e6:7.1f} {peer[direction] / seconds:6.2f}x")


if __name__ == "__main__":
    main()
