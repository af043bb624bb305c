"""The CUDA compilers Debian ships (compat.toml ``[[cuda_compiler_deb]]``): `[image] cuda_toolkit` for the CUDA 11
and 12 cells on the base each row names (imagekit/image/cuda_toolkit.py holds the rule). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class CompilerDeb:
    """Debian's CUDA toolkit for one (CUDA, base)."""

    cuda: str  # 11.8
    base: str  # debian-bookworm
    package: str  # nvidia-cuda-toolkit
    version: str  # the archive's version when the fact was read (the lock pins what apt resolves)
    component: str  # non-free
    host_compiler: str  # g++-11: what the package depends on first and its nvcc runs
    driver: str  # the driver release its closure depends on (libcuda.so.1, libnvidia-ml.so.1): the stub provides it
    source: str


def compiler_rows(curated: Mapping) -> tuple[CompilerDeb, ...]:
    keys = ("cuda", "base", "package", "version", "component", "host_compiler", "driver", "source")
    return tuple(CompilerDeb(*(d[k] for k in keys)) for d in curated.get("cuda_compiler_deb", ()))
