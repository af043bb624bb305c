"""The wheel-build stage on alignment-handbook's cell (cu128-torch2.8.0-py3.11), against the build a user makes by hand.

1. imagekit: `deepspeed>=0.17.2` from its source archive (`from_source = ["deepspeed"]`), its built wheel and record
   removed first (a cold stage: the torch layer's wheels stay cached, as after a first `fetch`), in a container of
   the cell's base: network off, the cell's torch layer installed, SOURCE_DATE_EPOCH set. Twice, to show the
   wheel's sha256 is the same.
2. The peer fed the same archive: `pip wheel --no-deps <the same .tar.gz>` on the host, with pip's own build
   isolation (what the issue's user ran by hand: a wheel built without the cell's torch, on the host's Python and
   glibc, with the network on).
3. A re-lock that finds the wheel built, against the lock of the same cell without it (both forced to resolve).
4. The CUDA compiler layer `[image] cuda_toolkit = true` adds (CUDA 13 only: NVIDIA's cu11/cu12 compiler wheels hold
   ptxas, no nvcc): its wheels' installed size, from the wheel cache, when a cu130 lock with it is present.

Run: .venv/bin/python bench/wheel_build.py   (about 5 minutes on 2 cores once the cell's wheels are cached)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.effects.docker import Engine  # noqa: E402
from imagekit.image.buildplan import base_for  # noqa: E402
from imagekit.image.image_options import ImageOptions  # noqa: E402
from imagekit.locking import resolution  # noqa: E402
from imagekit.locking import source_builds as sb  # noqa: E402
from imagekit.model import Cell  # noqa: E402
from imagekit.services import inputs  # noqa: E402
from imagekit.services.builds.base_images import present  # noqa: E402
from imagekit.services.locks import lock_cells  # noqa: E402
from imagekit.services.wheels import wheel_builds  # noqa: E402
from imagekit.services.wheels.wheel_cache import wheel_cache  # noqa: E402

CELL = Cell("12.8", "2.8.0", "4.57.6", "3.11", ("deepspeed>=0.17.2",), from_source=("deepspeed",))


def timed(fn):
    start = time.monotonic()
    out = fn()
    return out, time.monotonic() - start


def main() -> None:
    data, engine, settings = inputs.compat_data(), Engine(), resolution.LockSettings()
    base = present(base_for(CELL.python, data, {}, ImageOptions()), engine, data.bases)
    build = wheel_builds.builder_in(engine, base, lambda line: print("  " + line))
    with tempfile.TemporaryDirectory(prefix="bench-wheel-build-") as tmp:
        folder = Path(tmp)
        first = lock_cells.lock_one(CELL, folder / "with", settings, data, build=build)
        assert first.lock is not None, first.error and first.error.render()
        record = sb.recorded(first.lock.meta)["deepspeed"]
        req = resolution.request(CELL, settings, data)
        shas, stage = [], []
        for _ in range(2):  # cold: the wheel and the build's record gone, the torch layer's wheels cached
            (wheel_cache() / record.wheel_sha256 / record.wheel).unlink(missing_ok=True)
            for kept in wheel_builds.built_dir().glob("*.json"):
                kept.unlink()
            done, seconds = timed(lambda: wheel_builds.build_one("deepspeed", CELL, req, first.lock, base, engine))
            shas.append(done.built.wheel_sha256)
            stage.append(seconds)
        archive = wheel_builds.sdist_path(sb.Sdist("deepspeed", record.version, record.sdist.rsplit("/", 1)[-1],
                                                   record.sdist, record.sdist_sha256))  # fmt: skip
        out = folder / "peer"
        _, peer = timed(lambda: subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "-w", str(out), str(archive)],
            check=True,
        ))  # fmt: skip
        _, warm = timed(lambda: lock_cells.lock_one(CELL, folder / "with", settings, data, build=build,
                                                     upgrade=("deepspeed",)))  # fmt: skip
        plain = replace(CELL, packages=("hjson",), from_source=())
        lock_cells.lock_one(plain, folder / "without", settings, data)
        _, without = timed(lambda: lock_cells.lock_one(plain, folder / "without", settings, data, upgrade=("hjson",)))
        shutil.rmtree(out, ignore_errors=True)
    print(f"\nwheel-build stage, deepspeed {record.version} in {CELL.id} ({base.name}, network off):")
    same = shas[0] == shas[1]
    print(f"  cold, twice: {stage[0]:.0f} s, {stage[1]:.0f} s; wheel sha256 {shas[0][:16]}…, same both times: {same}")
    print(f"  peer `pip wheel --no-deps` of the same archive on the host (build isolation, no torch): {peer:.0f} s")
    print(f"  ratio imagekit/peer: {stage[0] / peer:.1f}x (the cell's 3.3 GB torch layer installed into the build)")
    print(
        f"  re-lock finding it built: {warm:.1f} s; the cell without it: {without:.1f} s; added {warm - without:.1f} s"
    )
    _toolkit_layer()


def _toolkit_layer() -> None:
    from imagekit.image import cuda_toolkit

    sizes: dict[str, int] = {}
    for path in wheel_cache().glob("*/*.whl"):
        name = path.name.split("-")[0].replace("_", "-")
        if name in cuda_toolkit.DISTRIBUTIONS:
            with zipfile.ZipFile(path) as zf:
                sizes[path.name] = (path.stat().st_size, sum(i.file_size for i in zf.infolist()))
    if not sizes:
        print("CUDA compiler layer: no cu130 toolkit wheels in the cache (lock a cu130 cell with cuda_toolkit = true)")
        return
    wheels, installed = sum(s[0] for s in sizes.values()), sum(s[1] for s in sizes.values())
    print(f"CUDA compiler layer (cuda_toolkit = true): {len(sizes)} wheels, {wheels / 1e6:.0f} MB of wheels, "
          f"{installed / 1e6:.0f} MB installed")  # fmt: skip
    for name, (size, unpacked) in sorted(sizes.items()):
        print(f"  {name}: {size / 1e6:.1f} MB, {unpacked / 1e6:.1f} MB installed")


if __name__ == "__main__":
    main()
