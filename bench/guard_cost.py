"""What the lifetime guard costs in a running pod, every trigger armed, against the watchdog RunPod's docs suggest.

The image is started as a RunPod pod (its id and a key in the env, the API pointed at an address nothing answers, a
dry run: nothing is ever stopped), with the defaults `pod create` arms (idle 45m, blocker 20m, exit) plus a deadline,
the GPU-idle watchdog and the CPU-fallback watchdog, at the guard's default interval (30 s), in job mode with a job
running (`sleep 7200`: each look reads the job's process tree and its write count as well). For MINUTES (10 by
default) the guard's process is read from /proc inside the container: CPU time used (user + system) and its resident
memory. The peer, in the same image at the same time: `sleep 7200; runpodctl pod stop` (RunPod's docs), a shell and
a sleep. Printed: CPU seconds, the share of one core, the peak memory of each, and the ratios.

Needs an imagekit image (`make demo`, or any `imagekit build`).
Run: .venv/bin/python bench/guard_cost.py [IMAGE] [MINUTES]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.effects.docker import Engine  # noqa: E402

DEFAULT_IMAGE = "127.0.0.1:5000/imagekit/train:cu121-torch2.1.2-py3.11-tf4.48.2"
ARMED = {
    "RUNPOD_POD_ID": "benchpod", "RUNPOD_API_KEY": "rpa_BENCH", "IMAGEKIT_RUNPOD_API": "http://127.0.0.1:9/v1",
    "IMAGEKIT_GUARD_DRY_RUN": "1", "IMAGEKIT_IDLE_STOP": "45m", "IMAGEKIT_ON_BLOCKER": "stop",
    "IMAGEKIT_BLOCKER_GRACE": "20m", "IMAGEKIT_ON_EXIT": "stop", "IMAGEKIT_MAX_RUNTIME": "6h",
    "IMAGEKIT_GPU_IDLE_WARN": "10m", "IMAGEKIT_GPU_IDLE_STOP": "30m", "IMAGEKIT_GUARD_ACTION": "stop",
}  # fmt: skip
# The process's CPU ticks (utime + stime) and resident pages, and the clock's ticks per second and page size.
READ = r"""
import os, sys
pid = sys.argv[1]
with open(f"/proc/{pid}/stat") as fh:
    fields = fh.read().rsplit(")", 1)[1].split()
print(int(fields[11]) + int(fields[12]), int(fields[21]), os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE"))
"""


def _pid(container, pattern: str) -> str:
    for _ in range(60):
        code, out = container.exec_run(["pgrep", "-o", "-f", pattern])
        if code == 0 and out.strip():
            return out.decode().split()[0]
        time.sleep(1)
    raise SystemExit(f"no process matching {pattern!r} in the container")


def _sample(container, pid: str) -> tuple[float, int]:
    code, out = container.exec_run(["/opt/venv/bin/python", "-c", READ, pid])
    if code != 0:
        raise SystemExit(f"cannot read /proc/{pid}: {out.decode()[-300:]}")
    ticks, pages, hz, page = (int(x) for x in out.split())
    return ticks / hz, pages * page


def measure(engine: Engine, image: str, runs: dict[str, tuple[dict, list[str] | None, str]], minutes: float) -> dict:
    """Each run (name -> env, command, the process to read) in a container of its own, all at once, read every 10 s
    for ``minutes``: CPU seconds used and the peak resident memory of the process."""
    started = {name: engine.client.containers.run(image, cmd, environment=env, detach=True) for name, (env, cmd, _) in
               runs.items()}  # fmt: skip
    try:
        pids = {name: _pid(started[name], pattern) for name, (_, _, pattern) in runs.items()}
        first = {name: _sample(started[name], pids[name])[0] for name in runs}
        start, peak, cpu = time.monotonic(), dict.fromkeys(runs, 0), dict(first)
        while time.monotonic() - start < minutes * 60:
            time.sleep(10)
            for name in runs:
                cpu[name], rss = _sample(started[name], pids[name])
                peak[name] = max(peak[name], rss)
        seconds = time.monotonic() - start
        return {name: {"cpu": cpu[name] - first[name], "seconds": seconds, "peak": peak[name]} for name in runs}
    finally:
        for container in started.values():
            container.remove(force=True)


def main() -> None:
    image = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_IMAGE
    minutes = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    peer_cmd = ["sh", "-c", "sleep 7200; runpodctl pod stop $RUNPOD_POD_ID"]
    got = measure(Engine(), image, {
        "imagekit guard": (ARMED, ["sleep", "7200"], "guard.py"),
        "peer: sleep; runpodctl pod stop": ({"RUNPOD_POD_ID": "benchpod"}, peer_cmd, "sleep 7200"),
    }, minutes)  # fmt: skip
    print(f"{image}, {minutes:g} minutes, side by side; every trigger armed (dry run), a job running, interval 30 s:")
    for name, m in got.items():
        share = 100 * m["cpu"] / m["seconds"]
        print(f"  {name}: {m['cpu']:.2f} CPU s ({share:.3f} % of one core), peak memory {m['peak'] / 1e6:.1f} MB")
    guard, peer = got["imagekit guard"], got["peer: sleep; runpodctl pod stop"]
    cpu_ratio = f"{guard['cpu'] / peer['cpu']:.0f}x" if peer["cpu"] else "n/a (the peer used no measurable CPU)"
    print(f"  ratio guard/peer: CPU {cpu_ratio}, memory {guard['peak'] / max(peer['peak'], 1):.1f}x "
          "(the peer watches nothing but the clock)")  # fmt: skip


if __name__ == "__main__":
    main()
