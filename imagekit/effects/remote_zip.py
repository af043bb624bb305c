"""Read one member of a remote wheel with HTTP range requests (for wheels published without PEP 658 metadata)."""

from __future__ import annotations

import struct
import zlib

from imagekit.effects import http
from imagekit.errors import EnvironmentFailure
from imagekit.trust import urls

MAX_MEMBER = 64 << 20  # a METADATA file is kilobytes; a zip directory that claims more is not a wheel


def _range(url: str, spec: str) -> bytes:
    status, _, body = http.request(
        "GET", url, headers={"Range": f"bytes={spec}", "Accept-Encoding": "identity"}, max_bytes=MAX_MEMBER
    )
    if status != 206:
        raise EnvironmentFailure(
            f"{urls.display(url)} answered HTTP {status} to a range request",
            "use an index that serves PEP 658 metadata",
        )
    return body


def read_member(url: str, suffix: str) -> bytes:
    """The bytes of the first member whose name ends with ``suffix`` (e.g. ``.dist-info/METADATA``)."""
    try:
        return _read_member(url, suffix)
    except (struct.error, zlib.error, UnicodeDecodeError) as exc:
        raise EnvironmentFailure(
            f"{urls.display(url)}: not a readable wheel ({exc})", "use an index that serves PEP 658 metadata"
        ) from None


def _read_member(url: str, suffix: str) -> bytes:
    tail = _range(url, "-65536")
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0:
        raise EnvironmentFailure(f"{urls.display(url)}: no zip directory in the last 64 KiB")
    if len(tail) < eocd + 22:
        raise EnvironmentFailure(
            f"{urls.display(url)}: a truncated zip directory", "use an index that serves PEP 658 metadata"
        )
    cd_size, cd_offset = struct.unpack("<II", tail[eocd + 12 : eocd + 20])
    if cd_size > MAX_MEMBER:
        raise EnvironmentFailure(
            f"{urls.display(url)}: a zip directory of {cd_size} bytes", "use an index that serves PEP 658 metadata"
        )
    directory = _range(url, f"{cd_offset}-{cd_offset + cd_size - 1}")
    pos = 0
    while pos + 46 <= len(directory) and directory[pos : pos + 4] == b"PK\x01\x02":
        (method,) = struct.unpack("<H", directory[pos + 10 : pos + 12])
        (csize,) = struct.unpack("<I", directory[pos + 20 : pos + 24])
        nlen, elen, clen = struct.unpack("<HHH", directory[pos + 28 : pos + 34])
        (local,) = struct.unpack("<I", directory[pos + 42 : pos + 46])
        name = directory[pos + 46 : pos + 46 + nlen].decode()
        pos += 46 + nlen + elen + clen
        if not name.endswith(suffix):
            continue
        head = _range(url, f"{local}-{local + 29}")
        lnlen, lelen = struct.unpack("<HH", head[26:30])
        start = local + 30 + lnlen + lelen
        data = _range(url, f"{start}-{start + csize - 1}")
        return zlib.decompressobj(-15).decompress(data, MAX_MEMBER) if method == 8 else data
    raise EnvironmentFailure(f"{urls.display(url)}: no member ending in {suffix}")
