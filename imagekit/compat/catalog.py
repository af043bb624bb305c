"""Compatibility data: curated facts (compat.toml) plus index metadata (pypi-metadata.json), with lookups.

The curated facts (CUDA variants, driver floors, archs, bases: each with its source) ship with imagekit. The index
metadata ships too, and `imagekit compat refresh` writes a newer copy to the user data folder (``user_data_dir``),
which `load` prefers when it is valid and knows at least as many torch releases as the shipped copy.

`load` reads those files; everything else here is pure.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from imagekit.compat.companions import CompanionRow, UndeclaredRow, derived_rows, parse_rows
from imagekit.compat.compiler_debs import CompilerDeb, compiler_rows
from imagekit.errors import UnknownVersionError, UsageError
from imagekit.in_image import facts
from imagekit.model import variant_of_runtime
from imagekit.trust.untrusted import UntrustedData, load_json, printable

METADATA_FILE = "pypi-metadata.json"
CURATED_FILE = "compat.toml"
SHIPPED = "shipped"
USER = "user"


@dataclass(frozen=True)
class TorchMinor:
    minor: str
    variants: tuple[str, ...]
    variants_source: str
    pypi_default: str
    pypi_default_source: str
    glibc: str
    glibc_source: str
    cxx11_abi: bool | None = None  # PyPI's Linux x86_64 build: torch._C._GLIBCXX_USE_CXX11_ABI; None: no source says
    cxx11_abi_source: str = ""


@dataclass(frozen=True)
class ArchEntry:
    torch: tuple[str, ...]
    variants: tuple[str, ...]
    archs: tuple[str, ...]  # "8.0", "12.0"
    ptx: str | None
    source: str
    confidence: str
    platform: str = "linux/amd64"


@dataclass(frozen=True)
class BaseSpec:
    python: str
    name: str
    suite: str
    mirror: str
    vendor: str
    glibc: str
    source: str
    ports_mirror: str | None = None  # where the archive keeps other CPU architectures (Ubuntu's ports), if elsewhere

    def mirror_for(self, platform: str) -> str:
        """The archive a base for ``platform`` is bootstrapped from."""
        return self.ports_mirror if self.ports_mirror and platform != "linux/amd64" else self.mirror


@dataclass(frozen=True)
class PackageRelease:
    requires_python: str
    requires: dict[str, str]
    yanked: bool = False
    cuda_runtime: str | None = None


@dataclass(frozen=True)
class CompatData:
    data_version: str
    sources: dict[str, str]
    torch_minors: dict[str, TorchMinor]
    torch_releases: dict[str, dict]  # version -> {"python": [...], "requires_python": ..., ...}
    driver_families: dict[int, tuple[str, str]]  # cuda major -> (min driver, source)
    toolkit_drivers: dict[str, str]
    archs: tuple[ArchEntry, ...]
    gpus: dict[str, str]
    gpus_source: str
    bases: dict[str, BaseSpec]
    packages: dict[str, dict[str, PackageRelease]] = field(default_factory=dict)
    # compat/companions.py: torch's companions (the curated rows, the index metadata's), what torch imports undeclared
    companions: tuple[CompanionRow, ...] = ()
    companions_derived: tuple[CompanionRow, ...] = ()
    undeclared: tuple[UndeclaredRow, ...] = ()
    compiler_debs: tuple[CompilerDeb, ...] = ()  # compat/compiler_debs.py: Debian's CUDA compilers (CUDA 11, 12)
    # Where the two parts came from, for messages that say which file lacks what.
    curated_path: str = CURATED_FILE
    metadata_path: str = METADATA_FILE
    metadata_origin: str = SHIPPED  # "shipped" or "user" (written by `imagekit compat refresh`)
    cache: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    # -- lookups ---------------------------------------------------------------------------------------
    def torch_minor(self, torch: str) -> TorchMinor:
        v = Version(torch)
        minor = f"{v.major}.{v.minor}"
        if torch not in self.torch_releases:
            raise self.not_in_metadata("torch", torch)
        if minor not in self.torch_minors:
            raise UnknownVersionError(
                f"torch {torch} is on PyPI, but neither the index metadata ({self.metadata_path}) names its CUDA "
                f"runtime and glibc floor nor do imagekit's curated facts (data version {self.data_version}) have an "
                f"entry for torch {minor}: its CUDA variants, PyPI default variant and glibc floor are not known "
                f"(known: torch {_span(self.torch_minors)})",
                "run `imagekit compat refresh` (the index's metadata names them for a torch that requires its CUDA "
                f'runtime), or add a [[torch]] table with minor = "{minor}" (variants, pypi_default, glibc, each with '
                f"its source) to {self.curated_path}, or upgrade imagekit",
            )
        return self.torch_minors[minor]

    def torch_from_pypi(self, torch: str, variant: str, platform: str = "linux/amd64") -> bool:
        """Whether torch ``torch`` built for ``variant`` (``cu124``) is the build PyPI serves for ``platform`` (its
        minor's default variant; on linux/arm64 the CUDA build PyPI's aarch64 wheel is, none when it is CPU-only);
        else it comes from the PyTorch index (a lock request "routed" there). The one answer to "is this cell's torch
        from PyPI": every other place asks this."""
        if platform != "linux/arm64":
            return variant == self.torch_minor(torch).pypi_default
        return variant == self.pypi_aarch64_variant(torch)

    def torch_cxx11_abi(self, torch: str, variant: str, platform: str = "linux/amd64") -> tuple[bool, str] | None:
        """Whether torch ``torch`` built for ``variant`` on ``platform`` uses the C++11 ABI, and the fact that says
        so: a curated fact of PyPI's Linux x86_64 build of its minor. None where no source says (the PyTorch index's
        builds, aarch64, a minor the curated facts lack): a torch extension's ABI tag is then not checked."""
        if platform != "linux/amd64" or not self.torch_from_pypi(torch, variant, platform):
            return None
        tm = self.torch_minor(torch)
        return None if tm.cxx11_abi is None else (tm.cxx11_abi, self.source(tm.cxx11_abi_source))

    def pypi_aarch64_variant(self, torch: str) -> str | None:
        """The CUDA variant of PyPI's Linux aarch64 wheel of ``torch`` (None: a CPU-only build), as a refresh read it
        from the wheel; a release whose aarch64 wheel was not read is unknown, not guessed."""
        self.torch_minor(torch)
        rel = self.torch_releases.get(torch, {})
        if rel.get("aarch64_archs") is None:
            raise UnknownVersionError(
                f"torch {torch} on linux/arm64: the index metadata ({self.metadata_path}) does not say what PyPI's "
                "aarch64 wheel of it is (a CUDA build, or CPU-only)",
                "run `imagekit compat refresh` (it reads each torch minor's aarch64 wheel)",
            )
        runtime = rel.get("aarch64_cuda_runtime")
        return variant_of_runtime(runtime) if rel["aarch64_archs"] and isinstance(runtime, str) else None

    def package(self, name: str, version: str) -> PackageRelease:
        known = self.packages.get(name, {})
        if version not in known:
            raise self.not_in_metadata(name, version)
        return known[version]

    def releases(self, name: str) -> list[str]:
        """Every release of ``name`` the PyPI metadata knows, oldest first."""
        known = self.torch_releases if name == "torch" else self.packages.get(name, {})
        return sorted(known, key=Version)

    def not_in_metadata(self, name: str, version: str) -> UnknownVersionError:
        """A release the PyPI metadata lacks: refreshing the metadata is the fix when the release is newer."""
        known = self.releases(name)
        family = ".".join(version.split(".")[:2])
        near = [r for r in known if r.startswith(family + ".")]
        where = f"{self.metadata_origin} PyPI metadata {self.metadata_path}"
        detail = f"known {family}.x: {', '.join(near)}" if near else f"{len(known)} releases, {_span(known)}"
        what = f"{name} {version} is not" if len(version.split(".")) > 2 else f"no {name} {version} or {version}.x is"
        return UnknownVersionError(
            f"{what} in imagekit's {where} ({detail})",
            "check the version; a release on PyPI newer than this data needs `imagekit compat refresh` (it fetches "
            "the metadata; `imagekit compat show` says which data is in use)",
        )

    def resolve(self, name: str, wanted: str) -> str:
        """An exact known release, or the newest known release a prefix names (``2.5`` -> ``2.5.1``; the
        matrix selectors' rule: equal, or the prefix followed by a dot). Pre-releases and yanked releases are
        picked only when nothing else matches, and so is a torch release the curated facts do not cover yet (``2`` is
        the newest 2.x imagekit can check). Unknown: UnknownVersionError."""
        known = self.releases(name)
        if wanted in known:
            return wanted
        matching = [r for r in known if r.startswith(wanted + ".")]
        if not matching:
            raise self.not_in_metadata(name, wanted)

        def usable(r: str) -> bool:
            if Version(r).is_prerelease:
                return False
            if name == "torch":  # the curated facts cover it (CUDA variants, glibc): a newer one cannot be checked
                return f"{Version(r).major}.{Version(r).minor}" in self.torch_minors
            return not self.packages[name][r].yanked

        plain = [r for r in matching if usable(r)]
        return (plain or matching)[-1]

    def driver_family(self, cuda: str) -> tuple[str, str]:
        """(minimum driver, source) of the CUDA major family of ``cuda``: a curated fact."""
        major = int(cuda.split(".")[0])
        if major not in self.driver_families:
            raise UnknownVersionError(
                f"CUDA {cuda}: imagekit's curated facts (data version {self.data_version}) have no driver floor for "
                f"CUDA {major}.x (known: {', '.join(f'{m}.x' for m in sorted(self.driver_families))})",
                f"upgrade imagekit, or add a [[driver_family]] table with cuda_major = {major} (min_driver and its "
                f"source) to {self.curated_path}; `imagekit compat refresh` will not help: it updates only the PyPI "
                "metadata",
            )
        return self.driver_families[major]

    def arch_entry(self, torch: str, variant: str, platform: str = "linux/amd64") -> ArchEntry | None:
        """The GPU architectures compiled into torch ``torch`` built for ``variant`` on ``platform``: a curated
        [[arch]] table, else what the PyPI wheel itself says (its arch flags, read by `imagekit compat refresh`) when
        ``variant`` is PyPI's build; None when neither knows."""
        v = Version(torch)
        minor = f"{v.major}.{v.minor}"
        for entry in self.archs:
            if minor in entry.torch and variant in entry.variants and entry.platform == platform:
                return entry
        return self.wheel_archs(torch, variant, platform)

    def wheel_archs(self, torch: str, variant: str, platform: str = "linux/amd64") -> ArchEntry | None:
        """What PyPI's ``platform`` wheel of ``torch`` (or of the newest release of its minor that was read) says."""
        aarch64 = platform == "linux/arm64"
        flags_key, runtime_key = ("aarch64_archs", "aarch64_cuda_runtime") if aarch64 else ("archs", "cuda_runtime")
        v = Version(torch)
        same_minor = sorted(
            (Version(r) for r, rel in self.torch_releases.items()
             if (Version(r).major, Version(r).minor) == (v.major, v.minor) and rel.get(flags_key)),
            reverse=True,
        )  # fmt: skip
        for candidate in sorted(same_minor, key=lambda r: r != v):
            rel = self.torch_releases[str(candidate)]
            runtime = rel.get(runtime_key)
            if not isinstance(runtime, str) or variant_of_runtime(runtime) != variant:
                continue
            sass, ptx = facts.compiled_archs(rel[flags_key])
            archs = tuple("{}.{}".format(*facts.arch_key(a)) for a in sass)
            ptxs = ["{}.{}".format(*facts.arch_key(p)) for p in ptx]
            return ArchEntry(
                torch=(f"{v.major}.{v.minor}",),
                variants=(variant,),
                archs=archs,
                ptx=max(ptxs, key=Version) if ptxs else None,
                source=f"WHEEL torch {candidate} ({platform}, PyPI): libtorch_python.so arch flags '{rel[flags_key]}'",
                confidence="V",
                platform=platform,
            )
        if aarch64:  # the PyTorch index's aarch64 build of this variant, as a refresh read its kernels
            for candidate in sorted(
                (Version(r) for r, rel in self.torch_releases.items()
                 if (Version(r).major, Version(r).minor) == (v.major, v.minor)
                 and isinstance(rel.get("aarch64_index_archs"), dict) and variant in rel["aarch64_index_archs"]),
                key=lambda r: (r != v, -r.major, -r.minor, -r.micro),
            ):  # fmt: skip
                flags = self.torch_releases[str(candidate)]["aarch64_index_archs"][variant]
                sass, ptx = facts.compiled_archs(flags)
                ptxs = ["{}.{}".format(*facts.arch_key(p)) for p in ptx]
                return ArchEntry(
                    torch=(f"{v.major}.{v.minor}",),
                    variants=(variant,),
                    archs=tuple("{}.{}".format(*facts.arch_key(a)) for a in sass),
                    ptx=max(ptxs, key=Version) if ptxs else None,
                    source=f"WHEEL torch {candidate}+{variant} ({platform}, PyTorch index): libtorch_python.so arch "
                    f"flags '{flags}'",
                    confidence="V",
                    platform=platform,
                )
        return None

    def source(self, key: str) -> str:
        """Expand a source key such as ``"TI release/2.5"`` into its full citation."""
        head = key.split(" ")[0].rstrip(",;:")
        full = self.sources.get(head)
        return f"[{key}] {full}" if full else key


