"""A real project's first image: `imagekit build --push` of a public fine-tuning repository, from its own
dependency file, with the wheel cache warm and an engine that holds none of the image's layers, step by step.

PROJECT is a clone with its imagekit.toml and lock (`imagekit init --from FILE`, `[image]` copy/install/smoke as the
user writes them, `imagekit lock`); its wheels are fetched first (`imagekit fetch`, not timed: the cache is warm).
Each round, into a new empty registry of its own, with the page cache dropped:

1. the engine emptied of what an earlier round left: the project's tags, the cell's build-cache anchor, the step
   images (`imagekit prune --cache`) and the base image (re-imported from its cached tarball, as on a machine that
   has built nothing yet);
2. `imagekit build --cell CELL --push` in PROJECT: its time by step and the whole process's wall time;
3. with --peer, the same again with IMAGEKIT_PREPARE_BLOBS=0 (the push compresses each layer after the self-test,
   the way before blobs were prepared during the build): the ratio of the two in the same round.

Prints each round, the median, and the ratio to the goal (5 minutes).

Run: .venv/bin/python bench/first_publish.py PROJECT --cell CELL [--rounds 3] [--peer]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.effects.docker import Engine  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from cold_build import STEPS, drop_caches  # noqa: E402

GOAL = 300.0


def imagekit(project: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "imagekit", *args], cwd=project, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "IMAGEKIT_PROGRESS_INTERVAL": "100000", **(env or {})},
    )  # fmt: skip


def cold_engine(engine: Engine, project: Path, cell: str, state: Path) -> None:
    """Nothing of the image's layers left in the engine (tags of the project's images, the build cache, step images,
    the base image): the build that follows makes every layer."""
    for image in engine.client.images.list():
        for tag in image.tags:
            if tag.startswith(("127.0.0.1:", "imagekit/base:", "imagekit/build:", "imagekit/refused:")) or (
                cell in tag
            ):
                engine.remove(tag)
    imagekit(project, "prune", "--cache")
    engine.client.images.prune(filters={"dangling": True})
    shutil.rmtree(state, ignore_errors=True)


def one_build(project: Path, cell: str, registry: str, state: Path, env: dict[str, str]) -> tuple[float, dict]:
    drop_caches()
    t0 = time.perf_counter()
    res = imagekit(project, "build", "--cell", cell, "--push", "--gpus", "off", "--registry",
                   f"{registry}/bench/first", "--state-dir", str(state), "--release-index", str(state / "index.json"),
                   "--release-records", str(state / "records"), env=env)  # fmt: skip
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"imagekit build failed ({res.returncode}):\n{res.stderr[-3000:]}")
    found = next((m for line in res.stderr.splitlines() if (m := STEPS.match(line)) and m["cell"] == cell), None)
    steps = {m[1]: float(m[2]) for m in re.finditer(r"([a-z-]+) (\d+(?:\.\d+)?) s", found["steps"] if found else "")}
    for line in res.stderr.splitlines():
        if " built " in line or "compressed during the build" in line or " pushed " in line or "passed:" in line:
            print(f"    {line.split(' ', 1)[1][:220]}", flush=True)
    return wall, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("project", type=Path)
    ap.add_argument("--cell", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peer", action="store_true", help="also build with IMAGEKIT_PREPARE_BLOBS=0 each round")
    args = ap.parse_args()
    from tests.registry import Registry, free_port

    project, engine = args.project.resolve(), Engine()
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    fetched = imagekit(project, "fetch", "--cell", args.cell)
    if fetched.returncode != 0:
        sys.exit(f"imagekit fetch failed:\n{fetched.stderr[-2000:]}")
    print(f"imagekit {rev.stdout.strip()}, project {project.name}, cell {args.cell}, {os.cpu_count()} CPUs; "
          "wheels cached", flush=True)  # fmt: skip
    ways = [("imagekit", {})] + ([("prepare off", {"IMAGEKIT_PREPARE_BLOBS": "0"})] if args.peer else [])
    walls: dict[str, list[float]] = {name: [] for name, _ in ways}
    for round_ in range(1, args.rounds + 1):
        for name, env in ways:
            with tempfile.TemporaryDirectory(prefix="imagekit-bench-first-") as tmp:
                state = Path(tmp) / "state"
                cold_engine(engine, project, args.cell, state)
                registry = Registry(Path(tmp) / "registry", free_port()).start()
                try:
                    print(f"round {round_}, {name}:", flush=True)
                    wall, steps = one_build(project, args.cell, registry.address, state, env)
                finally:
                    registry.stop()
            walls[name].append(wall)
            print(f"  {wall:.0f} s in all ({wall / GOAL:.2f}x the 5-minute goal): "
                  + ", ".join(f"{k} {v:.0f} s" for k, v in steps.items() if v >= 0.5), flush=True)  # fmt: skip
        if args.peer:
            print(f"  round {round_}: imagekit / prepare off: {walls['imagekit'][-1] / walls['prepare off'][-1]:.2f}x")
    median = statistics.median(walls["imagekit"])
    print(f"median of {args.rounds}: {median:.0f} s ({median / GOAL:.2f}x the goal; each: "
          f"{', '.join(f'{w:.0f}' for w in walls['imagekit'])} s)")  # fmt: skip
    if args.peer:
        off = statistics.median(walls["prepare off"])
        print(f"prepare off: median {off:.0f} s; imagekit / prepare off: {median / off:.2f}x")


if __name__ == "__main__":
    main()
