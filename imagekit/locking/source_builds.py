"""What has no wheel, built once into a hash-locked wheel: which source archive, what the build needs, how it is
named in a lock and how a build is keyed. Pure.

Images install wheels only (a source build differs on every machine), so a package published as a source archive
alone (deepspeed) is built once, in a container of the cell's own base with the network off, and the wheel it gives
is locked by its sha256 like any other. The matrix names such packages (``[matrix] from_source``): building runs the
package's own setup code, which a lock should not do behind the user's back; the lock's refusal of an sdist-only
package says how to opt in. The lock records the input (the archive's URL and sha256, the build requirements' pins)
beside the wheel's sha256, so a machine without the wheel in its cache builds the same wheel again from the lock.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from imagekit.errors import CheckFailed, UsageError
from imagekit.locking import wheel_choice as wheels
from imagekit.trust import untrusted

BUILDER = 1  # the build script's version: a new one builds again
META_PREFIX = "built-"  # `# imagekit-built-<name>: {json}` in a lock's header
# PEP 517's fallback for a project without [build-system] (setuptools' legacy backend)
DEFAULT_REQUIRES = ("setuptools>=40.8.0", "wheel")
SOURCE_DATE_EPOCH = "315532800"  # 1980-01-01, the earliest date a zip can hold: every build writes the same times
_SHA = re.compile(r"[0-9a-f]{64}", re.ASCII)
_PIN = re.compile(r"(?P<name>[a-z0-9][a-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!_-]+) sha256:(?P<sha>[0-9a-f]{64})")
HINT = "add the package to `from_source` in [matrix] to build it once from its source archive, with the network off"


@dataclass(frozen=True)
class Sdist:
    name: str  # canonical
    version: str
    filename: str
    url: str
    sha256: str


@dataclass(frozen=True)
class Built:
    """A wheel built from a source archive, as the lock records it."""

    name: str  # canonical
    version: str
    sdist: str  # the archive's URL
    sdist_sha256: str
    wheel: str  # the built wheel's file name
    wheel_sha256: str
    requires: tuple[str, ...]  # the build requirements' pins: "name==version sha256:<hex>", sorted

    def meta(self) -> tuple[str, str]:
        """The lock header's key and value (one line of JSON)."""
        doc = {
            "version": self.version,
            "sdist": self.sdist,
            "sdist-sha256": self.sdist_sha256,
            "wheel": self.wheel,
            "wheel-sha256": self.wheel_sha256,
            "requires": list(self.requires),
        }
        return META_PREFIX + self.name, json.dumps(doc, sort_keys=True, separators=(",", ":"))


def recorded(meta: dict[str, str]) -> dict[str, Built]:
    """The built wheels a lock's header records, each checked (a lock is read back from disk: its words are data)."""
    out = {}
    for key, value in sorted(meta.items()):
        if key.startswith(META_PREFIX):
            built = _parse_meta(key[len(META_PREFIX) :], value)
            out[built.name] = built
    return out


def _parse_meta(name: str, value: str) -> Built:
    bad = CheckFailed(
        f"the lock's record of {untrusted.printable(name, 60)} built from source is unreadable",
        "never build from it: run `imagekit lock` to write it again",
    )
    try:
        doc = untrusted.load_json(value, "the record", max_bytes=1 << 16, max_depth=4)
    except untrusted.UntrustedData:
        raise bad from None
    if not isinstance(doc, dict) or canonicalize_name(name) != name:
        raise bad
    fields = ("version", "sdist", "sdist-sha256", "wheel", "wheel-sha256")
    if not all(isinstance(doc.get(f), str) for f in fields) or not isinstance(doc.get("requires"), list):
        raise bad
    if not (_SHA.fullmatch(doc["sdist-sha256"]) and _SHA.fullmatch(doc["wheel-sha256"])):
        raise bad
    if not all(isinstance(r, str) and _PIN.fullmatch(r) for r in doc["requires"]):
        raise bad
    if not doc["sdist"].startswith(("https://", "http://", "git+https://", "git+http://")):
        raise bad
    if not wheel_named(doc["wheel"], name, doc["version"]) or not doc["version"]:
        raise bad
    return Built(name, doc["version"], doc["sdist"], doc["sdist-sha256"], doc["wheel"], doc["wheel-sha256"],
                 tuple(doc["requires"]))  # fmt: skip


