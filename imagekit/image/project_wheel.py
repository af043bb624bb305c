"""The project's own wheel (`[image] install`): what builds it, what it needs from the lock, and how the image
installs it. Pure: `services/builds/project_build.py` reads the files and runs the build.

The wheel is built from the copied code (`[image] copy`, as the code layer holds it: the same files, the same
exclusions) in a container of the cell's base, with no network: the build backend and everything it imports must be
locked wheels of the cell, fetched and checked like every other, or the build is refused naming them. The image
installs the wheel in its code layer, checked by its sha256, with ``--no-deps``: what the project declares it needs
must be in the lock already, at versions its requirements allow, or the build is refused naming each.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from email.parser import HeaderParser

from packaging.markers import InvalidMarker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from imagekit.errors import UsageError
from imagekit.image.code_layer import CodeLayer
from imagekit.model import MACHINES, Cell
from imagekit.trust import untrusted
from imagekit.trust.untrusted import printable

REQUIREMENTS_FILE = "requirements-project.txt"  # the code layer's requirements (the wheel, by its sha256)
# PEP 517's fallback for a project without [build-system] (a setup.py alone); a setuptools older than 70.1 asks for
# `wheel` too, through get_requires_for_build_wheel, which the build then names
LEGACY_BACKEND = "setuptools.build_meta:__legacy__"
LEGACY_REQUIRES = ("setuptools>=40.8.0",)
MAX_WHEEL = 256 << 20  # the project's own code: data and checkpoints belong on the pod's volume
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", re.ASCII)
_BACKEND = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_.]*)?", re.ASCII)
_WHEEL_FILE = re.compile(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(-[0-9][A-Za-z0-9_.]*)?-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+"
                         r"-[A-Za-z0-9_.]+\.whl", re.ASCII)  # fmt: skip
HINT_DEPS = (
    "add them to the cell's packages ([matrix] packages, with the versions the project needs) and run "
    "`imagekit lock`: the image installs the project with --no-deps, from what the lock holds"
)


@dataclass(frozen=True)
class BuildSystem:
    """pyproject.toml's `[build-system]` (or PEP 517's fallback for a setup.py alone)."""

    backend: str  # module[:object]
    requires: tuple[str, ...]
    backend_path: tuple[str, ...] = ()  # in-tree backends, relative to the project folder


@dataclass(frozen=True)
class WheelMetadata:
    name: str
    version: str
    requires: tuple[str, ...]  # Requires-Dist, as written
    requires_python: str | None = None


@dataclass(frozen=True)
class ProjectWheel:
    """The wheel built for an image: its file, sha256 and distribution, and the folder it was built from."""

    filename: str
    sha256: str
    name: str  # canonical
    version: str
    source: str  # `[image] install`, as the matrix file's folder resolves it

    def requirements(self) -> str:
        """The code layer's requirements: the wheel alone, by its pin and sha256 (install-layer: --no-deps)."""
        return f"{self.name}=={self.version} \\\n    --hash=sha256:{self.sha256}\n"

    def to_json(self) -> dict:
        """As the manifest records it: not its sha256 (the code layer's requirements name that, and so the build
        hash), so a code change that keeps the version changes the code layer only, not the app layer's manifest."""
        return {"name": self.name, "version": self.version, "wheel": self.filename, "source": self.source}


def sub_folder(copy_source: str, install: str) -> str:
    """Where ``install`` lies in the copied folder (``.`` for the folder itself); refused outside it."""
    rel = posixpath.relpath(posixpath.normpath(install), posixpath.normpath(copy_source))
    if rel == ".." or rel.startswith("../") or posixpath.isabs(rel):
        raise UsageError(
            f"[image] install: {printable(install, 200)} is not inside the copied folder "
            f"({printable(copy_source, 200)})",
            "the wheel is built from the code `[image] copy` puts in the image: install that folder or one below it",
        )
    return rel


