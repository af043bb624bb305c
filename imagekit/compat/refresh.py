"""`imagekit compat refresh`, the pure part: which releases a refresh records, the document it builds from the index's
pages and metadata, the checks that refuse a document, and what an index lists that a document lacks (`--check`).

`imagekit.services.locks.compat_refresh` fetches the pages and metadata and writes the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from html.parser import HTMLParser

from packaging.version import Version

from imagekit.compat import catalog as compat
from imagekit.compat.pypi_metadata import (
    TORCH_FLOOR,
    WATCHED,
    TorchRelease,
    WheelFile,
    pick_metadata_wheel,
    pick_platform_wheel,
    releases_to_record,
    torch_releases,
    wheel_files,
    yanked_releases,
)
from imagekit.errors import UsageError
from imagekit.in_image import facts
from imagekit.model import variant_of_runtime
from imagekit.trust import validate

DEFAULT_INDEX = "https://pypi.org/simple"
DEFAULT_PYTORCH_INDEX = "https://download.pytorch.org/whl"  # read for the CUDA variants of each torch release
_TORCH_WHEEL = re.compile(
    r"torch-(?P<version>[0-9]{1,4}(?:\.[0-9]{1,4}){1,3})\+(?P<variant>cu1[0-9]{2})-cp[0-9]{2,3}-cp[0-9]{2,3}t?-"
    r"(?P<platform>(?:many)?linux[A-Za-z0-9_]{0,40}_(?P<arch>x86_64|aarch64))\.whl",
    re.ASCII,
)
ARCH_FIELDS = {"x86_64": "variants", "aarch64": "aarch64_variants"}


class _Anchors(HTMLParser):
    """The text of each <a> of a PEP 503 page (the file names)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.hrefs: list[str] = []
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "a":
            self._inside = True
            self.names.append("")
            href = next((v for k, v in attrs if k == "href" and isinstance(v, str)), "")
            self.hrefs.append(href[:2000])

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._inside = False

    def handle_data(self, data: str) -> None:
        if self._inside and len(self.names[-1]) < 300:
            self.names[-1] += data


def pytorch_variants(page_html: str) -> dict[str, dict[str, list[str]]]:
    """Per torch release, the CUDA variants the PyTorch index has Linux wheels of, per CPU architecture
    (``{"2.15.0": {"variants": ["cu126", "cu130"], "aarch64_variants": ["cu130"]}}``), from its PEP 503 page's file
    names (hostile until here: a name not of the wheel grammar is passed over)."""
    parser = _Anchors()
    parser.feed(page_html)
    found: dict[str, dict[str, set[str]]] = {}
    for name in parser.names:
        m = _TORCH_WHEEL.fullmatch(name.strip())
        if m is None:
            continue
        field = ARCH_FIELDS[m["arch"]]
        found.setdefault(m["version"], {}).setdefault(field, set()).add(m["variant"])
    return {
        v: {field: sorted(vs, key=lambda x: int(x[2:])) for field, vs in sorted(fields.items())}
        for v, fields in found.items()
    }


def pytorch_aarch64_reads(page_html: str) -> list[tuple[str, str, str]]:
    """(release, variant, link) whose GPU architectures a refresh reads from the PyTorch index: for the newest
    release of each minor, one Linux aarch64 wheel per CUDA variant (the first by name: every Python's build of a
    variant has the same kernels). Pure; the links are the page's own (the caller makes them absolute and checks
    them)."""
    parser = _Anchors()
    parser.feed(page_html)
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for name, href in zip(parser.names, parser.hrefs, strict=True):
        m = _TORCH_WHEEL.fullmatch(name.strip())
        if m is None or m["arch"] != "aarch64" or not href:
            continue
        key = (m["version"], m["variant"])
        if key not in found or name.strip() < found[key][0]:
            found[key] = (name.strip(), href.split("#", 1)[0])
    newest = set(newest_per_minor({v for v, _ in found}))
    return sorted((v, variant, url) for (v, variant), (_, url) in found.items() if v in newest)


PROJECTS = ("torch", *sorted(WATCHED))  # the index pages a refresh reads


def recorded_torch(page: dict) -> dict[str, TorchRelease]:
    """The torch releases a refresh records from torch's PEP 691 page (final, not yanked, Linux x86_64 CPython
    wheels, at or above the floor)."""
    return torch_releases(page, TORCH_FLOOR)


