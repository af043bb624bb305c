"""Parse package metadata (wheel METADATA, PEP 691 simple-index JSON) into compatibility data. Pure.

`imagekit compat refresh` feeds these functions with what it downloads from the index; the tests feed them
with real metadata files committed under tests/fixtures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from email.parser import HeaderParser

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from imagekit.compat.catalog import MAX_VERSION
from imagekit.trust.untrusted import printable

# Packages whose Requires-Python and Requires-Dist we record, and the floor of versions worth recording.
WATCHED: dict[str, str] = {
    "transformers": "4.40",
    "accelerate": "0.30",
    "peft": "0.10",
    "trl": "0.9",
    "torchvision": "0.16",
    "torchaudio": "2.1",
    "xformers": "0.0.23",
    "torchtext": "0.15",  # companions whose METADATA pins torch== (compat/companions.py reads the pairs)
    "torchdata": "0.6",
}
TORCH_FLOOR = "1.13"
# Requirements on these names are the ones a cell can pin, so the ones worth checking; triton: torch's own pin of it
# (which triton goes with which torch, compat/companions.py).
REQUIREMENT_TARGETS = frozenset({"torch", "triton", *WATCHED})
# transformers declares torch in an extra; the image installs torch, so the extra applies.
APPLICABLE_EXTRAS = frozenset({"torch"})


def image_marker_env(python: str, machine: str = "x86_64") -> dict[str, str]:
    """The PEP 508 marker environment of an image (Linux ``machine`` CPython ``python``), whatever the host."""
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": machine,
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


_ENV = image_marker_env("3.11")
_WHEEL_RE = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)
_MANYLINUX_RE = re.compile(r"manylinux_(\d{1,3})_(\d{1,3})_x86_64|manylinux(1|2010|2014)_x86_64")
_LEGACY_GLIBC = {"1": "2.5", "2010": "2.12", "2014": "2.17"}


@dataclass(frozen=True)
class PackageMeta:
    """What one release's METADATA says that matters for compatibility."""

    name: str
    version: str
    requires_python: str
    requires: dict[str, str] = field(default_factory=dict)  # canonical name -> specifier
    cuda_runtime: str | None = None  # torch only: nvidia-cuda-runtime-cuXX pin

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "requires_python": self.requires_python,
            "requires": dict(sorted(self.requires.items())),
        }
        if self.cuda_runtime:
            data["cuda_runtime"] = self.cuda_runtime
        return data


def parse_metadata(text: str, machine: str = "x86_64") -> PackageMeta:
    """Parse a core-metadata file (the METADATA inside a wheel, or PEP 658 ``.metadata``). A Version that is none
    is a ValueError; the other fields are checked where the document is (`compat.metadata_problems`)."""
    msg = HeaderParser().parsestr(text)
    name = canonicalize_name(msg["Name"] or "")
    raw = str(msg["Version"] or "")
    try:
        if len(raw) > MAX_VERSION:
            raise ValueError(raw)
        version = str(Version(raw))
    except ValueError:  # InvalidVersion, or a number past int()'s digit limit
        shown = printable(raw, 40) + (f"… ({len(raw)} characters)" if len(raw) > 40 else "")
        raise ValueError(f"its Version {shown!r} is not a version") from None
    specs: dict[str, SpecifierSet] = {}
    cuda_runtime = None
    env = _ENV if machine == "x86_64" else image_marker_env("3.11", machine)
    for line in msg.get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        req_name = canonicalize_name(req.name)
        if req.marker is not None and not any(
            req.marker.evaluate({**env, "extra": extra}) for extra in ("", *APPLICABLE_EXTRAS)
        ):
            continue
        if re.fullmatch(r"nvidia-cuda-runtime-cu\d+|cuda-toolkit", req_name):
            pins = [s.version for s in req.specifier if s.operator == "=="]
            cuda_runtime = pins[0] if pins else None
        if req_name in REQUIREMENT_TARGETS and req_name != name:
            specs[req_name] = specs.get(req_name, SpecifierSet()) & req.specifier
    return PackageMeta(
        name=name,
        version=version,
        requires_python=(msg["Requires-Python"] or "").strip(),
        requires={k: str(v) for k, v in sorted(specs.items())},
        cuda_runtime=cuda_runtime,
    )


@dataclass(frozen=True)
class WheelFile:
    filename: str
    url: str
    version: str
    python_tag: str
    abi: str
    platform: str
    yanked: bool
    has_metadata: bool


def wheel_files(simple_json: dict) -> list[WheelFile]:
    """The wheels listed in a PEP 691 simple-index JSON page."""
    out = []
    for f in simple_json.get("files", []):
        m = _WHEEL_RE.match(f["filename"])
        if not m or len(m["version"]) > MAX_VERSION:
            continue
        try:
            version = str(Version(m["version"]))
        except (InvalidVersion, ValueError):  # ValueError: a release number past int()'s digit limit
            continue
        meta = f.get("core-metadata", f.get("data-dist-info-metadata", False))
        out.append(
            WheelFile(
                filename=f["filename"],
                url=f["url"],
                version=version,
                python_tag=m["py"],
                abi=m["abi"],
                platform=m["plat"],
                yanked=bool(f.get("yanked")),
                has_metadata=bool(meta),
            )
        )
    return out


