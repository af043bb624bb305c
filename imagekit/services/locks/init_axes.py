"""`imagekit init --from`: axes that lock. Where each chosen torch comes from (PyPI's default build or the PyTorch
index), and a transformers axis the file's range leaves to imagekit chosen by the resolver: the file's requirements
resolved against the candidate cell, the newest known release that resolves written, and the pins that ruled out
the newer ones said (the resolver's own reason)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from imagekit.compat import rules
from imagekit.compat.catalog import CompatData
from imagekit.errors import CheckFailed, EnvironmentFailure, UnknownVersionError
from imagekit.locking import resolution
from imagekit.locking.resolution import LockRequest, LockSettings
from imagekit.matrix import project_axes
from imagekit.matrix.project_deps import ProjectDeps
from imagekit.model import Cell, Query, variant_of
from imagekit.trust import untrusted
from imagekit.trust.redact import redact

Resolve = Callable[[LockRequest], str]  # the resolver's output; CheckFailed: no resolution
_PIN = re.compile(r"^transformers(?:\[[^\]]*\])?==(?P<version>\S+)", re.MULTILINE)
MAX_TRIES = 4  # exact resolutions tried below the resolver's answer before the derived axis is kept
REASON_LINES = 6


def settings_of(deps: ProjectDeps) -> LockSettings:
    """The indexes the lock will use, as far as the file says (its --index-url / --extra-index-url lines)."""
    main = next((i.url for i in deps.indexes if i.main), resolution.PYPI)
    extras = tuple(dict.fromkeys(i.url for i in deps.indexes if not i.main and i.url != main))
    return LockSettings(index_url=main, extra_index_urls=extras)


def torch_sources(axes: dict[str, tuple[str, ...]], data: CompatData, settings: LockSettings) -> list[str]:
    """One line per torch of the axes, for each CUDA variant the rules allow it with: the index that serves it."""
    notes = []
    for torch in axes["torch"]:
        for cuda in axes["cuda"]:
            if not _allowed(cuda, torch, None, min(axes["python"], key=Version), data):
                continue
            variant = variant_of(cuda)
            if data.torch_from_pypi(torch, variant):
                index = "PyPI" if settings.index_url == resolution.PYPI else redact(settings.index_url)
                notes.append(f"torch {torch} (CUDA {cuda}): PyPI's default build ({variant}), from {index}")
            else:
                default = data.torch_minor(torch).pypi_default
                notes.append(
                    f"torch {torch} (CUDA {cuda}): the PyTorch index ({settings.torch_index_base}/{variant}); PyPI "
                    f"serves torch {torch} built for {default or 'no CUDA'} only"
                )
    return notes


def _allowed(cuda: str, torch: str, transformers: str | None, python: str, data: CompatData) -> bool:
    try:
        return rules.evaluate(Query(cuda=cuda, torch=torch, transformers=transformers, python=python), data).compatible
    except UnknownVersionError:
        return False


def candidates(items: Iterable[project_axes.Item], cuda: str, torch: str, python: str, data: CompatData) -> list[str]:
    """Known transformers releases the file's ``items`` allow and the rules allow in the cell, newest first."""
    items = list(items)
    out = []
    for release in reversed(data.releases("transformers")):
        v = Version(release)
        rel = data.packages.get("transformers", {}).get(release)
        if v.is_prerelease or rel is None or rel.yanked:
            continue
        if all(project_axes.admits(i, release) for i in items) and _allowed(cuda, torch, release, python, data):
            out.append(release)
    return out


def settle(
    axes: dict[str, tuple[str, ...]],
    deps: ProjectDeps,
    data: CompatData,
    transformers_given: bool,
    defaults: dict[str, tuple[str, ...]],
    resolve: Resolve | None = None,
) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """The axes `derive` chose, with transformers resolved when the file's range leaves it to init, and a note per
    chosen torch saying which index serves it."""
    settings = settings_of(deps)
    notes: list[str] = []
    if leaves_transformers_open(deps, min(axes["python"], key=Version), transformers_given, defaults["transformers"]):
        if resolve is None:
            from imagekit.effects import resolver

            tool = resolver.for_settings(settings)
            resolve = lambda req: tool.compile(req)  # noqa: E731
        axes, notes = pick_transformers(axes, deps, data, settings, resolve)
    return axes, [*notes, *torch_sources(axes, data, settings)]


def leaves_transformers_open(deps: ProjectDeps, python: str, given: bool, defaults: tuple[str, ...]) -> bool:
    """Whether init chooses transformers from the file's range alone: not given, not pinned, and allowing none of
    the default releases (which a range keeps, as documented)."""
    items = [i for i in project_axes.for_env(deps, python) if i.name == "transformers"]
    if given or not items or any(project_axes.exact(i.req) for i in items):
        return False
    return not any(all(project_axes.admits(i, v) for i in items) for v in defaults)


