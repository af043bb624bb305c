"""Wheels that are not on an index: PEP 508 direct references to a wheel URL, with the wheel's sha256. Pure.

Prebuilt wheels such as flash-attn's are release assets (``flash-attn @ https://github.com/.../flash_attn-2.7.4.post1
+cu12torch2.5cxx11abiFALSE-cp311-cp311-linux_x86_64.whl#sha256=...``): no index serves them, so they are named by
URL and hash-locked like any other pin. A matrix file may leave the ``#sha256=`` out: `imagekit lock` downloads the
wheel once and records it (services.direct_sources). A wheel committed with the project is named by a relative
``file:`` URL (``deepspeed @ file:wheels/deepspeed-0.19.8-py3-none-any.whl``) and locked by its sha256 the same way.
What a build cannot install reproducibly is refused before anything runs: a source archive (it would be built,
differently on every machine), a VCS reference, a file outside the project, and a wheel whose tags say it cannot run
in the cell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from packaging.markers import InvalidMarker, Marker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from imagekit.errors import UsageError
from imagekit.trust import untrusted, validate

_SHA = re.compile(r"sha256=([0-9a-f]{64})", re.ASCII)
# What the wheel's local version says it was built against, in the spellings real wheels use: flash-attn's
# `+cu12torch2.5cxx11abiFALSE`, PyG's `+pt25cu124` (data.pyg.org: `pt` then torch's major digit and minor digits, as
# their build scripts write them: pt113 = 1.13, pt20 = 2.0, pt210 = 2.10), `+pt2.5cu124` and `+torch2.5cu118`. A `pt`
# right after a letter is part of another word (`opt25`, `script21`), not a torch tag.
_LOCAL_TORCH = re.compile(r"(?:(?<![a-z])pt|torch)([1-9])\.?([0-9]{1,2})(?![0-9])", re.ASCII | re.IGNORECASE)
_LOCAL_CUDA = re.compile(r"cu(\d+)", re.ASCII | re.IGNORECASE)
_LOCAL_ABI = re.compile(r"cxx11abi(true|false)", re.ASCII | re.IGNORECASE)  # the C++ ABI a torch extension links
FIX = (
    "name a prebuilt wheel by URL with its hash (`NAME @ https://.../NAME-VERSION-TAGS.whl#sha256=<hex>`), or "
    "publish a wheel to your own index (`index_url` / `extra_index_urls` in the matrix file)"
)


LOCAL_FIX = (
    "commit the wheel inside the project and name it relative to the matrix file's folder: "
    "`NAME @ file:wheels/NAME-VERSION-TAGS.whl`"
)


class NotAWheel(ValueError):
    """A direct reference a build cannot install as it is; ``hint`` names the fix."""

    def __init__(self, message: str, hint: str = FIX) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class DirectWheel:
    name: str  # canonical
    url: str  # without the fragment
    filename: str
    version: str  # as the file name spells it (what the wheel's METADATA says)
    sha256: str  # hex

    @property
    def reference(self) -> str:
        return f"{self.name} @ {self.url}#sha256={self.sha256}"


def parse(name: str, url: str, *, hashed: bool = True) -> DirectWheel:
    """The direct reference ``name @ url``, checked: an http(s) URL to a wheel file whose name is ``name``, or a
    ``file:`` URL relative to the project (``file:wheels/NAME-VERSION-TAGS.whl``: no host, no absolute path, no
    ``..``), with ``#sha256=<64 hex>``. ``hashed=False`` (what a matrix file may say): the hash may be missing, and
    the wheel's ``sha256`` is then "" (`imagekit lock` learns and records it: services.direct_sources)."""
    shown = untrusted.printable(url, 120)
    if url.startswith(("git+", "hg+", "svn+", "bzr+")):
        raise NotAWheel(f"{name} @ {shown}: a VCS reference is built from source, differently on every machine")
    parts = urlsplit(url)
    if parts.scheme == "file":
        _check_local(name, shown, parts.netloc, parts.path)
    elif parts.scheme not in ("http", "https") or not parts.netloc:
        raise NotAWheel(f"{name} @ {shown}: only http(s) URLs of wheel files, or file: URLs of wheels in the project, "
                        "can be locked")  # fmt: skip
    if parts.username is not None or parts.password is not None:
        raise NotAWheel(
            f"{name} @ {untrusted.printable(parts.hostname or '', 60)}/...: the URL carries a credential, which a "
            "lock would keep",
            "serve it from a private index instead (credentials come from the environment or ~/.netrc)",
        )
    if parts.query:
        raise NotAWheel(
            f"{name} @ {untrusted.printable(parts._replace(query='', fragment='').geturl(), 120)}?...: a URL with a "
            "query (a signed or expiring download link) would keep its signature in the lock and stop working",
            "name the wheel's permanent URL, or serve it from your own index",
        )
    filename = unquote(parts.path.rsplit("/", 1)[-1])
    if not filename.endswith(".whl"):
        shown_file = untrusted.printable(filename, 80) or "no file name"
        raise NotAWheel(f"{name} @ {shown}: not a wheel ({shown_file}); a source archive is built")
    try:
        untrusted.wheel_filename(filename)
        dist, _, _, _ = parse_wheel_filename(filename)
    except (untrusted.UntrustedData, InvalidWheelFilename):
        shown_name = untrusted.printable(filename, 80)
        raise NotAWheel(f"{name} @ {shown}: {shown_name!r} is not a wheel file name (NAME-VERSION-TAGS.whl)") from None
    if canonicalize_name(dist) != canonicalize_name(name):
        raise NotAWheel(f"{name} @ {shown}: the file is a wheel of {dist}, not of {name}")
    sha = _SHA.fullmatch(parts.fragment or "")
    if sha is None and not hashed and not parts.fragment:
        sha = ("", "")  # no hash yet: `imagekit lock` records it
    if sha is None:
        raise NotAWheel(
            f"{name} @ {shown}: no #sha256=<hex> on the URL: what it serves could change",
            f"add the wheel's hash: `sha256sum {filename}` and append #sha256=<hex> to the URL",
        )
    version = filename[:-4].split("-")[1]
    plain = url.split("#", 1)[0] if parts.scheme == "file" else parts._replace(fragment="").geturl()
    return DirectWheel(canonicalize_name(name), plain, filename, version, sha[1])