def wheel_named(filename: str, name: str, version: str) -> bool:
    """Whether ``filename`` is a wheel file name of ``name`` at ``version`` (what a build must give; any version
    when ``version`` is empty: a git commit's wheel says its own)."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        untrusted.wheel_filename(filename)
        dist, ver, _, _ = parse_wheel_filename(filename)
    except (untrusted.UntrustedData, InvalidWheelFilename):
        return False
    return canonicalize_name(dist) == name and (not version or ver == Version(version))


def git_sources(packages: tuple[str, ...]) -> dict[str, str]:
    """name -> URL of each VCS requirement (``name @ git+https://...@commit``): built from that commit's tree."""
    from imagekit.locking.vcs_refs import is_vcs

    out = {}
    for text in packages:
        try:
            r = Requirement(text)
        except InvalidRequirement:
            continue
        if r.url and is_vcs(r.url):
            out[canonicalize_name(r.name)] = r.url
    return out


def built_names(cell: object) -> tuple[str, ...]:
    """What the wheel-build stage builds for a cell: its `from_source` packages and its VCS requirements."""
    packages = getattr(cell, "packages", ())
    return tuple(sorted({*getattr(cell, "from_source", ()), *git_sources(packages)}))


def names(value: object) -> tuple[str, ...]:
    """`[matrix] from_source`: a list of package names, canonical and sorted."""
    hint = 'list the packages to build from their source archives, such as from_source = ["deepspeed"]'
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError("expected a list of package names", hint)
    out = set()
    for v in value:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?", v):
            raise UsageError(f"{untrusted.printable(v, 60)!r} is not a package name", hint)
        out.add(canonicalize_name(v))
    if out & {"torch", "transformers"}:
        raise UsageError("torch and transformers are axes of the matrix, installed from their wheels", hint)
    return tuple(sorted(out))


def specifier_of(name: str, requirements: tuple[str, ...]) -> SpecifierSet:
    """Every specifier the cell's requirements give ``name`` (markers ignored: the build is for the image)."""
    spec = SpecifierSet()
    for text in requirements:
        try:
            r = Requirement(text)
        except InvalidRequirement:
            continue
        if canonicalize_name(r.name) == name:
            if r.url:
                raise UsageError(
                    f"{name} is named by URL ({untrusted.printable(r.url, 80)}) and listed in from_source",
                    "a package comes either from a wheel URL or from its source archive: drop one",
                )
            spec &= r.specifier
    return spec


def _archives(name: str, files: list[wheels.Candidate]) -> Iterator[tuple[Version, wheels.Candidate]]:
    """(version, file) of each source archive (.tar.gz or .zip, with a sha256) of ``name`` that ``files`` list."""
    for f in files:
        if not f.filename.endswith((".tar.gz", ".zip")) or not f.sha256:
            continue
        try:
            dist, version = parse_sdist_filename(f.filename)
        except InvalidSdistFilename:
            continue
        if canonicalize_name(dist) == name:
            yield version, f


def pick_sdist(name: str, spec: SpecifierSet, files: list[wheels.Candidate], where: str) -> Sdist:
    """The newest source archive (.tar.gz, or .zip) of ``name`` that ``spec`` allows (no pre-release unless the
    specifier names one), with its sha256 as the index lists it."""
    found = [
        (version, Sdist(name, str(version), f.filename, f.url, f.sha256))
        for version, f in _archives(name, files)
        if spec.contains(version, prereleases=bool(spec.prereleases))
    ]
    if not found:
        allowed = f" {spec}" if str(spec) else ""
        raise CheckFailed(
            f"{name}{allowed}: {where} lists no source archive with a sha256 that fits",
            f"check the name and the version the requirements allow; `pip download --no-binary :all: --no-deps "
            f"'{name}{spec}'` shows what the index has",
        )
    return max(found, key=lambda pair: pair[0])[1]


def build_requires(pyproject: str | None) -> tuple[list[str], str]:
    """The build requirements a source archive's pyproject.toml declares, and its build backend; PEP 517's
    fallback (setuptools' legacy backend) when it has none."""
    if pyproject is None:
        return list(DEFAULT_REQUIRES), "setuptools.build_meta:__legacy__"
    try:
        doc = untrusted.load_toml(pyproject, "its pyproject.toml")
    except untrusted.UntrustedData as exc:
        raise CheckFailed(str(exc), "the source archive is damaged") from None
    system = doc.get("build-system")
    if not isinstance(system, dict):
        return list(DEFAULT_REQUIRES), "setuptools.build_meta:__legacy__"
    requires = system.get("requires", list(DEFAULT_REQUIRES))
    backend = system.get("build-backend", "setuptools.build_meta:__legacy__")
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires) or not isinstance(backend, str):
        raise CheckFailed("its pyproject.toml's [build-system] is malformed", "the source archive is damaged")
    if len(requires) > MAX_BUILD_REQUIRES:
        raise CheckFailed(f"its pyproject.toml names {len(requires)} build requirements", "the archive is damaged")
    for r in requires:
        problem = build_requirement_problem(r)
        if problem:
            raise CheckFailed(
                f"its build requirement {untrusted.printable(r, 80)!r} {problem}",
                "imagekit resolves build requirements by name from the cell's indexes, with their hashes, before "
                "anything is fetched: a URL or a local path would be fetched by the resolver as it is",
            )
    return requires, backend


MAX_BUILD_REQUIRES = 64


