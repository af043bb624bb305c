"""A layer's tar written from a staged folder (install-layer's staged mode), and `docker load`'s archive around it.

Deterministic: entries in a sorted walk (each folder before what it holds), numeric owners with no names, dates
clamped to SOURCE_DATE_EPOCH (as finalize-layer clamps them on the builder), folders the image already has keeping
its owner and mode (``dirs.json``), hard links within the layer as link entries. The same staged files give the same
bytes, so the same diff id, on every build.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

CHUNK = 4 << 20


class _Hashing(io.RawIOBase):
    """A file that hashes what is written to it."""

    def __init__(self, fh) -> None:
        self.fh, self.sha, self.size = fh, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.fh.write(data) if self.fh is not None else len(data)


def _walk(root: Path) -> Iterator[str]:
    """Paths below ``root``, relative, each folder before its contents, names sorted (symlinks not followed)."""
    for here, dirs, files in os.walk(root):
        dirs.sort()
        rel = os.path.relpath(here, root)
        for name in sorted(dirs + files):
            yield name if rel == "." else f"{rel}/{name}"


def write_layer(root: Path, out, epoch: int, folders: dict[str, list[int]] | None = None) -> tuple[str, int]:
    """Write the layer tar of everything under ``root`` to the binary file ``out`` (None: nowhere, only measured);
    returns (diff id, size)."""
    folders = folders or {}
    seen: dict[tuple[int, int], str] = {}
    sink = _Hashing(out)
    with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT, copybufsize=CHUNK) as tar:  # type: ignore[call-overload]
        for rel in _walk(root):
            path = root / rel
            st = os.lstat(path)
            info = tarfile.TarInfo(rel)
            info.mode = stat.S_IMODE(st.st_mode)
            info.uid, info.gid, info.uname, info.gname = st.st_uid, st.st_gid, "", ""
            info.mtime = min(int(st.st_mtime), epoch)
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                if rel in folders:
                    info.mode, info.uid, info.gid = folders[rel]
                tar.addfile(info)
            elif stat.S_ISLNK(st.st_mode):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in seen:
                    info.type, info.linkname = tarfile.LNKTYPE, seen[key]
                    tar.addfile(info)
                    continue
                seen[key] = rel
                info.size = st.st_size
                with open(path, "rb") as src:
                    tar.addfile(info, src)
            else:
                raise ValueError(f"{rel}: not a file, folder or symlink; a layer of installs has none")
    return f"sha256:{sink.sha.hexdigest()}", sink.size


def stream_layer(root: Path, epoch: int, folders: dict[str, list[int]] | None, size: int) -> Iterator[bytes]:
    """The layer tar of ``root`` again, as chunks (a thread writes it into a pipe): for `docker load`, after
    ``write_layer(root, None, ...)`` measured it, so the tar is never written to disk. Raises ``ValueError`` when
    it comes out another size than measured (the folder changed between the two)."""
    import threading

    read_fd, write_fd = os.pipe()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with open(write_fd, "wb", buffering=CHUNK) as out:
                write_layer(root, out, epoch, folders)
        except BaseException as exc:  # handed to the reader
            failure.append(exc)

    worker = threading.Thread(target=produce, daemon=True)
    worker.start()
    got = 0
    with open(read_fd, "rb", buffering=0) as src:
        while chunk := src.read(CHUNK):
            got += len(chunk)
            yield chunk
    worker.join()
    if failure:
        raise failure[0]
    if got != size:
        raise ValueError(f"{root} gave a {got}-byte layer tar, {size} bytes a moment before: it changed")


def read_folders(stage: Path) -> dict[str, list[int]]:
    """install-layer's ``dirs.json``: owner and mode of the staged folders the image already has."""
    path = stage / "dirs.json"
    if not path.exists():
        return {}
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or not all(
        isinstance(v, list) and len(v) == 3 and all(isinstance(n, int) and n >= 0 for n in v) for v in doc.values()
    ):
        raise ValueError(f"{path}: not a map of folder to [mode, uid, gid]")
    return doc


def load_archive(
    config: bytes, layer: tuple[int, Iterator[bytes]] | None, layer_count: int, tags: list[str] | None = None
) -> Iterator[bytes]:
    """`docker load`'s input: the config, a manifest naming ``layer_count`` layers, and the last layer's tar
    (``layer``: its size and its chunks; None: the engine holds every layer). The engine reads no file of a layer whose
    chain it holds."""
    digest = hashlib.sha256(config).hexdigest()
    names = [f"{i}/layer.tar" for i in range(layer_count)]
    manifest = json.dumps([{"Config": f"{digest}.json", "RepoTags": tags or [], "Layers": names}]).encode()

    def header(name: str, size: int) -> bytes:
        info = tarfile.TarInfo(name)
        info.size = size
        return info.tobuf(format=tarfile.USTAR_FORMAT)

    def pad(size: int) -> bytes:
        return b"\0" * (-size % 512)

    if layer is not None:
        size, chunks = layer
        yield header(names[-1], size)
        yield from chunks
        yield pad(size)
    for name, data in ((f"{digest}.json", config), ("manifest.json", manifest)):
        yield header(name, len(data)) + data + pad(len(data))
    yield b"\0" * 1024
