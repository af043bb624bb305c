"""Build plans for cells: their lock (read from disk), their base and the image's options."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from imagekit.compat.catalog import CompatData
from imagekit.effects.files import read_code
from imagekit.errors import UsageError
from imagekit.image.buildplan import BuildPlan, base_for
from imagekit.image.code_layer import CodeLayer
from imagekit.image.image_options import ImageOptions
from imagekit.matrix.matrix_file import MatrixConfig
from imagekit.model import Cell
from imagekit.services.locks.lock_cells import lock_path, verified_lock

# What imagekit writes into a project at their default places, relative to where it runs (the project's folder):
# the state (wheels, contexts, reports), the locks, the release index and records, the workflow `ci init` writes and
# the wheel it names (both change with imagekit's version).
# Never in the code layer, so a publish (a new record) or a re-lock never changes the next build's image. The locks
# too: the image carries its own lock (the manifest's pins, the layers' requirements), and another cell's re-lock
# would otherwise change every cell's code layer.
IMAGEKIT_OUTPUTS = (
    Path(".imagekit"), Path("lockfiles"), Path("releases/index.json"), Path("releases/records"),
    Path(".github/imagekit"), Path(".github/workflows/images.yml"),
)  # fmt: skip


def code_for(options: ImageOptions, outputs: tuple[Path, ...] = ()) -> CodeLayer | None:
    """`[image] copy`, read now (once per build: every cell gets the same files). ``outputs``: files and folders
    imagekit writes into (the render's --out, the build's --state-dir, --lock-dir, --release-index and
    --release-records), with :data:`IMAGEKIT_OUTPUTS`, left out where they lie inside the copied folder (after the
    excludes and the folder's `.dockerignore`: no `!` line brings them back), so a second run never copies the first
    one's output in."""
    spec = options.copy
    if spec is None:
        return None
    root = Path(spec.source).resolve()
    extra = []
    for folder in (*outputs, *IMAGEKIT_OUTPUTS):
        try:
            extra.append(Path(folder).resolve().relative_to(root).as_posix())
        except ValueError:
            continue  # outside the copied folder
    extra = [e for e in dict.fromkeys(extra) if e != "."]
    if extra:
        spec = replace(spec, exclude=(*spec.exclude, *(f"/{e}" for e in extra)))
    return read_code(spec)


def plans_for(
    cells: list[Cell],
    config: MatrixConfig,
    lock_dir: Path,
    data: CompatData,
    options: ImageOptions | None = None,
    revision: str = "unknown",
    outputs: tuple[Path, ...] = (),
) -> list[BuildPlan]:
    """The plan of each cell over its current lock; ``options``: the matrix's `[image]` with the command's flags over
    it (default: the matrix's alone)."""
    options = options if options is not None else config.options
    missing, plans = [], []
    code = code_for(options, outputs)
    for cell in cells:
        lock = verified_lock(lock_path(lock_dir, cell), cell, data, current=True)
        if lock is None:
            missing.append(cell.key)
            continue
        base = base_for(cell.python, data, config.bases, options, platform=cell.platform)
        plans.append(
            BuildPlan.make(
                cell, lock, base, config.repository, data, options=options, code=code, source_revision=revision
            )
        )
    if missing:
        raise UsageError(
            f"no lock for {', '.join(missing)} in {lock_dir}",
            "run `imagekit lock` for them first, or narrow the selection (e.g. --source pypi)",
        )
    return plans
