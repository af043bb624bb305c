"""What `imagekit build` (or `fetch`) would do, per cell, before doing any of it: the lock to resolve or reuse, the
base to bootstrap, import or reuse, the wheels in the cache and to download (count and bytes, from the lock and
the index's metadata), the image size, and the disk that needs versus the disk that is free."""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from imagekit.compat.catalog import CompatData
from imagekit.effects import index_auth
from imagekit.effects.cache import cache_root, unusable
from imagekit.errors import CheckFailed, EnvironmentFailure, ImagekitError
from imagekit.image import cuda_toolkit
from imagekit.image.buildplan import BaseRef, base_for
from imagekit.locking import resolution
from imagekit.matrix.matrix_file import MatrixConfig
from imagekit.model import Cell
from imagekit.services.locks import lock_cells as lock_service
from imagekit.services.progress import human_bytes
from imagekit.services.wheels import wheel_forecast
from imagekit.services.wheels.wheel_cache import wheel_cache

# A bootstrapped base (Debian + Python + compilers + sshd), measured: 212 MB; without compilers about 200 MB less.
BASE_BYTES = {True: 212_000_000, False: 60_000_000}
VENV_BYTES = 25_000_000  # the empty venv and imagekit's doctor
BYTECODE_RATIO = 0.12  # compiled bytecode on top of installed wheels (measured on the torch closure)


@dataclass(frozen=True)
class BaseForecast:
    reference: str
    action: str  # reuse (in the engine) | import (cached tarball) | bootstrap | pull | unknown (engine unreachable)
    bytes: int
    new_bytes: int  # what creating it adds to the engine's storage


@dataclass(frozen=True)
class CellForecast:
    cell: str
    lock_status: str  # up-to-date | stale | missing | invalid
    lock_path: str
    lock_note: str | None
    base: BaseForecast
    wheels: wheel_forecast.WheelForecast | None  # None until the cell is locked
    image_bytes: int | None  # estimated image size
    host_blocker: tuple[str, str] | None = None  # (why, hint): this host cannot run the image's platform's programs
    compiler_bytes: int | None = None  # `[image] cuda_toolkit`: the CUDA compiler layer, installed
    # `[image] cuda_toolkit` on CUDA 11.8/12.4: Debian's toolkit in the apt layer, (.debs, bytes to download)
    compiler_debs: tuple[int, int] | None = None
    project_blocker: tuple[str, str] | None = None  # (why, hint): `[image] install`'s wheel would be refused

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["lock"] = {"status": doc.pop("lock_status"), "path": doc.pop("lock_path"), "note": doc.pop("lock_note")}
        if self.wheels is not None:
            doc["wheels"].pop("downloads")
            doc["wheels"].pop("installed")
        debs = doc.pop("compiler_debs")
        if debs is not None:
            doc["cuda_compiler_debs"] = {"count": debs[0], "download_bytes": debs[1]}
        if self.compiler_bytes is None:
            doc.pop("compiler_bytes")
        else:
            doc["cuda_compiler_layer_bytes"] = doc.pop("compiler_bytes")
        doc["image_estimate_bytes"] = doc.pop("image_bytes")
        doc.pop("host_blocker")
        doc.pop("project_blocker")
        return doc


@dataclass(frozen=True)
class DiskForecast:
    path: str
    purpose: str
    free_bytes: int | None  # None: not on this machine (a remote engine)
    needed_bytes: int
    problem: str | None = None  # why the folder cannot take files at all (a file there, read-only)

    @property
    def ok(self) -> bool:
        return self.problem is None and (self.free_bytes is None or self.needed_bytes <= self.free_bytes)


