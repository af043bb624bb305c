"""What a package index lists for a lock's pins: its pages read and checked, and the one wheel to download for a pin.
Also the indexes a lock names (main, torch, extras) and the machine it was resolved for."""

from __future__ import annotations

import dataclasses
from html.parser import HTMLParser
from typing import Any

from imagekit.effects import http, index_auth
from imagekit.errors import CheckFailed, EnvironmentFailure, ImagekitError, UsageError
from imagekit.locking import direct_wheels
from imagekit.locking import wheel_choice as wheels
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.trust import untrusted, urls


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def _join(base: str, href: str) -> str:
    return urls.join(base, href)  # an href that is no URL stays as it is: refused by urls.require_http when picked


def _filename(url: str) -> str:
    return urls.filename(url)


def _from_json(base: str, raw: bytes) -> list[wheels.Candidate]:
    """PEP 691 files; PEP 700's ``size`` kept when declared and plausible (0 to `http.MAX_DOWNLOAD`); a sha256 that
    is not 64 hex digits is none (it matches no locked hash)."""
    hint = "check the index URL: it must be a PEP 691/503 index"
    try:
        page: Any = untrusted.load_json(raw, f"the index page {urls.display(base)}")
    except untrusted.UntrustedData as exc:
        raise EnvironmentFailure(str(exc), hint) from None
    files = page.get("files") if isinstance(page, dict) else None
    if not isinstance(files, list):
        raise EnvironmentFailure(f"the index page {urls.display(base)} has no list of files", "check the index URL")
    out = []
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("filename"), str) or not isinstance(f.get("url"), str):
            raise EnvironmentFailure(
                f"the index page {urls.display(base)} lists a file without a filename or url", "check the index"
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


def candidates(index: str, name: str, auth: index_auth.IndexAuth | None = None) -> list[wheels.Candidate]:
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


def index_sources(lock: Lock) -> tuple[str, str, bool]:
    """(the lock's index, its torch index, whether the torch family is routed there), each an http(s) URL; an index
    line edited by hand (not the one the lock was resolved against) is refused."""
    index = lock.meta.get("index", "https://pypi.org/simple")
    recorded = _recorded_index(lock)
    if recorded is not None and recorded != index:
        raise CheckFailed(
            f"the lock's index line ({urls.display(index)}) is not the index it was resolved against "
            f"({urls.display(recorded)}): edited by hand",
            "run `imagekit lock` to rewrite the lock",
        )
    torch_index = lock.meta.get("torch-index", "")
    routed = torch_index.startswith("http")
    for url in (index, torch_index, *extra_indexes(lock)) if routed else (index, *extra_indexes(lock)):
        urls.require_http(
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


def extra_indexes(lock: Lock) -> tuple[str, ...]:
    """The lock's extra indexes (from its recorded settings): a pin the main index lacks is looked up there."""
    from imagekit.locking import resolution

    try:
        urls = resolution.recorded_settings(lock).get("extra_index_urls") or []
    except CheckFailed:
        return ()
    return tuple(u for u in urls if isinstance(u, str))


def lock_machine(lock: Lock) -> str:
    """The CPU architecture a lock was resolved for (its recorded platform, ``aarch64-manylinux_2_28``); locks from
    before platforms were recorded are x86_64."""
    recorded = str(lock.meta.get("platform") or "")
    return "aarch64" if recorded.startswith("aarch64-") else "x86_64"


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


def remote_wheel(
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
        if direct_wheels.is_local(wheel.url):
            raise CheckFailed(
                f"{entry.spec}: the project's wheel is not in the wheel cache",
                "run `imagekit lock` or `imagekit fetch` in the project (with its --matrix): they copy the project's "
                "wheels into the cache",
            )
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
                found = candidates(index, entry.name, auth)
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
