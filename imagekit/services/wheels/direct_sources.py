"""Wheels named outside any index, made hash-locked before the resolver runs (imagekit.locking.direct_wheels).

Two kinds of direct reference in a matrix file need `imagekit lock` to learn a sha256:

- ``NAME @ https://.../NAME-VERSION-TAGS.whl`` without ``#sha256=``: downloaded once into the wheel cache
  (``wheels/<sha256>/<file>``), its hash said on stderr and recorded in the lock. A later lock takes the hash from
  the existing lock's entry for the same URL, else from the cache's note of it (``direct-urls/``): never downloaded
  again. The matrix text, and so the lock's input hash, stays as the user wrote it.
- ``NAME @ file:wheels/NAME-VERSION-TAGS.whl``: a wheel committed with the project, relative to the matrix file's
  folder, read without following a link out of it (a regular file only), copied into the wheel cache under its
  sha256. The lock keeps the relative URL with the hash; `fetch` copies it again from the project on a fresh
  machine, and a build installs exactly those bytes from its wheelhouse, as any locked wheel.

The resolver is handed the cached file (``file:///.../wheels/<sha>/<file>#sha256=...``), so uv reads the bytes just
hashed; its answer is rewritten to the references the lock keeps (:meth:`Sourced.undo`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from packaging.requirements import InvalidRequirement, Requirement

from imagekit.effects import foreign_files, http, resolver
from imagekit.effects.cache import cache_root
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.locking import direct_wheels
from imagekit.locking.lockfile import Lock
from imagekit.locking.resolution import LockRequest, check_direct_wheels
from imagekit.services.progress import human_bytes
from imagekit.services.wheels.wheel_cache import PARTIAL, require_cache, wheel_cache
from imagekit.trust import untrusted, urls

MAX_WHEEL = http.MAX_DOWNLOAD  # what a URL or a project file may hold: no wheel is larger
_SHA = re.compile(r"[0-9a-f]{64}", re.ASCII)
_url_locks: dict[str, threading.Lock] = {}  # cells locked concurrently download a URL once
_url_locks_guard = threading.Lock()


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Sourced:
    """What the resolver is given for a cell's requirements, and how its answer becomes the lock's text."""

    given: dict[str, str] = field(default_factory=dict)  # the cell's requirement -> what the resolver reads
    swaps: tuple[tuple[str, str], ...] = ()  # (the wheel's sha256, the reference the lock keeps)
    changed: bool = False  # a project wheel's bytes are not those the existing lock records

    def undo(self, output: str) -> str:
        """The resolver's output with each cached file's URL replaced by the reference the lock keeps."""
        for sha, reference in self.swaps:
            line = re.compile(
                rf"^(?P<head>[A-Za-z0-9][A-Za-z0-9._-]*(?:\[[^\]\n]*\])?[ \t]*@[ \t]*)file:\S*#sha256={sha}(?=[ \t]|$)",
                re.MULTILINE,
            )
            output = line.sub(lambda m, ref=reference: m["head"] + ref, output)
        return output


def _direct(text: str) -> Requirement | None:
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None
    # a git requirement is no wheel: the wheel-build stage builds it (services/wheels/wheel_builds.py)
    return req if req.url and not req.url.startswith("git+") else None


def _reference(req: Requirement, url: str) -> str:
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    marker = f" ; {req.marker}" if req.marker else ""
    return f"{req.name}{extras} @ {url}{marker}"


def _locked(existing: Lock | None) -> dict[str, str]:
    """URL (no fragment) -> sha256, from the existing lock's direct references."""
    out = {}
    for entry in existing.entries if existing is not None else ():
        if entry.url and "#sha256=" in entry.url:
            url, sha = entry.url.split("#sha256=", 1)
            out[url] = sha
    return out


def prepare(
    req: LockRequest,
    project: Path,
    existing: Lock | None,
    say: Callable[[str], None] | None = None,
) -> Sourced:
    """Each direct reference of the cell's requirements with its sha256: a project wheel hashed and cached, a URL
    without a hash learned (from ``existing``, the cache, else one download), each checked against the cell first
    (its tags: nothing is downloaded for a wheel that cannot run there). Raises UsageError or CheckFailed (with the
    fix) for a wheel that is not what the matrix file says."""
    requirements = tuple(r for r in req.requirements if _direct(r) is not None)
    if not requirements:
        return Sourced()
    check_direct_wheels(req, list(requirements))
    say = say or _stderr
    known = _locked(existing)
    out, swaps, changed = {}, [], False
    for text in requirements:
        req = _direct(text)
        if req is None:
            continue
        wheel = direct_wheels.parse(req.name, req.url or "", hashed=False)
        if direct_wheels.is_local(wheel.url):
            path = import_local(project, wheel)
            sha = path.parent.name
            if wheel.sha256 and sha != wheel.sha256:  # a stated hash is verified, never replaced by the file's own
                raise CheckFailed(
                    f"{wheel.name} @ file:{untrusted.printable(unquote(wheel.url[5:]), 200)} has sha256 {sha}, but "
                    f"the requirement states #sha256={wheel.sha256}",
                    "restore the wheel the requirement names, or state the new file's sha256 after checking where "
                    "it came from",
                )
            if wheel.url not in known or known[wheel.url] != sha:
                say(f"{wheel.name}: recorded sha256:{sha} of {unquote(wheel.url[5:])} (the project's wheel)")
            changed = changed or (wheel.url in known and known[wheel.url] != sha)
        elif wheel.sha256:
            continue
        else:
            path = _learn(wheel, known.get(wheel.url), say)
            sha = path.parent.name
        cached = path.is_file()
        out[text] = _reference(req, f"{path.as_uri() if cached else wheel.url}#sha256={sha}")
        if cached:
            swaps.append((sha, f"{wheel.url}#sha256={sha}"))
    return Sourced(out, tuple(swaps), changed)


