"""An image's exact config bytes and layer tars, read from the engine: straight from its layer store when the engine
runs on this machine and keeps layers in folders (overlay2, fuse-overlayfs), else from `docker save`.

The store path reads each layer's files where the engine keeps them and puts the tar back together with the engine's
own tar-split record, the way `docker save` and `docker push` do, but without `docker save`'s copy of the whole
image into a temporary folder first (65 of its 86 s for a 5.7 GB image here) and one layer at a time, so a layer the
registry already has is never read. Nothing read is trusted: every layer's tar must hash to the diff id the image's
config names, and the config to the image id (`export.LayerMismatch` otherwise), so a store laid out differently
than expected fails loudly, never publishes other bytes."""

from __future__ import annotations

import gzip
import os
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from imagekit.errors import EnvironmentFailure
from imagekit.oci import layer_blobs

STORE_DRIVERS = ("overlay2", "fuse-overlayfs")
READ = 4 << 20
MAX_CONFIG = 8 << 20


class LayerMismatch(EnvironmentFailure):
    """What was read is not the image's bytes."""


def _digest_hex(digest: str) -> str:
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64 or not all(c in "0123456789abcdef" for c in hexpart):
        raise LayerMismatch(f"{digest[:80]!r} is not a sha256 digest", "check the engine")
    return hexpart


@dataclass(frozen=True)
class StoreExport:
    """Layers read from the engine's own folders (``root``: its DockerRootDir, ``driver``: its storage driver)."""

    root: Path
    driver: str
    image_id: str

    def config(self) -> bytes:
        path = self.root / "image" / self.driver / "imagedb" / "content" / "sha256" / _digest_hex(self.image_id)
        with open(path, "rb") as fh:
            data = fh.read(MAX_CONFIG + 1)
        if len(data) > MAX_CONFIG or layer_blobs.sha256(data) != self.image_id:
            raise LayerMismatch(f"the engine's stored config of {self.image_id} is another's", "check the engine")
        return data

    def layer(self, diff_ids: list[str], index: int) -> Iterator[bytes]:
        """The exact tar of layer ``index`` (bottom 0), in chunks; the caller checks it against its diff id."""
        chain = layer_blobs.chain_ids(diff_ids)[index]
        meta = self.root / "image" / self.driver / "layerdb" / "sha256" / _digest_hex(chain)
        cache_id = (meta / "cache-id").read_text().strip()
        if not cache_id or "/" in cache_id or cache_id in (".", ".."):
            raise LayerMismatch(f"layer {chain} has no usable cache id", "check the engine")
        folder = os.path.realpath(self.root / self.driver / cache_id / "diff")
        checked: set[str] = set()
        with gzip.open(meta / "tar-split.json.gz", "rb") as records:
            try:
                for record in layer_blobs.tar_split(records):
                    if isinstance(record, layer_blobs.Segment):
                        yield record.data
                        continue
                    with _regular(folder, record, chain, checked) as fh:
                        left = record.size
                        while left:
                            data = fh.read(min(left, READ))
                            if not data:
                                raise LayerMismatch(f"{record.name} in {chain} is short", "check the engine")
                            left -= len(data)
                            yield data
            except layer_blobs.BadRecord as exc:
                raise LayerMismatch(f"the engine's tar-split of layer {chain}: {exc}", "check the engine") from None


def _regular(folder: str, record: layer_blobs.FileBody, chain: str, checked: set[str]) -> IO[bytes]:
    """The layer's file ``record`` names, opened only when it is a regular file of the recorded size inside the
    layer's folder: a symlinked folder leading anywhere (each folder is checked once, ``checked``), a symlink, a FIFO
    or a device (which could block or never end) is a mismatch, never read."""
    path = os.path.join(folder, record.name)
    parent = os.path.dirname(path)
    if parent not in checked:
        if os.path.realpath(parent) != parent:
            raise LayerMismatch(f"{record.name[:120]!r} in layer {chain} is under a symbolic link", "check the engine")
        checked.add(parent)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise LayerMismatch(
            f"{record.name[:120]!r} in layer {chain} cannot be read: {exc}", "check the engine"
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size != record.size:
        os.close(fd)
        raise LayerMismatch(
            f"{record.name[:120]!r} in layer {chain} is not the regular file of {record.size} bytes recorded",
            "check the engine",
        )
    return os.fdopen(fd, "rb")


def store_export(info: dict, image_id: str) -> StoreExport | None:
    """The store reader for this engine (its `docker info`), or None when its layers cannot be read here: another
    machine's engine, another storage driver, or folders this process may not read."""
    if os.environ.get("DOCKER_HOST", "unix://").split("://", 1)[0] != "unix":
        return None
    root, driver = info.get("DockerRootDir"), info.get("Driver")
    if not isinstance(root, str) or driver not in STORE_DRIVERS:
        return None
    found = StoreExport(Path(root), driver, image_id)
    try:
        found.config()
    except (OSError, EnvironmentFailure):
        return None
    return found


@dataclass(frozen=True)
class Saved:
    """One layer from `docker save`: its tar's digest (the diff id) and a temporary file of its compressed blob."""

    diff_id: str
    blob: layer_blobs.Blob
    path: Path


def save_export(
    save: Callable[[], Iterator[bytes]],
    image_id: str,
    diff_ids: list[str],
    compress: Callable[[Iterator[bytes], IO[bytes]], tuple[str, layer_blobs.Blob]],
    workdir: Path,
) -> tuple[bytes, dict[str, Saved]]:
    """Config bytes and every layer, compressed as they stream out of `docker save` (whatever layout the engine
    writes: Docker's ``<id>/layer.tar`` or an OCI layout's ``blobs/sha256/``): each file of the archive is identified
    by its bytes' digest, never by its name."""
    stream = _ChunkReader(save())
    config: bytes | None = None
    layers: dict[str, Saved] = {}
    wanted = set(diff_ids)
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            fh = tar.extractfile(member)
            if fh is None:
                continue
            if member.size <= MAX_CONFIG:
                data = fh.read()
                if layer_blobs.sha256(data) == image_id:
                    config = data
                    continue
                fh = _BytesChunks(data)
            handle, name = tempfile.mkstemp(prefix="imagekit-layer-", dir=workdir)
            with os.fdopen(handle, "wb") as out:
                diff_id, blob = compress(_chunks(fh), out)
            if diff_id in wanted and diff_id not in layers:
                layers[diff_id] = Saved(diff_id, blob, Path(name))
            else:
                os.unlink(name)
    if config is None:
        raise LayerMismatch(f"`docker save` of {image_id} held no config with that digest", "check the engine")
    missing = [d for d in diff_ids if d not in layers]
    if missing:
        raise LayerMismatch(f"`docker save` of {image_id} lacks layer {missing[0]}", "check the engine")
    return config, layers


def _chunks(fh: Any) -> Iterator[bytes]:
    while True:
        data = fh.read(READ)
        if not data:
            return
        yield data


class _BytesChunks:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out


class _ChunkReader:
    """A file-like reader over an iterator of byte chunks (the engine's `docker save` stream) for tarfile."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.buf, self.off = chunks, b"", 0

    def read(self, n: int = -1) -> bytes:
        if n >= 0 and len(self.buf) - self.off >= n:
            self.off += n
            return self.buf[self.off - n : self.off]
        parts = [self.buf[self.off :]]
        have = len(parts[0])
        self.buf, self.off = b"", 0
        while n < 0 or have < n:
            try:
                chunk = next(self.chunks)
            except StopIteration:
                break
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        if n < 0 or len(data) <= n:
            return data
        self.buf, self.off = data, n
        return data[:n]
