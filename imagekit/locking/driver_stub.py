"""The driver stub: a .deb of imagekit's own that stands in for the NVIDIA driver's libraries in apt's eyes. Pure.

Debian's CUDA toolkit (`[image] cuda_toolkit` for CUDA 11 and 12 cells) depends on the driver's ``libcuda.so.1`` and
``libnvidia-ml.so.1`` (nvidia-cuda-dev, libcuinj64, libnvidia-ml-dev: compat.toml ``[[cuda_compiler_deb]]``). An
image must not carry a driver: on a GPU host the NVIDIA container runtime mounts the host's own libraries, and a
second, older copy in the image is a version mismatch waiting to happen. This package holds no file; it only
*provides* those names, so apt installs the toolkit and nothing of the driver. Its bytes are made here, the same on
every machine (fixed times, owners and order), so the lock pins it by sha256 like every .deb it names.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from functools import cache

from imagekit.locking.debs import DebPin

NAME = "imagekit-cuda-driver-stub"
VERSION = "1"
ARCH = "all"
DRIVER = "550"  # the driver release it provides: at least what every [[cuda_compiler_deb]] row's closure asks
# A URL that names the pool file the lock's line format asks for; nothing is ever fetched from it (fetch writes
# the bytes below, and a pin of this name with other bytes is refused).
URL = f"https://imagekit.invalid/stub/{NAME}_{VERSION}_{ARCH}.deb"
CONTROL = (
    f"Package: {NAME}\n"
    f"Version: {VERSION}\n"
    f"Architecture: {ARCH}\n"
    "Maintainer: imagekit <imagekit@invalid>\n"
    f"Provides: libcuda.so.1 (= {DRIVER}), libcuda1-any, libcuda-11.8-1, libcuda-12.4-1, "
    f"libnvidia-ml.so.1 (= {DRIVER})\n"
    "Section: non-free/libs\n"
    "Priority: optional\n"
    "Description: the host's NVIDIA driver, mounted at run time (no files)\n"
    " imagekit installs this instead of libcuda1 and libnvidia-ml1: the NVIDIA container runtime\n"
    " mounts the host driver's libraries into the container.\n"
)


def _tar_gz(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        root = tarfile.TarInfo("./")
        root.type, root.mode, root.mtime = tarfile.DIRTYPE, 0o755, 0
        tar.addfile(root)
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(f"./{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def _ar_member(name: str, data: bytes) -> bytes:
    header = f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode()
    assert len(header) == 60
    return header + data + (b"\n" if len(data) % 2 else b"")


@cache
def deb_bytes() -> bytes:
    """The .deb: an ar archive of debian-binary, control.tar.gz (control only) and an empty data.tar.gz."""
    return (
        b"!<arch>\n"
        + _ar_member("debian-binary", b"2.0\n")
        + _ar_member("control.tar.gz", _tar_gz({"control": CONTROL.encode()}))
        + _ar_member("data.tar.gz", _tar_gz({}))
    )


def pin() -> DebPin:
    data = deb_bytes()
    return DebPin(NAME, VERSION, ARCH, len(data), hashlib.sha256(data).hexdigest(), URL)


def is_stub(p: DebPin) -> bool:
    """Whether ``p`` names the stub (by name): its bytes must then be exactly :func:`deb_bytes`."""
    return p.name == NAME