@dataclass(frozen=True)
class Forecast:
    cells: tuple[CellForecast, ...]
    disks: tuple[DiskForecast, ...]
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())

    @property
    def disk_ok(self) -> bool:
        return all(d.ok for d in self.disks)

    @property
    def blockers(self) -> list[tuple[str, str, str | None]]:
        """(cell, why, hint) for each cell whose build cannot succeed as locked."""
        rows = [(c.cell, c.wheels.blocker, c.wheels.blocker_hint) for c in self.cells if c.wheels and c.wheels.blocker]
        rows += [(c.cell, *c.project_blocker) for c in self.cells if c.project_blocker]
        return rows + [(c.cell, *c.host_blocker) for c in self.cells if c.host_blocker]

    def blocked_error(self) -> CheckFailed:
        rows = self.blockers
        hint = next((h for _, _, h in rows if h), None)
        return CheckFailed(
            f"{len(rows)} cell(s) cannot be built: " + "; ".join(f"{cell}: {why}" for cell, why, _ in rows), hint
        )

    def to_json(self) -> dict:
        return {
            "cells": [c.to_json() for c in self.cells],
            "disk": [{**asdict(d), "ok": d.ok} for d in self.disks],
            "disk_ok": self.disk_ok,
            "blockers": [{"cell": c, "message": m, "hint": h} for c, m, h in self.blockers],
            "notes": list(self.notes),
            "seconds": round(self.seconds, 2),
        }

    def disk_error(self) -> EnvironmentFailure:
        broken = [d for d in self.disks if d.problem]
        if broken:
            return EnvironmentFailure(
                "; ".join(f"the {d.purpose} cannot be used: {d.problem}" for d in broken),
                "point IMAGEKIT_CACHE (or XDG_CACHE_HOME) at a writable folder, or move what is in the way",
            )
        short = [d for d in self.disks if not d.ok]
        what = "; ".join(
            f"{d.purpose} ({d.path}) needs {human_bytes(d.needed_bytes)}, {human_bytes(d.free_bytes or 0)} free"
            for d in short
        )
        return EnvironmentFailure(
            f"not enough disk to build: {what}",
            "free space (docker image prune; delete old wheels under the cache), build fewer cells at once, or "
            "move IMAGEKIT_CACHE to a larger disk; `imagekit build --dry-run` shows the numbers",
        )


PROJECT_HINT = (
    "run `imagekit lock` (each cell's packages take the project's [build-system] requires); the project's own "
    'dependencies join them when the matrix names its file: [matrix] requirements = "pyproject.toml" (or add them '
    "to [matrix] packages)"
)


def _base_ref(cell: Cell, data: CompatData, config: MatrixConfig) -> BaseRef:
    """The base `build` starts the cell FROM (before it is made present)."""
    return base_for(cell.python, data, config.bases, config.options, platform=cell.platform)


def _base(cell: Cell, data: CompatData, config: MatrixConfig, engine) -> BaseForecast:
    ref = _base_ref(cell, data, config)
    size = BASE_BYTES[config.options.compiler]
    if engine is None:
        return BaseForecast(ref.reference, "unknown", size, size)
    image = engine.image(ref.reference)
    if image is not None:
        return BaseForecast(ref.reference, "reuse", int(image.get("Size") or size), 0)
    if ref.registry:
        return BaseForecast(ref.reference, "pull", size, size)
    tag = ref.reference.rsplit(":", 1)[1]
    tarball = cache_root() / "bases" / f"{tag}.tar"
    if tarball.is_file() and (cache_root() / "bases" / f"{tag}.json").is_file():
        return BaseForecast(ref.reference, "import", tarball.stat().st_size, tarball.stat().st_size)
    return BaseForecast(ref.reference, "bootstrap", size, size)


def _lock(cell: Cell, lock_dir: Path, settings: resolution.LockSettings, data: CompatData):
    status = lock_service.status_of(lock_dir, cell, settings, data)
    note = None
    if status.status == "stale" and status.lock is not None:
        note = resolution.stale_reason(status.lock, cell, data) or "made with other resolver settings"
    elif status.status == "missing":
        note = "`imagekit build` resolves it (needs the index); `imagekit lock` does it alone"
    elif status.error is not None:
        note = status.error.message
    return status, note