class Resolving:
    """A resolver (effects.resolver.Resolver) that reads each direct reference as ``sourced`` gives it (a hash
    appended, the cached file) and answers with the references the lock keeps: the request, and so what the lock
    is checked against, stays the cell's own."""

    def __init__(self, tool: resolver.Resolver, sourced: Sourced) -> None:
        self.tool, self.sourced, self.name = tool, sourced, tool.name

    def version(self) -> str:
        return self.tool.version()

    def compile(
        self,
        req: LockRequest,
        preferences: str | None = None,
        upgrade: tuple[str, ...] = (),
        upgrade_all: bool = False,
        abort: Callable[[], bool] | None = None,
    ) -> str:
        given = replace(req, requirements=tuple(self.sourced.given.get(r, r) for r in req.requirements))
        return self.sourced.undo(self.tool.compile(given, preferences, upgrade, upgrade_all, abort=abort))


def resolving(tool: resolver.Resolver, sourced: Sourced) -> resolver.Resolver:
    return Resolving(tool, sourced) if sourced.given else tool


# ---- wheels committed with the project ---------------------------------------------------------------------------
def import_local(project: Path, wheel: direct_wheels.DirectWheel, want: str | None = None) -> Path:
    """The project's wheel ``wheel`` (``file:wheels/...whl``) in the wheel cache, under its sha256: read from inside
    ``project`` only, never through a link that leads out of it, a regular file only. ``want``: the sha256 the
    lock records, which the file must still have."""
    rel = unquote(wheel.url.split("#", 1)[0][len("file:") :])
    shown = untrusted.printable(rel, 200)
    path = Path(project) / rel
    where = f"the project's folder, {untrusted.printable(str(project), 200)}"
    if not os.path.lexists(path):
        raise UsageError(f"{wheel.name} @ file:{shown}: no such file in {where}", direct_wheels.LOCAL_FIX)
    real = foreign_files.inside(Path(project), path)
    if real is None:
        raise UsageError(
            f"{wheel.name} @ file:{shown} leads out of the project through a link (it is "
            f"{untrusted.printable(str(path.resolve()), 200)})",
            "copy the wheel into the project itself (replace the link by the file)",
        )
    try:
        source = foreign_files.open_regular(real, limit=MAX_WHEEL)
    except foreign_files.Refused as exc:
        raise UsageError(f"{wheel.name} @ file:{shown}: it {exc.why}", direct_wheels.LOCAL_FIX) from None
    with source:
        dest = _store(source, wheel.filename, lambda _: None)
    problem = wheel_problem(dest, wheel)
    if problem:  # said here, by name, not by the resolver as "the cell's pins conflict"
        raise UsageError(
            f"{wheel.name} @ file:{shown} is not a wheel of {wheel.name} {wheel.version}: {problem}",
            "replace it by the wheel itself (`pip wheel` or `python -m build` makes one; a wheel is a zip holding "
            "NAME-VERSION.dist-info/METADATA)",
        )
    sha = dest.parent.name
    if want is not None and sha != want:
        raise CheckFailed(
            f"{wheel.name} @ file:{shown} has sha256 {sha}, the lock records {want}: the file changed since it was "
            "locked",
            "run `imagekit lock` to lock the new file (review and commit the lock), or restore the locked file",
        )
    return dest


_METADATA = ".dist-info/METADATA"


def wheel_problem(path: Path, wheel: direct_wheels.DirectWheel) -> str | None:
    """Why the file at ``path`` is not the wheel its name says (not a zip, no metadata, another name or version), or
    None. Reads the zip's directory and the METADATA file alone (bounded)."""
    import zipfile
    from email.parser import HeaderParser

    from packaging.utils import canonicalize_name, canonicalize_version

    try:
        with zipfile.ZipFile(path) as zf:
            found = [i for i in zf.infolist() if i.filename.count("/") == 1 and i.filename.endswith(_METADATA)]
            if len(found) != 1:
                return "it holds no .dist-info/METADATA" if not found else "it holds more than one .dist-info"
            if found[0].file_size > 4 << 20:
                return "its METADATA is larger than 4 MB"
            text = zf.read(found[0]).decode("utf-8", "replace")
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        return f"it is not a readable zip ({untrusted.printable(str(exc), 120)})"
    meta = HeaderParser().parsestr(text)
    name, version = str(meta.get("Name") or ""), str(meta.get("Version") or "")
    if canonicalize_name(name) != canonicalize_name(wheel.name):
        return f"its metadata names {untrusted.printable(name, 80)!r}"
    if canonicalize_version(version) != canonicalize_version(wheel.version):
        return f"its metadata says version {untrusted.printable(version, 80)!r}"
    return None


