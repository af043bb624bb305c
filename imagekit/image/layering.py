"""The layering of one cell: which locked distributions go into which image layer, bottom first. Pure.

Layers are ordered by how often they change, so a rebuild or a pull redoes as little as possible:

1. the CUDA runtime libraries (the ``nvidia-*`` wheels of the torch closure), installed into ``CUDA_PREFIX``, a
   folder outside the virtual environment that holds nothing Python-specific: cells whose CUDA pins agree get
   byte-identical layers (same digest) whatever their Python or torch. The venv sees the folder through a ``.pth``
   made in the base stage, and the torch layer links each folder the wheels made there (``nvidia/``,
   ``cusparselt/``) into site-packages, so torch loads these libraries through its own RPATH exactly as from
   site-packages. They are split into several layers:
   - the CUDA toolkit's components (cuBLAS, cuFFT, cuRAND, cuSOLVER, cuSPARSE, the runtime, NVRTC, CUPTI, nvJitLink,
     NVTX, cuFile): they change with the CUDA version only;
   - then one layer per library NVIDIA releases on its own schedule: cuDNN, NCCL, then the others by name
     (cuSPARSELt, NVSHMEM, ...), which torch releases added later. A torch upgrade that adds a library or moves
     one of these keeps every layer below it, which matters for Docker's graph-driver store: it reuses a pulled
     layer only when the whole chain below it is the same (registries and containerd reuse any equal blob).
2. torch and the rest of its closure (triton, sympy, ...), in the venv, bytecode compiled;
   - last, with `[image] cuda_toolkit`, the CUDA compiler (nvcc, cicc, the crt and CCCL headers:
     imagekit.image.cuda_toolkit), in the same prefix: it completes the toolkit tree the runtime wheels began
     (``nvidia/cu13``) and changes with the CUDA release only; a cell without it keeps every layer below.
3. the Debian packages of `[image] apt`, when there are any (they change less often than the app's pins, and
   nothing in the venv depends on them);
4. everything else (the app layer: transformers, accelerate, ...).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from imagekit.image import cuda_toolkit as cuda_toolkit_
from imagekit.locking import debs
from imagekit.locking.lockfile import Lock, LockEntry

CUDA_PREFIX = "/opt/cuda-libs"
VENV = "/opt/venv"
# Components that ship in every CUDA toolkit release (cu12 names carry a -cu12 suffix, cu13 ones none).
_TOOLKIT = re.compile(
    r"nvidia-(cublas|cuda-[a-z0-9]+|cufft|cufile|curand|cusolver|cusparse|nvjitlink|nvtx|npp|nvjpeg)(-cu\d+)?"
)
_OWN_SCHEDULE_FIRST = ("cudnn", "nccl")  # the big, long-standing ones, before those torch added later


@dataclass(frozen=True)
class Layer:
    name: str  # cuda-toolkit, cuda-cudnn, ..., torch, app
    entries: tuple[LockEntry, ...]
    target: str  # CUDA_PREFIX (a plain folder, no bytecode) or VENV
    title: str

    @property
    def requirements(self) -> str:
        """What the layer installs: pins and hashes, no `# via` (a new dependent elsewhere changes nothing here)."""
        return "".join(e.render(via=False, installed=True) + "\n" for e in self.entries)

    @property
    def requirements_sha256(self) -> str:
        return hashlib.sha256(self.requirements.encode()).hexdigest()

    @property
    def filename(self) -> str:
        return f"requirements-{self.name}.txt"

    @property
    def key(self) -> str:
        """Same key, same layer contents (given the same installer): the rendered inputs of the layer."""
        return hashlib.sha256(f"{self.target}\n{self.requirements}".encode()).hexdigest()

    @property
    def python_independent(self) -> bool:
        return self.target == CUDA_PREFIX


@dataclass(frozen=True)
class AptLayer:
    """The `[image] apt` packages: exactly the locked .debs, installed by apt from the build's wheelhouse."""

    pins: tuple[debs.DebPin, ...]
    name: str = "apt"
    title: str = "Debian packages"

    @property
    def requirements(self) -> str:
        return debs.install_list(self.pins)

    @property
    def requirements_sha256(self) -> str:
        return hashlib.sha256(self.requirements.encode()).hexdigest()

    @property
    def filename(self) -> str:
        return "requirements-apt.txt"


