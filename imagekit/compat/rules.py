"""Compatibility rules: a query (cell, fleet, driver) -> violations, each citing its source. Pure.

Rules only check the axes a query names; versions the data does not know raise UnknownVersionError (exit 2)
instead of being guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imagekit.compat import companions
from imagekit.compat.catalog import ArchEntry, CompatData
from imagekit.compat.pypi_metadata import image_marker_env
from imagekit.errors import UnknownVersionError
from imagekit.in_image import facts
from imagekit.model import AMD64, ARM64, MACHINES, Query, Verdict, Violation, variant_of, variant_of_runtime
from imagekit.trust.validate import arch_key, cc_to_sm, driver_key, pinned_version, requirement_name

PYPI_META = "[PYPI] wheel METADATA on PyPI"


@lru_cache(maxsize=4096)
def _allows(spec: str, version: str) -> bool:
    """Cached `SpecifierSet(spec).contains(version)`: matrices repeat the same few pairs thousands of times."""
    return SpecifierSet(spec).contains(version, prereleases=True)


def cuda_major(cuda: str) -> int:
    return int(cuda.split(".")[0])


@dataclass(frozen=True)
class DriverFloor:
    minimum: str  # minor-version-compatibility floor of the CUDA major family
    full: str | None  # the toolkit's own GA driver: full feature set, PTX JIT
    source: str


def driver_floor(data: CompatData, cuda: str) -> DriverFloor:
    minimum, src = data.driver_family(cuda)  # UnknownVersionError naming the curated table when missing
    return DriverFloor(minimum, data.toolkit_drivers.get(cuda), data.source(src))


def how_arch_runs(entry: ArchEntry, target: str) -> str | None:
    """ "cubin sm_80" when a same-major cubin not newer than the GPU exists, "ptx" when only PTX JIT can run it
    (facts.best_kernel: one rule, so the build host and the pod judge a GPU alike)."""
    how = facts.best_kernel(arch_key(target), entry.archs, entry.ptx)
    if how is None:
        return None
    return f"cubin sm_{how[1][0]}{how[1][1]}" if how[0] == "cubin" else "ptx"


def _torch_known(q: Query, data: CompatData) -> None:
    if q.torch:
        data.torch_minor(q.torch)


def rule_cuda_variant(q: Query, data: CompatData) -> list[Violation]:
    if not (q.cuda and q.torch):
        return []
    tm = data.torch_minor(q.torch)
    if variant_of(q.cuda) in tm.variants:
        return []
    return [
        Violation(
            "cuda-variant",
            f"torch {q.torch} has no {variant_of(q.cuda)} wheels; its CUDA variants are {', '.join(tm.variants)}",
            data.source(tm.variants_source),
        )
    ]


def rule_python_torch(q: Query, data: CompatData) -> list[Violation]:
    if not (q.python and q.torch):
        return []
    data.torch_minor(q.torch)
    pythons = data.torch_releases[q.torch]["python"]
    if q.python in pythons:
        return []
    return [
        Violation(
            "python-torch",
            f"torch {q.torch} publishes Linux x86_64 wheels for Python {pythons[0]}–{pythons[-1]}, not {q.python}",
            f"{PYPI_META} (torch {q.torch} wheel tags)",
        )
    ]


def _release_checks(q: Query, data: CompatData, name: str, version: str) -> list[Violation]:
    """Requires-Python, requirements on other pinned packages, and yanked status of one pinned release."""
    rel = data.package(name, version)
    out: list[Violation] = []
    src = f"{PYPI_META} ({name} {version})"
    if q.python and rel.requires_python and not _allows(rel.requires_python, q.python + ".0"):
        rule = "python-transformers" if name == "transformers" else "package-python"
        out.append(Violation(rule, f"{name} {version} requires Python {rel.requires_python}, not {q.python}", src))
    pinned = {"torch": q.torch, "transformers": q.transformers}
    for req in q.packages:
        pinned[requirement_name(req)] = pinned_version(req)
    for dep, spec in sorted(rel.requires.items()):
        have = pinned.get(dep)
        if not have or not spec or _allows(spec, have):
            continue
        rule = "transformers-torch" if (name, dep) == ("transformers", "torch") else "package-requires"
        out.append(Violation(rule, f"{name} {version} requires {dep}{spec}, not {dep} {have}", src))
    if rel.yanked:
        out.append(Violation("package-yanked", f"{name} {version} is yanked on PyPI", src))
    return out


def rule_transformers(q: Query, data: CompatData) -> list[Violation]:
    if not q.transformers:
        return []
    if q.torch:
        data.torch_minor(q.torch)
    return _release_checks(q, data, "transformers", q.transformers)


def rule_packages(q: Query, data: CompatData) -> list[Violation]:
    out: list[Violation] = []
    for req in q.packages:
        name, version = requirement_name(req), pinned_version(req)
        if version is None or name not in data.packages or name == "torch":
            continue  # unpinned or not a package the data watches: the resolver decides
        out.extend(_release_checks(q, data, name, version))
    return out


def rule_companions(q: Query, data: CompatData) -> list[Violation]:
    """A package of the query that contradicts torch's companion table (compat/companions.py): a pin of a companion
    built for another torch (torchaudio==2.11.0 with torch 2.7.1), or of what torch imports undeclared (numpy>=2 with
    torch 2.1.2)."""
    if not (q.torch and q.packages):
        return []
    data.torch_minor(q.torch)
    env = image_marker_env(q.python or "3.11", MACHINES[q.platform])
    return [
        Violation(
            "torch-companion",
            f"{text} contradicts the companion table: {c.why}, so a cell of torch {q.torch} holds {c.requirement}",
            data.source(c.source),
        )
        for text, c in companions.conflicts(q.packages, companions.constraints(data, q.torch), env)
    ]


def rule_driver(q: Query, data: CompatData) -> list[Violation]:
    if not (q.cuda and q.driver):
        return []
    floor = driver_floor(data, q.cuda)
    if driver_key(q.driver) >= driver_key(floor.minimum):
        return []
    return [
        Violation(
            "driver-floor",
            f"{variant_of(q.cuda)} wheels need an NVIDIA driver >= {floor.minimum} (CUDA {cuda_major(q.cuda)}.x "
            f"minor-version compatibility); the oldest host driver is {q.driver}",
            floor.source,
        )
    ]


def rule_gpu_arch(q: Query, data: CompatData) -> list[Violation]:
    if not (q.archs and q.cuda and q.torch):
        return []
    data.torch_minor(q.torch)
    entry = data.arch_entry(q.torch, variant_of(q.cuda), q.platform)
    if entry is None:
        return []  # no such variant (rule_cuda_variant says so), or no aarch64 CUDA build (rule_platform)
    out = []
    have = ", ".join(cc_to_sm(a) for a in entry.archs) + (f" + PTX {cc_to_sm(entry.ptx)}" if entry.ptx else "")
    for target in q.archs:
        how = how_arch_runs(entry, target)
        src = f"[{entry.source}] ({entry.confidence}) " + data.source(entry.source).split("] ", 1)[-1]
        if how is None:
            out.append(
                Violation(
                    "gpu-arch",
                    f"torch {q.torch}+{variant_of(q.cuda)} has no kernels for {target} ({have}): "
                    "'no kernel image is available for execution on the device'",
                    src,
                )
            )
        elif how == "ptx" and q.driver:
            full = driver_floor(data, q.cuda).full
            if full and driver_key(q.driver) < driver_key(full):
                out.append(
                    Violation(
                        "ptx-jit-driver",
                        f"{target} runs torch {q.torch}+{variant_of(q.cuda)} only by JIT-compiling PTX, which needs a "
                        f"driver >= {full} (CUDA {q.cuda} GA); the oldest host driver is {q.driver}",
                        f"{data.source('NV')} (I: PTX JIT needs a driver at least as new as the toolkit)",
                    )
                )
    return out


def rule_glibc(q: Query, data: CompatData) -> list[Violation]:
    if not (q.torch and q.base_glibc):
        return []
    tm = data.torch_minor(q.torch)
    if Version(q.base_glibc) >= Version(tm.glibc):
        return []
    return [
        Violation(
            "glibc",
            f"torch {q.torch} wheels need glibc >= {tm.glibc}; the base image has {q.base_glibc}",
            data.source(tm.glibc_source),
        )
    ]


def pypi_aarch64_builds(data: CompatData) -> str:
    """PyPI's aarch64 CUDA builds by variant and the torch releases each spans: 'cu130 (torch 2.11.0 to 2.14.1),
    cu132 (torch 2.15.0)'."""
    spans: dict[str, list[Version]] = {}
    for release, rel in data.torch_releases.items():
        runtime = rel.get("aarch64_cuda_runtime")
        if rel.get("aarch64_archs") and isinstance(runtime, str):
            spans.setdefault(variant_of_runtime(runtime), []).append(Version(release))
    if not spans:
        return "none is known (run `imagekit compat refresh`)"
    shown = []
    for variant, releases in sorted(spans.items(), key=lambda kv: min(kv[1])):
        low, high = min(releases), max(releases)
        shown.append(f"{variant} (torch {low}" + (f" to {high})" if high != low else ")"))
    return ", ".join(shown)