def _store(source: BinaryIO, filename: str, on_bytes: Callable[[int], None]) -> Path:
    """``source``'s bytes (at most MAX_WHEEL) as ``wheels/<sha256>/<filename>``, written in a partial folder of its
    own first (swept when a killed run leaves it)."""
    incoming = require_cache() / "incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=PARTIAL, dir=incoming))
    try:
        h, size = hashlib.sha256(), 0
        with open(staging / filename, "wb") as out:
            for block in iter(lambda: source.read(1 << 20), b""):
                size += len(block)
                if size > MAX_WHEEL:
                    raise _TooBig(size)
                h.update(block)
                out.write(block)
                on_bytes(len(block))
        dest = wheel_cache() / h.hexdigest() / filename
        if not dest.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / filename, dest)
        return dest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class _TooBig(Exception):
    pass


# ---- wheel URLs without a hash -----------------------------------------------------------------------------------
def _memo(url: str) -> Path:
    return cache_root() / "direct-urls" / hashlib.sha256(url.encode()).hexdigest()


def _remembered(wheel: direct_wheels.DirectWheel) -> str | None:
    """The sha256 an earlier lock learned for this URL, when its wheel is still in the cache."""
    try:
        sha = foreign_files.read_bytes(_memo(wheel.url), 256).decode("ascii", "replace").strip()
    except foreign_files.Refused:
        return None
    ok = _SHA.fullmatch(sha) and (wheel_cache() / sha / wheel.filename).is_file()
    return sha if ok else None


def _learn(wheel: direct_wheels.DirectWheel, locked: str | None, say: Callable[[str], None]) -> Path:
    """``wheels/<sha256>/<file>`` of a URL given without a hash (the path may not exist when the sha256 came from
    the existing lock and the cache lacks the wheel: the resolver then reads the URL, its hash fixed)."""
    if locked:
        return wheel_cache() / locked / wheel.filename
    with _url_locks_guard:
        lock = _url_locks.setdefault(wheel.url, threading.Lock())
    with lock:
        sha = _remembered(wheel)
        if sha:
            return wheel_cache() / sha / wheel.filename
        dest, size, final = _download(wheel, say)
        memo = _memo(wheel.url)
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(dest.parent.name + "\n")
        os.replace(tmp, memo)
    via = ""
    if urls.origin(final) != urls.origin(wheel.url):
        via = f", served by {untrusted.printable(urlsplit(final).hostname or '', 100)} after a redirect"
    say(f"{wheel.name}: recorded sha256:{dest.parent.name} of {wheel.filename} (downloaded once, {human_bytes(size)}"
        f"{via})")  # fmt: skip
    return dest


def _download(wheel: direct_wheels.DirectWheel, say: Callable[[str], None]) -> tuple[Path, int, str]:
    """The wheel at ``wheel.url`` into the cache: (its path, its size, the URL that served it). Redirects are
    followed only to http(s), never with a credential (effects.http.stream); more than MAX_WHEEL bytes is refused."""
    import httpx

    shown = urls.display(wheel.url)
    say(f"{wheel.name}: downloading {wheel.filename} once to record its sha256")
    size = 0

    def count(n: int) -> None:
        nonlocal size
        size += n

    try:
        with http.stream(
            "GET", wheel.url, headers={"Accept-Encoding": "identity"}, timeout=httpx.Timeout(120.0, connect=10.0)
        ) as resp:
            if resp.status_code != 200:
                raise EnvironmentFailure(f"cannot download {shown}: HTTP {resp.status_code}", "check the wheel's URL")
            declared = resp.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > MAX_WHEEL:
                raise _TooBig(int(declared))
            dest = _store(_Body(resp.iter_bytes(1 << 20)), wheel.filename, count)
            return dest, size, str(resp.url)
    except _TooBig:
        raise CheckFailed(
            f"{wheel.name} @ {shown} serves more than {MAX_WHEEL} bytes: no wheel is that large; nothing was kept",
            "check the URL: it must name the wheel file itself",
        ) from None
    except httpx.HTTPError as exc:
        raise EnvironmentFailure(
            f"cannot download {shown}: {untrusted.printable(str(exc), 200)}", "check network access to it"
        ) from None


class _Body:
    """An answer's blocks as a file's ``read``."""

    def __init__(self, blocks) -> None:  # type: ignore[no-untyped-def]
        self._blocks = iter(blocks)

    def read(self, _n: int = -1) -> bytes:
        return next(self._blocks, b"")