def _span(versions: object) -> str:  # ``1.13.0 … 2.15.0``: the range of a set of versions
    ordered = sorted(versions, key=Version)  # type: ignore[call-overload]
    return f"{ordered[0]} … {ordered[-1]}" if ordered else "none"


def derived_minors(metadata_torch: Mapping[str, dict], curated: Collection[str]) -> dict[str, TorchMinor]:
    """The torch minors the curated facts lack, from what the index says of their newest final release: the PyPI
    default variant from the CUDA runtime its wheel requires (``cuda-toolkit==13.2.2`` -> cu132), the glibc floor from
    its wheel tag, and the CUDA variants from the PyTorch index when a refresh read it (else the PyPI default only).
    A minor whose release names no CUDA runtime or glibc is left out: nothing is guessed."""
    newest: dict[str, tuple[Version, Mapping]] = {}
    for ver, rel in metadata_torch.items():
        v = Version(ver)
        minor = f"{v.major}.{v.minor}"
        if v.is_prerelease or minor in curated or not isinstance(rel, Mapping):
            continue
        if minor not in newest or v > newest[minor][0]:
            newest[minor] = (v, rel)
    out = {}
    for minor, (v, rel) in newest.items():
        runtime, glibc = rel.get("cuda_runtime"), rel.get("glibc")
        if not (isinstance(runtime, str) and isinstance(glibc, str)):
            continue
        default = variant_of_runtime(runtime)
        indexed = rel.get("variants")
        variants = tuple(indexed) if isinstance(indexed, list) and indexed else (default,)
        out[minor] = TorchMinor(
            minor=minor,
            variants=variants if default in variants else (*variants, default),
            variants_source=(
                f"PTI (the PyTorch index's torch {v} wheels)"
                if indexed
                else f"PYPI (torch {v}: its PyPI build only; the PyTorch index was not read)"
            ),
            pypi_default=default,
            pypi_default_source=f"PYPI (torch {v} METADATA: CUDA runtime {runtime})",
            glibc=glibc,
            glibc_source=f"PYPI (torch {v} wheel tag)",
        )
    return out


