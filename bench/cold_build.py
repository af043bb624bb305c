"""A cold build, self-test and publish of one cell against a one-`RUN` uv Dockerfile fed the same wheels, side by
side, several rounds: the ratios the project's performance goals are stated in.

Each round, page cache dropped before each part, the wheels cached (`imagekit fetch`), the same lock and base image,
the same engine (the legacy builder) and a new empty registry of the round's own:

1. imagekit: `imagekit build --cell CELL --no-cache --push` (the cell stage's steps run by imagekit, the self-test,
   the publish with the blobs compressed during the build), its time by step;
2. the peer: `docker build --no-cache` of `FROM <imagekit's base>`, the lock and uv's binary copied in, one `RUN uv
   pip install --require-hashes --no-deps --compile-bytecode` (the same bytecode work imagekit's layers do; `--peer
   uv` drops `--compile-bytecode`) from the same wheels on loopback;
3. with --push-peer, `docker push` of imagekit's very image to a second new registry: the publish the peer's path
   would take for the same image (the engine's own gzip, one core per layer).

Prints per round and as the median of the rounds: imagekit's build + self-test against the peer's build, and the
whole path (build + self-test + publish) against the peer's build + push where it was measured.

Run: .venv/bin/python bench/cold_build.py [--cell CELL] [--rounds 3] [--push-peer] [--peer uv|uv-bytecode]
Needs: Docker, Debian's docker-registry, the cell's lock and wheels (`make demo` leaves both for the default cell).
"""

from __future__ import annotations

import argparse
import json
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
sys.path.insert(0, str(ROOT / "bench"))

from layers import PEERS, REPO, default_cells, fed_peers  # noqa: E402

from imagekit.effects.docker import Engine  # noqa: E402
from imagekit.services import inputs  # noqa: E402

DEMO = "cu121-torch2.1.2-py3.11-tf4.48.2"
STEPS = re.compile(r"^(?P<cell>\S+) time by step: (?P<steps>.*)$")


def drop_caches() -> None:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        print("page cache NOT dropped (not root)", flush=True)


def imagekit_build(cell: str, registry: str, state: Path, env: dict[str, str]) -> tuple[float, dict[str, float]]:
    """A cold `imagekit build --push`: (wall seconds, seconds by step)."""
    drop_caches()
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "imagekit", "build", "--cell", cell, "--no-cache", "--push", "--gpus", "off",
         "--registry", f"{registry}/bench/cold", "--state-dir", str(state),
         "--release-index", str(state / "index.json"), "--release-records", str(state / "records")],
        cwd=ROOT, env={**os.environ, "IMAGEKIT_PROGRESS_INTERVAL": "100000", **env}, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    (state / "stderr.log").write_text(res.stderr)
    if res.returncode != 0:
        sys.exit(f"imagekit build failed ({res.returncode}):\n{res.stderr[-3000:]}")
    found = next((m for line in res.stderr.splitlines() if (m := STEPS.match(line)) and m["cell"] == cell), None)
    steps = {m[1]: float(m[2]) for m in re.finditer(r"([a-z-]+) (\d+(?:\.\d+)?) s", found["steps"] if found else "")}
    return wall, steps


