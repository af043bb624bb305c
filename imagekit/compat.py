"""Compatibility data: curated facts (compat.toml) plus index metadata (pypi-metadata.json), with lookups.

Loading reads two packaged files; everything else here is pure.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from packaging.version import Version

from imagekit.errors import UnknownVersionError

REFRESH_HINT = "run `imagekit compat refresh` (or upgrade imagekit) so its compatibility data knows this release"


@dataclass(frozen=True)
class TorchMinor:
    minor: str
    variants: tuple[str, ...]
    variants_source: str
    pypi_default: str
    pypi_default_source: str
    glibc: str
    glibc_source: str


@dataclass(frozen=True)
class ArchEntry:
    torch: tuple[str, ...]
    variants: tuple[str, ...]
    archs: tuple[str, ...]  # "8.0", "12.0"
    ptx: str | None
    source: str
    confidence: str


@dataclass(frozen=True)
class BaseSpec:
    python: str
    name: str
    suite: str
    mirror: str
    vendor: str
    glibc: str
    source: str


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

    # -- lookups ---------------------------------------------------------------------------------------
    def torch_minor(self, torch: str) -> TorchMinor:
        v = Version(torch)
        minor = f"{v.major}.{v.minor}"
        if torch not in self.torch_releases or minor not in self.torch_minors:
            raise UnknownVersionError(
                f"torch {torch} is not in imagekit's compatibility data (data version {self.data_version}; "
                f"known: {', '.join(sorted(self.torch_minors, key=Version))})",
                REFRESH_HINT,
            )
        return self.torch_minors[minor]

    def package(self, name: str, version: str) -> PackageRelease:
        known = self.packages.get(name, {})
        if version not in known:
            raise UnknownVersionError(
                f"{name} {version} is not in imagekit's compatibility data (data version {self.data_version})",
                REFRESH_HINT,
            )
        return known[version]

    def arch_entry(self, torch: str, variant: str) -> ArchEntry | None:
        v = Version(torch)
        minor = f"{v.major}.{v.minor}"
        for entry in self.archs:
            if minor in entry.torch and variant in entry.variants:
                return entry
        return None

    def source(self, key: str) -> str:
        """Expand a source key such as ``"TI release/2.5"`` into its full citation."""
        head = key.split(" ")[0].rstrip(",;")
        full = self.sources.get(head)
        return f"[{key}] {full}" if full else key


def _load_json(name: str) -> dict:
    return json.loads(resources.files("imagekit.data").joinpath(name).read_text())


def parse(curated: dict, metadata: dict) -> CompatData:
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
        )
        for t in curated["torch"]
    }
    archs = tuple(
        ArchEntry(
            tuple(a["torch"]), tuple(a["variants"]), tuple(a["archs"]), a.get("ptx"), a["source"], a["confidence"]
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
    )


@cache
def load() -> CompatData:
    """The compatibility data shipped with this imagekit."""
    curated = tomllib.loads(resources.files("imagekit.data").joinpath("compat.toml").read_text())
    return parse(curated, _load_json("pypi-metadata.json"))
