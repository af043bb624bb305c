"""The resolver behind one interface (:class:`Resolver`; pip-tools' ``BaseRepository`` is the model): uv (the
default) or pip-tools, each a class, run as subprocesses via effects.process. :func:`for_settings` picks one by
``LockSettings.resolver``; the lock use case knows only the interface."""

from __future__ import annotations

import os
import re
import shutil
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Protocol

from imagekit.effects import http, process
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.locking.resolution import CONSTRAINTS_FILE, LockRequest, LockSettings, constraints_text
from imagekit.trust.redact import redact, redact_text

_NETWORK_SIGNS = (
    "Failed to fetch",
    "error sending request",
    "dns error",
    "Could not connect",
    "failed to lookup",
    "Connection refused",
    "timed out",
    "Name or service not known",
    "tcp connect error",
)
# An index that answers, but not with a package page: refused credentials, an error status, HTML or other JSON.
_INDEX_SIGNS = (
    "401 Unauthorized",
    "403 Forbidden",
    "lack of valid authentication credentials",
    "HTTP status client error",
    "HTTP status server error",
    "Received some unexpected JSON",
    "Received some unexpected HTML",
)


class IndexUnreachable(EnvironmentFailure):
    """An index a resolution needs did not answer a probe: one error shared by every cell that needs it."""


PROBE_TIMEOUT_S = 5.0  # an index that does not answer a HEAD request in this long is unreachable
_probes: dict[str, IndexUnreachable | None] = {}
_probe_locks: dict[str, threading.Lock] = {}
_probes_guard = threading.Lock()


def index_urls(req: LockRequest) -> list[str]:
    """Every index the resolution of ``req`` reads: the main one, the extra ones, the PyTorch variant index."""
    urls = [req.settings.index_url, *req.settings.extra_index_urls]
    if req.routed and req.torch_index:
        urls.append(req.torch_index)
    return list(dict.fromkeys(urls))


def unreachable_index(req: LockRequest) -> IndexUnreachable | None:
    """The failure of the first index ``req`` needs that cannot be reached, found before any resolver runs.

    Each URL is probed at most once per process (concurrent cells wait for the one probe, `build` re-locking
    stale cells reuses it), and every cell needing an unreachable URL gets the same error object, so a caller can
    report it once."""
    for url in index_urls(req):
        with _probes_guard:
            lock = _probe_locks.setdefault(url, threading.Lock())
        with lock:
            if url not in _probes:
                why = http.unreachable(url, PROBE_TIMEOUT_S)
                _probes[url] = None if why is None else _unreachable(req, url, why)
        if _probes[url] is not None:
            return _probes[url]
    return None


def _unreachable(req: LockRequest, url: str, why: str) -> IndexUnreachable:
    shown = redact(url)
    if url == req.torch_index:
        return IndexUnreachable(
            f"cannot reach the PyTorch index {shown}: {redact_text(why)}",
            f"check the network and proxy settings (HTTPS_PROXY, NO_PROXY); pass --torch-index-url BASE for a "
            f"reachable mirror (BASE/{req.cell.variant} is read), or --source pypi to select only the cells whose "
            "torch is on PyPI",
        )
    flag = "--index-url" if url == req.settings.index_url else "--extra-index-url"
    return IndexUnreachable(
        f"cannot reach the package index {shown}: {redact_text(why)}",
        f"check the network and proxy settings (HTTPS_PROXY, NO_PROXY), or pass {flag} URL for a reachable mirror",
    )


def uv_binary() -> str:
    """uv ships as a declared dependency (the `uv` wheel); find its binary next to this interpreter first."""
    scripts = Path(sysconfig.get_path("scripts"))
    for candidate in (scripts / "uv", Path(sys.executable).parent / "uv"):
        if candidate.is_file():
            return str(candidate)
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found]

        return find_uv_bin()
    except ImportError:
        found = shutil.which("uv")
        if found:
            return found
    raise EnvironmentFailure("uv is not installed", "pip install imagekit (uv is one of its dependencies)")


@cache
def uv_version() -> str:
    res = process.run([uv_binary(), "--version"], timeout=30)
    return res.stdout.strip() or "uv"


_AUTH = re.compile(
    r"lack of valid authentication credentials \((?P<status>\d{3})[^)]*\)|\b(?P<code>401|403) (Unauthorized|Forbidden)"
)


# uv's words for a conflict that goes through an axis of the matrix: "Because transformers>=5.25.0 depends on
# huggingface-hub>=2.4.0,<3.0 and imagekit-cell depends on transformers==5.25.0, ..."
_AXIS_CONFLICT = re.compile(r"(?:Because |and )(?P<name>torch|transformers)(?:[<>=!~][^\s,]*)? depends on ")

# uv's words for a wheel named by URL or path that is no wheel of that name: "Failed to read `x @ file:///...`"
_UNREADABLE = re.compile(r"Failed to read `(?P<what>[^`\n]{1,400})`")