def _free(path: Path) -> tuple[Path, int | None, int | None]:
    """(the existing folder measured, its free bytes, its device) for ``path`` or its nearest existing parent."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return probe, shutil.disk_usage(probe).free, os.stat(probe).st_dev
    except OSError:
        return probe, None, None


def forecast(
    cells: list[Cell],
    config: MatrixConfig,
    data: CompatData,
    *,
    lock_dir: Path,
    settings: resolution.LockSettings,
    engine=None,
    build: bool = True,
) -> Forecast:
    """The plan for these cells (``build``: also base and image; otherwise only what `fetch` does)."""
    start = time.monotonic()
    pages: dict = {}  # index pages, read once for all cells
    locks = {cell.key: _lock(cell, lock_dir, settings, data) for cell in cells}
    glibc = {cell.key: _base_ref(cell, data, config).glibc for cell in cells}
    auth = index_auth.for_indexes([settings.index_url, *settings.extra_index_urls])
    wheel_forecast.read_pages(
        [(s.lock, c.python, glibc[c.key]) for c in cells for s, _ in [locks[c.key]] if s.lock is not None],
        pages,
        auth=auth,
    )

    def one(cell: Cell) -> CellForecast:
        status, note = locks[cell.key]
        base = _base(cell, data, config, engine) if build else BaseForecast("", "none", 0, 0)
        wheels = None
        if status.lock is not None and status.status != "invalid":
            wheels = wheel_forecast.forecast_lock(
                status.lock, cell.python, glibc[cell.key], pages=pages, jobs=1, auth=auth
            )
        image = None
        if build and wheels is not None and wheels.error is None and wheels.blocker is None:
            image = base.bytes + VENV_BYTES + int(wheels.installed_bytes * (1 + BYTECODE_RATIO))
        blocker = None
        if build:
            from imagekit.services.builds.base_images import emulation_hint, emulation_problem

            problem = emulation_problem(cell.platform, os.uname().machine)
            blocker = (problem, emulation_hint(cell.platform)) if problem else None
        compiler, debs = None, None
        if config.options.cuda_toolkit and cuda_toolkit.major(cell.cuda) < cuda_toolkit.FIRST_MAJOR:
            held = status.lock.apt if status.lock is not None else ()  # Debian's toolkit: the lock's .debs
            debs = (len(held), sum(p.size for p in held)) if held else None
        elif config.options.cuda_toolkit and wheels is not None and wheels.error is None and wheels.blocker is None:
            compiler = sum(n for name, n in wheels.installed if name in cuda_toolkit.DISTRIBUTIONS)
        project = None
        options = config.options
        if build and options.install and options.copy and status.status == "up-to-date" and status.lock is not None:
            from imagekit.services.builds.project_build import forecast_problems

            problems = forecast_problems(options.copy.source, options.install, cell, status.lock)
            if problems:
                project = ("[image] install: " + "; ".join(problems), PROJECT_HINT)
        return CellForecast(
            cell.key, status.status, str(status.path), note, base, wheels, image, blocker, compiler, debs, project
        )

    with ThreadPoolExecutor(max_workers=4) as pool:
        rows = tuple(pool.map(one, cells))
    notes = []
    if engine is None and build:
        notes.append("the Docker engine is not reachable: bases and the engine's free space are unknown")
    unread = [r.cell for r in rows if r.wheels is not None and r.wheels.error]
    if unread:
        notes.append(f"{len(unread)} cell(s) whose index could not be read: their downloads are not counted")
    unlocked = [r.cell for r in rows if r.wheels is None]
    if unlocked:
        notes.append(f"{len(unlocked)} cell(s) without a current lock: their wheels are known only after locking")
    downloads = {sha: size for r in rows if r.wheels for sha, size in r.wheels.downloads}
    disks: list[DiskForecast] = []
    cache_dir, cache_free, cache_dev = _free(wheel_cache())
    problem = unusable(wheel_cache())
    disks.append(DiskForecast(str(cache_dir), "wheel cache", cache_free, sum(downloads.values()), problem))
    if build:
        root = engine.root_dir() if engine is not None else None
        bases = {r.base.reference: r.base.new_bytes for r in rows}
        images = sum((r.image_bytes or 0) - r.base.bytes for r in rows if r.image_bytes)
        transient = max((r.wheels.largest_bytes for r in rows if r.wheels), default=0)
        needed = sum(bases.values()) + images + transient
        if root is not None:
            docker_dir, docker_free, docker_dev = _free(root)
            if docker_dev is not None and docker_dev == cache_dev:  # one disk holds both: they add up
                disks[0] = DiskForecast(
                    str(docker_dir), "wheel cache + Docker", docker_free, disks[0].needed_bytes + needed, problem
                )
            else:
                disks.append(DiskForecast(str(docker_dir), "Docker", docker_free, needed))
        else:
            disks.append(DiskForecast("(engine)", "Docker", None, needed))
    return Forecast(rows, tuple(disks), time.monotonic() - start, tuple(notes))


def render_text(fc: Forecast, *, build: bool = True) -> list[str]:
    """The plan as lines for a terminal."""
    lines = []
    for r in fc.cells:
        lock = {"up-to-date": "lock up to date", "stale": "lock stale: re-resolve", "missing": "no lock: resolve"}.get(
            r.lock_status, f"lock {r.lock_status}"
        )
        parts = [lock]
        if build:
            parts.append(f"base {r.base.action}")
        w = r.wheels
        if w is None:
            parts.append("wheels: after locking")
        elif w.blocker:
            parts.append(f"wheels: BLOCKED ({w.blocker.splitlines()[0][:200]})")
        elif w.error:
            parts.append(f"wheels: index unreadable ({w.error.splitlines()[0][:160]})")
        else:
            parts.append(
                f"wheels {w.cached}/{w.count} cached ({human_bytes(w.cached_bytes)}), "
                f"{w.download} to download ({human_bytes(w.download_bytes)}"
                + (f", {w.unknown_sizes} of unknown size" if w.unknown_sizes else "")
                + ")"
            )
        if build and r.image_bytes:
            parts.append(f"image ~{human_bytes(r.image_bytes)}")
        if r.compiler_bytes is not None:
            parts.append(f"CUDA compiler layer ~{human_bytes(r.compiler_bytes)}")
        if r.compiler_debs is not None:
            parts.append(
                f"CUDA compiler: Debian's nvidia-cuda-toolkit, {r.compiler_debs[0]} .debs in the apt layer "
                f"({human_bytes(r.compiler_debs[1])} to download)"
            )
        if r.host_blocker:
            parts.append(f"BLOCKED ({r.host_blocker[0]})")
        if r.project_blocker:
            parts.append(f"BLOCKED ({r.project_blocker[0][:300]})")
        lines.append(f"{r.cell}: " + "; ".join(parts))
        if r.lock_note and r.lock_status != "up-to-date":
            lines.append(f"  {r.lock_note}")
    for d in fc.disks:
        free = human_bytes(d.free_bytes) if d.free_bytes is not None else "unknown"
        verdict = f"NOT USABLE ({d.problem})" if d.problem else "ok" if d.ok else "NOT ENOUGH"
        lines.append(f"disk {d.purpose} {d.path}: needs {human_bytes(d.needed_bytes)}, {free} free: {verdict}")
    lines += [f"note: {n}" for n in fc.notes]
    return lines


def engine_or_none():
    """The engine when it answers; a plan is still useful without one."""
    from imagekit.effects.docker import Engine

    try:
        return Engine()
    except ImagekitError:
        return None
