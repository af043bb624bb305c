"""Layer blobs as imagekit publishes them: gzip made by a pinned libdeflate in fixed-size members, so the same layer
gives the same blob digest on every run and every machine, compressed on every core; and the manifest that names them.

Why members: libdeflate compresses whole buffers (no streaming), and independent members are what lets a layer be
compressed on several cores with output that does not depend on how many: the input is cut every ``MEMBER`` bytes,
each piece is one gzip member, and the members are concatenated in order (RFC 1952 allows it; Go's gzip reader, which
Docker, containerd and skopeo pull with, and pigz read such a stream as one). Its digest depends on the layer's
bytes, the level and libdeflate's version (pinned in pyproject.toml; its output is deterministic per version on any
CPU), which `identity` names: a cache of digests is keyed by it.

Here too: what a publish format is (``LayerFormat``; gzip's and zstd's are here, ``publish_formats`` lists them by
name), and the manifest that names the blobs. And the engine's tar-split records (how Docker's layer store
reassembles a layer's exact tar from its files), read as untrusted lines, and the chain ids that find a layer in that
store."""

from __future__ import annotations

import base64
import hashlib
import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Protocol

from imagekit.oci.media_types import (
    DOCKER_CONFIG,
    DOCKER_LAYER_GZIP,
    DOCKER_MANIFEST,
    OCI_CONFIG,
    OCI_LAYER_ZSTD,
    OCI_MANIFEST,
)

MEMBER = 16 << 20  # bytes of layer per gzip member (a ratio cost of about 0.01 %: one 32 KiB window per member)
# The level: 4 gives about the bytes of the engine's own gzip (Go's default level; so a pull downloads what it did)
# at a third more speed than 6 on CUDA libraries here (85 against 65 MB/s on two cores), 6 is 1-3 % smaller.
DEFAULT_LEVEL = 4
LEVELS = range(1, 13)  # libdeflate's
ZSTD_LEVEL = 3  # zstd's default: smaller than gzip at 4 and several times faster to compress and to decompress
MAX_NAME = 4096  # bytes of a path in a layer (Linux's PATH_MAX)
MAX_ENTRY = 1 << 40  # no file in a layer is larger than a TiB


@dataclass(frozen=True)
class Blob:
    """A blob as a manifest names it. A layer's may carry ``annotations`` (a lazy-pull format's table of contents)
    and ``diff_id``: the digest of its uncompressed content where the format rewrote the layer's tar (eStargz adds
    its TOC entry), so the image's config names that instead; None: the layer's own tar."""

    digest: str
    size: int
    media_type: str = DOCKER_LAYER_GZIP
    annotations: Mapping[str, str] | None = None
    diff_id: str | None = None

    def descriptor(self) -> dict:
        found = {"mediaType": self.media_type, "size": self.size, "digest": self.digest}
        return {**found, "annotations": dict(self.annotations)} if self.annotations else found


class LayerFormat(Protocol):
    """How a layer's tar becomes a blob: what a publish format is (publish_formats.FORMATS lists them).

    ``name`` is the format's key (a variant's tag suffix ``<tag>-<name>`` and its release record's field),
    ``media_type`` its layers' type (one Docker's schema 2 lacks makes the manifest OCI's), ``identity`` what its
    blobs depend on beside the layer's bytes (tool versions, level: the blob cache's key). ``encode`` reads the
    whole tar, in chunks, and hands the blob's bytes in order to ``write``; ``pool`` runs work in parallel.
    ``rewrites_tars``: its blobs hold another tar than the layer's (eStargz adds its TOC entry; each ``Blob.diff_id``
    says which), so its image has its own config."""

    name: str
    media_type: str
    rewrites_tars: bool

    @property
    def identity(self) -> str: ...

    def encode(self, chunks: Iterable[bytes], write: Callable[[bytes], object], pool: Executor) -> Blob: ...


def in_pieces(
    chunks: Iterable[bytes],
    write: Callable[[bytes], object],
    pool: Executor,
    compress: Callable[[bytes], bytes],
    media_type: str,
) -> Blob:
    """Encode a tar as independently compressed pieces of ``MEMBER`` bytes, concatenated in order: the pieces are
    compressed on the pool's threads (libdeflate and zstandard release the GIL) and written in order, a bounded
    number in flight. What gzip and zstd are; the bytes depend on the layer's only, never on the chunking."""
    packed = hashlib.sha256()
    size = 0
    pending: deque[Future[bytes]] = deque()
    limit = 2 * (getattr(pool, "_max_workers", 1) or 1) + 1

    def drain(keep: int) -> None:
        nonlocal size
        while len(pending) > keep:
            data = pending.popleft().result()
            packed.update(data)
            write(data)
            size += len(data)

    for piece in pieces(chunks):
        pending.append(pool.submit(compress, piece))
        drain(limit)
    drain(0)
    return Blob("sha256:" + packed.hexdigest(), size, media_type)


@dataclass(frozen=True)
class Gzip:
    """How a layer becomes a blob: libdeflate's gzip at ``level``, one member per ``MEMBER`` bytes."""

    level: int = DEFAULT_LEVEL

    @property
    def identity(self) -> str:
        return f"gzip-libdeflate{libdeflate_version()}-level{self.level}-member{MEMBER >> 20}m"

    name = "gzip"
    media_type = DOCKER_LAYER_GZIP
    rewrites_tars = False

    def compress(self, piece: bytes) -> bytes:
        import deflate

        return deflate.gzip_compress(piece, self.level)

    def encode(self, chunks: Iterable[bytes], write: Callable[[bytes], object], pool: Executor) -> Blob:
        return in_pieces(chunks, write, pool, self.compress, self.media_type)