def remove_tags(engine: Engine, prefix: str) -> None:
    for image in engine.client.images.list():
        for tag in image.tags:
            if tag.startswith(prefix):
                engine.remove(tag)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cell", default=DEMO)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peer", choices=("uv-bytecode", "uv"), default="uv-bytecode")
    ap.add_argument("--push-peer", action="store_true", help="also `docker push` the peer (its publish)")
    ap.add_argument("--skip-peer", action="store_true", help="imagekit's builds only (an A/B of its settings)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="for imagekit (IMAGEKIT_PREPARE_BLOBS=0)")
    args = ap.parse_args()
    from tests.registry import Registry, free_port

    engine, data = Engine(), inputs.compat_data()
    cell = next(c for c in default_cells(data) if c.id == args.cell)
    env = dict(kv.split("=", 1) for kv in args.env)
    peer = "uv --compile-bytecode" if args.peer == "uv-bytecode" else "uv"
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"imagekit {rev.stdout.strip()}, cell {args.cell}, {os.cpu_count()} CPUs, peer: one RUN `{peer}`, "
          f"imagekit env {env or '-'}", flush=True)  # fmt: skip
    rows = []
    for round_ in range(1, args.rounds + 1):
        with tempfile.TemporaryDirectory(prefix="imagekit-bench-cold-") as tmp:
            registry = Registry(Path(tmp) / "registry", free_port()).start()
            try:
                state = Path(tmp) / "state"
                state.mkdir()
                wall, steps = imagekit_build(args.cell, registry.address, state, env)
                built = steps.get("build", 0.0) + steps.get("self-test", 0.0)
                path = built + steps.get("publish", 0.0)
                print(f"round {round_}: imagekit {wall:.0f} s in all; " + ", ".join(f"{k} {v:.0f} s" for k, v in
                      steps.items()), flush=True)  # fmt: skip
                stderr = (state / "stderr.log").read_text().splitlines()
                for line in stderr:
                    if ("compressed during the build" in line and "layers" in line) or "pushed " in line[:200]:
                        print(f"  {line.split(' ', 1)[1][:200]}", flush=True)
                base = "imagekit/base:" + next(
                    line.split("imagekit/base:", 1)[1].split()[0].rstrip(")")
                    for line in (state / "build" / args.cell / "Dockerfile").read_text().splitlines()
                    if line.startswith("FROM imagekit/base:")
                )
                if args.skip_peer:
                    continue
                drop_caches()
                skip = tuple(n for n in PEERS if n != peer)
                peer_s, _ = fed_peers(engine, base, cell, data, skip=skip, keep=True)[peer]
                push_s = None
                engine.remove(f"{REPO}-peer:uv")
                if args.push_peer:  # the same image, `docker push`ed to a registry of its own
                    other = Registry(Path(tmp) / "registry-docker", free_port()).start()
                    try:
                        tag = f"{other.address}/bench/docker-push:{round_}"
                        subprocess.run(["docker", "tag", f"{registry.address}/bench/cold:{args.cell}", tag], check=True)
                        drop_caches()
                        t0 = time.perf_counter()
                        subprocess.run(["docker", "push", tag], check=True, stdout=subprocess.DEVNULL)
                        push_s = time.perf_counter() - t0
                        engine.remove(tag)
                    finally:
                        other.stop()
                        shutil.rmtree(Path(tmp) / "registry-docker", ignore_errors=True)
                rows.append((built, path, peer_s, push_s))
                said = f"  peer: build {peer_s:.0f} s"
                if push_s:
                    said += f"; docker push of the image {push_s:.0f} s"
                said += f"; imagekit build + self-test / peer build: {built / peer_s:.2f}x"
                if push_s:
                    said += f"; build + self-test + publish / peer build + push: {path / (peer_s + push_s):.2f}x"
                print(said, flush=True)
            finally:
                registry.stop()
                remove_tags(engine, registry.address)
                shutil.rmtree(Path(tmp) / "registry", ignore_errors=True)
    if not rows:
        return
    builds = [r[0] / r[2] for r in rows]
    print(f"median of {len(rows)} rounds: imagekit build + self-test / {peer} peer build: "
          f"{statistics.median(builds):.2f}x (each: {', '.join(f'{b:.2f}' for b in builds)})")  # fmt: skip
    if args.push_peer:
        paths = [r[1] / (r[2] + r[3]) for r in rows]
        pushes = [r[3] / max(r[1] - r[0], 0.1) for r in rows]
        print(f"  whole path / peer build + push: {statistics.median(paths):.2f}x; docker push / imagekit publish: "
              f"{statistics.median(pushes):.1f}x")  # fmt: skip
    print(json.dumps({"rounds": [dict(zip(("built", "path", "peer", "peer_push"), r, strict=True)) for r in rows]}))


if __name__ == "__main__":
    main()