def parse(
    curated: dict,
    metadata: dict,
    *,
    curated_path: str = CURATED_FILE,
    metadata_path: str = METADATA_FILE,
    metadata_origin: str = SHIPPED,
) -> CompatData:
    """Build CompatData from the two documents (pure; tests use it on edited copies)."""
    torch_minors = {
        t["minor"]: TorchMinor(
            minor=t["minor"],
            variants=tuple(t["variants"]),
            variants_source=t["variants_source"],
            pypi_default=t["pypi_default"],
            pypi_default_source=t["pypi_default_source"],
            glibc=t["glibc"],
            glibc_source=t["glibc_source"],
            cxx11_abi=t.get("cxx11_abi"),
            cxx11_abi_source=t.get("cxx11_abi_source", ""),
        )
        for t in curated["torch"]
    }
    torch_minors |= derived_minors(metadata["torch"], torch_minors)
    archs = tuple(
        ArchEntry(
            tuple(a["torch"]),
            tuple(a["variants"]),
            tuple(a["archs"]),
            a.get("ptx"),
            a["source"],
            a["confidence"],
            a.get("platform", "linux/amd64"),
        )
        for a in curated["arch"]
    )
    gpus = dict(curated["gpus"])
    gpus_source = gpus.pop("gpus_source")
    bases = {
        b["python"]: BaseSpec(
            python=b["python"],
            name=b["name"],
            suite=b["bootstrap"]["suite"],
            mirror=b["bootstrap"]["mirror"],
            vendor=b["bootstrap"]["vendor"],
            glibc=b["glibc"],
            source=b["source"],
            ports_mirror=b["bootstrap"].get("ports_mirror"),
        )
        for b in curated["base"]
    }
    packages = {
        name: {
            ver: PackageRelease(r["requires_python"], dict(r["requires"]), bool(r.get("yanked")), r.get("cuda_runtime"))
            for ver, r in releases.items()
        }
        for name, releases in metadata["packages"].items()
    }
    packages["torch"] = {
        ver: PackageRelease(r.get("requires_python", ""), dict(r.get("requires", {})), False, r.get("cuda_runtime"))
        for ver, r in metadata["torch"].items()
    }
    companions, undeclared = parse_rows(curated)
    return CompatData(
        data_version=curated["data_version"],
        sources=dict(curated["sources"]),
        torch_minors=torch_minors,
        torch_releases=dict(metadata["torch"]),
        driver_families={f["cuda_major"]: (f["min_driver"], f["source"]) for f in curated["driver_family"]},
        toolkit_drivers=dict(curated["toolkit_ga_driver"]),
        archs=archs,
        gpus=gpus,
        gpus_source=gpus_source,
        bases=bases,
        packages=packages,
        companions=companions,
        companions_derived=tuple(derived_rows(metadata["packages"])),
        undeclared=undeclared,
        compiler_debs=compiler_rows(curated),
        curated_path=curated_path,
        metadata_path=metadata_path,
        metadata_origin=metadata_origin,
    )


