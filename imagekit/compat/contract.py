"""A published image's runtime contract: what a host must offer to run it (pure).

One derivation from the compatibility facts (:func:`of_cell`), made once per plan (``BuildPlan.contract``) and
written once (:meth:`Contract.to_json`: the manifest, the OCI label ``imagekit.runtime``, the release record);
`pod create`, `runpod-template` and `vast-template` read it from the release record here, so a host filter says what
the image says of itself. A record written before the contract existed gets it from the cell's compatibility facts,
as its build would have.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from imagekit.compat import rules
from imagekit.compat.catalog import CompatData
from imagekit.errors import UsageError
from imagekit.in_image import facts
from imagekit.model import AMD64, Cell, variant_of
from imagekit.trust import validate
from imagekit.trust.untrusted import printable

SM = re.compile(r"sm_[1-9][0-9]{1,2}[af]?", re.ASCII)
CUDA = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}", re.ASCII)
PLATFORMS = ("linux/amd64", "linux/arm64")
_MAX_ARCHS = 64


@dataclass(frozen=True)
class Contract:
    driver_min: str
    cuda: str
    sass: tuple[str, ...]  # cubins, sm_XY
    ptx: str | None  # the PTX the driver can JIT for newer GPUs, sm_XY
    platform: str  # linux/amd64
    glibc_min: str | None
    # the CUDA toolkit's own driver: every feature, and the PTX JIT (the manifest's `driver.full_feature`); not asked of
    # a host, not in the contract as written; None where not known (a contract read back from a record)
    driver_full: str | None = None

    def to_json(self) -> dict:
        """The contract as written (the manifest's ``runtime``, the label ``imagekit.runtime``): what
        :func:`problems` and :func:`from_record` read back."""
        return {
            "driver_min": self.driver_min,
            "cuda": self.cuda,
            "cuda_major": rules.cuda_major(self.cuda),
            "sass": list(self.sass),
            "ptx": self.ptx,
            "platform": self.platform,
            "glibc_min": self.glibc_min,
        }

    def how_runs(self, arch: str) -> str | None:
        """How torch's kernels run on a GPU of compute capability ``arch`` ('8.6', 'sm_86'): 'cubin sm_80',
        'PTX sm_90' (JIT by the driver), or None: 'no kernel image is available for execution on the device'."""
        how = facts.best_kernel(arch, self.sass, self.ptx)
        if how is None:
            return None
        return f"{'cubin' if how[0] == 'cubin' else 'PTX'} sm_{how[1][0]}{how[1][1]}"

    def archs_text(self) -> str:
        return ", ".join(self.sass) + (f" + PTX {self.ptx}" if self.ptx else "") if self.sass else "?"

    @property
    def cpu_arch(self) -> str:
        return self.platform.split("/", 1)[1]


def problems(runtime: object, cell: object = None) -> list[str]:
    """What keeps ``runtime`` (a release record's ``manifest.runtime``, hostile until checked) from being the contract
    of ``cell`` (the record's cell, when given): ``field: why``."""
    if not isinstance(runtime, dict):
        return [": expected an object"]
    out: list[str] = []

    def check(key: str, fn: Callable[[object], object], value: object) -> None:
        try:
            if fn(value) != value:
                raise UsageError(f"{printable(str(value), 40)!r} is not written as imagekit writes it")
        except UsageError as exc:
            out.append(f"{key}: {exc.message}")

    def sm(value: object) -> str:
        if not isinstance(value, str) or len(value) > 8 or not SM.fullmatch(value):
            raise UsageError(f"{printable(str(value), 40)!r} is not a GPU architecture such as sm_90")
        return value

    check("driver_min", validate.driver, runtime.get("driver_min"))
    check("cuda", validate.cuda, runtime.get("cuda"))
    if runtime.get("ptx") is not None:
        check("ptx", sm, runtime["ptx"])
    if runtime.get("glibc_min") is not None:
        check("glibc_min", validate.glibc, runtime["glibc_min"])
    sass = runtime.get("sass")
    if not isinstance(sass, list) or not 1 <= len(sass) <= _MAX_ARCHS or len(set(map(str, sass))) != len(sass):
        out.append(f"sass: expected a list of 1 to {_MAX_ARCHS} different GPU architectures such as sm_90")
    else:
        for item in sass:
            check("sass[]", sm, item)
    if runtime.get("platform") not in PLATFORMS:
        out.append(f"platform: one of {', '.join(PLATFORMS)}")
    want = cell.get("cuda") if isinstance(cell, dict) else None
    if isinstance(want, str) and isinstance(runtime.get("cuda"), str) and runtime["cuda"] != want:
        out.append(f"cuda: {printable(runtime['cuda'], 20)!r}, but the record's cell is CUDA {printable(want, 20)}")
    return out


def of_cell(cell: Cell, data: CompatData) -> Contract:
    """What a host must offer to run the image of ``cell``, from the compatibility facts: the driver floor of its CUDA
    major, the architectures its torch build was compiled for on its platform, the glibc its torch wheels need. The
    one derivation: the plan, the matrix's outputs and a record that predates the contract all ask here."""
    archs, ptx = rules.supported_archs(data, cell.torch, cell.cuda, cell.platform)
    floor = rules.driver_floor(data, cell.cuda)
    glibc = data.torch_minor(cell.torch).glibc
    return Contract(floor.minimum, cell.cuda, tuple(archs), ptx, cell.platform, glibc, floor.full)


def from_record(entry: dict, data: CompatData) -> Contract:
    """The contract of a release record (an index entry `services.release_index.read_index` checked): its own, or for a
    record that predates it, the one the cell's facts give; a usage error when neither is there."""
    manifest = entry["manifest"]
    runtime = manifest.get("runtime")
    if isinstance(runtime, dict) and not problems(runtime, manifest.get("cell")):
        return Contract(
            driver_min=runtime["driver_min"],
            cuda=runtime["cuda"],
            sass=tuple(runtime["sass"]),
            ptx=runtime.get("ptx"),
            platform=runtime["platform"],
            glibc_min=runtime.get("glibc_min"),
        )
    cell = manifest["cell"]
    torch, cuda = cell.get("torch"), cell.get("cuda")
    if not (isinstance(torch, str) and isinstance(cuda, str) and CUDA.fullmatch(cuda)):
        raise UsageError(
            f"the release record of {entry['tag']} names no runtime contract and no torch/CUDA versions",
            "publish it again with this imagekit (`imagekit build --push`)",
        )
    try:  # a record from before arm64 images: linux/amd64; only its torch and CUDA matter to the contract
        return of_cell(Cell(cuda, torch, "", "", platform=AMD64), data)
    except ValueError as exc:  # a version text packaging refuses, in an old record
        raise UsageError(
            f"the release record of {entry['tag']} names no runtime contract, and imagekit's facts lack "
            f"torch {torch[:20]}+{variant_of(cuda)}: {exc}",
            "publish it again with this imagekit (`imagekit build --push`)",
        ) from None


# GPUs that come on Grace boards only: their hosts' CPUs are arm64 (design notes, "Grace hosts (GH200, GB200)")
GRACE_GPUS = ("GH200", "GB200")


def gpus(contract: Contract, data: CompatData) -> tuple[list[str], list[str], list[str]]:
    """The GPUs imagekit knows, by name: (those the image runs on, those its torch has no kernels for, those whose
    hosts have another CPU architecture than the image: Grace GPUs for a linux/amd64 image, every other one for a
    linux/arm64 image)."""
    arm = contract.platform == "linux/arm64"
    other_host = sorted(n for n in data.gpus if (n in GRACE_GPUS) != arm)
    no_kernels = sorted(n for n, cc in data.gpus.items() if contract.how_runs(cc) is None and n not in other_host)
    runs = sorted(set(data.gpus) - set(no_kernels) - set(other_host))
    return runs, no_kernels, other_host


def gpu_line(contract: Contract, data: CompatData) -> str:
    """The templates' line of which GPUs to rent for the image, and which not and why."""
    runs, no_kernels, other_host = gpus(contract, data)
    line = f"GPUs it runs on: {', '.join(runs) or 'none imagekit knows'}"
    if no_kernels:
        line += f"; not on: {', '.join(no_kernels)} ('no kernel image is available')"
    if other_host and contract.platform == "linux/arm64":
        line += f"; not on {', '.join(other_host)} hosts (x86_64 CPUs; this image is {contract.platform})"
    elif other_host:
        line += f"; not on {', '.join(other_host)} hosts (Grace: arm64 CPUs; this image is {contract.platform})"
    return line + "."


def capability(cc: str) -> int:
    """A compute capability as an integer x 100 (`sm_86` -> 860), as Vast's offers write it."""
    major, minor, _ = facts.parse_arch(cc) or (0, 0, "")
    return major * 100 + minor * 10


def of_record(entry: dict, data: CompatData) -> Contract | None:
    """:func:`from_record`, or None for a record that says too little (a template then says what it lacks)."""
    try:
        return from_record(entry, data)
    except UsageError:
        return None
