"""What fetching a lock would do, without downloading: wheels cached and to download, counted and sized from index
metadata. The wheel picked for each pin is remembered in the cache (the picks memo)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from imagekit.effects import foreign_files, http, index_auth
from imagekit.effects.cache import cache_root
from imagekit.effects.files import write_atomic
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.locking import uv_pin as tools
from imagekit.locking import wheel_choice as wheels
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.locking.resolution import is_torch_family
from imagekit.services.wheels.wheel_cache import cached_wheel, wheel_cache
from imagekit.services.wheels.wheel_index import candidates, extra_indexes, index_sources, lock_machine, remote_wheel
from imagekit.trust import untrusted


@dataclass(frozen=True)
class WheelForecast:
    """What fetching a lock would do, without downloading: wheels in the cache and wheels to download."""

    count: int
    cached: int
    cached_bytes: int
    download: int
    download_bytes: int
    unknown_sizes: int  # wheels to download whose index declares no size
    installed_bytes: int  # uncompressed size of the wheels (cached: measured; others: estimated)
    largest_bytes: int  # the largest wheel (a build holds it in the container while installing)
    downloads: tuple[tuple[str, int], ...] = ()  # (sha256, bytes) to download: cells sharing a wheel fetch it once
    error: str | None = None  # the index could not be read
    blocker: str | None = None  # a pin the image cannot install (no wheel fits it): the build would fail
    blocker_hint: str | None = None
    installed: tuple[tuple[str, int], ...] = ()  # (distribution, its installed bytes): a layer's size in the plan


# Installed (uncompressed) bytes per wheel byte, measured on this project's torch closures (bench/dry_run.py).
INSTALL_RATIO = 1.8


def forecast_lock(
    lock: Lock,
    python: str,
    glibc: str,
    *,
    jobs: int = 16,
    pages: dict | None = None,
    auth: index_auth.IndexAuth | None = None,
) -> WheelForecast:
    """Count and size what `fetch_lock` would take from the cache and from the index (index metadata only)."""
    index, torch_index, routed = index_sources(lock)
    supported = wheels.supported_tags(python, glibc, lock_machine(lock))

    picks = _load_picks(lock, python, glibc)
    known = len(picks)

    def one(entry: LockEntry) -> tuple[bool, int | None, int, str]:
        path = cached_wheel(entry, supported)
        if path is not None:
            return True, path.stat().st_size, _uncompressed(path), path.parent.name
        if entry.pin in picks:
            sha, size = picks[entry.pin]
            return False, size, int((size or 0) * INSTALL_RATIO), sha
        source = torch_index if routed and is_torch_family(entry.name) else index
        cand = remote_wheel(entry, source, python, glibc, supported, pages, extra_indexes(lock), auth)
        picks[entry.pin] = (cand.sha256, cand.size)
        return False, cand.size, int((cand.size or 0) * INSTALL_RATIO), cand.sha256

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            rows = list(pool.map(one, lock.entries))
    except CheckFailed as exc:  # read, and no wheel fits: not an unreadable index, a build that cannot succeed
        return WheelForecast(len(lock.entries), 0, 0, 0, 0, 0, 0, 0, blocker=exc.message, blocker_hint=exc.hint)
    except EnvironmentFailure as exc:
        return WheelForecast(len(lock.entries), 0, 0, 0, 0, 0, 0, 0, error=exc.message)
    if len(picks) > known:
        _save_picks(lock, python, glibc, picks)
    installed = tuple((e.name, r[2]) for e, r in zip(lock.entries, rows, strict=True))
    tool = tools.uv_for(lock_machine(lock))
    uv = wheel_cache() / tool.sha256 / tool.filename  # the installer: fetched too, never in the image
    rows.append((uv.is_file(), tool.size, 0, tool.sha256))
    cached = [r for r in rows if r[0]]
    remote = [r for r in rows if not r[0]]
    return WheelForecast(
        count=len(rows),
        cached=len(cached),
        cached_bytes=sum(r[1] or 0 for r in cached),
        download=len(remote),
        download_bytes=sum(r[1] or 0 for r in remote),
        unknown_sizes=sum(1 for r in remote if r[1] is None),
        installed_bytes=sum(r[2] for r in rows),
        largest_bytes=max((r[1] or 0 for r in rows), default=0),
        downloads=tuple((r[3], r[1] or 0) for r in remote),
        installed=installed,
    )


def read_pages(
    locks: list[tuple[Lock, str, str]], pages: dict, *, jobs: int = 6, auth: index_auth.IndexAuth | None = None
) -> None:
    """Read, once each and concurrently, the index pages that forecasting these (lock, python, glibc) needs:
    the pins the cache cannot serve. A failure is remembered (forecast_lock reports it). Six at a time: each new
    connection is a DNS lookup, and a lost lookup costs the resolver's 5 s timeout."""
    wanted = set()
    for lock, python, glibc in locks:
        index, torch_index, routed = index_sources(lock)
        supported = wheels.supported_tags(python, glibc, lock_machine(lock))
        picks = _load_picks(lock, python, glibc)
        for entry in lock.entries:
            if entry.pin not in picks and cached_wheel(entry, supported) is None:
                wanted.add((torch_index if routed and is_torch_family(entry.name) else index, entry.name))

    def one(key: tuple[str, str]) -> None:
        try:
            pages[key] = candidates(*key, auth)
        except (EnvironmentFailure, CheckFailed, UsageError) as exc:
            pages[key] = exc  # remembered: forecast_lock reports it without asking again

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, sorted(wanted - set(pages))))


def _picks_file(lock: Lock, python: str, glibc: str) -> Path:
    key = "\n".join([python, glibc, lock_machine(lock), *(f"{e.pin} {' '.join(e.hashes)}" for e in lock.entries)])
    return cache_root() / "picks" / f"{hashlib.sha256(key.encode()).hexdigest()[:40]}.json"


def _load_picks(lock: Lock, python: str, glibc: str) -> dict[str, tuple[str, int | None]]:
    """pin -> (sha256, size) of the wheel an earlier look at the index picked for this lock and platform. A pick
    never changes (the lock's hashes name the files), so the index need not be asked again."""
    try:  # a memo in the cache: bounded like anything read back (a planted file must not end the plan)
        raw = foreign_files.read_bytes(_picks_file(lock, python, glibc), 16 << 20)
        doc = untrusted.load_json(raw, "picks", max_bytes=16 << 20)
    except (OSError, ValueError):
        return {}
    out = {}
    for entry in lock.entries:
        got = doc.get(entry.pin) if isinstance(doc, dict) else None
        if not isinstance(got, dict) or f"sha256:{got.get('sha256')}" not in entry.hashes:
            continue
        size = got.get("size")
        plausible = isinstance(size, int) and not isinstance(size, bool) and 0 <= size <= http.MAX_DOWNLOAD
        out[entry.pin] = (got["sha256"], size if plausible else None)
    return out


def _save_picks(lock: Lock, python: str, glibc: str, picks: dict[str, tuple[str, int | None]]) -> None:
    doc = {pin: {"sha256": sha, "size": size} for pin, (sha, size) in sorted(picks.items())}
    try:
        write_atomic(_picks_file(lock, python, glibc), json.dumps(doc) + "\n")
    except OSError:
        pass  # a memo only


def _uncompressed(path: Path) -> int:
    """A cached wheel's installed size, from its zip directory (no extraction)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return sum(i.file_size for i in zf.infolist())
    except (OSError, zipfile.BadZipFile):
        return int(path.stat().st_size * INSTALL_RATIO)