def _check_local(name: str, shown: str, host: str, path: str) -> None:
    """A ``file:`` URL names a wheel of the project: a relative path below the matrix file's folder."""
    if host or path.startswith("/") or not path:
        raise NotAWheel(f"{name} @ {shown}: a file: URL must be relative to the project (no host, no absolute path)",
                        LOCAL_FIX)  # fmt: skip
    if any(part in ("..", "") for part in unquote(path).split("/")) or "\\" in path:
        raise NotAWheel(f"{name} @ {shown}: a file: URL may not leave the project (`..`, an empty or odd segment)",
                        LOCAL_FIX)  # fmt: skip


def is_local(url: str) -> bool:
    """A wheel of the project (``file:wheels/...whl``), not one on a server."""
    return url.startswith("file:")


def cell_problems(
    wheel: DirectWheel, supported: list, torch: str, cuda: str, cxx11_abi: tuple[bool, str] | None = None
) -> list[str]:
    """Why the wheel cannot run in a cell (``supported``: the image's wheel tags, best first; the cell's torch and
    CUDA versions; ``cxx11_abi``: whether the cell's torch build uses the C++11 ABI and the fact that says so, None
    when no source says), from what its file name says: Python, ABI and platform tags, and the torch, CUDA and C++
    ABI a local version such as ``+cu12torch2.5cxx11abiFALSE`` or ``+pt25cu124`` names."""
    _, _, _, tags = parse_wheel_filename(wheel.filename)
    problems = []
    if not set(tags) & set(supported):
        problems.append(f"its tags ({', '.join(sorted(str(t) for t in tags))}) do not run on this image's Python and "
                        f"platform (best: {supported[0]})")  # fmt: skip
    local = wheel.version.partition("+")[2]
    built_torch = _LOCAL_TORCH.search(local)
    if built_torch and (int(built_torch[1]), int(built_torch[2])) != tuple(int(p) for p in torch.split(".")[:2]):
        problems.append(f"it was built for torch {built_torch[1]}.{built_torch[2]}, the cell has torch {torch}")
    built_cuda = _LOCAL_CUDA.search(local)
    if built_cuda:
        digits = built_cuda[1]
        major = cuda.split(".")[0]
        minor_digits = "".join(cuda.split(".")[:2])
        if digits not in (major, minor_digits):
            problems.append(f"it was built for CUDA {digits}, the cell has CUDA {cuda}")
    built_abi = _LOCAL_ABI.search(local)
    if built_abi and cxx11_abi is not None and (built_abi[1].lower() == "true") != cxx11_abi[0]:
        cell_abi = "the C++11 ABI" if cxx11_abi[0] else "the pre-C++11 ABI"
        problems.append(f"it was built with {built_abi[0]}, the cell's torch {torch} uses {cell_abi} ({cxx11_abi[1]})")
    return problems