def source_files(code: CodeLayer, sub: str) -> tuple[tuple[str, bytes, int], ...]:
    """The copied files below ``sub``, relative to it: what the wheel is built from."""
    if sub == ".":
        return code.files
    prefix = sub.rstrip("/") + "/"
    return tuple((rel[len(prefix) :], data, mode) for rel, data, mode in code.files if rel.startswith(prefix))


def build_system(files: tuple[tuple[str, bytes, int], ...], where: str) -> BuildSystem:
    """The backend that builds the project and what it needs, from its pyproject.toml (PEP 517/518)."""
    by_name = {rel: data for rel, data, _ in files}
    hint = f"give {where} a pyproject.toml with [build-system] (requires, build-backend), as `pip wheel` needs"
    if "pyproject.toml" not in by_name:
        if "setup.py" in by_name:
            return BuildSystem(LEGACY_BACKEND, LEGACY_REQUIRES)
        raise UsageError(f"[image] install: {where} has no pyproject.toml or setup.py to build a wheel from", hint)
    try:
        doc = untrusted.load_toml(by_name["pyproject.toml"].decode(), f"[image] install: {where}/pyproject.toml")
    except UnicodeDecodeError as exc:
        raise UsageError(f"[image] install: {where}/pyproject.toml is not UTF-8 ({exc.reason})", hint) from None
    except untrusted.UntrustedData as exc:
        raise UsageError(str(exc), hint) from None
    table = doc.get("build-system")
    if table is None:
        return BuildSystem(LEGACY_BACKEND, LEGACY_REQUIRES)
    table = table if isinstance(table, dict) else {}
    requires, paths = table.get("requires"), table.get("backend-path", [])
    backend = table.get("build-backend", LEGACY_BACKEND)
    ok = (
        isinstance(requires, list) and all(isinstance(r, str) for r in requires)
        and isinstance(backend, str) and _BACKEND.fullmatch(backend)
        and isinstance(paths, list) and all(isinstance(p, str) and _inside(p) for p in paths)
    )  # fmt: skip
    if not ok:
        raise UsageError(f"[image] install: {where}/pyproject.toml has an unusable [build-system] table", hint)
    for req in requires:  # type: ignore[union-attr]
        _requirement(req, f"{where}/pyproject.toml [build-system] requires")
    return BuildSystem(backend, tuple(requires), tuple(paths))  # type: ignore[arg-type]


# setuptools 70.1.0 adopted the bdist_wheel command from the wheel project (setuptools' changelog, v70.1.0, #1386:
# https://setuptools.pypa.io/en/stable/history.html#v70-1-0); an older one asks for `wheel` through
# get_requires_for_build_wheel, so a setuptools backend that may be older builds with `wheel` beside it
SETUPTOOLS_OWN_BDIST_WHEEL = Version("70.1")


def build_requires(system: BuildSystem) -> tuple[str, ...]:
    """What the build environment needs before the backend is asked: `[build-system] requires`, and for a setuptools
    backend that may be older than 70.1, `wheel` (SETUPTOOLS_OWN_BDIST_WHEEL)."""
    if not system.backend.startswith("setuptools.") and system.backend != "setuptools":
        return system.requires
    reqs = [Requirement(r) for r in system.requires]
    if any(canonicalize_name(r.name) == "wheel" for r in reqs):
        return system.requires
    floors = [
        Version(s.version.rstrip(".*"))
        for r in reqs
        if canonicalize_name(r.name) == "setuptools"
        for s in r.specifier
        if s.operator in (">=", "==", "~=", "===") and _version_ok(s.version.rstrip(".*"))
    ]
    if floors and max(floors) >= SETUPTOOLS_OWN_BDIST_WHEEL:
        return system.requires
    return (*system.requires, "wheel")