def platform_violations(q: Query, data: CompatData) -> list[Violation]:
    """On linux/arm64: the torch build must be a CUDA build for aarch64. PyPI's aarch64 wheel of a release is a
    CPU-only build up to torch 2.10 and a CUDA build from 2.11 (what `imagekit compat refresh` reads from the
    wheels); any other build (every CUDA build of torch <= 2.10) is routed to the PyTorch index, which must have an
    aarch64 wheel of that variant."""
    if q.platform != ARM64 or not (q.torch and q.cuda):
        return []
    variant = variant_of(q.cuda)
    rel = data.torch_releases.get(q.torch, {})
    pypi = data.pypi_aarch64_variant(q.torch)  # UnknownVersionError when the wheel was not read
    indexed = rel.get("aarch64_variants")
    known = {*data.torch_minor(q.torch).variants, *(indexed if isinstance(indexed, list) else ())}
    if pypi == variant or variant not in known | {pypi}:
        return []  # PyPI's aarch64 build; or no such build of this torch at all (the cuda-variant rule says so)
    what = "a CPU-only build" if pypi is None else f"a {pypi} build"
    if isinstance(indexed, list) and variant in indexed:
        return []  # routed: the PyTorch index's aarch64 build (its GPU architectures: the gpu-arch rule)
    route = f"a torch PyPI has an aarch64 CUDA build of: {pypi_aarch64_builds(data)}"
    if pypi is not None:
        route = f"CUDA {pypi[2:-1]}.{pypi[-1]} ({pypi}: PyPI's aarch64 build of this release)"
    if not isinstance(indexed, list):
        index = (
            "the PyTorch index's aarch64 builds of it are not in the index metadata: `imagekit compat refresh` "
            "where download.pytorch.org is reachable records them, and routes this cell there"
        )
    elif indexed:
        index = f"the PyTorch index has no aarch64 {variant} build of it (its aarch64 builds: {', '.join(indexed)})"
    else:
        index = "the PyTorch index has no aarch64 CUDA build of it"
    return [
        Violation(
            "platform-wheels",
            f"PyPI's torch {q.torch} for aarch64 is {what}"
            + (" (on a Grace host it would train on the CPU)" if pypi is None else "")
            + f", and {index}. Use {route}",
            f"{data.source('PYPI')} (torch {q.torch}: its Linux aarch64 wheel); {data.source('PTI')}",
        )
    ]