def requirement(value: object) -> str:
    """A requirement string (``accelerate==1.2.1``) in canonical form, no control characters; a URL only to a wheel
    (a wheel on no index: this module), its sha256 given or left for `imagekit lock` to record."""
    if not isinstance(value, str) or not value or not validate.SAFE_TEXT.fullmatch(value):
        raise validate.bad("requirement", value, "a single-line requirement such as 'accelerate==1.2.1'")
    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        raise validate.bad("requirement", value, f"a PEP 508 requirement ({exc})") from None
    problem = requirement_problem(req)
    if problem:
        raise UsageError(f"invalid requirement {untrusted.printable(value, 200)!r}: {problem}", REQUIREMENT_HINT)
    if req.url and req.url.startswith("git+"):  # built from the commit's tree (locking/vcs_refs.py)
        return _git_requirement(req)
    if req.url:
        try:
            wheel = parse(req.name, req.url, hashed=False)
        except NotAWheel as exc:
            raise UsageError(f"invalid requirement: {exc}", exc.hint) from None
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        marker = f" ; {req.marker}" if req.marker else ""
        fragment = f"#sha256={wheel.sha256}" if wheel.sha256 else ""
        return f"{wheel.name}{extras} @ {wheel.url}{fragment}{marker}"
    return str(req)


# An image's marker environment, enough to evaluate any marker a requirement may carry (``extra`` added by the caller)
MARKER_ENV = {"python_version": "3.11", "python_full_version": "3.11.0", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython"}  # fmt: skip
REQUIREMENT_HINT = (
    "write a PEP 440 version (torch==2.5.1, numpy>=1.26; arbitrary equality, ===, is refused) and a marker that "
    'compares an environment marker with a value (python_version >= "3.11", platform_machine == "x86_64")'
)


def requirement_problem(req: Requirement) -> str | None:
    """What packaging's grammar lets through but nothing after it can use, or None: a specifier's version that is no
    PEP 440 version (``===2.5.1x``: arbitrary equality, which no axis or resolver question can be asked with) or is
    thousands of digits long, an extra that is no name, a marker that cannot be evaluated in an image's environment
    (``"a" == "a"`` compares no variable)."""
    for spec in req.specifier:
        version = spec.version.removesuffix(".*") if spec.operator in ("==", "!=") else spec.version
        problem = version_problem(version)
        if problem:
            return f"{untrusted.printable(spec.version, 60)} {problem}"
    bad = next((e for e in req.extras if not _EXTRA_NAME.fullmatch(e)), None)
    if bad is not None:
        return f"{untrusted.printable(repr(bad), 60)} is not an extra's name"
    if req.marker is not None and evaluated(req.marker, {**MARKER_ENV, "extra": ""}) is None:
        return "its marker cannot be evaluated in an image's environment"
    return None


_EXTRA_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", re.ASCII)


def version_problem(version: str) -> str | None:
    if len(version) > validate.MAX_VERSION:
        return f"is {len(version)} characters long, not a version"
    try:
        Version(version)
    except InvalidVersion:
        return "is not a PEP 440 version"
    return None


def evaluated(marker: Marker, env: dict[str, str]) -> bool | None:
    """The marker's value in ``env``, or None when it cannot be evaluated there (a comparison of no variable, a
    version compared with a text: packaging raises one of several errors, not all of them ValueError)."""
    try:
        return bool(marker.evaluate(env))
    except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName, ValueError, TypeError):
        return None


def _git_requirement(req: Requirement) -> str:
    """``name @ git+https://host/org/repo@ref`` checked (vcs_refs.parse) and written canonically; a branch or tag is
    refused by `imagekit lock`, with the commit it names today."""
    from imagekit.locking import vcs_refs

    try:
        ref = vcs_refs.parse(req.name, req.url or "")
    except vcs_refs.NotARef as exc:
        raise UsageError(f"invalid requirement: {exc}", exc.hint) from None
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    marker = f" ; {req.marker}" if req.marker else ""
    return f"{canonicalize_name(req.name)}{extras} @ {ref.url}{marker}"
