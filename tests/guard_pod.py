"""The image started as a pod platform starts it, for the lifetime guard's tests against the real image: the pod's id
and key in its env, the provider's API a stand-in on the host's bridge address (a real HTTP server: the provider is
the one fake, at the outer boundary), a fake `nvidia-smi` first on PATH whose answers the test rewrites, time
compressed through the guard's settings (a look every second, windows of seconds). A record of what each scenario
showed is kept with pytest's temporary folders (docs/pods.md quotes it)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from tests import containers, hostile_http

POD_ID, KEY = "podguard42", "rpa_GUARDKEY_0123456789abcdef"
FAKE_SMI = """#!/bin/sh
# the guard's queries; the doctor's only where /fake/gpus says what GPUs there are (else it fails as on a host
# without a driver)
case "$*" in
  *utilization.gpu*) cat /fake/util ;;
  *query-compute-apps*) cat /fake/procs ;;
  *index,name,driver_version*) if [ -f /fake/gpus ]; then cat /fake/gpus; exit 0; fi
    echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." ; exit 9 ;;
  *) echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." ; exit 9 ;;
esac
"""
STOP = ("POST", f"/v2/pods/{POD_ID}/action", "stop")  # RunPod's REST v2, as the guard asks it
TERMINATE = ("POST", f"/v2/pods/{POD_ID}/action", "terminate")


def sent(api, index: int) -> tuple[str, str, str]:  # type: ignore[no-untyped-def]
    """(method, path, the action its body names) of the stand-in's request ``index``."""
    import json

    seen = api.seen[index]
    try:
        action = json.loads(seen.body or b"{}").get("action", "")
    except ValueError:
        action = "?"
    return seen.method, seen.path, action


ROWS: list[tuple[str, str, str]] = []  # (scenario, expected, observed) of every scenario run this session
PATH = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def gateway(engine) -> str:  # type: ignore[no-untyped-def]
    """Where containers on the default bridge reach the host: its gateway (Docker names it, or it is the subnet's
    first address, as Docker assigns it when it does not)."""
    import ipaddress

    config = engine.client.networks.get("bridge").attrs["IPAM"]["Config"][0]
    return config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


@contextmanager
def stand_in(engine, answer=None) -> Iterator[hostile_http.Server]:  # type: ignore[no-untyped-def]
    """The provider's API where the pods reach the host; ``answer(seen)``: every answer (200 ``{}`` by default)."""
    with hostile_http.serve(fallback=answer or (lambda _seen: (200, {}, b"{}")), host=gateway(engine)) as server:
        yield server


def fake_gpu(tmp_path: Path, util: str = "0\n", procs: str = "") -> Path:
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(FAKE_SMI)
    (fake / "nvidia-smi").chmod(0o755)
    (fake / "util").write_text(util)
    (fake / "procs").write_text(procs)
    return fake


def start(engine, image, api, tmp_path, env, command=None, ready=None, fake=None, **docker_kw):  # type: ignore[no-untyped-def]
    """The image as a RunPod pod (its id and key in the env, the API base pointed at the stand-in, a root-owned
    volume on /workspace, as RunPod mounts it); ``fake``: a folder whose nvidia-smi comes first on PATH."""
    vol = tmp_path / "volume"
    vol.mkdir()
    vol.chmod(0o755)
    full = {"RUNPOD_POD_ID": POD_ID, "RUNPOD_API_KEY": KEY, "IMAGEKIT_RUNPOD_API": f"{api.url}/v2", **env}
    full.setdefault("IMAGEKIT_GUARD_INTERVAL", "1s")
    volumes = {str(vol): ("/workspace", "rw")}
    if fake is not None:
        full["PATH"] = "/fake:" + PATH
        volumes[str(fake)] = ("/fake", "ro")
    kw = {"ready": ready} if ready is not None else {}
    pod = containers.start(
        engine, image, env=full, volumes=volumes, ports=("22/tcp",), command=command, **kw, **docker_kw
    )
    return pod, vol


def wait_request(api, count: int, timeout: float = 60) -> float:  # type: ignore[no-untyped-def]
    """The time at which the stand-in has seen ``count`` requests."""
    begin = time.time()
    while len(api.seen) < count:
        assert time.time() - begin < timeout, "no request from the guard"
        time.sleep(0.05)
    return time.time()


