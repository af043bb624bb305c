"""Wheelhouse: download every locked wheel once into a content-addressed cache, verifying each hash."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from imagekit.effects import foreign_files, http, index_auth
from imagekit.effects.cache import cache_root, unusable
from imagekit.effects.files import refuse_links, replace_folder, write_atomic
from imagekit.errors import CheckFailed, EnvironmentFailure, ImagekitError, UsageError
from imagekit.locking import direct_wheels
from imagekit.locking import uv_pin as tools
from imagekit.locking import wheel_choice as wheels
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.locking.resolution import is_torch_family
from imagekit.services.progress import NullProgress, Progress, activity, human_bytes
from imagekit.trust import untrusted


@dataclass(frozen=True)
class FetchedWheel:
    name: str
    path: Path
    downloaded: bool


def wheel_cache() -> Path:
    return cache_root() / "wheels"


def require_cache() -> Path:
    """The wheel cache, when it can take files; else an EnvironmentFailure saying what is in the way."""
    problem = unusable(wheel_cache())
    if problem:
        raise EnvironmentFailure(
            f"the wheel cache cannot be used: {problem}",
            "point IMAGEKIT_CACHE (or XDG_CACHE_HOME) at a writable folder, or move what is in the way",
        )
    return wheel_cache()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def _join(base: str, href: str) -> str:
    return http.join(base, href)  # an href that is no URL stays as it is: refused by _require_http when picked


def _filename(url: str) -> str:
    return http.filename(url)


def _from_json(base: str, raw: bytes) -> list[wheels.Candidate]:
    """PEP 691 files; PEP 700's ``size`` kept when declared and plausible (0 to `http.MAX_DOWNLOAD`); a sha256 that
    is not 64 hex digits is none (it matches no locked hash)."""
    hint = "check the index URL: it must be a PEP 691/503 index"
    try:
        page: Any = untrusted.load_json(raw, f"the index page {http.display(base)}")
    except untrusted.UntrustedData as exc:
        raise EnvironmentFailure(str(exc), hint) from None
    files = page.get("files") if isinstance(page, dict) else None
    if not isinstance(files, list):
        raise EnvironmentFailure(f"the index page {http.display(base)} has no list of files", "check the index URL")
    out = []
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("filename"), str) or not isinstance(f.get("url"), str):
            raise EnvironmentFailure(
                f"the index page {http.display(base)} lists a file without a filename or url", "check the index"
            )
        hashes = f.get("hashes") if isinstance(f.get("hashes"), dict) else {}
        size = f.get("size")
        plausible = isinstance(size, int) and not isinstance(size, bool) and 0 <= size <= http.MAX_DOWNLOAD
        # the URL stays as the page gives it: joined only for the wheel picked (pages list thousands of files)
        out.append(
            wheels.Candidate(
                f["filename"], f["url"], untrusted.sha256_lenient(hashes.get("sha256")), size if plausible else None
            )
        )
    return out


def _candidates(index: str, name: str, auth: index_auth.IndexAuth | None = None) -> list[wheels.Candidate]:
    """Files of a project from a PEP 691 (JSON) or PEP 503 (HTML, sha256 in the URL fragment) index page.
    ``auth``: the credentials of the indexes the matrix file or the options name (a lock names indexes too, but
    what a lock says never decides where credentials go); without it, a netrc entry for the host only."""
    base = f"{index.rstrip('/')}/{name}/"
    headers = (auth or index_auth.IndexAuth()).headers(base)
    raw = http.get(base, accept=http.SIMPLE_JSON + ", text/html;q=0.1", headers=headers)
    if raw.lstrip().startswith(b"{"):
        return _from_json(base, raw)
    parser = _Links()
    parser.feed(raw.decode("utf-8", "replace"))
    out = []
    for href in parser.hrefs:
        url, _, fragment = href.partition("#")
        sha = untrusted.sha256_lenient(fragment.split("=", 1)[1]) if fragment.startswith("sha256=") else ""
        out.append(wheels.Candidate(_filename(_join(base, url)), _join(base, url), sha))
    return out


PARTIAL = ".partial-"  # a download in progress: wheels/<sha>/.partial-XXXX/{.lock, the temporary file}
STALE_PARTIAL_S = 3600  # a partial download without a lock file (or an older imagekit's) this old is dead
_live: set[Path] = set()  # this process's partial downloads (removed at once when it is interrupted)
_live_lock = threading.Lock()
_discarded = threading.Event()  # set by discard_partials: no download of this process may start after it


class Interrupted(Exception):
    """A download stopped because the fetch was interrupted (SIGINT, SIGTERM, or another download failed)."""


def _download(
    cand: wheels.Candidate,
    dest: Path,
    on_bytes: Callable[[int], None] | None = None,
    cancel: threading.Event | None = None,
    auth: index_auth.IndexAuth | None = None,
) -> None:
    """The wheel into the cache, with ``auth``'s credentials for its host (the configured private indexes' only):
    http(s) only, no larger than the index declares (or http.MAX_DOWNLOAD). The bytes go
    to a folder of its own beside ``dest`` whose lock file this process holds while it writes, so that a later
    fetch can tell a dead run's partial download (swept: `sweep_partials`) from a live one (left alone)."""
    http.require_http(
        cand.url,
        f"the index lists {cand.filename} at",
        EnvironmentFailure,
        "an index may only point at http(s) files; use another index",
    )

    def advance(n: int) -> None:
        if cancel is not None and cancel.is_set():
            raise Interrupted(cand.filename)
        if on_bytes is not None:
            on_bytes(n)

    dest.parent.mkdir(parents=True, exist_ok=True)
    with _live_lock:  # made and recorded in one step: discard_partials sees every folder, or none starts after it
        if _discarded.is_set():
            raise Interrupted(cand.filename)
        staging = Path(tempfile.mkdtemp(prefix=PARTIAL, dir=dest.parent))
        _live.add(staging)
    try:
        with open(staging / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            http.download(
                cand.url,
                staging / dest.name,
                sha256=cand.sha256,
                max_bytes=cand.size if cand.size is not None else http.MAX_DOWNLOAD,
                on_bytes=advance,
                headers=(auth or index_auth.IndexAuth()).headers(cand.url),
            )
            os.replace(staging / dest.name, dest)
    finally:
        with _live_lock:
            _live.discard(staging)
        shutil.rmtree(staging, ignore_errors=True)


def discard_partials() -> None:
    """Remove this process's partial downloads now (an interrupted fetch: its threads may still be reading)."""
    with _live_lock:
        _discarded.set()
        for staging in list(_live):
            # Renamed first: a thread still writing creates its files by path, so none lands in the folder
            # being removed (where one created between rmtree's listing and its rmdir would keep it).
            gone = staging.with_name(staging.name + ".gone")
            try:
                os.rename(staging, gone)
            except OSError:
                gone = staging
            shutil.rmtree(gone, ignore_errors=True)


def sweep_partials() -> int:
    """Remove the partial downloads that killed runs left in the wheel cache: a ``.partial-*`` folder whose lock
    no live process holds (or, lacking a lock file, an hour old), and an older imagekit's ``.download-*`` file
    not written for an hour. A live download, this process's or another's, is never touched. Returns the count."""
    cutoff = time.time() - STALE_PARTIAL_S
    removed = 0
    for path in wheel_cache().glob(f"*/{PARTIAL}*"):
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                continue
            fd = os.open(path / ".lock", os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            if _older(path, cutoff):
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # held: a live download
        shutil.rmtree(path, ignore_errors=True)  # removed while this holds its lock
        os.close(fd)
        removed += 1
    for path in wheel_cache().glob("*/.download-*"):
        try:
            if stat.S_ISREG(os.lstat(path).st_mode) and _older(path, cutoff):
                path.unlink()
                removed += 1
        except OSError:
            pass
    return removed


def _older(path: Path, cutoff: float) -> bool:
    try:
        return os.lstat(path).st_mtime < cutoff
    except OSError:
        return False


def _sources(lock: Lock) -> tuple[str, str, bool]:
    index = lock.meta.get("index", "https://pypi.org/simple")
    recorded = _recorded_index(lock)
    if recorded is not None and recorded != index:
        raise CheckFailed(
            f"the lock's index line ({http.display(index)}) is not the index it was resolved against "
            f"({http.display(recorded)}): edited by hand",
            "run `imagekit lock` to rewrite the lock",
        )
    torch_index = lock.meta.get("torch-index", "")
    routed = torch_index.startswith("http")
    for url in (index, torch_index, *_extras(lock)) if routed else (index, *_extras(lock)):
        http.require_http(
            url, "the lock's index", UsageError, "fetch downloads from http(s) indexes; re-lock against one"
        )
    return index, torch_index, routed


def _recorded_index(lock: Lock) -> str | None:
    from imagekit.locking import resolution

    if "settings" not in lock.meta:  # a lock of an older imagekit: its index line is all there is
        return None
    try:
        url = resolution.recorded_settings(lock).get("index_url")
    except CheckFailed:
        return None
    return url if isinstance(url, str) else None


def _extras(lock: Lock) -> tuple[str, ...]:
    """The lock's extra indexes (from its recorded settings): a pin the main index lacks is looked up there."""
    from imagekit.locking import resolution

    try:
        urls = resolution.recorded_settings(lock).get("extra_index_urls") or []
    except CheckFailed:
        return ()
    return tuple(u for u in urls if isinstance(u, str))


def _cached(entry: LockEntry, supported: list[str]) -> Path | None:
    """The cached wheel for this pin that fits this image (locks sharing a pin share wheels of other Pythons)."""
    root = wheel_cache()
    cached = [
        wheels.Candidate(path.name, str(path), path.parent.name)
        for h in entry.hashes
        for path in (root / h.split(":", 1)[1]).glob("*.whl")
    ]
    hit = wheels.pick(cached, entry.hashes, supported)
    return Path(hit.url) if hit is not None else None


def _named_safely(entry: LockEntry, found: list[wheels.Candidate]) -> None:
    """Every wheel the index lists with one of the pin's hashes has a name that can be a file name in the cache (a
    wheel-name grammar: no `/`, `..` or control character), else the index is not to be built from. Other files
    (the sdist a lock also hashes) are never downloaded: `wheels.pick` takes only names ending in `.whl`."""
    allowed = {h.split(":", 1)[1] for h in entry.hashes}
    for cand in found:
        if cand.sha256 in allowed and cand.filename.endswith(".whl"):
            try:
                untrusted.wheel_filename(cand.filename)
            except untrusted.UntrustedData as exc:
                raise EnvironmentFailure(
                    f"{entry.pin}: the index lists its file sha256:{cand.sha256[:12]}… under a name that is "
                    f"not a wheel file name ({exc})",
                    "the index is broken or hostile; do not build from it (use another index or mirror)",
                ) from None


def _remote(
    entry: LockEntry,
    source: str,
    python: str,
    glibc: str,
    supported: list,
    pages: dict | None = None,
    extras: tuple[str, ...] = (),
    auth: index_auth.IndexAuth | None = None,
) -> wheels.Candidate:
    """The wheel to download for this pin, its URL absolute; ``pages`` memoizes index pages across locks. A wheel
    the lock names by URL is downloaded from there (its sha256 is the lock's)."""
    if entry.url:
        wheel = direct_wheels.parse(entry.name, entry.url)
        if not wheels.pick([wheels.Candidate(wheel.filename, wheel.url, wheel.sha256)], entry.hashes, supported):
            raise CheckFailed(
                f"{entry.spec}: the wheel does not fit Python {python} / manylinux glibc {glibc}",
                "name the wheel built for this cell, and lock again",
            )
        return wheels.Candidate(wheel.filename, wheel.url, wheel.sha256)
    cand = None
    indexes = (source, *extras)  # uv may have taken it from an extra index: look there too, in order
    for i, index in enumerate(indexes):
        key = (index, entry.name)
        found = pages.get(key) if pages is not None else None
        if found is None:
            try:
                found = _candidates(index, entry.name, auth)
            except EnvironmentFailure as exc:
                found = exc
            if pages is not None:
                pages[key] = found
        if isinstance(found, ImagekitError):  # read_pages could not read it: not asked again per pin
            if i + 1 < len(indexes) and "HTTP 404" in found.message:
                continue  # not on this index: the next one may have it
            raise found
        _named_safely(entry, found)
        cand = wheels.pick(found, entry.hashes, supported)
        if cand is not None:
            source = index
            break
    if cand is None:
        raise CheckFailed(
            f"{entry.pin}: no wheel for Python {python} / manylinux glibc {glibc} among its locked hashes",
            "builds install wheels only; re-lock for this platform",
        )
    return dataclasses.replace(cand, url=_join(f"{source.rstrip('/')}/{entry.name}/", cand.url))


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
) -> list[FetchedWheel]:
    """Every wheel the lock names for this Python/platform, from the cache when its hash still verifies; ``auth``:
    the configured private indexes' credentials (index_auth.for_indexes of the settings, never of the lock)."""
    index, torch_index, routed = _sources(lock)
    extras = _extras(lock)
    supported = wheels.supported_tags(python, glibc, lock_machine(lock))
    progress = progress or NullProgress()
    require_cache()
    sweep_partials()
    _discarded.clear()  # a new fetch (in a process whose earlier one was stopped: tests, a long-lived caller)
    cancel = threading.Event()

    def one(entry: LockEntry) -> FetchedWheel:
        path = _cached(entry, supported)
        if path is not None:
            if _sha256(path) == path.parent.name:
                return FetchedWheel(entry.name, path, False)
            raise CheckFailed(
                f"cached wheel {path} does not match its hash sha256:{path.parent.name}",
                f"the wheel cache was tampered with; delete {path.parent} and fetch again",
            )
        source = torch_index if routed and is_torch_family(entry.name) else index
        cand = _remote(entry, source, python, glibc, supported, extras=extras, auth=auth)
        dest = wheel_cache() / cand.sha256 / cand.filename
        log(f"downloading {cand.filename}" + (f" ({human_bytes(cand.size)})" if cand.size else ""))
        with activity(progress, cell, f"download {cand.filename}", total=cand.size, unit="B") as act:
            _download(cand, dest, act.advance, cancel, auth=auth)
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
        if dest.is_file():
            if _sha256(dest) != pin.sha256:
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
                _download(cand, dest, act.advance)
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
        if _sha256(dest) == tool.sha256:
            return FetchedWheel(tool.name, dest, False)
        raise CheckFailed(
            f"cached wheel {dest} does not match its hash sha256:{tool.sha256}",
            f"the wheel cache was tampered with; delete {dest.parent} and fetch again",
        )
    cand = wheels.Candidate(tool.filename, tool.url, tool.sha256, tool.size)
    with activity(progress or NullProgress(), cell, f"download {tool.filename}", total=tool.size, unit="B") as act:
        _download(cand, dest, act.advance)
    return FetchedWheel(tool.name, dest, True)


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
    index, torch_index, routed = _sources(lock)
    supported = wheels.supported_tags(python, glibc, lock_machine(lock))

    picks = _load_picks(lock, python, glibc)
    known = len(picks)

    def one(entry: LockEntry) -> tuple[bool, int | None, int, str]:
        path = _cached(entry, supported)
        if path is not None:
            return True, path.stat().st_size, _uncompressed(path), path.parent.name
        if entry.pin in picks:
            sha, size = picks[entry.pin]
            return False, size, int((size or 0) * INSTALL_RATIO), sha
        source = torch_index if routed and is_torch_family(entry.name) else index
        cand = _remote(entry, source, python, glibc, supported, pages, _extras(lock), auth)
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
    )