@dataclass(frozen=True)
class Layering:
    """Which locked distributions go into which image layer, bottom first (a part of a build plan, not a plan)."""

    cuda: tuple[Layer, ...]
    torch: Layer
    app: Layer
    apt: AptLayer | None = None  # installed between the torch and the app layers

    @property
    def layers(self) -> tuple[Layer, ...]:
        """The Python layers (the apt layer, when there is one, is :attr:`apt`)."""
        return (*self.cuda, self.torch, self.app)

    @property
    def requirement_files(self) -> dict[str, str]:
        """What each layer's RUN reads beside the wheels: file name -> text."""
        files = {layer.filename: layer.requirements for layer in self.layers}
        if self.apt is not None:
            files[self.apt.filename] = self.apt.requirements
        return files

    def to_json(self) -> dict:
        return {
            "cuda_prefix": CUDA_PREFIX,
            "layers": [
                {
                    "name": layer.name,
                    "target": layer.target,
                    "key": layer.key[:16],
                    "distributions": [e.name for e in layer.entries],
                }
                for layer in self.layers
            ]
            + ([{"name": "apt", "target": "/", "debs": [p.name for p in self.apt.pins]}] if self.apt else []),
        }


def is_cuda_runtime(name: str) -> bool:
    return name.startswith("nvidia-")


def _group(name: str) -> str:
    if _TOOLKIT.fullmatch(name):
        return "toolkit"
    stem = name.removeprefix("nvidia-")
    return re.sub(r"-cu\d+$", "", stem)


def split(lock: Lock, cuda_toolkit: bool = False) -> Layering:
    """The lock's torch section split into CUDA runtime layers and the torch layer; its app section is the app layer.
    ``cuda_toolkit`` (`[image] cuda_toolkit`): the compiler's wheels, from either section, are a CUDA layer of their
    own, the last."""
    groups: dict[str, list[LockEntry]] = {}
    rest = []
    compiler = [e for e in lock.entries if e.name in cuda_toolkit_.DISTRIBUTIONS] if cuda_toolkit else []
    for entry in lock.torch:
        if compiler and entry.name in cuda_toolkit_.DISTRIBUTIONS:
            continue
        if is_cuda_runtime(entry.name):
            groups.setdefault(_group(entry.name), []).append(entry)
        else:
            rest.append(entry)
    order = sorted(groups, key=lambda g: (g != "toolkit", g not in _OWN_SCHEDULE_FIRST, _rank(g), g))
    cuda = tuple(
        Layer(
            f"cuda-{g}",
            tuple(sorted(groups[g], key=lambda e: e.name)),
            CUDA_PREFIX,
            "CUDA toolkit libraries" if g == "toolkit" else f"CUDA library {g}",
        )
        for g in order
    )
    if compiler:
        entries = tuple(sorted(compiler, key=lambda e: e.name))
        cuda += (Layer(cuda_toolkit_.LAYER, entries, CUDA_PREFIX, cuda_toolkit_.TITLE),)
    app = tuple(e for e in lock.app if not (compiler and e.name in cuda_toolkit_.DISTRIBUTIONS))
    return Layering(
        cuda,
        Layer("torch", tuple(rest), VENV, "torch and its closure"),
        Layer("app", app, VENV, "everything else"),
        _apt_layer(lock),
    )


def _apt_layer(lock: Lock) -> AptLayer | None:
    """The `[image] apt` layer; with Debian's CUDA compiler (`[image] cuda_toolkit`, CUDA 11 and 12) it says so."""
    if not lock.apt:
        return None
    if any(p.name == cuda_toolkit_.DEB_PACKAGE for p in lock.apt):
        return AptLayer(lock.apt, title=f"Debian packages, the CUDA compiler ({cuda_toolkit_.DEB_PACKAGE}) among them")
    return AptLayer(lock.apt)


def _rank(group: str) -> int:
    return _OWN_SCHEDULE_FIRST.index(group) if group in _OWN_SCHEDULE_FIRST else len(_OWN_SCHEDULE_FIRST)
