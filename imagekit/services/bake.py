"""Bake targets for the locked cells: what `docker buildx bake` builds from `imagekit render --out DIR` after
`imagekit fetch --into DIR`, tagged with the alias and the immutable tag of exactly those contexts."""

from __future__ import annotations

from pathlib import Path

from imagekit import naming, render
from imagekit.compat import CompatData
from imagekit.errors import CheckFailed
from imagekit.matrix import MatrixConfig
from imagekit.model import Cell
from imagekit.services.build_plans import plans_for
from imagekit.services.lock_cells import lock_path, verified_lock


def targets(
    cells: list[Cell], config: MatrixConfig, data: CompatData, lock_dir: Path, context_root: Path = Path("build")
) -> tuple[list[tuple[str, str, list[str]]], list[tuple[str, str]]]:
    """(cell id, context digest, [alias, immutable]) for each cell with a current lock; (cell id, why) for the rest.
    ``context_root``: where `imagekit render --out` puts the contexts (left out of an `[image] copy` of the project,
    as render leaves it out)."""
    locked, skipped = [], []
    for cell in cells:
        try:
            lock = verified_lock(lock_path(lock_dir, cell), cell, data, current=True)
        except CheckFailed as exc:
            skipped.append((cell.id, exc.message.splitlines()[0]))
            continue
        if lock is None:
            skipped.append((cell.id, f"no lock in {lock_dir} (`imagekit lock --cell {cell.id}`)"))
            continue
        locked.append(cell)
    out = []
    for plan in plans_for(locked, config, lock_dir, data, builder="buildkit", outputs=(context_root,)):
        digest = render.context_digest(render.render_plan(plan, data))
        tags = [
            naming.alias_tag(config.repository, plan.cell),
            naming.immutable_tag(config.repository, plan.cell, digest),
        ]
        out.append((plan.cell.id, digest, tags))
    return out, skipped