# uv's words for a requirement that only an sdist meets (with --only-binary :all:)
_NO_WHEEL = re.compile(r"(?:Because |and )(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)[^\n]*? has no usable wheels")
# and its hint, one per package: "hint: Wheels are required for `deepspeed` because building from source is disabled"
_WHEELS_REQUIRED = re.compile(r"Wheels are required for `(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,99})`")


class NoWheel(CheckFailed):
    """A resolution that needs a release published as a source archive only; ``names``: the packages uv named."""

    def __init__(self, message: str, hint: str, names: tuple[str, ...]) -> None:
        super().__init__(message, hint)
        self.names = names


def _fail(req: LockRequest, stderr: str) -> Exception:
    text = redact_text(stderr.strip())
    tail = "\n".join(text.splitlines()[-12:])
    auth = _AUTH.search(text)
    if auth:  # uv words a refused index as "not found ... unsatisfiable": it is the environment, not the pins
        status = auth["status"] or auth["code"]
        return EnvironmentFailure(
            f"{req.cell.id}: the package index refused access (HTTP {status}):\n{tail}",
            "give the index's credentials: IMAGEKIT_INDEX_USER and IMAGEKIT_INDEX_PASSWORD (for the indexes the "
            "matrix file or --index-url names), or a ~/.netrc entry for its host; imagekit never writes them into a "
            "lock",
        )
    if any(sign in text for sign in _INDEX_SIGNS):
        return EnvironmentFailure(
            f"{req.cell.id}: the package index refused or garbled the request:\n{tail}",
            "check the index URL and its credentials (https://USER:TOKEN@host/simple, or a netrc); "
            "a private mirror must serve the PEP 503/691 simple API",
        )
    if any(sign in text for sign in _NETWORK_SIGNS):
        index = redact(req.torch_index) if req.torch_index and (req.torch_index.split("/")[2] in text) else None
        index = index or redact(req.settings.index_url)
        hint = (
            f"the index {index} is unreachable from here; cells on the {req.cell.variant} variant need it. "
            "Run `imagekit lock` where it is reachable (CI with index access), or point --torch-index-url / "
            "--index-url at a reachable mirror"
        )
        return EnvironmentFailure(f"{req.cell.id}: cannot reach the package index:\n{tail}", hint)
    unreadable = _UNREADABLE.search(text)
    if unreadable:  # the file is wrong, not the pins
        return CheckFailed(
            f"{req.cell.id}: uv could not read {unreadable['what']}, a wheel the requirements name:\n{tail}",
            "a wheel named by URL or path must be a wheel of that name and version (a zip holding "
            "NAME-VERSION.dist-info/METADATA whose Name and Version are the file name's): replace the file",
        )
    named = [m["name"] for m in _WHEELS_REQUIRED.finditer(text)] or [m["name"] for m in _NO_WHEEL.finditer(text)]
    if named:  # --only-binary: a version with an sdist only is not installable in an image
        from packaging.utils import canonicalize_name

        from imagekit.locking import direct_wheels, source_builds

        names = tuple(dict.fromkeys(canonicalize_name(n) for n in named))
        return NoWheel(
            f"{req.cell.id}: {', '.join(names)} {'has' if len(names) == 1 else 'have'} no wheel for Python "
            f"{req.cell.python} on {req.platform} (images install wheels only; a source build differs on every "
            f"machine):\n{tail}",
            f"{source_builds.from_source_hint(names)}; or {direct_wheels.FIX.replace('NAME', names[0])}",
            names,
        )
    axis = _AXIS_CONFLICT.search(text)
    if axis:  # the axis is the matrix's choice (init takes the newest release a range allows): another may fit
        name = axis["name"]
        version = req.cell.torch if name == "torch" else req.cell.transformers
        return CheckFailed(
            f"{req.cell.id}: no resolution:\n{tail}",
            f"the cell's {name} {version} (an axis of the matrix) requires what the other requirements exclude "
            f"(uv's reason above): choose a {name} release that fits them in the matrix file's `{name}` axis "
            f"(or `imagekit init --from FILE --{name} VERSION`)",
        )
    return CheckFailed(
        f"{req.cell.id}: no resolution:\n{tail}", "the cell's pins conflict; `imagekit explain` may say why"
    )


def compile_uv(
    req: LockRequest,
    preferences: str | None = None,
    upgrade: tuple[str, ...] = (),
    upgrade_all: bool = False,
    timeout: float = 900,
    abort: Callable[[], bool] | None = None,
) -> str:
    """Resolve ``req`` with uv; ``preferences`` (an earlier lock's text) keeps pins that need not move; ``abort``
    stops it (process.Aborted) when it answers True."""
    with tempfile.TemporaryDirectory(prefix="imagekit-lock-") as tmp:
        work = Path(tmp)
        (work / "pyproject.toml").write_text(req.pyproject())
        (work / CONSTRAINTS_FILE).write_text(constraints_text(req))
        args = [uv_binary(), *req.uv_args(), "-o", "out.txt"]
        env = _netrc_env(req, work)
        if preferences:
            (work / "out.txt").write_text(preferences)
        for name in upgrade:
            args += ["--upgrade-package", name]
        if upgrade_all:
            args.append("--upgrade")
        res = process.run(args, cwd=work, env=env, timeout=timeout, abort=abort)
        if not res.ok:
            raise _fail(req, res.stderr)
        return (work / "out.txt").read_text()