# Bounds on what a metadata file may hold. A version of 64 characters or a specifier of 200 is far beyond any real
# one, and keeps every number in them far below int()'s digit limit (a 5,000-digit version breaks every comparison).
MAX_VERSION = 64
MAX_SPECIFIER = 200
_NAME = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,98}[a-z0-9])?", re.ASCII)
_PYTHON = re.compile(r"3\.\d{1,2}", re.ASCII)
_GLIBC = re.compile(r"\d{1,2}\.\d{1,3}", re.ASCII)
_VARIANT = re.compile(r"cu1[0-9]{2}", re.ASCII)


def metadata_problems(doc: object) -> list[str]:
    """What keeps ``doc`` from being PyPI metadata `parse` and the rules can use (pure): the shape `imagekit compat
    refresh` writes, every field checked (versions, specifiers, Python minors, glibc, names; each bounded). Empty
    when it is usable; at most five, each naming the release and the field."""
    if not isinstance(doc, dict):
        return [f"expected a JSON object, got {type(doc).__name__}"]
    problems: list[str] = []
    torch, packages = doc.get("torch"), doc.get("packages")
    if not isinstance(torch, dict) or not torch:
        problems.append("'torch' is not a non-empty object of releases")
        torch = {}
    if not isinstance(packages, dict):
        problems.append("'packages' is not an object")
        packages = {}
    for ver, rel in torch.items():
        where = f"torch {ver if _is_version(ver) else _shown(ver)}"
        if not _is_version(ver):
            problems.append(f"torch release {_shown(ver)} is not a version")
        elif not isinstance(rel, dict) or not isinstance(rel.get("python"), list) or not rel.get("python"):
            problems.append(f"{where}: 'python' is not a non-empty list of versions")
        elif not all(isinstance(p, str) and _PYTHON.fullmatch(p) for p in rel["python"]):
            bad = next(p for p in rel["python"] if not (isinstance(p, str) and _PYTHON.fullmatch(p)))
            problems.append(f"{where}: python {_shown(bad)} is not a Python 3 minor (3.N)")
        elif "glibc" in rel and not (isinstance(rel["glibc"], str) and _GLIBC.fullmatch(rel["glibc"])):
            problems.append(f"{where}: glibc {_shown(rel['glibc'])} is not a glibc version (2.N)")
        elif bad := next((f for f in ("variants", "aarch64_variants") if f in rel and not _variants(rel[f])), None):
            problems.append(f"{where}: {bad} is not a list of CUDA variants (cuXYZ)")
        elif bad := next((f for f in ("archs", "aarch64_archs") if f in rel and not _flags(rel[f])), None):
            problems.append(f"{where}: {bad} is not a list of GPU architectures (sm_XY compute_XY)")
        elif "aarch64_index_archs" in rel and not _index_archs(rel["aarch64_index_archs"]):
            problems.append(f"{where}: aarch64_index_archs is not an object of CUDA variant: GPU architectures")
        elif "aarch64_cuda_runtime" in rel and not _is_version(rel["aarch64_cuda_runtime"]):
            problems.append(f"{where}: aarch64_cuda_runtime {_shown(rel['aarch64_cuda_runtime'])} is not a version")
        else:
            problems += _release_problems(where, rel, required=False)
    for name, releases in packages.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            problems.append(f"packages: {_shown(name)} is not a package name")
        elif not isinstance(releases, dict):
            problems.append(f"packages.{name} is not an object of releases")
        else:
            for ver, rel in releases.items():
                where = f"{name} {ver if _is_version(ver) else _shown(ver)}"
                if not _is_version(ver):
                    problems.append(f"{name} release {_shown(ver)} is not a version")
                else:
                    problems += _release_problems(where, rel, required=True)
    return problems[:5]


