"""Wheelhouse: download every locked wheel once into a content-addressed cache, verifying each hash."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx

from imagekit import wheels
from imagekit.effects import http
from imagekit.effects.cache import cache_root
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
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


def _join(base: str, href: str) -> str:
    try:
        return str(httpx.URL(base).join(href))
    except httpx.InvalidURL:
        return href  # refused by _require_http when picked


def _filename(url: str) -> str:
    try:
        return httpx.URL(url).path.rsplit("/", 1)[-1]  # decoded: %2B -> +
    except httpx.InvalidURL:
        return ""


def _from_json(base: str, raw: bytes) -> list[wheels.Candidate]:
    """PEP 691 files; PEP 700's ``size`` kept when declared."""
    page: Any = http.parse_json(raw, f"the index page {base}", "check the index URL: it must be a PEP 691/503 index")
    files = page.get("files") if isinstance(page, dict) else None
    if not isinstance(files, list):
        raise EnvironmentFailure(f"the index page {base} has no list of files", "check the index URL")
    out = []
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("filename"), str) or not isinstance(f.get("url"), str):
            raise EnvironmentFailure(f"the index page {base} lists a file without a filename or url", "check the index")
        hashes = f.get("hashes") if isinstance(f.get("hashes"), dict) else {}
        size = f.get("size")
        declared = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
        out.append(wheels.Candidate(f["filename"], _join(base, f["url"]), str(hashes.get("sha256", "")), declared))
    return out


def _candidates(index: str, name: str) -> list[wheels.Candidate]:
    """Files of a project from a PEP 691 (JSON) or PEP 503 (HTML, sha256 in the URL fragment) index page."""
    base = f"{index.rstrip('/')}/{name}/"
    raw = http.get(base, accept=http.SIMPLE_JSON + ", text/html;q=0.1")
    if raw.lstrip().startswith(b"{"):
        return _from_json(base, raw)
    parser = _Links()
    parser.feed(raw.decode("utf-8", "replace"))
    out = []
    for href in parser.hrefs:
        url, _, fragment = href.partition("#")
        sha = fragment.split("=", 1)[1] if fragment.startswith("sha256=") else ""
        out.append(wheels.Candidate(_filename(_join(base, url)), _join(base, url), sha))
    return out


def _download(cand: wheels.Candidate, dest: Path) -> None:
    """The wheel into the cache: http(s) only, no larger than the index declares (or http.MAX_DOWNLOAD)."""
    http.require_http(
        cand.url,
        f"the index lists {cand.filename} at",
        EnvironmentFailure,
        "an index may only point at http(s) files; use another index",
    )
    http.download(
        cand.url, dest, sha256=cand.sha256, max_bytes=cand.size if cand.size is not None else http.MAX_DOWNLOAD
    )


def fetch_lock(
    lock: Lock, python: str, glibc: str, *, jobs: int = 4, log: Callable[[str], None] = lambda _: None
) -> list[FetchedWheel]:
    """Every wheel the lock names for this Python/platform, from the cache when its hash still verifies."""
    index = lock.meta.get("index", "https://pypi.org/simple")
    torch_index = lock.meta.get("torch-index", "")
    routed = torch_index.startswith("http")
    for url in (index, torch_index) if routed else (index,):
        http.require_http(
            url, "the lock's index", UsageError, "fetch downloads from http(s) indexes; re-lock against one"
        )
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
        _download(cand, dest)
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
