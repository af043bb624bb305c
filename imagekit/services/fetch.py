"""Wheelhouse: download every locked wheel once into a content-addressed cache, verifying each hash."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin

from imagekit import wheels
from imagekit.effects import http
from imagekit.effects.cache import cache_root
from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.lockfile import Lock, LockEntry
from imagekit.locking import is_torch_family


@dataclass(frozen=True)
class FetchedWheel:
    name: str
    path: Path
    downloaded: bool


def wheel_cache() -> Path:
    return cache_root() / "wheels"


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


def _candidates(index: str, name: str) -> list[wheels.Candidate]:
    """Files of a project from a PEP 691 (JSON) or PEP 503 (HTML, sha256 in the URL fragment) index page."""
    base = f"{index.rstrip('/')}/{name}/"
    raw = http.get(base, accept=http.SIMPLE_JSON + ", text/html;q=0.1")
    if raw.lstrip().startswith(b"{"):
        page = json.loads(raw)
        return [
            wheels.Candidate(f["filename"], urljoin(base, f["url"]), f.get("hashes", {}).get("sha256", ""))
            for f in page.get("files", [])
        ]
    parser = _Links()
    parser.feed(raw.decode("utf-8", "replace"))
    out = []
    for href in parser.hrefs:
        url, _, fragment = href.partition("#")
        sha = fragment.split("=", 1)[1] if fragment.startswith("sha256=") else ""
        out.append(wheels.Candidate(unquote(url.rsplit("/", 1)[-1]), urljoin(base, url), sha))
    return out


def _download(url: str, dest: Path, sha256: str) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".download-")
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=120) as resp:
            for block in iter(lambda: resp.read(1 << 20), b""):
                h.update(block)
                out.write(block)
        if h.hexdigest() != sha256:
            raise CheckFailed(
                f"{url} has sha256 {h.hexdigest()}, the lock says {sha256}",
                "the index served different bytes than it listed; do not build from it",
            )
        os.replace(tmp, dest)
    except (urllib.error.URLError, OSError) as exc:
        raise EnvironmentFailure(f"cannot download {url}: {exc}", "check network access to the index") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def fetch_lock(
    lock: Lock, python: str, glibc: str, *, jobs: int = 4, log: Callable[[str], None] = lambda _: None
) -> list[FetchedWheel]:
    """Every wheel the lock names for this Python/platform, from the cache when its hash still verifies."""
    index = lock.meta.get("index", "https://pypi.org/simple")
    torch_index = lock.meta.get("torch-index", "")
    routed = torch_index.startswith("http")
    supported = wheels.supported_tags(python, glibc)

    def one(entry: LockEntry) -> FetchedWheel:
        # a cache hit must fit this image too: locks that share a pin share cached wheels of other Pythons
        cached = [
            wheels.Candidate(path.name, str(path), path.parent.name)
            for h in entry.hashes
            for path in (wheel_cache() / h.split(":", 1)[1]).glob("*.whl")
        ]
        hit = wheels.pick(cached, entry.hashes, supported)
        if hit is not None:
            path = Path(hit.url)
            if _sha256(path) == hit.sha256:
                return FetchedWheel(entry.name, path, False)
            raise CheckFailed(
                f"cached wheel {path} does not match its hash sha256:{hit.sha256}",
                f"the wheel cache was tampered with; delete {path.parent} and fetch again",
            )
        source = torch_index if routed and is_torch_family(entry.name) else index
        cand = wheels.pick(_candidates(source, entry.name), entry.hashes, supported)
        if cand is None:
            raise CheckFailed(
                f"{entry.pin}: no wheel for Python {python} / manylinux glibc {glibc} among its locked hashes",
                "builds install wheels only; re-lock for this platform",
            )
        dest = wheel_cache() / cand.sha256 / cand.filename
        log(f"downloading {cand.filename}")
        _download(cand.url, dest, cand.sha256)
        return FetchedWheel(entry.name, dest, True)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, lock.entries))


def wheelhouse(fetched: list[FetchedWheel], directory: Path) -> Path:
    """A folder of links to exactly these wheels, for `pip --no-index --find-links`."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():
        old.unlink()
    for w in fetched:
        (directory / w.path.name).symlink_to(w.path)
    return directory