_FLAGS = re.compile(r"(?:(?:sm|compute)_[0-9]{2,3}[af]?(?: |$)){0,64}", re.ASCII)


def _flags(value: object) -> bool:
    """torch's arch flags ('sm_80 sm_90 compute_90'), or '' (a build with none: CPU-only)."""
    return isinstance(value, str) and len(value) <= 1000 and _FLAGS.fullmatch(value) is not None


def _index_archs(value: object) -> bool:
    """``{"cu128": "sm_80 sm_90 ..."}``: the PyTorch index's aarch64 builds of a release, each with its arch flags."""
    return (
        isinstance(value, dict)
        and len(value) <= 32
        and all(isinstance(k, str) and _VARIANT.fullmatch(k) and _flags(v) and v for k, v in value.items())
    )


def _variants(value: object) -> bool:
    short = isinstance(value, list) and len(value) <= 32
    return short and all(isinstance(x, str) and _VARIANT.fullmatch(x) is not None for x in value)


def _shown(value: object) -> str:
    """A value as a message quotes it: printable, cut short (a 5,000-digit one is not echoed)."""
    text = printable(value, 40) if isinstance(value, str) else type(value).__name__
    return repr(text) + (f" ({len(value)} characters)" if isinstance(value, str) and len(value) > 40 else "")