def _netrc_env(req: LockRequest, work: Path) -> dict[str, str] | None:
    """A netrc of this run's own for the private indexes' environment credentials (imagekit.effects.index_auth),
    so that none is on the resolver's command line; None when the resolver's own netrc lookup is all there is."""
    from imagekit.effects import index_auth

    text = index_auth.for_indexes([req.settings.index_url, *req.settings.extra_index_urls]).netrc_text()
    if text is None:
        return None
    path = work / "netrc"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return {"NETRC": str(path)}


def compile_pip_tools(req: LockRequest, timeout: float = 3600, abort: Callable[[], bool] | None = None) -> str:
    """pip-compile, for teams that require it: only where the host is the target (it cannot cross-resolve)."""
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    if req.routed:
        raise UsageError(
            f"{req.cell.id}: --resolver pip-tools cannot pin torch to the PyTorch index",
            "use the default uv resolver for non-default CUDA variants",
        )
    if host != req.cell.python or sys.platform != "linux":
        raise UsageError(
            f"{req.cell.id}: pip-tools resolves for the host (Python {host}, {sys.platform}), "
            f"not the image (Python {req.cell.python}, Linux)",
            "use the default uv resolver",
        )
    pip_compile = Path(sysconfig.get_path("scripts")) / "pip-compile"
    if not pip_compile.is_file():
        raise EnvironmentFailure("pip-compile is not installed", "pip install 'imagekit[pip-tools]'")
    with tempfile.TemporaryDirectory(prefix="imagekit-lock-") as tmp:
        work = Path(tmp)
        (work / CONSTRAINTS_FILE).write_text(constraints_text(req))
        held = [f"-c {CONSTRAINTS_FILE}"] if req.constraints else []
        (work / "requirements.in").write_text("\n".join([*req.requirements, *held]) + "\n")
        args = [
            str(pip_compile),
            "--generate-hashes",
            "--no-header",
            "--quiet",
            "--pip-args=--only-binary=:all:",
            "--index-url",
            req.settings.index_url,
            "-o",
            "out.txt",
            "requirements.in",
        ]
        res = process.run(args, cwd=work, timeout=timeout, abort=abort)
        if not res.ok:
            raise _fail(req, res.stderr)
        return (work / "out.txt").read_text()


class Resolver(Protocol):
    """What the lock use case needs of a resolver: its name and version (the lock header records them), and one
    resolution of a :class:`LockRequest` to ``uv pip compile``-style output (hash-pinned requirements).
    ``preferences`` (an earlier lock's text) keeps pins that need not move; ``abort`` stops it
    (:class:`process.Aborted`) when it answers True. A resolver that cannot honour a request raises UsageError."""

    name: str

    def version(self) -> str: ...
    def compile(
        self,
        req: LockRequest,
        preferences: str | None = None,
        upgrade: tuple[str, ...] = (),
        upgrade_all: bool = False,
        abort: Callable[[], bool] | None = None,
    ) -> str: ...


class UvResolver:
    """uv: cross-resolves for the image's platform and Python; torch's variant index as a source."""

    name = "uv"

    def version(self) -> str:
        return uv_version()

    def compile(
        self,
        req: LockRequest,
        preferences: str | None = None,
        upgrade: tuple[str, ...] = (),
        upgrade_all: bool = False,
        abort: Callable[[], bool] | None = None,
    ) -> str:
        return compile_uv(req, preferences, upgrade, upgrade_all, abort=abort)


class PipToolsResolver:
    """pip-compile, for teams that require it: only where the host is the target, PyPI-default torch only; it
    takes no preferences (each lock is resolved anew)."""

    name = "pip-tools"

    def version(self) -> str:
        return "pip-tools"

    def compile(
        self,
        req: LockRequest,
        preferences: str | None = None,
        upgrade: tuple[str, ...] = (),
        upgrade_all: bool = False,
        abort: Callable[[], bool] | None = None,
    ) -> str:
        return compile_pip_tools(req, abort=abort)


RESOLVERS: dict[str, Resolver] = {"uv": UvResolver(), "pip-tools": PipToolsResolver()}


def for_settings(settings: LockSettings) -> Resolver:
    """The resolver ``settings.resolver`` names."""
    try:
        return RESOLVERS[settings.resolver]
    except KeyError:
        raise UsageError(f"invalid --resolver {settings.resolver!r}", f"use {' or '.join(RESOLVERS)}") from None