def build_requirement_problem(text: str) -> str | None:
    """Why a build requirement cannot be resolved from the indexes alone, or None. Checked before the host's resolver
    sees it: a requirement naming a URL (``pkg @ https://...``, ``pkg @ file:///...``) would be downloaded by it,
    with the network on, before the lock could refuse what came back."""
    if len(text) > 1024:
        return f"is {len(text)} characters long"
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return "is not a requirement"
    if req.url is not None:
        return "names a URL, not a package of the index"
    for spec in req.specifier:
        version = spec.version.removesuffix(".*")
        if spec.operator == "===" or len(version) > 64:
            return f"has the specifier {untrusted.printable(str(spec), 80)}, which no index answers"
        try:
            Version(version)
        except InvalidVersion:
            return f"has {untrusted.printable(spec.version, 80)}, which is not a version"
    return None


def build_key(sdist_sha256: str, base: str, python: str, platform: str, installed: list[str], env: dict) -> str:
    """What a build depends on, as one digest: the archive, the base, the Python and platform, every pin installed
    for the build (the cell's torch layer and the build requirements, with their hashes) and the environment."""
    doc = {
        "builder": BUILDER,
        "sdist": sdist_sha256,
        "base": base,
        "python": python,
        "platform": platform,
        "installed": sorted(installed),
        "env": env,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def pin_line(name: str, version: str, sha256: str) -> str:
    return f"{canonicalize_name(name)}=={version} sha256:{sha256}"


def requirements_text(pins: list[str]) -> str:
    """Pins as "name==version sha256:<hex>" made into a requirements file pip installs with --require-hashes."""
    lines = []
    for p in sorted(pins):
        m = _PIN.fullmatch(p)
        if m is None:
            raise CheckFailed(f"not a build pin: {untrusted.printable(p, 80)}", "run `imagekit lock` again")
        lines.append(f"{m['name']}=={m['version']} --hash=sha256:{m['sha']}")
    return "\n".join(lines) + "\n"


# Runs in a container of the cell's base, network off, root filesystem read-only, as the invoking user; /build is
# a scratch folder of the host's and /in holds the archive and the build's requirements. A venv with the build's
# pins (the cell's torch layer and the build requirements, from the mounted wheelhouse, hashes required), the archive
# unpacked at a fixed path (what a compiler writes into a binary names the same folder on every machine), then
# `pip wheel` of that folder in the environment as it is (no isolation: a package that builds against torch sees
# the cell's). The wheel lands in /build/out; the log is the container's output.
BUILD_SCRIPT = r"""
set -eu
python=$1; archive=$2
export HOME=/build/home TMPDIR=/build/tmp PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
mkdir -p "$HOME" "$TMPDIR" /build/unpack /build/out
"$python" -m venv /build/env
/build/env/bin/python -m pip install --quiet --no-index --no-deps --require-hashes --no-compile \
    --find-links /wheels -r /in/build-requirements.txt
cd /build/unpack
case "$archive" in
  *.zip) /build/env/bin/python -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(".")' "/in/$archive" ;;
  *) tar -xzf "/in/$archive" --no-same-owner --no-same-permissions ;;
esac
[ "$(ls -A /build/unpack | wc -l)" = 1 ] || { echo "error: the archive does not hold one folder" >&2; exit 3; }
mv "/build/unpack/$(ls -A /build/unpack)" /build/src
cd /build/src
echo "building $archive"
/build/env/bin/python -m pip wheel --no-deps --no-build-isolation --no-index --no-cache-dir --wheel-dir /build/out .
"""


MAX_PLACEHOLDERS = 200  # versions of one package stood in for: the newest ones


def sdist_versions(name: str, files: list[wheels.Candidate]) -> list[str]:
    """The versions of ``name`` an index lists a source archive (with a sha256) of, newest first."""
    found = {version for version, _ in _archives(name, files)}
    return [str(v) for v in sorted(found, reverse=True)[:MAX_PLACEHOLDERS]]


def placeholder_wheel(name: str, version: str) -> tuple[str, bytes]:
    """(file name, bytes) of a wheel of ``name`` ``version`` with no code and no requirements. It stands in, in a
    resolution only, for a release published as a source archive alone, so the resolver goes on past it: to the next
    source-only package (every one found in one pass), or to the torch layer a build of it installs (a source-only
    package deep in the tree). Never fetched, installed or locked: the real build's wheel replaces it."""
    import io
    import zipfile

    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: imagekit-placeholder\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"]).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for path, data in files.items():
            zf.writestr(zipfile.ZipInfo(path, (1980, 1, 1, 0, 0, 0)), data)
    return f"{dist}-{version}-py3-none-any.whl", out.getvalue()


def from_source_hint(names: list[str] | tuple[str, ...]) -> str:
    """The fix for packages with no wheel: build them once from their source archives (`from_source`)."""
    listed = ", ".join(f'"{n}"' for n in names)
    return (
        f"build them once from their source archives: from_source = [{listed}] in [matrix] (built in the cell's base "
        "with the network off, each wheel locked by its sha256; a dependency of a dependency may be named too)"
    )
