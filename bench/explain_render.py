"""Time `explain` over every cell of a 10,000-cell synthetic matrix, and rendering the default matrix.

Goal (issue 2): under 2 s each on the project's 2-core machine. Run: .venv/bin/python bench/explain_render.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.compat import catalog as compat  # noqa: E402
from imagekit.image import render  # noqa: E402
from imagekit.matrix import matrix_file as matrix  # noqa: E402
from imagekit.services import inputs  # noqa: E402
from imagekit.services.builds.build_plans import plans_for  # noqa: E402


def synthetic(data: compat.CompatData) -> dict:
    torches = sorted((v for v in data.torch_releases if ".".join(v.split(".")[:2]) in data.torch_minors), key=Version)[
        -25:
    ]
    tfs = sorted(data.packages["transformers"], key=Version)[-10:]
    cudas = ["11.8", "12.1", "12.4", "12.6", "12.8", "12.9", "13.0", "13.2"]
    pythons = ["3.9", "3.10", "3.11", "3.12", "3.13"]
    return {
        "matrix": {
            "cuda": cudas,
            "torch": torches,
            "transformers": tfs,
            "python": pythons,
            "packages": ["accelerate==1.2.1"],
        },
        "targets": {"gpus": ["A100", "H100", "B200"], "min_driver": "570.124.06"},
    }


def timed(fn, repeat: int = 5) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    data = inputs.compat_data()
    doc = synthetic(data)
    config = matrix.parse(doc, "<synthetic>", data)
    t_explain, cells = timed(lambda: matrix.evaluate(matrix.parse(doc, "<synthetic>", data), data))
    ok = sum(1 for c in cells if c.verdict.compatible)
    print(
        f"explain: {len(config.cells)} cells ({ok} compatible) in {t_explain:.3f} s "
        f"(median of 5; goal < 2 s; {t_explain / 2:.2f}x of budget)"
    )

    default = matrix.parse(matrix.default_document(), "<default>", data)
    evaluated = [c for c in matrix.evaluate(default, data) if c.verdict.compatible]
    lockdir = ROOT / "lockfiles"
    cells_with_locks = [c.cell for c in evaluated if (lockdir / f"{c.cell.id}.txt").exists()]

    def render_default() -> int:
        files = render.render_many(plans_for(cells_with_locks, default, lockdir, data))
        with tempfile.TemporaryDirectory() as tmp:
            from imagekit.effects.files import write_tree_atomic

            write_tree_atomic(Path(tmp), {k: v[0] for k, v in files.items()}, {k: v[1] for k, v in files.items()})
        return len(files)

    t_render, nfiles = timed(render_default)
    print(
        f"render: {len(cells_with_locks)} locked default-matrix cells ({nfiles} files written) in {t_render:.3f} s "
        f"(median of 5; goal < 2 s; {t_render / 2:.2f}x of budget)"
    )


if __name__ == "__main__":
    main()