def metadata_wheels(page: dict, versions: list[str]) -> dict[str, WheelFile]:
    """Per release, the wheel whose metadata stands for it; a release with none (no Linux x86_64 or pure-Python
    wheel) is left out, and so is not recorded."""
    files = wheel_files(page)
    picks = {v: pick_metadata_wheel(files, v) for v in versions}
    return {v: w for v, w in picks.items() if w is not None}


def recorded_releases(name: str, page: dict) -> list[str]:
    """The releases of ``name`` (torch or a watched package) a refresh records from its page, oldest first."""
    if name == "torch":
        return sorted(recorded_torch(page), key=Version)
    return list(metadata_wheels(page, releases_to_record(page, WATCHED[name])))


def document(
    pages: Mapping[str, dict],
    metadata: Mapping[str, Mapping[str, dict]],
    variants: Mapping[str, Mapping[str, list[str]]] | None = None,
) -> dict:
    """The pypi-metadata.json document. ``pages``: each project's PEP 691 page (`PROJECTS`); ``metadata``: per
    project, per release, its parsed metadata (`PackageMeta.to_json`); ``variants``: the PyTorch index's CUDA
    variants per torch release (`pytorch_variants`), when it was read. A package release without metadata is left
    out; a torch release keeps its Python window and glibc floor."""
    torch = recorded_torch(pages["torch"])
    torch_meta = metadata.get("torch", {})
    doc: dict = {
        "generated_by": "imagekit compat refresh",
        "source": "PYPI",
        "torch": {
            v: {"python": list(r.pythons), "glibc": r.glibc, **torch_meta.get(v, {}), **(variants or {}).get(v, {})}
            for v, r in sorted(torch.items())
        },
        "packages": {},
    }
    for name in sorted(WATCHED):
        meta = metadata.get(name, {})
        yanked = yanked_releases(pages[name])
        versions = releases_to_record(pages[name], WATCHED[name])
        doc["packages"][name] = {v: {**meta[v], "yanked": v in yanked} for v in versions if v in meta}
    return doc


def newest_per_minor(versions: Collection[str]) -> list[str]:
    """The newest final release of each minor among ``versions``, oldest minor first."""
    newest: dict[tuple[int, int], Version] = {}
    for ver in versions:
        v = Version(ver)
        if not v.is_prerelease:
            key = (v.major, v.minor)
            newest[key] = max(newest.get(key, v), v)
    return [str(v) for _, v in sorted(newest.items())]


def arch_reads(page: dict, torch_meta: Mapping[str, dict]) -> dict[str, list[tuple[str, WheelFile]]]:
    """Which wheels a refresh reads torch's compiled GPU architectures from (a range read of one library each), per
    CPU architecture: for the newest release of each minor, its Linux aarch64 wheel (whether PyPI's aarch64 build is
    a CUDA build, and for which GPUs) and its x86_64 wheel (PyPI's build of its CUDA runtime's variant: what no
    curated source gives, and what a curated [[arch]] table is held to, `arch_overpromises`)."""
    files = wheel_files(page)
    out: dict[str, list[tuple[str, WheelFile]]] = {"x86_64": [], "aarch64": []}
    for v in newest_per_minor(torch_meta):
        aarch64 = pick_platform_wheel(files, v, "aarch64")
        if aarch64 is not None:
            out["aarch64"].append((v, aarch64))
        x86 = pick_platform_wheel(files, v, "x86_64")
        if x86 is not None and isinstance(torch_meta[v].get("cuda_runtime"), str):
            out["x86_64"].append((v, x86))
    return out


