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

CUDA 11 and 12 cells get Debian's own toolkit instead, where Debian ships one for the cell's CUDA and base
(compat.toml ``[[cuda_compiler_deb]]``: CUDA 11.8 on bookworm, the Python 3.11 base; CUDA 12.4 on trixie, the Python
3.13 base). ``nvidia-cuda-toolkit`` joins the cell's `[image] apt` packages (and ``ninja`` its Python ones): apt
resolves it over the base with the non-free component added, each .deb of its closure is locked by sha256, and the
image installs exactly those files (the apt layer of the build plan). Its nvcc is ``/usr/bin/nvcc``
(``CUDA_HOME=/usr``); it runs the g++ release the package depends on (its ``/etc/nvcc.profile`` puts Debian's
gcc/g++ scripts first on nvcc's PATH: g++-11 for 11.8, g++-13 for 12.4), whatever the base's default g++ is. The
driver's libraries it depends on are provided by a stub package (``imagekit.locking.driver_stub``): the host's
driver is mounted at run time. Any other CUDA 11 or 12 cell is refused.

How it is pinned: each CUDA 13 cell requires ``cuda-toolkit[cccl,crt,nvcc,nvvm]==<the cell's CUDA>.*`` (NVIDIA's
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

from imagekit.compat.catalog import CompatData
from imagekit.compat.compiler_debs import CompilerDeb
from imagekit.errors import ConfigError
from imagekit.model import AMD64, Cell
from imagekit.trust import validate

FIRST_MAJOR = 13  # the first CUDA whose nvcc is on PyPI (nvidia-cuda-nvcc)
META = "cuda-toolkit"
EXTRAS = ("cccl", "crt", "nvcc", "nvvm")  # nvcc and its tools, the crt and CCCL headers, cicc and libdevice
NINJA = "ninja"
# What the compiler layer holds: the wheels the extras above pin (the runtime's headers come with torch's cudart)
DISTRIBUTIONS = frozenset({"nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-cuda-nvcc", "nvidia-nvvm"})
LAYER = "cuda-compiler"
TITLE = "CUDA compiler: nvcc, cicc, the CUDA headers"
DEB_PACKAGE = "nvidia-cuda-toolkit"  # Debian's (non-free): CUDA 11 and 12 cells, [[cuda_compiler_deb]]
DEB_HOME = "/usr"  # where Debian's toolkit lives: /usr/bin/nvcc, /usr/include/cuda_runtime.h


def major(cuda: str) -> int:
    return int(cuda.split(".")[0])


def requirements(cuda: str) -> tuple[str, str]:
    """What a cell of CUDA ``cuda`` (``13.0``) adds to its requirements."""
    return f"{META}[{','.join(EXTRAS)}]=={cuda}.*", NINJA


def compiler_deb(cell: Cell, data: CompatData, base: str | None) -> CompilerDeb | None:
    """Debian's toolkit for ``cell`` over the base named ``base``, or None (a CUDA 13 cell's comes from PyPI)."""
    if cell.platform != AMD64:
        return None
    return next((d for d in data.compiler_debs if d.cuda == cell.cuda and d.base == base), None)


def have_one(data: CompatData) -> str:
    """Which cells can have the compiler, in words (for a refusal)."""
    debian = [f"CUDA {d.cuda} cells on {d.base} (Debian's {d.package})" for d in data.compiler_debs]
    return ", ".join([*debian, f"CUDA {FIRST_MAJOR} cells (NVIDIA's wheels on PyPI)"])


def describe(cuda: str, python: str | None, data: CompatData) -> str:
    """What `[image] cuda_toolkit = true` gives a cell of ``cuda`` (and ``python``: its base), in words, with the
    source (`imagekit explain`)."""
    if major(cuda) >= FIRST_MAJOR:
        wheels = f"{META}[{','.join(EXTRAS)}]=={cuda}.*"
        return f"nvcc from NVIDIA's wheels ({wheels}), CUDA_HOME={home('/opt/cuda-libs', cuda)}"
    base = data.bases.get(python) if python else None
    rows = [d for d in data.compiler_debs if d.cuda == cuda and (base is None or d.base == base.name)]
    if rows:
        return "; ".join(
            f"Debian's {d.package} {d.version} ({d.component}) on {d.base}, nvcc running {d.host_compiler}, "
            f"CUDA_HOME={DEB_HOME} [{d.source}]"
            for d in rows
        )
    on = f" on {base.name}" if base else ""
    return f"none for CUDA {cuda}{on}: the option is refused (the cells that have one: {have_one(data)})"


def problem(cell: Cell, data: CompatData, base: str | None) -> str | None:
    """Why ``cell`` (over the base named ``base``) cannot have the compiler, or None."""
    if major(cell.cuda) >= FIRST_MAJOR or compiler_deb(cell, data, base) is not None:
        return None
    return (
        f"{cell.id}: no CUDA compiler for CUDA {cell.cuda} on {base or 'its base'} ({cell.platform}): PyPI has nvcc "
        f"for CUDA {FIRST_MAJOR} only, and Debian's archive has nvidia-cuda-toolkit for "
        + ", ".join(f"CUDA {d.cuda} on {d.base} [{d.source.split(' (')[0]}]" for d in data.compiler_debs)
    )


def with_toolkit(
    cells: dict[str, Cell], origin: str, data: CompatData, base_of: dict[str, str | None]
) -> dict[str, Cell]:
    """Each cell with the compiler among its requirements (locked and hashed like any other): a CUDA 13 cell's
    wheels, or Debian's toolkit among a CUDA 11 or 12 cell's `[image] apt` packages. ``base_of``: the base each
    Python's cells start from (None: a base of the user's, whose archive imagekit knows nothing of). A cell that
    can have none is refused, all of them at once, naming the cells that can."""
    problems = [p for p in (problem(c, data, base_of.get(c.python)) for c in cells.values()) if p]
    if problems:
        raise ConfigError(
            [f"{origin}: image.cuda_toolkit: {p}" for p in problems],
            f"keep cuda_toolkit = true for the cells that have a compiler ({have_one(data)}), or leave it out",
        )
    return {k: _with(c) if major(c.cuda) >= FIRST_MAJOR else _with_deb(c) for k, c in cells.items()}


def _with_deb(cell: Cell) -> Cell:
    """Debian's toolkit among the cell's apt packages, and ``ninja`` (torch's extension builder runs it) among its
    Python ones, as for a CUDA 13 cell."""
    names = {validate.requirement_name(r) for r in cell.packages}
    packages = cell.packages if NINJA in names else tuple(sorted((*cell.packages, NINJA)))
    return replace(cell, apt=tuple(sorted({*cell.apt, DEB_PACKAGE})), packages=packages)


def _with(cell: Cell) -> Cell:
    names = {validate.requirement_name(r) for r in cell.packages}
    added = [r for r in requirements(cell.cuda) if validate.requirement_name(r) not in names]
    return replace(cell, packages=tuple(sorted((*cell.packages, *added))))


def home(cuda_prefix: str, cuda: str) -> str:
    """``CUDA_HOME``: the toolkit tree the wheels make in the CUDA prefix (``/opt/cuda-libs/nvidia/cu13``), or
    Debian's (``/usr``) for a CUDA 11 or 12 cell."""
    return f"{cuda_prefix}/nvidia/cu{major(cuda)}" if major(cuda) >= FIRST_MAJOR else DEB_HOME


def cudart_script(cuda_prefix: str, cuda: str) -> tuple[str, bytes]:
    """(image path, bytes) of ``$CUDA_HOME/lib/libcudart.so``: an ld script naming the wheel's versioned library."""
    text = "/* imagekit: -lcudart is the wheel's runtime (an ld script, as libc.so is) */\n"
    text += f"INPUT(libcudart.so.{major(cuda)})\n"
    return f"{home(cuda_prefix, cuda)}/lib/libcudart.so", text.encode()