def read_pages(
    locks: list[tuple[Lock, str, str]], pages: dict, *, jobs: int = 6, auth: index_auth.IndexAuth | None = None
) -> None:
    """Read, once each and concurrently, the index pages that forecasting these (lock, python, glibc) needs:
    the pins the cache cannot serve. A failure is remembered (forecast_lock reports it). Six at a time: each new
    connection is a DNS lookup, and a lost lookup costs the resolver's 5 s timeout."""
    wanted = set()
    for lock, python, glibc in locks:
        index, torch_index, routed = _sources(lock)
        supported = wheels.supported_tags(python, glibc, lock_machine(lock))
        picks = _load_picks(lock, python, glibc)
        for entry in lock.entries:
            if entry.pin not in picks and _cached(entry, supported) is None:
                wanted.add((torch_index if routed and is_torch_family(entry.name) else index, entry.name))

    def one(key: tuple[str, str]) -> None:
        try:
            pages[key] = _candidates(*key, auth)
        except (EnvironmentFailure, CheckFailed, UsageError) as exc:
            pages[key] = exc  # remembered: forecast_lock reports it without asking again

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, sorted(wanted - set(pages))))


def lock_machine(lock: Lock) -> str:
    """The CPU architecture a lock was resolved for (its recorded platform, ``aarch64-manylinux_2_28``); locks from
    before platforms were recorded are x86_64."""
    recorded = str(lock.meta.get("platform") or "")
    return "aarch64" if recorded.startswith("aarch64-") else "x86_64"


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


