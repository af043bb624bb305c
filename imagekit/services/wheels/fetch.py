"""Fetch: every wheel a lock names, its .debs and the installer's wheel, downloaded once into the wheel cache, each hash
verified. A cached file is checked again before use."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagekit.effects import index_auth
from imagekit.effects.files import write_atomic
from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.locking import direct_wheels, driver_stub
from imagekit.locking import uv_pin as tools
from imagekit.locking import wheel_choice as wheels
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.locking.resolution import is_torch_family
from imagekit.locking.source_builds import recorded
from imagekit.services.progress import NullProgress, Progress, activity, human_bytes
from imagekit.services.wheels import direct_sources
from imagekit.services.wheels.wheel_cache import (
    allow_downloads,
    cached_wheel,
    discard_partials,
    download,
    require_cache,
    sha256_of,
    sweep_partials,
    wheel_cache,
)
from imagekit.services.wheels.wheel_index import extra_indexes, index_sources, lock_machine, remote_wheel
from imagekit.trust import untrusted


@dataclass(frozen=True)
class FetchedWheel:
    name: str
    path: Path
    downloaded: bool


def fetch_lock(
    lock: Lock,
    python: str,
    glibc: str,
    *,
    jobs: int = 4,
    log: Callable[[str], None] = lambda _: None,
    progress: Progress | None = None,
    cell: str = "",
    auth: index_auth.IndexAuth | None = None,
    project: Path | None = None,
) -> list[FetchedWheel]:
    """Every wheel the lock names for this Python/platform, from the cache when its hash still verifies; ``auth``:
    the configured private indexes' credentials (index_auth.for_indexes of the settings, never of the lock);
    ``project``: the matrix file's folder, where the project's own wheels (``file:wheels/...whl``) are copied from
    when the cache lacks them."""
    index, torch_index, routed = index_sources(lock)
    extras = extra_indexes(lock)
    supported = wheels.supported_tags(python, glibc, lock_machine(lock))
    progress = progress or NullProgress()
    require_cache()
    sweep_partials()
    allow_downloads()  # a new fetch (in a process whose earlier one was stopped: tests, a long-lived caller)
    cancel = threading.Event()

    built = recorded(lock.meta)

    def one(entry: LockEntry) -> FetchedWheel:
        path = cached_wheel(entry, supported)
        if path is not None:
            if sha256_of(path) == path.parent.name:
                return FetchedWheel(entry.name, path, False)
            raise CheckFailed(
                f"cached wheel {path} does not match its hash sha256:{path.parent.name}",
                f"the wheel cache was tampered with; delete {path.parent} and fetch again",
            )
        if entry.url and direct_wheels.is_local(entry.url) and project is not None:
            wheel = direct_wheels.parse(entry.name, entry.url)
            return FetchedWheel(entry.name, direct_sources.import_local(project, wheel, wheel.sha256), False)
        if entry.name in built:  # no index has it: the wheel-build stage made it, and `build` makes it again
            raise CheckFailed(
                f"{entry.pin} was built from its source archive when the cell was locked, and this machine's wheel "
                "cache does not hold the wheel",
                "run `imagekit build` for the cell (it builds the wheel again from the lock's record, in the cell's "
                "base) or `imagekit lock` where Docker runs",
            )
        source = torch_index if routed and is_torch_family(entry.name) else index
        cand = remote_wheel(entry, source, python, glibc, supported, extras=extras, auth=auth)
        dest = wheel_cache() / cand.sha256 / cand.filename
        log(f"downloading {cand.filename}" + (f" ({human_bytes(cand.size)})" if cand.size else ""))
        with activity(progress, cell, f"download {cand.filename}", total=cand.size, unit="B") as act:
            download(cand, dest, act.advance, cancel, auth=auth)
        return FetchedWheel(entry.name, dest, True)

    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    futures = [pool.submit(one, entry) for entry in lock.entries]
    try:
        got = [f.result() for f in futures]
    except KeyboardInterrupt:  # SIGINT, or SIGTERM as the CLI raises it: stop now, the partial files go first
        cancel.set()
        discard_partials()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    except BaseException:  # one download failed: the others stop at their next block
        cancel.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    return got


def fetch_for_build(lock: Lock, python: str, glibc: str, **kw: Any) -> list[FetchedWheel]:
    """What a build's wheelhouse holds: the lock's wheels, its .debs (`[image] apt`) and the installer's (uv)."""
    wheels_ = fetch_lock(lock, python, glibc, **kw)
    progress, cell = kw.get("progress"), kw.get("cell", "")
    return [
        *wheels_,
        *fetch_debs(lock, progress=progress, cell=cell),
        fetch_tool(tools.uv_for(lock_machine(lock)), progress=progress, cell=cell),
    ]


