"""A code change, from the edit to the published image, on a real torch cell, against a real local registry.

A project (`copy = "."`, a smoke command that runs its training script) over the real cell (the committed lock),
built and pushed once; imagekit's own outputs land in its folder as they do for a user (the release index and
records, the state). Then, each step timed from the start of `build --push` to the published image:

1. No change: the same build again. Goal: the same tag and digest, 0 bytes pushed (the registry's blob storage does
   not grow).
2. A one-line edit of the training script, published with the self-test's reuse (the default: the results of the
   layers below the code layer are the last release's; the code layer's checks and the smoke command run).
3. The peer: another one-line edit of the same file, published with `--full-self-test` (every check again, as before
   reuse): same inputs, same steps, only the self-test differs. Printed: both times and their ratio.
4. What a user runs: three more one-line edits, each published by a whole `imagekit build --push` process in the
   project's folder (the default matrix file with `[image] copy = "."` and the smoke command), timed from the
   process's start to its exit: Python's start, the plan, the fetch checks, the build, the self-test, the publish.

Bytes pushed = growth of the registry's blob storage (compressed, what went over the wire).
Run: .venv/bin/python bench/edit_to_publish.py   (about 3 minutes on 2 cores once the real cell's layers are cached)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.effects.docker import Engine  # noqa: E402
from imagekit.image.code_layer import CopySpec  # noqa: E402
from imagekit.image.image_options import ImageOptions  # noqa: E402
from imagekit.model import Cell  # noqa: E402
from imagekit.services import inputs  # noqa: E402
from imagekit.services.builds.build import BuildOptions, CellResult, build_cell  # noqa: E402
from tests.registry import Registry, free_port  # noqa: E402

CELL = Cell("12.1", "2.1.2", "4.48.2", "3.11", ("accelerate==1.2.1", "numpy<2"))  # tests/conftest.py REAL_CELL
TRAIN = "import torch\nprint('training with torch', torch.__version__)\n"


def stored_bytes(root: Path) -> int:
    root.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["du", "-sb", str(root)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def project(folder: Path) -> ImageOptions:
    (folder / "acme").mkdir(parents=True)
    (folder / "acme" / "__init__.py").write_text("VERSION = 1\n")
    (folder / "train.py").write_text(TRAIN)
    (folder / "lockfiles").mkdir()
    shutil.copy(ROOT / "lockfiles" / f"{CELL.id}.txt", folder / "lockfiles")
    return ImageOptions(copy=CopySpec(str(folder), project=str(folder)), smoke=("python /opt/app/train.py --help",))


def whole_process(folder: Path, registry: str) -> None:
    """Step 4: one-line edits, each published by `imagekit build --push` as a process, as a user runs it."""
    matrix = (ROOT / "imagekit" / "data" / "default-matrix.toml").read_text()
    keys = 'copy = "."\nsmoke = ["python /opt/app/train.py --help"]\n'
    matrix = (
        matrix.replace("\n[image]\n", "\n[image]\n" + keys, 1)
        if "\n[image]\n" in matrix
        else matrix + "\n[image]\n" + keys
    )
    (folder / "imagekit.toml").write_text(matrix)
    times = []
    for n in range(4, 7):
        (folder / "train.py").write_text(TRAIN + f"print('edit {n}')\n")
        start = time.monotonic()
        res = subprocess.run(
            [sys.executable, "-m", "imagekit", "build", "--cell", CELL.id, "--push", "--registry",
             f"{registry}/bench/edit", "--state-dir", ".imagekit", "--release-index", "releases/index.json",
             "--release-records", "releases/records"],
            cwd=folder, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        took = time.monotonic() - start
        assert res.returncode == 0, res.stderr[-3000:]
        times.append(took)
        steps = next((line.split(" time by step: ", 1)[1] for line in res.stderr.splitlines() if " time by step: " in
                      line), "")  # fmt: skip
        reused = "self-test: the code layer's checks" in res.stderr
        print(f"4.{n - 3} one-line edit, `imagekit build --push` as a process: {took:.1f} s from its start to its exit "
              f"(self-test results reused: {reused}); {steps}")  # fmt: skip
    print(f"whole process, three edits: {', '.join(f'{t:.1f}' for t in times)} s (goal: under 10 s)")


def main() -> None:
    data, engine = inputs.compat_data(), Engine()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder = work / "project"
        options = project(folder)
        os.chdir(folder)  # imagekit runs in the project's folder: its outputs land there
        reg = Registry(work / "registry", free_port()).start()
        try:
            opts = BuildOptions(
                repository=f"{reg.address}/bench/edit",
                lock_dir=folder / "lockfiles",
                state_dir=folder / ".imagekit",
                release_index=folder / "releases" / "index.json",
                release_records=folder / "releases" / "records",
                push=True,
                options=options,
            )

            def timed(o: BuildOptions) -> tuple[CellResult, float, int]:
                before = stored_bytes(reg.root / "data")
                start = time.monotonic()
                r = build_cell(CELL, o, engine, data, lambda cid, msg: None)
                assert r.status == "published", r.error and r.error.render()
                return r, time.monotonic() - start, stored_bytes(reg.root / "data") - before

            first, t0, b0 = timed(opts)
            print(f"first publish of the project: {t0:.0f} s, pushed {b0 / 1e9:.2f} GB ({first.tag})")
            same, t1, b1 = timed(opts)
            print(
                f"1. rebuild, no change: {t1:.1f} s, pushed {b1} bytes (goal 0); same tag: {same.tag == first.tag}, "
                f"same digest: {same.digest == first.digest}; self-test reused "
                f"{len((same.report or {}).get('reused', {}).get('checks', []))} checks"
            )
            results = []
            for n, full in ((2, False), (3, True)):
                (folder / "train.py").write_text(TRAIN + f"print('edit {n}')\n")  # one line
                r, t, b = timed(replace(opts, full_selftest=full))
                reused = (r.report or {}).get("reused", {}).get("checks", [])
                selftest = r.steps.get("self-test", 0.0)
                results.append(t)
                print(
                    f"{n}. one-line edit, {'--full-self-test (the peer)' if full else 'reuse (default)'}: {t:.1f} s "
                    f"edit to published (self-test {selftest:.1f} s, {len(reused)} checks reused), pushed "
                    f"{b / 1e3:.0f} kB; steps: {r.step_summary()}"
                )
            print(f"reuse vs full self-test: {results[0]:.1f} s vs {results[1]:.1f} s = {results[0] / results[1]:.2f}x")
            whole_process(folder, reg.address)
        finally:
            reg.stop()


if __name__ == "__main__":
    main()
