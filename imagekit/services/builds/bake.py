"""Bake targets for the locked cells: what `docker buildx bake` builds from `imagekit render --out DIR` after
`imagekit fetch --into DIR`, tagged with the alias and the immutable tag of exactly those contexts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from imagekit.compat.catalog import CompatData
from imagekit.errors import CheckFailed
from imagekit.image import naming, render
from imagekit.matrix.matrix_file import MatrixConfig
from imagekit.model import AMD64, Cell
from imagekit.services.builds.build_plans import plans_for
from imagekit.services.locks.lock_cells import lock_path, verified_lock


def targets(
    cells: list[Cell], config: MatrixConfig, data: CompatData, lock_dir: Path, context_root: Path = Path("build")
) -> tuple[list[tuple[str, str, list[str], str]], list[tuple[str, str]]]:
    """(context folder, context digest, tags, platform) for each cell with a current lock; (cell, why) for the rest.
    A linux/amd64 image is tagged with the alias and its immutable tag; another platform's with its immutable tag
    only (its Dockerfile is another one, so bake cannot put both under one tag: `docker buildx imagetools create`
    does, as the matrix command prints). ``context_root``: where `imagekit render --out` puts the contexts (left
    out of an `[image] copy` of the project, as render leaves it out)."""
    locked, skipped = [], []
    for cell in cells:
        try:
            lock = verified_lock(lock_path(lock_dir, cell), cell, data, current=True)
        except CheckFailed as exc:
            skipped.append((cell.key, exc.message.splitlines()[0]))
            continue
        if lock is None:
            flag = "" if cell.platform == AMD64 else f" --platform {cell.platform}"
            skipped.append((cell.key, f"no lock in {lock_dir} (`imagekit lock --cell {cell.id}{flag}`)"))
            continue
        locked.append(cell)
    out = []
    options = replace(config.options, builder="buildkit")  # what `imagekit render` renders by default
    for plan in plans_for(locked, config, lock_dir, data, options, outputs=(context_root,)):
        digest = render.context_digest(render.render_plan(plan))
        tags = [
            *([naming.alias_tag(config.repository, plan.cell)] if plan.cell.platform == AMD64 else []),
            naming.immutable_tag(config.repository, plan.cell, digest),
        ]
        out.append((plan.cell.slug, digest, tags, plan.cell.platform))
    return out, skipped


def multi_platform(found: list[tuple[str, str, list[str], str]]) -> list[tuple[str, list[str]]]:
    """(alias, the immutable tags of its platforms' images) for each cell the targets build on more than one
    platform. Pure."""
    by_cell: dict[str, list[str]] = {}
    for _folder, _digest, tags, _platform in found:
        immutable = tags[-1]
        repo, tag = immutable.rsplit(":", 1)
        alias = f"{repo}:{tag.rsplit('-', 1)[0].removesuffix('-arm64')}"
        by_cell.setdefault(alias, []).append(immutable)
    return [(alias, tags) for alias, tags in sorted(by_cell.items()) if len(tags) > 1]
