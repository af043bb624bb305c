"""Lock speed against peers on the same work, and incremental re-locking of a 20-cell matrix.

Same inputs for all three: torch 2.5.1 + transformers 4.48.2 + accelerate 1.2.1, Python 3.11, Linux x86_64.
- `imagekit lock` (fresh lock dir each run, warm resolver cache)
- bare `uv pip compile --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28`
- `pip-compile --generate-hashes` (pip-tools; host Python 3.11 == target), run once: it takes minutes
Goals (issue 3): >= 100x faster than pip-compile, within 1.5x of bare uv; after changing one cell of a
20-cell matrix, exactly one cell is re-resolved.

Run: .venv/bin/python bench/lock.py [--skip-pip-compile]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.compat import catalog as compat  # noqa: E402
from imagekit.effects.resolver import uv_binary  # noqa: E402
from imagekit.locking import resolution  # noqa: E402
from imagekit.matrix import matrix_file as matrix  # noqa: E402
from imagekit.model import Cell  # noqa: E402
from imagekit.services import inputs  # noqa: E402
from imagekit.services.locks import lock_cells as lock_service  # noqa: E402

REQS = ["torch==2.5.1", "transformers==4.48.2", "accelerate==1.2.1"]
CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11", ("accelerate==1.2.1",))


def median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def imagekit_lock(data: compat.CompatData) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        res = lock_service.lock_one(CELL, Path(tmp), resolution.LockSettings(), data)
        assert res.status == "locked", res.error and res.error.render()


def bare_uv() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "requirements.in").write_text("\n".join(REQS) + "\n")
        subprocess.run(
            [
                uv_binary(),
                "pip",
                "compile",
                "requirements.in",
                "--generate-hashes",
                "--python-version",
                "3.11",
                "--python-platform",
                "x86_64-manylinux_2_28",
                "-o",
                "out.txt",
                "--quiet",
            ],
            cwd=tmp,
            check=True,
        )


def pip_compile() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "requirements.in").write_text("\n".join(REQS) + "\n")
        start = time.perf_counter()
        subprocess.run(
            [
                str(Path(sys.executable).parent / "pip-compile"),
                "--generate-hashes",
                "--quiet",
                "--cache-dir",
                str(Path(tmp) / "cache"),
                "-o",
                "out.txt",
                "requirements.in",
            ],
            cwd=tmp,
            check=True,
        )
        return time.perf_counter() - start


def incremental(data: compat.CompatData) -> None:
    stacks = [("12.4", "2.5.1"), ("12.4", "2.6.0"), ("12.6", "2.7.1"), ("12.8", "2.8.0"), ("12.8", "2.9.1")]
    include = [
        {"cuda": c, "torch": t, "transformers": tf, "python": py}
        for c, t in stacks
        for py in ("3.11", "3.12")
        for tf in ("4.48.2", "4.57.6")
    ]
    doc = {"matrix": {"include": include, "packages": ["accelerate==1.2.1"]}}
    cells = [e.cell for e in matrix.evaluate(matrix.parse(doc, "<bench>", data), data) if e.verdict.compatible]
    assert len(cells) == 20, len(cells)
    with tempfile.TemporaryDirectory() as tmp:
        locks = Path(tmp)
        start = time.perf_counter()
        first = lock_service.lock_cells(cells, locks, resolution.LockSettings(), data, jobs=4)
        t_first = time.perf_counter() - start
        assert all(r.status == "locked" for r in first), [r.error.render() for r in first if r.error]
        include[7] = {**include[7], "packages": ["accelerate==1.2.1", "peft==0.14.0"]}
        changed = [e.cell for e in matrix.evaluate(matrix.parse(doc, "<bench>", data), data)]
        start = time.perf_counter()
        second = lock_service.lock_cells(changed, locks, resolution.LockSettings(), data, jobs=4)
        t_second = time.perf_counter() - start
        relocked = [r.cell.id for r in second if r.status == "locked"]
        print(
            f"incremental: 20 cells locked in {t_first:.1f} s; after changing 1 cell, re-resolved "
            f"{len(relocked)} cell(s) ({', '.join(relocked)}) in {t_second:.2f} s"
        )


def imagekit_process(lock_dir: Path) -> None:
    """`imagekit lock` as a user runs it: a whole process (interpreter start-up and imports included)."""
    for old in lock_dir.glob("*.txt"):
        old.unlink()  # a fresh resolution every run, as for bare uv
    subprocess.run(
        [sys.executable, "-m", "imagekit", "lock", "--cell", CELL.id, "--dir", str(lock_dir)],
        check=True, capture_output=True, cwd=lock_dir,
    )  # fmt: skip


def compile_imagekit() -> None:
    """Bytecode for imagekit's modules, as an installed imagekit has it (pip compiles a wheel at install): with
    PYTHONDONTWRITEBYTECODE set and an editable install, every run would compile each module from source again,
    which no user pays and which bare uv, a native binary, never does."""
    import compileall

    compileall.compile_dir(ROOT / "imagekit", quiet=1)


def paired(runs: int) -> tuple[float, float]:
    """Median seconds of whole-process `imagekit lock` and bare `uv pip compile`, run in alternating pairs so both
    see the same machine load and network."""
    ik, uv = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            start = time.perf_counter()
            imagekit_process(Path(tmp))
            ik.append(time.perf_counter() - start)
            start = time.perf_counter()
            bare_uv()
            uv.append(time.perf_counter() - start)
    return statistics.median(ik), statistics.median(uv)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-pip-compile", action="store_true")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    data = inputs.compat_data()
    compile_imagekit()
    imagekit_lock(data)  # warm the resolver cache for both uv-based tools
    bare_uv()
    t_proc, t_uv = paired(args.runs)
    print(
        f"whole processes, paired: `imagekit lock`: {t_proc:.3f} s; bare `uv pip compile`: {t_uv:.3f} s "
        f"(median of {args.runs}); imagekit/uv = {t_proc / t_uv:.2f}x (goal <= 1.5x)"
    )
    t_ik = median_time(lambda: imagekit_lock(data), args.runs)
    print(f"in-process lock_one (no start-up): {t_ik:.3f} s = {t_ik / t_uv:.2f}x bare uv")
    if not args.skip_pip_compile:
        t_pc = pip_compile()
        print(
            f"pip-compile --generate-hashes: {t_pc:.1f} s (one run, cold cache); "
            f"pip-compile/imagekit = {t_pc / t_ik:.0f}x (goal >= 100x)"
        )
    incremental(data)


if __name__ == "__main__":
    main()