def quiet_for(api, count: int, seconds: float, pod) -> None:  # type: ignore[no-untyped-def]
    """No request beyond ``count`` for ``seconds``: what a false stop would have sent by then."""
    end = time.time() + seconds
    while time.time() < end:
        assert len(api.seen) == count, f"the guard ended the pod:\n{pod.logs()[-3000:]}"
        time.sleep(0.1)


def logs_with(pod, text: str, timeout: float = 20) -> str:  # type: ignore[no-untyped-def]
    """The container's log (with timestamps) once it holds ``text`` (the log driver passes lines on a moment later)."""
    begin = time.time()
    while True:
        logs = pod.container.logs(timestamps=True).decode()
        if text in logs:
            return logs
        assert time.time() - begin < timeout, f"never logged {text!r}:\n{logs[-3000:]}"
        time.sleep(0.1)


def logged_at(pod, text: str) -> float:  # type: ignore[no-untyped-def]
    """When the container first logged a line holding ``text`` (the log's timestamps)."""
    for line in logs_with(pod, text).splitlines():
        stamp, _, rest = line.partition(" ")
        if text in rest:
            return datetime.fromisoformat(stamp[:26] + "+00:00").timestamp()
    raise AssertionError(f"never logged {text!r}")


def fired_at(pod, trigger: str) -> float:  # type: ignore[no-untyped-def]
    """When the guard logged the trigger."""
    return logged_at(pod, f"imagekit-guard: {trigger}:")


def guard_line(pod, trigger: str) -> str:  # type: ignore[no-untyped-def]
    return next(x for x in logs_with(pod, f"imagekit-guard: {trigger}:").splitlines() if f"guard: {trigger}:" in x)


def imagekit(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """The `imagekit` command as a user runs it (its own process; the account key for the provider's stand-in)."""
    import os
    import sys

    return subprocess.run([sys.executable, "-m", "imagekit", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "RUNPOD_API_KEY": KEY, **env})  # fmt: skip


def target(pod, tmp_path: Path) -> list[str]:  # type: ignore[no-untyped-def]
    """`imagekit pod`'s TARGET and key options for the pod's sshd (the key ``throwaway_key`` made)."""
    return [f"root@127.0.0.1:{pod.port('22/tcp')}", "--key", str(tmp_path / "id_ed25519"), "--insecure-host-key"]


def throwaway_key(tmp_path: Path) -> str:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key.with_suffix(".pub").read_text().strip()


def ssh_argv(pod, tmp_path: Path, *extra: str) -> list[str]:  # type: ignore[no-untyped-def]
    """ssh to the pod as root with the key ``throwaway_key`` made."""
    return ["ssh", "-i", str(tmp_path / "id_ed25519"), "-p", str(pod.port("22/tcp")), "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            *extra, "root@127.0.0.1"]  # fmt: skip


def ssh(pod, tmp_path: Path, command: str) -> str:  # type: ignore[no-untyped-def]
    """``command`` over a real SSH login (sshd may still be starting); its output."""
    for _ in range(20):
        done = subprocess.run([*ssh_argv(pod, tmp_path), command], capture_output=True, timeout=60, text=True)
        if done.returncode == 0:
            return done.stdout
        time.sleep(0.5)
    raise AssertionError(f"no SSH login to the pod:\n{pod.logs()[-3000:]}")


def scanner(pod) -> socket.socket:  # type: ignore[no-untyped-def]
    """A connection to the pod's :22 that sends its banner and never authenticates (a port scanner's)."""
    conn = socket.create_connection(("127.0.0.1", pod.port("22/tcp")))
    conn.recv(256)
    conn.sendall(b"SSH-2.0-scanner\r\n")
    return conn


def write_table(folder: Path) -> None:
    """The scenarios run so far, as the table docs/pods.md shows, in ``folder``/guard-scenarios.md."""
    lines = ["| scenario | expected | observed |", "|---|---|---|", *(f"| {a} | {b} | {c} |" for a, b, c in ROWS)]
    (folder / "guard-scenarios.md").write_text("\n".join(lines) + "\n")
