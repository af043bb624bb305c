"""Layer blobs as imagekit publishes them: gzip made by a pinned libdeflate in fixed-size members, so the same layer
gives the same blob digest on every run and every machine, compressed on every core; and the manifest that names them.

Why members: libdeflate compresses whole buffers (no streaming), and independent members are what lets a layer be
compressed on several cores with output that does not depend on how many: the input is cut every ``MEMBER`` bytes,
each piece is one gzip member, and the members are concatenated in order (RFC 1952 allows it; Go's gzip reader, which
Docker, containerd and skopeo pull with, and pigz read such a stream as one). Its digest depends on the layer's
bytes, the level and libdeflate's version (pinned in pyproject.toml; its output is deterministic per version on any
CPU), which `identity` names: a cache of digests is keyed by it.

Also here: the engine's tar-split records (how Docker's layer store reassembles a layer's exact tar from its files),
read as untrusted lines, and the chain ids that find a layer in that store."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

MEMBER = 16 << 20  # bytes of layer per gzip member (a ratio cost of about 0.01 %: one 32 KiB window per member)
# The level: 4 gives about the bytes of the engine's own gzip (Go's default level; so a pull downloads what it did)
# at a third more speed than 6 on CUDA libraries here (85 against 65 MB/s on two cores), 6 is 1-3 % smaller.
DEFAULT_LEVEL = 4
LEVELS = range(1, 13)  # libdeflate's
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
# zstd layers exist in OCI's types only (Docker >= 23 and containerd pull them; Docker 20.10 cannot)
ZSTD_LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+zstd"
OCI_CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
OCI_MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
ZSTD_LEVEL = 3  # zstd's default: smaller than gzip at 4 and several times faster to compress and to decompress
MAX_NAME = 4096  # bytes of a path in a layer (Linux's PATH_MAX)
MAX_ENTRY = 1 << 40  # no file in a layer is larger than a TiB


@dataclass(frozen=True)
class Gzip:
    """How a layer becomes a blob: libdeflate's gzip at ``level``, one member per ``MEMBER`` bytes."""

    level: int = DEFAULT_LEVEL

    @property
    def identity(self) -> str:
        return f"gzip-libdeflate{libdeflate_version()}-level{self.level}-member{MEMBER >> 20}m"

    name = "gzip"
    media_type = LAYER_TYPE

    def compress(self, piece: bytes) -> bytes:
        import deflate

        return deflate.gzip_compress(piece, self.level)


@dataclass(frozen=True)
class Zstd:
    """The zstd variant: one zstd frame per ``MEMBER`` bytes (concatenated frames are one zstd stream to every
    reader), each made by the pinned zstandard binding at ``level`` on one thread: deterministic per version."""

    level: int = ZSTD_LEVEL
    name = "zstd"
    media_type = ZSTD_LAYER_TYPE

    @property
    def identity(self) -> str:
        from importlib.metadata import version

        return f"zstd-zstandard{version('zstandard')}-level{self.level}-member{MEMBER >> 20}m"

    def compress(self, piece: bytes) -> bytes:
        import zstandard

        return zstandard.ZstdCompressor(level=self.level, write_content_size=True, write_checksum=True).compress(piece)


Codec = Gzip | Zstd


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


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int
    media_type: str = LAYER_TYPE

    def descriptor(self) -> dict:
        return {"mediaType": self.media_type, "size": self.size, "digest": self.digest}


def manifest(config: bytes, layers: list[Blob]) -> bytes:
    """The image manifest (Docker's schema 2, what `docker push` writes for such an image; OCI's for zstd layers,
    which Docker's schema has no type for) for the exact config bytes and the layer blobs, bottom first; the same
    inputs give the same bytes, so the same manifest digest."""
    oci = any(layer.media_type == ZSTD_LAYER_TYPE for layer in layers)
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST_TYPE if oci else MANIFEST_TYPE,
        "config": {"mediaType": OCI_CONFIG_TYPE if oci else CONFIG_TYPE, "size": len(config), "digest": sha256(config)},
        "layers": [layer.descriptor() for layer in layers],
    }
    return json.dumps(doc, indent=3).encode()


def manifest_type(body: bytes) -> str:
    """The media type :func:`manifest` gave ``body``."""
    return OCI_MANIFEST_TYPE if b'"' + OCI_MANIFEST_TYPE.encode() + b'"' in body[:200] else MANIFEST_TYPE


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