def rule_platform(q: Query, data: CompatData) -> list[Violation]:
    return platform_violations(q, data)


RULES: tuple[Callable[[Query, CompatData], list[Violation]], ...] = (
    rule_cuda_variant,
    rule_python_torch,
    rule_transformers,
    rule_packages,
    rule_companions,
    rule_driver,
    rule_platform,
    rule_gpu_arch,
    rule_glibc,
)
# Every id a violation's `rule` can be (`explain --json`, `matrix --explain`); a test holds the rules to it.
RULE_IDS = (
    "cuda-variant",
    "python-torch",
    "python-transformers",
    "transformers-torch",
    "package-python",
    "package-requires",
    "package-yanked",
    "torch-companion",
    "driver-floor",
    "platform-wheels",
    "gpu-arch",
    "ptx-jit-driver",
    "glibc",
)


def _archs_known(q: Query, data: CompatData) -> None:
    """A torch build imagekit knows of but whose GPU architectures it does not: no image can say which hosts run it
    (its runtime contract), so the cell is unknown rather than compatible."""
    if not (q.cuda and q.torch) or variant_of(q.cuda) not in data.torch_minor(q.torch).variants:
        return
    if q.platform == ARM64 and platform_violations(q, data):
        return  # not an aarch64 CUDA build at all: rule_platform says why, and what works
    if data.arch_entry(q.torch, variant_of(q.cuda), q.platform) is None:
        minor = ".".join(q.torch.split(".")[:2])
        on = "" if q.platform == AMD64 else f" on {q.platform}"
        where = f', platform = "{q.platform}"' if q.platform != AMD64 else ""
        raise UnknownVersionError(
            f"torch {q.torch}+{variant_of(q.cuda)}{on}: imagekit has no GPU architecture list for it (not in its "
            f"curated facts, data version {data.data_version}, nor in the index metadata), so no image of it can say "
            "which GPUs it runs on",
            f'add an [[arch]] table (torch = ["{minor}"], variants = ["{variant_of(q.cuda)}"]{where}, archs, ptx, '
            f"source) to {data.curated_path}, read from the wheel (torch._C._cuda_getArchFlags()), or upgrade "
            "imagekit; `imagekit compat refresh` reads it only for PyPI's own builds",
        )


def evaluate(q: Query, data: CompatData) -> Verdict:
    _torch_known(q, data)
    if q.cuda:
        driver_floor(data, q.cuda)
    _archs_known(q, data)
    violations: list[Violation] = []
    for rule in RULES:
        violations.extend(rule(q, data))
    return Verdict(tuple(violations))


def supported_archs(data: CompatData, torch: str, cuda: str, platform: str = AMD64) -> tuple[list[str], str | None]:
    """(cubin archs as sm_XY, PTX arch or None) compiled into torch's ``cuda`` variant for ``platform``."""
    entry = data.arch_entry(torch, variant_of(cuda), platform)
    if entry is None:
        return [], None
    return [cc_to_sm(a) for a in entry.archs], (cc_to_sm(entry.ptx) if entry.ptx else None)