def _is_version(value: object) -> bool:
    try:
        return isinstance(value, str) and len(value) <= MAX_VERSION and str(Version(value)) == value
    except (InvalidVersion, ValueError):
        return False


def _is_specifier(value: object) -> bool:
    """A PEP 440 specifier set ("" for none) of at most `MAX_SPECIFIER` characters."""
    if not isinstance(value, str) or len(value) > MAX_SPECIFIER:
        return False
    try:
        SpecifierSet(value)
    except (InvalidSpecifier, ValueError):
        return False
    return True


def _release_problems(where: str, rel: object, *, required: bool) -> list[str]:
    if not isinstance(rel, dict):
        return [f"{where}: not an object"]
    if required and not ("requires_python" in rel and "requires" in rel):
        return [f"{where}: not a release with requires_python and requires"]
    requires = rel.get("requires", {})
    cuda = rel.get("cuda_runtime")
    if not _is_specifier(rel.get("requires_python", "")):
        return [f"{where}: requires_python {_shown(rel.get('requires_python'))} is not a version specifier"]
    if not isinstance(requires, dict):
        return [f"{where}: requires is not an object of name: specifier"]
    for name, spec in requires.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            return [f"{where}: requires: {_shown(name)} is not a package name"]
        if not _is_specifier(spec):
            return [f"{where}: requires.{name} {_shown(spec)} is not a version specifier"]
    if cuda is not None and not _is_version(cuda):
        return [f"{where}: cuda_runtime {_shown(cuda)} is not a version"]
    if not isinstance(rel.get("yanked", False), bool):
        return [f"{where}: yanked is not true or false"]
    return []