def fetch_debs(lock: Lock, *, progress: Progress | None = None, cell: str = "") -> list[FetchedWheel]:
    """Each .deb the lock pins (`[image] apt`), from the cache when its sha256 still verifies, else from the URL
    apt gave when the cell was locked (checked: size and sha256). Named by content: ``<sha256>.deb``."""
    got = []
    for pin in lock.apt:
        dest = wheel_cache() / pin.sha256 / pin.filename
        if driver_stub.is_stub(pin):  # `[image] cuda_toolkit` (CUDA 11, 12): made here, never downloaded
            if pin != driver_stub.pin():
                raise CheckFailed(
                    f"the lock's {pin.name} (sha256:{pin.sha256}) is not the driver stub this imagekit makes",
                    "re-lock the cell (`imagekit lock -U`)",
                )
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(dest, driver_stub.deb_bytes())
            got.append(FetchedWheel(pin.name, dest, False))
            continue
        if dest.is_file():
            if sha256_of(dest) != pin.sha256:
                raise CheckFailed(
                    f"cached package {dest} does not match its hash sha256:{pin.sha256}",
                    f"the cache was tampered with; delete {dest.parent} and fetch again",
                )
            got.append(FetchedWheel(pin.name, dest, False))
            continue
        cand = wheels.Candidate(pin.filename, pin.url, pin.sha256, pin.size)
        with activity(
            progress or NullProgress(), cell, f"download {pin.name}_{pin.version}", total=pin.size, unit="B"
        ) as act:
            try:
                download(cand, dest, act.advance)
            except EnvironmentFailure as exc:
                if not any(f"HTTP {code}" in exc.message for code in (404, 410)):
                    raise
                raise CheckFailed(
                    f"{pin.name} {pin.version} is no longer at {untrusted.printable(pin.url, 200)} (the archive "
                    "moved on to a newer version)",
                    "re-lock the cell (`imagekit lock -U`) for the archive's current packages, or keep the cache "
                    "that holds these files",
                ) from None
        got.append(FetchedWheel(pin.name, dest, True))
    return got


def fetch_tool(tool: tools.ToolWheel, *, progress: Progress | None = None, cell: str = "") -> FetchedWheel:
    """A build tool's wheel (uv) into the wheel cache, checked against its pinned sha256 like a locked wheel."""
    dest = wheel_cache() / tool.sha256 / tool.filename
    if dest.is_file():
        if sha256_of(dest) == tool.sha256:
            return FetchedWheel(tool.name, dest, False)
        raise CheckFailed(
            f"cached wheel {dest} does not match its hash sha256:{tool.sha256}",
            f"the wheel cache was tampered with; delete {dest.parent} and fetch again",
        )
    cand = wheels.Candidate(tool.filename, tool.url, tool.sha256, tool.size)
    with activity(progress or NullProgress(), cell, f"download {tool.filename}", total=tool.size, unit="B") as act:
        download(cand, dest, act.advance)
    return FetchedWheel(tool.name, dest, True)
