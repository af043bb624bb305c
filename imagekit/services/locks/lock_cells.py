"""Lock use case: resolve each selected cell (concurrently), skipping cells whose inputs are unchanged."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from imagekit.compat.catalog import CompatData
from imagekit.effects import process, resolver
from imagekit.effects.files import write_atomic
from imagekit.errors import CheckFailed, ImagekitError, UsageError
from imagekit.locking import lockfile, resolution
from imagekit.locking.debs import DebPin
from imagekit.locking.lockfile import Lock
from imagekit.locking.source_builds import Built, built_names
from imagekit.model import AMD64, Cell
from imagekit.services.wheels import direct_sources, wheel_builds

T = TypeVar("T")


@dataclass(frozen=True)
class LockResult:
    cell: Cell
    status: str  # up-to-date | locked | stale | missing | failed
    path: Path
    lock: Lock | None = None
    error: ImagekitError | None = None


def lock_path(directory: Path, cell: Cell) -> Path:
    """``lockfiles/<id>.txt`` for linux/amd64, ``lockfiles/linux-arm64/<id>.txt`` for another platform (a folder of
    its own: the amd64 locks, and what lists them, stay as they were)."""
    if cell.platform == AMD64:
        return directory / f"{cell.id}.txt"
    return directory / cell.platform.replace("/", "-") / f"{cell.id}.txt"


MAX_LOCK = 32 << 20  # a lock of a thousand wheels with every platform's hash is a few MB


def lock_text(path: Path) -> str:
    """A lock file's text, as a project file is read: a regular file (a FIFO there never blocks), bounded, UTF-8;
    FileNotFoundError when there is none, OSError or UnicodeDecodeError when it cannot be read."""
    from imagekit.effects import foreign_files

    if not os.path.lexists(path):
        raise FileNotFoundError(path)
    try:
        data = foreign_files.read_bytes(path, MAX_LOCK, follow=True)
    except foreign_files.Refused as exc:
        raise OSError(exc.why) from None
    return data.decode("utf-8")


def read_lock(path: Path) -> Lock | None:
    """A lock as written, unverified (for resolver preferences only); None when missing or unreadable."""
    try:
        return lockfile.parse(lock_text(path), str(path))
    except (OSError, UnicodeDecodeError, UsageError):
        return None


def verified_lock(path: Path, cell: Cell, data: CompatData, *, current: bool = False) -> Lock | None:
    """This cell's lock, verified before any use (resolution.verify_lock; ``current``: made for the cell's present
    inputs); None when there is none."""
    try:
        text = lock_text(path)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckFailed(f"{path}: cannot read it: {exc}", f"delete {path} and run `imagekit lock`") from None
    try:
        lock = lockfile.parse(text, str(path))
    except UsageError as exc:
        raise CheckFailed(exc.message, f"never build from it: delete {path} and run `imagekit lock`") from None
    resolution.verify_lock(lock, text, cell, data, str(path), current=current)
    return lock


def _preferences(directory: Path, cell: Cell, existing: Lock | None) -> str | None:
    """The earlier lock of this cell, else a sibling with the same torch build: pins that need not move stay."""
    if existing is not None:
        return existing.layer_text("torch") + existing.layer_text("app")
    prefix = f"{cell.variant}-torch{cell.torch}-py{cell.python}-"
    for sibling in sorted(lock_path(directory, cell).parent.glob(f"{prefix}*.txt")):
        lock = read_lock(sibling)
        if lock is not None:
            return lock.layer_text("torch")
    return None


def _beside(fn: Callable[..., T], *args: object) -> Future[T]:
    """``fn(*args)`` on a daemon thread: nothing waits for it at exit when its answer is not needed."""
    future: Future[T] = Future()

    def work() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # handed to whoever asks for the result
            future.set_exception(exc)

    threading.Thread(target=work, daemon=True).start()
    return future


def _resolve_routed(
    tool: resolver.Resolver,
    req: resolution.LockRequest,
    prefs: str | None,
    upgrade: tuple[str, ...],
    upgrade_all: bool,
    abort: Callable[[], bool] | None = None,
) -> tuple[resolution.LockRequest, str]:
    """Resolve with ``tool``; for a routed cell, repeat while torch-closure packages (nvidia-*, triton) came from
    elsewhere. uv applies an index source only to direct dependencies, so each pass names the strays directly."""
    if req.routed and prefs:
        req = req.with_routed(
            {e.name for e in lockfile.parse_requirements(prefs) if resolution.is_torch_family(e.name)}
        )
    for _ in range(4):
        try:
            output = tool.compile(req, prefs, upgrade, upgrade_all, abort=abort)
        except CheckFailed as exc:
            missing = resolution.missing_family_package(req, exc.message)
            if not missing:
                raise
            req = req.with_routed({missing})
            continue
        extra = resolution.misrouted(req, output)
        if not extra:
            return req, output
        req = req.with_routed(extra)
    raise CheckFailed(
        f"{req.cell.id}: torch-family packages keep resolving outside the PyTorch index", "check the index settings"
    )


# (cell, its request, the cell resolved without its from_source packages) -> each of them built (or found built)
SourceBuilder = Callable[[Cell, resolution.LockRequest, Lock], list[tuple[Built, Path]]]


def _lock_with_builds(
    cell: Cell,
    req: resolution.LockRequest,
    tool: resolver.Resolver,
    prefs: str | None,
    upgrade: tuple[str, ...],
    upgrade_all: bool,
    stop: Callable[[], bool],
    build: SourceBuilder,
    matrix: str | None,
    data: CompatData,
    version: Future[str],
) -> Lock:
    """Two resolutions around the wheel-build stage: the cell without its from_source packages (the torch layer the
    builds install), then with the built wheels beside the indexes, the torch layer held where it was."""
    names = set(built_names(cell))
    first = replace(req, requirements=tuple(r for r in req.requirements if _name(r) not in names))
    # a from_source package another one requires (a dependency of a dependency) is met, in this resolution only, by
    # placeholders of the versions its index has archives of: the resolver reaches the torch layer, and says which
    # version the tree wants built
    stand_in, _ = wheel_builds.placeholders(sorted(set(cell.from_source)), req)
    try:
        first = replace(first, find_links=(*first.find_links, str(stand_in)))
        first, output = _resolve_routed(tool, first, prefs, upgrade, upgrade_all, abort=stop)
    finally:
        shutil.rmtree(stand_in, ignore_errors=True)
    prelock = resolution.build_lock(first, output, matrix, data, version.result())
    deep = {e.name: e.version for e in prelock.entries if e.name in names}  # placeholders: never built from
    prelock = replace(prelock, app=tuple(e for e in prelock.app if e.name not in deep))
    listed = {_name(r) for r in req.requirements}
    wanted = tuple(f"{n}=={v}" for n, v in sorted(deep.items()) if n not in listed)  # the version the tree took
    built = build(cell, replace(req, requirements=(*req.requirements, *wanted)), prelock)
    folder = wheel_builds.find_links([path for _, path in built])
    try:
        # a git requirement is met by the wheel built from its commit: asked for by name and version
        kept = tuple(r for r in req.requirements if not resolution.is_vcs(r))
        listed = {_name(r) for r in kept}
        pins = tuple(f"{b.name}=={b.version}" for b, _ in built if b.name not in listed)
        second = replace(req, requirements=(*kept, *pins), find_links=(str(folder),))
        held = prelock.layer_text("torch") + prelock.layer_text("app")
        second, output = _resolve_routed(tool, second, held, (), False, abort=stop)
        lock = resolution.build_lock(second, output, matrix, data, version.result())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    moved = sorted({e.pin for e in prelock.torch} ^ {e.pin for e in lock.torch})
    if moved:
        raise CheckFailed(
            f"{cell.id}: the packages built from source moved the torch layer they were built against "
            f"({', '.join(moved[:6])})",
            "pin the moved packages in the matrix's packages so both resolutions agree",
        )
    got = {e.name: e for e in lock.entries}
    for b, _ in built:
        entry = got.get(b.name)
        if entry is None or entry.version != b.version or f"sha256:{b.wheel_sha256}" not in entry.hashes:
            raise CheckFailed(
                f"{cell.id}: the resolution did not take the wheel built for {b.name} {b.version}",
                "a requirement excludes that version: widen it, or pin the version to build",
            )
    meta = dict(lock.meta)
    for b, _ in built:
        key, value = b.meta()
        meta[key] = value
    return replace(lock, meta=meta)


MAX_SOURCE_ONLY = 32  # resolutions spent finding source-only packages after the first


def _every_source_only(
    tool: resolver.Resolver, req: resolution.LockRequest, first: resolver.NoWheel, stop: Callable[[], bool]
) -> resolver.NoWheel:
    """Every package of the resolution published as source archives only, found in one `lock`: each one found is
    met by placeholders of its archives' versions (wheel_builds.placeholders) and the resolution runs again, until
    it resolves or fails for another reason. What the archives themselves require is known once they are built."""
    found = list(first.names)
    for _ in range(MAX_SOURCE_ONLY):
        folder, unlisted = wheel_builds.placeholders(found, req)
        try:
            if unlisted:  # no archive on the indexes either: nothing to stand in for
                break
            _resolve_routed(tool, replace(req, find_links=(*req.find_links, str(folder))), None, (), False, stop)
            break
        except resolver.NoWheel as exc:
            new = [n for n in exc.names if n not in found]
            if not new:
                break
            found += new
        except ImagekitError:
            break
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    if found == list(first.names):
        return first
    from imagekit.locking.source_builds import from_source_hint

    return resolver.NoWheel(
        f"{req.cell.id}: {len(found)} packages have no wheel for Python {req.cell.python} on {req.platform}, only "
        f"source archives: {', '.join(found)} (images install wheels only; a source build differs on every "
        f"machine). The first, as the resolver said it:\n{first.message.split(chr(10), 1)[-1]}",
        from_source_hint(found),
        tuple(found),
    )


def _name(requirement: str) -> str:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return canonicalize_name(Requirement(requirement).name)


def status_of(directory: Path, cell: Cell, settings: resolution.LockSettings, data: CompatData) -> LockResult:
    path = lock_path(directory, cell)
    try:
        existing = verified_lock(path, cell, data)
    except CheckFailed as exc:
        return LockResult(cell, "invalid", path, error=exc)
    if existing is None:
        return LockResult(cell, "missing", path)
    req = resolution.request(cell, settings, data)
    if existing.meta.get("input-hash") != req.input_hash or resolution.companion_drift(existing, cell, data):
        return LockResult(cell, "stale", path, existing)
    return LockResult(cell, "up-to-date", path, existing)


def lock_one(
    cell: Cell,
    directory: Path,
    settings: resolution.LockSettings,
    data: CompatData,
    *,
    matrix: str | None = None,
    upgrade: tuple[str, ...] = (),
    upgrade_all: bool = False,
    using: resolver.Resolver | None = None,
    apt: Callable[[Cell], tuple[DebPin, ...]] | None = None,
    build: SourceBuilder | None = None,
) -> LockResult:
    """Lock ``cell`` unless its lock is made for its present inputs (or an upgrade is asked for); the resolver is
    the one ``settings`` names unless ``using`` (a test's fake) is given. ``apt`` resolves the cell's `[image] apt`
    packages over its base (services/locks/apt_resolve.py); a cell with some cannot be locked without it. ``build``
    builds
    its `from_source` packages in its base (services/wheels/wheel_builds.py); likewise needed when it has some."""
    path = lock_path(directory, cell)
    req = resolution.request(cell, settings, data)
    try:
        existing = verified_lock(path, cell, data)  # a tampered lock is reported, never silently replaced
    except CheckFailed as exc:
        return LockResult(cell, "failed", path, error=exc)
    try:  # wheels named without a hash, and the project's own: their sha256 (services.direct_sources)
        sourced = direct_sources.prepare(req, Path(settings.project), existing)
    except ImagekitError as exc:
        return LockResult(cell, "failed", path, existing, exc)
    current = existing is not None and existing.meta.get("input-hash") == req.input_hash
    if current and not upgrade and not upgrade_all and not resolution.companion_drift(existing, cell, data):
        if not sourced.changed:  # a project wheel whose bytes changed is locked again
            return LockResult(cell, "up-to-date", path, existing)
    conflict = resolution.companion_conflicts(cell, data)  # a pin the companion table contradicts: named, with why
    if conflict is not None:
        return LockResult(cell, "failed", path, existing, conflict)
    try:  # a wheel named by URL that cannot run in the cell: said in imagekit's words, before uv says it in its own
        direct = [p for p in cell.packages if resolution.is_direct(p) and not resolution.is_vcs(p)]
        resolution.check_direct_wheels(req, direct, data)
    except CheckFailed as exc:
        return LockResult(cell, "failed", path, existing, exc)
    if cell.apt and apt is None:
        return LockResult(
            cell, "failed", path, existing,
            UsageError(f"{cell.id}: [image] apt packages are resolved in the cell's base, with Docker",
                       "run `imagekit lock` where Docker runs (it bootstraps or pulls the base)"),
        )  # fmt: skip
    if built_names(cell) and build is None:
        return LockResult(
            cell, "failed", path, existing,
            UsageError(f"{cell.id}: from_source and git requirements are built in the cell's base, with Docker",
                       "run `imagekit lock` where Docker runs (it bootstraps or pulls the base)"),
        )  # fmt: skip
    tool = direct_sources.resolving(using or resolver.for_settings(settings), sourced)
    # The resolver starts at once; the index probe (once per URL and process) and its version run beside it. An
    # index that does not answer stops the resolver (uv would retry for half a minute) with the probe's one error.
    probe = _beside(resolver.unreachable_index, req)
    version = _beside(tool.version)
    try:
        prefs = None if upgrade_all else _preferences(directory, cell, existing)
        stop = lambda: probe.done() and bool(probe.result())  # noqa: E731
        if built_names(cell) and build is not None:
            lock = _lock_with_builds(cell, req, tool, prefs, upgrade, upgrade_all, stop, build, matrix, data, version)
        else:
            req, output = _resolve_routed(tool, req, prefs, upgrade, upgrade_all, abort=stop)
            lock = resolution.build_lock(req, output, matrix, data, version.result())
        if cell.apt and apt is not None:
            lock = replace(lock, apt=apt(cell))
    except (ImagekitError, process.Aborted) as exc:
        down = probe.result()
        if down is not None:
            return LockResult(cell, "failed", path, existing, down)
        if isinstance(exc, process.Aborted):
            raise
        if isinstance(exc, resolver.NoWheel):
            exc = _every_source_only(tool, req, exc, stop)
        held = resolution.companion_hint(req, exc.message, data) if isinstance(exc, CheckFailed) else None
        if held:  # the resolver's "no version of torchvision>0.29.2": why imagekit asked for that
            exc = CheckFailed(exc.message, f"{held}; {exc.hint}" if exc.hint else held)
        return LockResult(cell, "failed", path, existing, exc)
    write_atomic(path, lock.render())
    return LockResult(cell, "locked", path, lock)


def lock_cells(
    cells: list[Cell],
    directory: Path,
    settings: resolution.LockSettings,
    data: CompatData,
    *,
    matrix: str | None = None,
    upgrade: tuple[str, ...] = (),
    upgrade_all: bool = False,
    jobs: int = 4,
    on_result: Callable[[LockResult], None] | None = None,
    apt: Callable[[Cell], tuple[DebPin, ...]] | None = None,
    build: SourceBuilder | None = None,
) -> list[LockResult]:
    def work(cell: Cell) -> LockResult:
        result = lock_one(
            cell, directory, settings, data, matrix=matrix, upgrade=upgrade, upgrade_all=upgrade_all, apt=apt,
            build=build,
        )  # fmt: skip
        if on_result:
            on_result(result)
        return result

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(work, cells))


def current_locks(cells: list[Cell], directory: Path, data: CompatData) -> tuple[list[Cell], list[tuple[Cell, str]]]:
    """The cells whose lock in ``directory`` is made for their present inputs, and the others with the reason."""
    locked, others = [], []
    for cell in cells:
        try:
            lock = verified_lock(lock_path(directory, cell), cell, data, current=True)
        except CheckFailed as exc:
            others.append((cell, exc.message.splitlines()[0]))
            continue
        if lock is None:
            others.append((cell, f"no lock in {directory}"))
        else:
            locked.append(cell)
    return locked, others


def check_cells(
    cells: list[Cell], directory: Path, settings: resolution.LockSettings, data: CompatData
) -> list[LockResult]:
    return [status_of(directory, c, settings, data) for c in cells]