def floor_problem(doc: dict, shipped: dict) -> str | None:
    """The sanity floor: user metadata must know at least as many torch releases, and releases of each package, as
    the shipped copy (it is meant to be newer; an index that lost releases is not). None when it does."""
    if len(doc["torch"]) < len(shipped["torch"]):
        have, want = len(doc["torch"]), len(shipped["torch"])
        return f"it knows {have} torch releases, fewer than the {want} shipped with imagekit"
    missing = sorted(set(shipped["packages"]) - set(doc["packages"]))
    if missing:
        return f"it has no releases of {', '.join(missing)}, which the shipped data has"
    counts = {name: (len(doc["packages"][name]), len(rels)) for name, rels in sorted(shipped["packages"].items())}
    short = [f"{have} {name} releases, fewer than the {want}" for name, (have, want) in counts.items() if have < want]
    if short:
        return f"it knows {'; '.join(short)} shipped with imagekit"
    return None


def user_data_dir(env: Mapping[str, str], home: Path | None) -> Path | None:
    """Where `imagekit compat refresh` writes and `load` looks: $IMAGEKIT_DATA_DIR, else $XDG_DATA_HOME/imagekit
    (an absolute one, as the XDG spec says), else ~/.local/share/imagekit. None without a home to put it in."""
    if env.get("IMAGEKIT_DATA_DIR"):
        return Path(env["IMAGEKIT_DATA_DIR"])
    xdg = env.get("XDG_DATA_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "imagekit"
    return home / ".local" / "share" / "imagekit" if home is not None else None


def user_metadata_path() -> Path | None:
    try:
        home: Path | None = Path.home()
    except RuntimeError:  # no $HOME and no passwd entry
        home = None
    folder = user_data_dir(os.environ, home)
    return folder / METADATA_FILE if folder is not None else None


def shipped_path(name: str) -> str:
    return str(resources.files("imagekit.data").joinpath(name))


def shipped_metadata() -> dict:
    return json.loads(resources.files("imagekit.data").joinpath(METADATA_FILE).read_text())


def parse_user_metadata(text: str, path: Path, hint: str) -> dict:
    """A metadata file's text, checked: a UsageError (exit 2) naming ``path`` when it is not JSON of the right shape."""
    try:
        doc = load_json(text, "its text", max_bytes=16 << 20, max_depth=8)  # the file is 4 levels deep
    except UntrustedData as exc:
        raise UsageError(f"the compatibility data {path} is not valid JSON: {exc}", hint) from None
    problems = metadata_problems(doc)
    if problems:
        raise UsageError(f"the compatibility data {path} has the wrong shape: {'; '.join(problems)}", hint)
    return doc


def curated_document() -> dict:
    return tomllib.loads(resources.files("imagekit.data").joinpath(CURATED_FILE).read_text())