def pick_transformers(
    axes: dict[str, tuple[str, ...]],
    deps: ProjectDeps,
    data: CompatData,
    settings: LockSettings,
    resolve: Resolve,
) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """``axes`` with a transformers release that resolves with the file for its newest torch cell; the notes say
    which and why. The axes are kept as they are when the resolver cannot be asked (no index reachable)."""
    python = min(axes["python"], key=Version)
    items = [i for i in project_axes.for_env(deps, python) if i.name == "transformers"]
    cells = _candidate_cells(axes, python, data)
    if not cells:
        return axes, []
    cell = cells[0]
    known = candidates(items, cell.cuda, cell.torch, python, data)
    if not known:
        return axes, []
    spec = ",".join(str(i.req.specifier) for i in items if str(i.req.specifier)) or "any release"
    where = ", ".join(f"torch {c.torch} on CUDA {c.cuda}" for c in cells) + f", Python {python}"
    try:
        answer = _resolved_version(cell, deps, data, settings, resolve, known[0])
        chosen = _newest_that_locks(cells, deps, data, settings, resolve, [r for r in known if Version(r) <= answer])
    except EnvironmentFailure as exc:
        first = untrusted.printable(exc.message.splitlines()[0], 200)
        return axes, [f"transformers not checked against the index ({first}): `imagekit lock` will say"]
    if chosen is None:
        return axes, [
            f"no transformers release {spec} allows resolves with the file ({where}): `imagekit lock` says why"
        ]
    fits = [c for c in cells if _allowed(c.cuda, c.torch, chosen, python, data)]
    where = ", ".join(f"torch {c.torch} on CUDA {c.cuda}" for c in fits) + f", Python {python}"
    notes = [f"transformers {chosen}: the newest known release ({spec}) that resolves with the file ({where})"]
    notes += [_excluded_with(c, chosen, python, data) for c in cells if c not in fits]
    if chosen != known[0]:
        notes.append(
            f"transformers {known[0]} (newer) does not: " + _reason(cell, deps, data, settings, resolve, known[0])
        )
    return {**axes, "transformers": (chosen,)}, notes


def _excluded_with(cell: Cell, transformers: str, python: str, data: CompatData) -> str:
    """What a torch of the axes comes to with the chosen transformers when the rules exclude the pair: its cells are
    dropped (the resolver cannot tell, as transformers does not declare torch)."""
    verdict = rules.evaluate(Query(cuda=cell.cuda, torch=cell.torch, transformers=transformers, python=python), data)
    why = "; ".join(f"{v.rule}: {v.message}" for v in verdict.violations)
    return (
        f"torch {cell.torch}: excluded with transformers {transformers} ({why}): its cells are dropped "
        "(`imagekit matrix --explain`); give --transformers to keep them"
    )


def _candidate_cells(axes: dict[str, tuple[str, ...]], python: str, data: CompatData) -> list[Cell]:
    """A cell per torch of the axes, newest first, on the first CUDA the rules allow it with (PyPI's build first)."""
    out = []
    for torch in sorted(axes["torch"], key=Version, reverse=True):
        allowed = [c for c in axes["cuda"] if _allowed(c, torch, None, python, data)]
        allowed.sort(key=lambda c: not data.torch_from_pypi(torch, variant_of(c)))  # what PyPI serves, first
        if allowed:
            out.append(Cell(allowed[0], torch, "0", python))
    return out


def _request(cell: Cell, deps: ProjectDeps, data: CompatData, settings: LockSettings, transformers: str) -> LockRequest:
    at = dataclasses.replace(cell, transformers=transformers)
    packages, _ = project_axes.cell_packages(at, deps, data)
    return resolution.request(dataclasses.replace(at, packages=packages), settings, data)


def _resolved_version(
    cell: Cell, deps: ProjectDeps, data: CompatData, settings: LockSettings, resolve: Resolve, newest: str
) -> Version:
    """The transformers the resolver takes when the file's range (up to the newest known release) is left open."""
    req = _request(cell, deps, data, settings, newest)
    opened = tuple(_opened(r, newest) for r in req.requirements)
    try:
        found = _PIN.search(resolve(dataclasses.replace(req, requirements=opened)))
    except CheckFailed:
        return Version("0")  # nothing in the range resolves
    return Version(found["version"]) if found else Version(newest)


def _opened(requirement: str, newest: str) -> str:
    """``transformers==X`` (extras and a marker kept) as ``transformers<=newest``: the resolver chooses."""
    req = Requirement(requirement.split(" ; ")[0])
    if canonicalize_name(req.name) != "transformers" or req.url:
        return requirement
    req.specifier = SpecifierSet(f"<={newest}")
    return str(req)


def _newest_that_locks(
    cells: list[Cell], deps: ProjectDeps, data: CompatData, settings: LockSettings, resolve: Resolve, known: list[str]
) -> str | None:
    """The newest of ``known`` that resolves in every candidate cell (one per torch), trying a few."""
    for release in known[:MAX_TRIES]:
        try:
            for cell in cells:
                if _allowed(cell.cuda, cell.torch, release, cell.python, data):  # the rules drop the others' cells
                    resolve(_request(cell, deps, data, settings, release))
        except CheckFailed:
            continue
        return release
    return None


def _reason(
    cell: Cell, deps: ProjectDeps, data: CompatData, settings: LockSettings, resolve: Resolve, newest: str
) -> str:
    """The resolver's reason ``newest`` does not resolve, and the lines of the file it names."""
    try:
        resolve(_request(cell, deps, data, settings, newest))
    except CheckFailed as exc:
        lines = [
            line.strip().removeprefix("╰─▶").strip().removeprefix("cause:").strip()
            for line in exc.message.splitlines()[1:]
        ]
        said = [line for line in lines if line and "No solution found" not in line][:REASON_LINES]
        text = " ".join(said)
        named = [
            d.shown()
            for d in deps.declared
            if d.name != "transformers" and re.search(rf"\b{re.escape(d.name)}\b", text, re.IGNORECASE)
        ]
        by = f" (the file's {'; '.join(named)})" if named else ""
        return untrusted.printable(text, 800) + by
    except EnvironmentFailure:
        return "the index could not be asked again"
    return "it resolved on a second try"
