"""How long `imagekit build --dry-run --json` takes for the default matrix (goal: under 3 s, no network beyond
index metadata), as whole processes (interpreter start-up and imports included).

- cold: a fresh IMAGEKIT_CACHE (no wheels, no remembered picks): every needed index page is read once
- warm: the same cache again: picks are remembered, so no network at all
- peer: the floor for the cold plan's network work: `curl` fetching the same distinct index pages, 16 at a time

Run: .venv/bin/python bench/dry_run.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.locking import resolution  # noqa: E402
from imagekit.matrix import matrix_file as matrix  # noqa: E402
from imagekit.services import inputs  # noqa: E402
from imagekit.services.locks import lock_cells as lock_service  # noqa: E402


def plan(cache: Path) -> tuple[float, dict]:
    env = {**os.environ, "IMAGEKIT_CACHE": str(cache)}
    start = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "imagekit", "build", "--dry-run", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    took = time.perf_counter() - start
    if res.returncode not in (0, 3):  # 3: the whole default matrix needs more disk than this machine has
        raise SystemExit(f"dry run failed ({res.returncode}):\n{res.stderr}")
    return took, json.loads(res.stdout)


def pages() -> list[str]:
    data = inputs.compat_data()
    cfg = inputs.load_matrix(None, data)
    names = set()
    for e in matrix.evaluate(cfg, data):
        if e.verdict.compatible:
            st = lock_service.status_of(ROOT / "lockfiles", e.cell, resolution.LockSettings(), data)
            if st.lock is not None:
                names |= {entry.name for entry in st.lock.entries}
    return [f"https://pypi.org/simple/{n}/" for n in sorted(names)]


def curl_floor(urls: list[str]) -> float:
    args = []
    for url in urls:
        args += ["-o", "/dev/null", url]
    start = time.perf_counter()
    subprocess.run(
        [
            "curl",
            "-sS",
            "--parallel",
            "--parallel-max",
            "16",
            "-H",
            "Accept: application/vnd.pypi.simple.v1+json",
            *args,
        ],
        check=True,
    )
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    cold, warm, floor = [], [], []
    doc: dict = {}
    urls = pages()
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            took, doc = plan(Path(tmp))
            cold.append(took)
            took, _ = plan(Path(tmp))
            warm.append(took)
        floor.append(curl_floor(urls))
    cells = doc["cells"]
    locked = sum(1 for c in cells if c["wheels"])
    print(f"default matrix: {len(cells)} cells, {locked} locked, {len(urls)} distinct index pages")
    print(f"cold plan (empty cache)     median {statistics.median(cold):.2f} s  runs {[round(t, 2) for t in cold]}")
    print(f"warm plan (picks known)     median {statistics.median(warm):.2f} s  runs {[round(t, 2) for t in warm]}")
    print(f"peer: curl the same pages   median {statistics.median(floor):.2f} s")
    print(f"cold / curl floor: {statistics.median(cold) / statistics.median(floor):.2f}x; goal: under 3 s")


if __name__ == "__main__":
    main()
