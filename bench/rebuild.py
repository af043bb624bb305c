"""Layer reuse and reproducibility on a real torch cell, against a real local registry.

1. Build cell A cold (--no-cache) and push it to an empty registry: time and bytes pushed.
2. Bump only transformers (cell B, its lock seeded from A's so the torch layer input is byte-identical), build and
   push: time and bytes pushed, as a fraction of the first. Goal: the torch layer is reused, second push < 5 %.
3. Build A again with --no-cache and compare layer digests with step 1. Goal: torch and app layers identical.

Bytes pushed = growth of the registry's blob storage (compressed, what went over the wire).
Run: .venv/bin/python bench/rebuild.py   (about 15 minutes on 2 cores; wheels come from the cache)
     .venv/bin/python bench/rebuild.py --against IMAGE   (step 3 only, against an earlier build of cell A)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.compat import catalog as compat  # noqa: E402
from imagekit.effects.docker import Engine  # noqa: E402
from imagekit.model import Cell  # noqa: E402
from imagekit.services import inputs  # noqa: E402
from imagekit.services.builds.build import BuildOptions, build_cell  # noqa: E402
from tests.registry import Registry, free_port  # noqa: E402

A = Cell("12.1", "2.1.2", "4.48.2", "3.11", ("accelerate==1.2.1", "numpy<2"))
B = replace(A, transformers="4.49.0")


def stored_bytes(root: Path) -> int:
    root.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["du", "-sb", str(root)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def reproducibility_only(engine: Engine, data: compat.CompatData, against: str) -> None:
    """Build A with --no-cache and compare its torch and app layers with an earlier, independent build."""
    before = engine.layers(against)
    if not before:
        sys.exit(f"error: {against} is not in the engine\nhint: build the cell first (make demo)")
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        opts = BuildOptions(
            repository="bench/repro",
            lock_dir=ROOT / "lockfiles",
            state_dir=tmpd / "state",
            release_index=tmpd / "releases.json",
            push=False,
            nocache=True,
        )
        t = time.time()
        r = build_cell(A, opts, engine, data, lambda cid, msg: None)
        assert r.status == "passed", r.error and r.error.render()
        again = engine.layers(r.tag)
        torch_i, app_i = len(again) - 5, len(again) - 3
        print(
            f"A rebuilt with --no-cache in {time.time() - t:.0f} s; against {against}: torch layer identical: "
            f"{before[torch_i] == again[torch_i]} ({again[torch_i][:19]}), app layer identical: "
            f"{before[app_i] == again[app_i]} ({again[app_i][:19]}); "
            f"{sum(x == y for x, y in zip(before, again, strict=False))} of {len(again)} layers identical"
        )
        engine.remove(r.tag)


def main() -> None:
    data = inputs.compat_data()
    engine = Engine()
    if len(sys.argv) > 2 and sys.argv[1] == "--against":
        reproducibility_only(engine, data, sys.argv[2])
        return
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        locks = tmpd / "locks"
        shutil.copytree(ROOT / "lockfiles", locks)
        reg = Registry(tmpd / "registry", free_port()).start()
        try:
            opts = BuildOptions(
                repository=f"{reg.address}/bench/train",
                lock_dir=locks,
                state_dir=tmpd / "state",
                release_index=tmpd / "releases.json",
                push=True,
                nocache=True,
            )
            log = lambda cid, msg: None  # noqa: E731

            def timed(cell: Cell, o: BuildOptions):
                before = stored_bytes(reg.root / "data")
                t = time.time()
                r = build_cell(cell, o, engine, data, log)
                assert r.status in ("published", "passed"), r.error and r.error.render()
                return r, time.time() - t, stored_bytes(reg.root / "data") - before

            ra, ta, ba = timed(A, opts)
            print(
                f"A cold (--no-cache) build+test+push: {ta:.0f} s, pushed {ba / 1e9:.2f} GB, "
                f"image {ra.size / 1e9:.2f} GB"
            )
            rb, tb, bb = timed(B, replace(opts, nocache=False))
            print(
                f"B (transformers {A.transformers} -> {B.transformers}) build+test+push: {tb:.0f} s, pushed "
                f"{bb / 1e6:.1f} MB = {bb / ba:.2%} of A's bytes (goal < 5 %), {tb / ta:.2f}x of A's time"
            )
            layers_a = engine.layers(ra.tag)
            layers_b = engine.layers(rb.tag)
            # counted from the top: manifest, doctor, app RUN, app requirements COPY, torch RUN (LABEL/USER add none)
            torch_i, app_i = len(layers_a) - 5, len(layers_a) - 3
            shared = sum(1 for x, y in zip(layers_a, layers_b, strict=False) if x == y)
            print(
                f"A and B share {shared} of {len(layers_a)} layers (torch layer reused: "
                f"{layers_a[torch_i] == layers_b[torch_i]})"
            )
            engine.remove(ra.tag)
            engine.remove(f"{reg.address}/bench/train:{A.id}")
            ra2, _, _ = timed(A, replace(opts, push=False))
            again = engine.layers(ra2.tag)
            same = [i for i, (x, y) in enumerate(zip(layers_a, again, strict=False)) if x == y]
            print(
                f"A rebuilt with --no-cache: {len(same)} of {len(layers_a)} layer digests identical "
                f"(torch layer: {layers_a[torch_i] == again[torch_i]}, app layer: {layers_a[app_i] == again[app_i]})"
            )
            for i, (x, y) in enumerate(zip(layers_a, again, strict=False)):
                if x != y:
                    print(f"  layer {i + 1} differs: {x[:19]} vs {y[:19]}")
        finally:
            reg.stop()


if __name__ == "__main__":
    main()
