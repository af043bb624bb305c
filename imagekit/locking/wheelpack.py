"""A wheel from files in memory (pure): what `imagekit ci init` commits beside the workflow, so that CI installs
exactly the imagekit that wrote it. Deterministic: the same files give the same bytes (sorted members, one fixed
timestamp, fixed modes), hence the same sha256 in the workflow."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import zipfile

_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip member can carry
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?", re.ASCII)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def filename(name: str, version: str) -> str:
    """PEP 427's name of a pure-Python wheel for any Python 3 (``imagekit-0.1.0-py3-none-any.whl``)."""
    if not _NAME.fullmatch(name) or not _NAME.fullmatch(version):
        raise ValueError(f"not a wheel name or version: {name!r} {version!r}")
    return f"{re.sub(r'[-_.]+', '_', name)}-{version}-py3-none-any.whl"


def build(name: str, version: str, files: dict[str, bytes], metadata: str, entry_points: str = "") -> bytes:
    """The wheel's bytes: ``files`` (archive path -> bytes) plus a ``.dist-info`` with METADATA, WHEEL,
    entry_points.txt and RECORD (each file's sha256 and size, as installers check them)."""
    info = f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = metadata.encode()
    members[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: imagekit\nRoot-Is-Purelib: true\nTag: py3-none-any\n\n"
    if entry_points:
        members[f"{info}/entry_points.txt"] = entry_points.encode()
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in sorted(members.items()))
    members[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(members):
            entry = zipfile.ZipInfo(path, _EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(entry, members[path])
    return buf.getvalue()