def arch_overpromises(curated: dict, doc: Mapping) -> list[str]:
    """Each curated [[arch]] table that promises more than the wheel it describes holds: for every torch release whose
    PyPI wheel's arch flags ``doc`` (pypi-metadata.json) records, the table of its minor and PyPI variant (per CPU
    architecture) must name no cubin and no PTX the flags lack. A GPU sent to an image on such a promise fails with
    'no kernel image is available'. Empty when every table agrees with the wheels."""
    out = []
    for version, rel in sorted(doc.get("torch", {}).items(), key=lambda kv: Version(kv[0])):
        v = Version(version)
        minor = f"{v.major}.{v.minor}"
        for platform, flags_key, runtime_key in (
            ("linux/amd64", "archs", "cuda_runtime"),
            ("linux/arm64", "aarch64_archs", "aarch64_cuda_runtime"),
        ):
            flags, runtime = rel.get(flags_key), rel.get(runtime_key)
            if not (isinstance(flags, str) and flags and isinstance(runtime, str)):
                continue
            variant = variant_of_runtime(runtime)
            for a in curated["arch"]:
                if minor not in a["torch"] or variant not in a["variants"]:
                    continue
                if a.get("platform", "linux/amd64") != platform:
                    continue
                sass = [validate.cc_to_sm(x) for x in a["archs"]]
                ptx = validate.cc_to_sm(a["ptx"]) if a.get("ptx") else None
                problems = facts.arch_contract_problems(flags, sass, ptx)
                if problems:
                    out.append(
                        f"[[arch]] torch {minor} {variant} ({platform}, source {a['source'][:80]!r}) promises "
                        f"{', '.join(problems).replace('no ', '')}; PyPI's torch {version} wheel has '{flags}'"
                    )
    return out


def dump(doc: dict) -> str:
    """The file's bytes: canonical JSON (sorted keys), so a refresh that learnt nothing rewrites the same file."""
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def refusal(doc: dict, floor: dict | None) -> str | None:
    """Why ``doc`` must not be written (None when it may): a shape `inputs.compat_data` would not read, or, with
    ``floor`` (the shipped metadata, when writing the file imagekit reads), fewer torch releases or fewer releases
    of a package than the floor, which `inputs.compat_data` would pass over."""
    problems = compat.metadata_problems(doc)
    if problems:
        return "; ".join(problems)
    return compat.floor_problem(doc, floor) if floor is not None else None


def missing_releases(doc: dict, pages: Mapping[str, dict]) -> dict[str, list[str]]:
    """Per project, the releases its index page lists that a refresh would record and ``doc`` lacks, oldest first;
    projects lacking none are left out. Release versions only: no metadata is needed to tell."""
    missing = {}
    for name in PROJECTS:
        known = doc["torch"] if name == "torch" else doc["packages"].get(name, {})
        new = [v for v in recorded_releases(name, pages[name]) if v not in known]
        if new:
            missing[name] = new
    return missing


def describe_missing(missing: Mapping[str, list[str]]) -> str:
    """``torch 2.11.0, transformers 5.10.0``: each release, torch first."""
    return ", ".join(f"{name} {v}" for name in PROJECTS for v in missing.get(name, ()))


def uncurated_minors(torch_versions: list[str], curated_minors: Collection[str]) -> list[str]:
    """The torch minors among ``torch_versions`` the curated facts have no entry for (refreshing cannot add one)."""
    minors = {f"{Version(v).major}.{Version(v).minor}" for v in torch_versions}
    return sorted(minors - set(curated_minors), key=Version)


def unbuildable(data: compat.CompatData) -> dict[str, str]:
    """Per torch minor the data lists a final release of, why no cell of its PyPI build can be made (empty when every
    one can): what the index did not say (its CUDA runtime or glibc), or a curated fact it needs and lacks (the
    driver floor of its CUDA major, the GPU architectures of its build). The weekly check fails on any of these."""
    newest: dict[str, Version] = {}
    for ver in data.torch_releases:
        v = Version(ver)
        if not v.is_prerelease:
            minor = f"{v.major}.{v.minor}"
            newest[minor] = max(newest.get(minor, v), v)
    out = {}
    for minor, v in sorted(newest.items(), key=lambda kv: kv[1]):
        try:
            tm = data.torch_minor(str(v))
        except UsageError:
            out[minor] = (
                f"torch {v}: the index names no CUDA runtime or glibc for it and the curated facts have no [[torch]] "
                f"table for {minor}"
            )
            continue
        default = tm.pypi_default
        cuda = validate.cuda(default)
        problems = []
        try:
            data.driver_family(cuda)
        except UsageError:
            problems.append(f"no driver floor for CUDA {cuda.split('.')[0]}.x (curated [[driver_family]])")
        if data.arch_entry(str(v), default) is None:
            problems.append(
                f"no GPU architecture list for torch {minor}+{default} (curated [[arch]]: read it from the wheel, "
                "torch._C._cuda_getArchFlags())"
            )
        if problems:
            out[minor] = f"torch {v} ({default} on PyPI): " + "; ".join(problems)
    return out