@dataclass(frozen=True)
class Zstd:
    """The zstd variant: one zstd frame per ``MEMBER`` bytes (concatenated frames are one zstd stream to every
    reader), each made by the pinned zstandard binding at ``level`` on one thread: deterministic per version."""

    level: int = ZSTD_LEVEL
    name = "zstd"
    media_type = OCI_LAYER_ZSTD  # zstd layers exist in OCI's types only (Docker 20.10 cannot pull them)
    rewrites_tars = False

    @property
    def identity(self) -> str:
        from importlib.metadata import version

        return f"zstd-zstandard{version('zstandard')}-level{self.level}-member{MEMBER >> 20}m"

    def compress(self, piece: bytes) -> bytes:
        import zstandard

        return zstandard.ZstdCompressor(level=self.level, write_content_size=True, write_checksum=True).compress(piece)

    def encode(self, chunks: Iterable[bytes], write: Callable[[bytes], object], pool: Executor) -> Blob:
        return in_pieces(chunks, write, pool, self.compress, self.media_type)


def libdeflate_version() -> str:
    """The version of the `deflate` binding (it bundles one libdeflate): what the blob bytes depend on."""
    from importlib.metadata import version

    return version("deflate")


def pieces(chunks: Iterable[bytes], size: int = MEMBER) -> Iterator[bytes]:
    """``chunks`` cut into pieces of exactly ``size`` bytes (the last one shorter): the member boundaries depend on
    the layer's bytes only, never on how a reader happened to chunk them."""
    buf = bytearray()
    for chunk in chunks:
        buf += chunk
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    if buf:
        yield bytes(buf)


def manifest(config: bytes, layers: list[Blob]) -> bytes:
    """The image manifest (Docker's schema 2, what `docker push` writes for such an image; OCI's for layers of a
    type Docker's schema has none for, such as zstd) for the exact config bytes and the layer blobs, bottom first;
    the same inputs give the same bytes, so the same manifest digest."""
    oci = any(layer.media_type != DOCKER_LAYER_GZIP for layer in layers)
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST if oci else DOCKER_MANIFEST,
        "config": {"mediaType": OCI_CONFIG if oci else DOCKER_CONFIG, "size": len(config), "digest": sha256(config)},
        "layers": [layer.descriptor() for layer in layers],
    }
    return json.dumps(doc, indent=3).encode()


def manifest_type(body: bytes) -> str:
    """The media type :func:`manifest` gave ``body``."""
    return OCI_MANIFEST if b'"' + OCI_MANIFEST.encode() + b'"' in body[:200] else DOCKER_MANIFEST


def config_naming(config: bytes, diff_ids: list[str]) -> bytes:
    """The image config ``config`` with ``diff_ids`` as its layers' (a format that rewrote the tars names what its
    blobs hold); ``config`` itself when they are its own."""
    doc = json.loads(config)
    if doc.get("rootfs", {}).get("diff_ids") == diff_ids:
        return config
    doc["rootfs"] = {**doc.get("rootfs", {}), "diff_ids": diff_ids}
    return json.dumps(doc, separators=(",", ":")).encode()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The layer store's id of each layer (the chain of diff ids below and including it), bottom first."""
    out: list[str] = []
    for diff in diff_ids:
        out.append(diff if not out else sha256(f"{out[-1]} {diff}".encode()))
    return out


class BadRecord(ValueError):
    """A tar-split line that is not what the engine writes."""


@dataclass(frozen=True)
class Segment:
    """Bytes of the tar stream itself (headers, padding, the end)."""

    data: bytes


@dataclass(frozen=True)
class FileBody:
    """A file's contents, ``size`` bytes read from ``name`` under the layer's folder."""

    name: str
    size: int


def tar_split(lines: Iterable[bytes | str]) -> Iterator[Segment | FileBody]:
    """The records of a layer's tar-split file (JSON lines: type 2, a segment of raw tar bytes in base64; type 1, a
    file whose body is read from the layer's folder), checked: a name that is absolute or climbs out with ``..`` is
    refused, as is any size that is not a count of bytes."""
    for number, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except ValueError:
            raise BadRecord(f"line {number} is not JSON") from None
        if not isinstance(rec, dict):
            raise BadRecord(f"line {number} is not an object")
        kind = rec.get("type")
        if kind == 2:
            payload = rec.get("payload")
            if not isinstance(payload, str):
                raise BadRecord(f"line {number}: a segment without its bytes")
            try:
                yield Segment(base64.b64decode(payload, validate=True))
            except ValueError:
                raise BadRecord(f"line {number}: a segment that is not base64") from None
        elif kind == 1:
            size = rec.get("size", 0)
            if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_ENTRY:
                raise BadRecord(f"line {number}: size {str(size)[:40]!r} is not a count of bytes")
            if not size:
                continue
            yield FileBody(_name(rec, number), size)
        else:
            raise BadRecord(f"line {number}: unknown record type {str(kind)[:20]!r}")


def _name(rec: dict, number: int) -> str:
    raw = rec.get("name_raw")
    try:
        name = base64.b64decode(raw, validate=True).decode("utf-8", "surrogateescape") if raw else rec.get("name")
    except ValueError:
        raise BadRecord(f"line {number}: a raw name that is not base64") from None
    if not isinstance(name, str) or not name or len(name.encode("utf-8", "surrogateescape")) > MAX_NAME:
        raise BadRecord(f"line {number}: no usable file name")
    parts = [p for p in name.split("/") if p not in ("", ".")]  # `docker import` tars name files ./etc/...
    if "\x00" in name or name.startswith("/") or not parts or ".." in parts:
        raise BadRecord(f"line {number}: file name {name[:80]!r} leaves the layer")
    return "/".join(parts)