def glibc_of(platform_tag: str) -> str | None:
    """`manylinux_2_28_x86_64` -> "2.28"; legacy aliases map to their glibc; non-x86_64 -> None."""
    best = None
    for part in platform_tag.split("."):
        m = _MANYLINUX_RE.fullmatch(part)
        if not m:
            continue
        glibc = f"{m[1]}.{m[2]}" if m[1] else _LEGACY_GLIBC[m[3]]
        if best is None or Version(glibc) < Version(best):
            best = glibc
    return best


@dataclass(frozen=True)
class TorchRelease:
    version: str
    pythons: tuple[str, ...]  # CPython minors with a Linux x86_64 wheel (free-threaded builds left out)
    glibc: str


def torch_releases(simple_json: dict, floor: str = TORCH_FLOOR) -> dict[str, TorchRelease]:
    """Per torch release on PyPI: Python windows and glibc floor of its Linux x86_64 wheels."""
    pythons: dict[str, set[str]] = {}
    glibcs: dict[str, str] = {}
    for w in wheel_files(simple_json):
        v = Version(w.version)
        if v.is_prerelease or v.is_devrelease or v < Version(floor) or w.yanked:
            continue
        glibc = glibc_of(w.platform)
        m = re.fullmatch(r"cp3(\d{1,2})", w.python_tag)
        if glibc is None or not m or w.abi.endswith("t"):
            continue
        pythons.setdefault(w.version, set()).add(f"3.{m[1]}")
        if w.version not in glibcs or Version(glibc) > Version(glibcs[w.version]):
            glibcs[w.version] = glibc
    return {
        ver: TorchRelease(ver, tuple(sorted(py, key=lambda p: int(p.split(".")[1]))), glibcs[ver])
        for ver, py in pythons.items()
    }


def pick_metadata_wheel(files: list[WheelFile], version: str) -> WheelFile | None:
    """The wheel of ``version`` whose metadata stands for the release on Linux x86_64, CPython 3.11."""

    def rank(w: WheelFile) -> int:
        if w.python_tag == "cp311" and glibc_of(w.platform):
            return 0
        if w.platform == "any":
            return 1
        if glibc_of(w.platform):
            return 2
        return 9

    candidates = sorted((w for w in files if w.version == version), key=lambda w: (rank(w), w.filename))
    return candidates[0] if candidates and rank(candidates[0]) < 9 else None


def pick_platform_wheel(files: list[WheelFile], version: str, arch: str) -> WheelFile | None:
    """The Linux CPython wheel of ``version`` for the CPU architecture ``arch`` (``x86_64``, ``aarch64``), not a
    free-threaded one; cp311 first, then the lowest CPython."""
    candidates = [
        w for w in files
        if w.version == version and not w.yanked and "linux" in w.platform and w.platform.endswith("_" + arch)
        and re.fullmatch(r"cp3\d{1,2}", w.python_tag) and not w.abi.endswith("t")
    ]  # fmt: skip
    return min(candidates, key=lambda w: (w.python_tag != "cp311", int(w.python_tag[3:]), w.filename), default=None)


ARCH_FLAGS = re.compile(rb"\x00((?:(?:sm|compute)_[0-9]{2,3}[af]? ){0,63}(?:sm|compute)_[0-9]{2,3}[af]?)\x00")
# The same list packed right after another constant with no NUL between (torch 2.8.0 and 2.9.x's x86_64 wheels:
# '...std::string ipc_hsm_70 sm_75 ... sm_120'): two or more flags, ending the constant.
PACKED_FLAGS = re.compile(rb"((?:(?:sm|compute)_[0-9]{2,3}[af]? ){1,63}(?:sm|compute)_[0-9]{2,3}[af]?)\x00")


def arch_flags(library: bytes) -> str | None:
    """torch's compiled GPU architectures as ``torch._C._cuda_getArchFlags()`` answers them ('sm_80 sm_90
    compute_90'), read out of ``libtorch_python.so`` without running it (the flags are one string constant there);
    None when the library holds no such string or several that differ."""
    found = {m.group(1).decode() for m in ARCH_FLAGS.finditer(library)}
    if not found:
        found = {m.group(1).decode() for m in PACKED_FLAGS.finditer(library)}
    return found.pop() if len(found) == 1 else None


def releases_to_record(simple_json: dict, floor: str) -> list[str]:
    """Final releases at or above ``floor`` that have at least one wheel, oldest first."""
    versions = set()
    for w in wheel_files(simple_json):
        v = Version(w.version)
        if v >= Version(floor) and not v.is_prerelease and not v.is_devrelease:
            versions.add(w.version)
    return sorted(versions, key=Version)


def yanked_releases(simple_json: dict) -> set[str]:
    """Releases whose every wheel is yanked."""
    state: dict[str, bool] = {}
    for w in wheel_files(simple_json):
        state[w.version] = state.get(w.version, True) and w.yanked
    return {v for v, y in state.items() if y}
