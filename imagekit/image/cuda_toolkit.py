"""`[image] cuda_toolkit = true`: a CUDA compiler in the image, from NVIDIA's own wheels, hash-locked. Pure.

What PyPI has (read from the wheels themselves, not their names): only the CUDA 13 wheels carry the compiler.
``nvidia-cuda-nvcc`` (13.x) holds ``bin/nvcc``, ``cudafe++``, ``fatbinary``, ``nvlink`` and ``ptxas``;
``nvidia-cuda-crt`` the ``include/crt`` headers nvcc includes; ``nvidia-cuda-cccl`` CUB, Thrust and libcu++;
``nvidia-nvvm`` ``nvvm/bin/cicc`` and libdevice; ``nvidia-cuda-runtime`` (already in torch's closure)
``cuda_runtime.h`` and ``libcudart.so.13``. Every one installs into one tree, ``nvidia/cu13/``, laid out as a
toolkit is: that folder is ``CUDA_HOME``. ``nvidia-cuda-nvcc-cu12`` (12.0 to 12.9) and ``-cu11`` (11.7, 11.8)
hold ``ptxas``, libnvvm and the crt headers, but no ``nvcc``, ``cudafe++`` or ``fatbinary``: no CUDA 11 or 12 cell
can have a compiler from wheels, so the option refuses them (torch's extension builder also refuses an nvcc of
another CUDA major than torch's).

How it is pinned: each cell requires ``cuda-toolkit[cccl,crt,nvcc,nvvm]==<the cell's CUDA>.*`` (NVIDIA's
meta-package, whose extras pin one coherent release of each component; torch's CUDA 13 wheels require the same
meta-package, so the compiler is of torch's own toolkit release) and ``ninja`` (torch's extension builder runs
it). They are resolved and hash-locked with the rest of the cell. The compiler's wheels are one layer of their
own in the CUDA prefix (``layering``), above the CUDA libraries and below torch; ``ninja`` is a venv package
(its ``ninja`` command lands in ``/opt/venv/bin``, on PATH) and lies in the app layer.

Linking an extension runs ``g++ ... -L$CUDA_HOME/lib -lcudart``; the wheel ships ``libcudart.so.13`` and no
``libcudart.so``. The app layer adds that file as a GNU ld script, ``INPUT(libcudart.so.13)`` (a regular file, as
``libc.so`` is: no link), so the extension records ``libcudart.so.13``, the library torch has already loaded.
"""

from __future__ import annotations

from dataclasses import replace

from imagekit.errors import ConfigError
from imagekit.model import Cell
from imagekit.trust import validate

FIRST_MAJOR = 13  # the first CUDA whose nvcc is on PyPI (nvidia-cuda-nvcc)
META = "cuda-toolkit"
EXTRAS = ("cccl", "crt", "nvcc", "nvvm")  # nvcc and its tools, the crt and CCCL headers, cicc and libdevice
NINJA = "ninja"
# What the compiler layer holds: the wheels the extras above pin (the runtime's headers come with torch's cudart)
DISTRIBUTIONS = frozenset({"nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-cuda-nvcc", "nvidia-nvvm"})
LAYER = "cuda-compiler"
TITLE = "CUDA compiler: nvcc, cicc, the CUDA headers"


def major(cuda: str) -> int:
    return int(cuda.split(".")[0])


def requirements(cuda: str) -> tuple[str, str]:
    """What a cell of CUDA ``cuda`` (``13.0``) adds to its requirements."""
    return f"{META}[{','.join(EXTRAS)}]=={cuda}.*", NINJA


def problem(cell: Cell) -> str | None:
    """Why ``cell`` cannot have the compiler, or None."""
    if major(cell.cuda) >= FIRST_MAJOR:
        return None
    return (
        f"{cell.id}: CUDA {cell.cuda} has no nvcc on PyPI (nvidia-cuda-nvcc-cu{major(cell.cuda)} holds ptxas and "
        "libnvvm, not nvcc; NVIDIA ships nvcc as a wheel from CUDA 13 on, as nvidia-cuda-nvcc)"
    )


def with_toolkit(cells: dict[str, Cell], origin: str) -> dict[str, Cell]:
    """Each cell with the compiler's requirements among its packages (locked and hashed like any other); a cell of
    CUDA 11 or 12 is refused, all of them at once."""
    problems = [p for p in (problem(c) for c in cells.values()) if p]
    if problems:
        raise ConfigError(
            [f"{origin}: image.cuda_toolkit: {p}" for p in problems],
            "keep cuda_toolkit = true for CUDA 13 cells only (cu130 and later: torch 2.11+ on PyPI), or leave it out",
        )
    return {k: _with(c) for k, c in cells.items()}


def _with(cell: Cell) -> Cell:
    names = {validate.requirement_name(r) for r in cell.packages}
    added = [r for r in requirements(cell.cuda) if validate.requirement_name(r) not in names]
    return replace(cell, packages=tuple(sorted((*cell.packages, *added))))


def home(cuda_prefix: str, cuda: str) -> str:
    """``CUDA_HOME``: the toolkit tree the wheels make in the CUDA prefix (``/opt/cuda-libs/nvidia/cu13``)."""
    return f"{cuda_prefix}/nvidia/cu{major(cuda)}"


def cudart_script(cuda_prefix: str, cuda: str) -> tuple[str, bytes]:
    """(image path, bytes) of ``$CUDA_HOME/lib/libcudart.so``: an ld script naming the wheel's versioned library."""
    text = "/* imagekit: -lcudart is the wheel's runtime (an ld script, as libc.so is) */\n"
    text += f"INPUT(libcudart.so.{major(cuda)})\n"
    return f"{home(cuda_prefix, cuda)}/lib/libcudart.so", text.encode()