def _version_ok(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def _inside(path: str) -> bool:
    clean = posixpath.normpath(path)
    return not posixpath.isabs(clean) and clean != ".." and not clean.startswith("../") and path.isprintable()


def _requirement(text: str, where: str) -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        raise UsageError(f"{where}: {printable(text, 200)} is not a requirement: {exc}", HINT_DEPS) from None


def marker_env(cell: Cell) -> dict[str, str]:
    """The environment markers of the cell's image (Linux, CPython, its Python and CPU)."""
    machine = MACHINES[cell.platform]
    return {
        "python_version": cell.python,
        "python_full_version": f"{cell.python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": machine,
        "extra": "",
    }


def _applies(req: Requirement, env: Mapping[str, str]) -> bool:
    try:
        return req.marker is None or req.marker.evaluate(dict(env))
    except InvalidMarker:  # pragma: no cover - packaging parsed it already
        return True


def unmet(requirements: Iterable[str], pins: Mapping[str, str], env: Mapping[str, str], where: str) -> list[str]:
    """The requirements (those whose markers hold in ``env``) the locked ``pins`` do not meet, each with why."""
    out = []
    for text in requirements:
        req = _requirement(text, where)
        if not _applies(req, env):
            continue
        name = canonicalize_name(req.name)
        have = pins.get(name)
        if have is None:
            out.append(f"{text} (not in the lock)")
        elif req.specifier and not req.specifier.contains(have, prereleases=True):
            out.append(f"{text} (the lock has {name} {have})")
    return out


def closure(roots: Iterable[str], requires_of: Callable[[str], tuple[str, ...]], env: Mapping[str, str]) -> list[str]:
    """The canonical names of ``roots`` and of every distribution they need, in turn (``requires_of``: the
    Requires-Dist of a locked distribution by its canonical name), sorted. What the build environment holds."""
    seen: set[str] = set()
    todo = [canonicalize_name(Requirement(r).name) for r in roots if _applies(Requirement(r), env)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in requires_of(name):
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue  # another party's metadata: what cannot be read is no requirement here
            if _applies(req, env):
                todo.append(canonicalize_name(req.name))
    return sorted(seen)


def wheel_file_ok(name: str) -> bool:
    """A wheel's file name as PEP 427 writes it (no folder, nothing a path or a requirements file would read
    otherwise)."""
    return bool(_WHEEL_FILE.fullmatch(name))


def parse_metadata(text: str) -> WheelMetadata:
    """A wheel's METADATA (the core metadata headers)."""
    headers = HeaderParser().parsestr(text, headersonly=True)
    name, version = (headers.get("Name") or "").strip(), (headers.get("Version") or "").strip()
    return WheelMetadata(name, version, tuple(r.strip() for r in headers.get_all("Requires-Dist") or ()),
                         (headers.get("Requires-Python") or "").strip() or None)  # fmt: skip


def check_built(meta: WheelMetadata, filename: str, cell: Cell, pins: Mapping[str, str]) -> None:
    """The built wheel may go into the cell's image: a name and version of its own, for the cell's Python, and every
    dependency it declares (for the cell's platform, no extras) locked at a version it allows."""
    where = f"[image] install: the project's wheel {printable(filename, 120)}"
    if not wheel_file_ok(filename) or not _NAME.fullmatch(meta.name):
        raise UsageError(f"{where} has an unusable file name or Name ({printable(meta.name, 80)})",
                         "check the project's name in its pyproject.toml")  # fmt: skip
    try:
        Version(meta.version)
    except InvalidVersion:
        raise UsageError(f"{where} has version {printable(meta.version, 80)!r}, not a PEP 440 version",
                         "check the project's version in its pyproject.toml") from None  # fmt: skip
    name = canonicalize_name(meta.name)
    if name in pins:
        raise UsageError(
            f"{where} is named {meta.name}, as the lock's {name} {pins[name]}: one would replace the other",
            "give the project a name of its own (pyproject.toml [project] name)",
        )
    if meta.requires_python:
        req = _requirement(f"python{meta.requires_python}", f"{where}: Requires-Python")
        if not req.specifier.contains(f"{cell.python}.0", prereleases=True):
            raise UsageError(f"{where} requires Python {meta.requires_python}; the cell {cell.id} has {cell.python}",
                             "build the project for the cells whose Python it supports")  # fmt: skip
    missing = unmet(meta.requires, pins, marker_env(cell), where)
    if missing:
        raise UsageError(f"{where} needs what the lock of {cell.key} does not hold: {'; '.join(missing)}", HINT_DEPS)
