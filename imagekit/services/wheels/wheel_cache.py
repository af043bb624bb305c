"""The content-addressed wheel cache: where it is, which cached wheel fits a pin, and the downloads into it. Each
download writes in a partial folder of its own, removed when its run is stopped and swept when its run died."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from imagekit.effects import http, index_auth
from imagekit.effects.cache import cache_root, unusable
from imagekit.errors import EnvironmentFailure
from imagekit.locking import wheel_choice as wheels
from imagekit.locking.lockfile import LockEntry
from imagekit.trust import urls


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


def sha256_of(path: Path) -> str:
    """The sha256 of a file in the cache, checked against the name of the folder it lies in."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def cached_wheel(entry: LockEntry, supported: list[str]) -> Path | None:
    """The cached wheel for this pin that fits this image (locks sharing a pin share wheels of other Pythons)."""
    root = wheel_cache()
    found = [
        wheels.Candidate(path.name, str(path), path.parent.name)
        for h in entry.hashes
        for path in (root / h.split(":", 1)[1]).glob("*.whl")
    ]
    hit = wheels.pick(found, entry.hashes, supported)
    return Path(hit.url) if hit is not None else None


PARTIAL = ".partial-"  # a download in progress: wheels/<sha>/.partial-XXXX/{.lock, the temporary file}
STALE_PARTIAL_S = 3600  # a partial download without a lock file (or an older imagekit's) this old is dead
_live: set[Path] = set()  # this process's partial downloads (removed at once when it is interrupted)
_live_lock = threading.Lock()
_discarded = threading.Event()  # set by discard_partials: no download of this process may start after it


class Interrupted(Exception):
    """A download stopped because the fetch was interrupted (SIGINT, SIGTERM, or another download failed)."""


def download(
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
    urls.require_http(
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
    except FileNotFoundError:
        if _discarded.is_set():  # its folder discarded under it: the fetch was interrupted
            raise Interrupted(cand.filename) from None
        raise
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


def allow_downloads() -> None:
    """Let this process download again: a new fetch after `discard_partials` stopped an earlier one."""
    _discarded.clear()


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