CONTEXT_HINT = "pass --into a folder of its own (`imagekit render --out DIR` makes one), with no links inside it"


def context_wheels(into: Path, cell_id: str) -> Path:
    """``DIR/<cell>/wheels`` for `fetch --into DIR`, refused when the cell folder or the wheels folder is a link or
    a file (DIR itself may be a link: the user named it). Checked before anything is downloaded."""
    return refuse_links(into / cell_id / "wheels", 2, "--into", CONTEXT_HINT)


def link_wheels(fetched: list[FetchedWheel], directory: Path, files: Mapping[str, str] | None = None) -> Path:
    """A folder holding exactly these wheels as real files (hard links into the cache, else copies), and
    ``files`` (each layer's requirements) beside them, for a BuildKit build context: a context carries symlinks as
    links, so links into the cache would dangle there. Built in a staging folder and swapped in whole; a link at
    ``directory`` or its parent is refused, never followed (`refuse_links`)."""
    refuse_links(directory, 2, "the wheels folder", CONTEXT_HINT)

    def fill(tmp: Path) -> None:
        for name, src in sorted({w.path.name: w.path for w in fetched}.items()):
            try:
                os.link(src, tmp / name)
            except OSError:  # another filesystem: a copy
                shutil.copyfile(src, tmp / name)
        for name, text in sorted((files or {}).items()):
            write_atomic(tmp / name, text)

    replace_folder(directory, fill)
    return directory


def requirements(lock: Lock) -> dict[str, str]:
    """Each layer's requirements file (name -> text): the RUN that installs a layer reads it beside the wheels."""
    from imagekit.image import layering as layers

    return layers.split(lock).requirement_files


def write_requirements(lock: Lock, directory: Path) -> None:
    """Each layer's requirements beside the wheels: the RUN that installs a layer reads them from there."""
    for name, text in requirements(lock).items():
        write_atomic(directory / name, text)


def wheelhouse(fetched: list[FetchedWheel], directory: Path) -> Path:
    """A folder of links to exactly these wheels, for `pip --no-index --find-links`: swapped in whole, never
    through a link at ``directory`` or its parent (`state/wheelhouse/<cell>`)."""
    refuse_links(directory, 2, "the wheelhouse", "remove the link, or pass another --state-dir")

    def fill(tmp: Path) -> None:
        for w in fetched:
            (tmp / w.path.name).symlink_to(w.path)

    replace_folder(directory, fill)
    return directory
