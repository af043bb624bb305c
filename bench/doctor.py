"""Doctor wall time inside a real image: quick tier, the pod start check with a GPU expected (start tier: quick +
torch's CUDA probe), standard tier, and the peer `python -m torch.utils.collect_env`.

Runs inside the image (so no `docker run` start-up is counted), each command 5 times, and prints medians and ratios.
Goals: quick tier under 0.5 s; the start check under 5 s with torch imported.
Needs a built image: `make demo` or `imagekit build --cell CELL`.
Run: .venv/bin/python bench/doctor.py [IMAGE]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.effects.docker import Engine  # noqa: E402

DEFAULT_IMAGE = "127.0.0.1:5000/imagekit/train:cu121-torch2.1.2-py3.11-tf4.48.2"
INSIDE = r"""
import json, os, statistics, subprocess, sys, time
doctor = "/opt/imagekit/doctor/imagekit_doctor.py"
cmds = {
    "doctor quick": [sys.executable, doctor, "--tier", "quick", "--json"],
    "doctor start (GPU expected)": [sys.executable, doctor, "--tier", "start", "--json"],
    "doctor standard": [sys.executable, doctor, "--tier", "standard", "--json"],
    "torch.utils.collect_env (peer)": [sys.executable, "-m", "torch.utils.collect_env"],
}
out = {}
for name, argv in cmds.items():
    times = []
    env = dict(os.environ, IMAGEKIT_REQUIRE_GPU="1") if "start" in name else None
    for _ in range(5):
        t = time.perf_counter()
        res = subprocess.run(argv, capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - t)
    if name.startswith("doctor"):
        report = json.loads(res.stdout)  # a crashed doctor must not pass for a fast one
        assert report["tier"] == name.split()[1], report
        ids = [c["id"] for c in report["checks"]]
        probed = "torch-probe" in ids or "cpu-fallback" in ids
        assert probed == (name != "doctor quick"), ids
    elif res.returncode != 0:
        raise SystemExit(res.stderr)
    out[name] = statistics.median(times)
print(json.dumps(out))
"""


def main() -> None:
    image = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_IMAGE
    engine = Engine()
    if engine.image(image) is None:
        sys.exit(f"error: {image} is not built\nhint: run `make demo` first, or pass an imagekit image")
    code, out, err = engine.run(image, ["-c", INSIDE], entrypoint=["/opt/venv/bin/python"])
    if code != 0:
        sys.exit(f"error: the timing run failed: {err[-1000:]}")
    times = json.loads(out)
    peer = times["torch.utils.collect_env (peer)"]
    print(f"image: {image} (no GPU on this machine; median of 5 runs inside the container)")
    for name, seconds in times.items():
        print(f"  {name:34s} {seconds:7.3f} s   ({seconds / peer:.2f}x of collect_env)")
    print(f"quick tier goal < 0.5 s: {'met' if times['doctor quick'] < 0.5 else 'NOT met'}")
    start = times["doctor start (GPU expected)"]
    print(f"start check goal < 5 s with torch imported: {'met' if start < 5 else 'NOT met'}")


if __name__ == "__main__":
    main()
