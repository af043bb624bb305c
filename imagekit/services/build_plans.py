"""Build plans for cells: their lock (read from disk) and their base."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from imagekit.compat.catalog import CompatData
from imagekit.effects.files import read_code
from imagekit.errors import UsageError
from imagekit.image.buildplan import BaseRef, BuildPlan, ImageOptions, bootstrap_base
from imagekit.image.code_layer import CodeLayer
from imagekit.matrix.matrix_file import MatrixConfig
from imagekit.model import Cell
from imagekit.services.lock_cells import lock_path, verified_lock


def base_for(cell: Cell, data: CompatData, digest: str | None = None, config: MatrixConfig | None = None) -> BaseRef:
    """The matrix's registry base for this Python, else the bootstrapped one."""
    if config is not None and cell.python in config.bases:
        return replace(config.bases[cell.python], platform=cell.platform)  # pulled for the cell's platform
    spec = data.bases.get(cell.python)
    if spec is None:
        raise UsageError(
            f"{cell.id}: no base image known for Python {cell.python}", f"known: {', '.join(sorted(data.bases))}"
        )
    compiler = config.options.compiler if config is not None else True
    return bootstrap_base(spec, digest=digest, compiler=compiler, platform=cell.platform)


def code_for(options: ImageOptions, outputs: tuple[Path, ...] = ()) -> CodeLayer | None:
    """`[image] copy`, read now (once per build: every cell gets the same files). ``outputs``: folders imagekit
    writes into (the render's --out, the build's --state-dir), left out where they lie inside the copied folder, so
    a second run never copies the first one's output in."""
    spec = options.copy
    if spec is None:
        return None
    root = Path(spec.source).resolve()
    extra = []
    for folder in outputs:
        try:
            extra.append(Path(folder).resolve().relative_to(root).as_posix())
        except ValueError:
            continue  # outside the copied folder
    if extra:
        spec = replace(spec, exclude=(*spec.exclude, *(f"/{e}" for e in extra if e != ".")))
    return read_code(spec)


def plans_for(
    cells: list[Cell],
    config: MatrixConfig,
    lock_dir: Path,
    data: CompatData,
    revision: str = "unknown",
    builder: str = "legacy",
    outputs: tuple[Path, ...] = (),
) -> list[BuildPlan]:
    missing, plans = [], []
    code = code_for(config.options, outputs)
    for cell in cells:
        lock = verified_lock(lock_path(lock_dir, cell), cell, data, current=True)
        if lock is None:
            missing.append(cell.key)
            continue
        plans.append(
            BuildPlan(
                cell=cell,
                lock=lock,
                base=base_for(cell, data, config=config),
                repository=config.repository,
                source_revision=revision,
                builder=builder,
                code=code,
                command=config.options.command,
            )
        )
    if missing:
        raise UsageError(
            f"no lock for {', '.join(missing)} in {lock_dir}",
            "run `imagekit lock` for them first, or narrow the selection (e.g. --source pypi)",
        )
    return plans
