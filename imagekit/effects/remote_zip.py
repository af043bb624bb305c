"""Read one member of a remote wheel with HTTP range requests (for wheels published without PEP 658 metadata)."""

from __future__ import annotations

import struct
import urllib.request
import zlib

from imagekit.errors import EnvironmentFailure


def _range(url: str, spec: str) -> bytes:
    req = urllib.request.Request(url, headers={"Range": f"bytes={spec}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            if resp.status != 206:
                raise EnvironmentFailure(
                    f"{url} ignores HTTP range requests", "use an index that serves PEP 658 metadata"
                )
            return resp.read()
    except OSError as exc:
        raise EnvironmentFailure(f"cannot read {url}: {exc}", "check network access to the package index") from exc


def read_member(url: str, suffix: str) -> bytes:
    """The bytes of the first member whose name ends with ``suffix`` (e.g. ``.dist-info/METADATA``)."""
    tail = _range(url, "-65536")
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0:
        raise EnvironmentFailure(f"{url}: no zip directory in the last 64 KiB")
    cd_size, cd_offset = struct.unpack("<II", tail[eocd + 12 : eocd + 20])
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
        return zlib.decompress(data, -15) if method == 8 else data
    raise EnvironmentFailure(f"{url}: no member ending in {suffix}")
