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
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from imagekit.effects import foreign_files

CHUNK = 4 << 20


_ZEROS = bytes(CHUNK)


class _Zeros:
    """A file's stand-in when a layer is only measured: as many bytes as asked, none read from the disk."""

    def read(self, n: int) -> bytes:
        return _ZEROS if n == CHUNK else bytes(n)

    def __enter__(self) -> _Zeros:
        return self

    def __exit__(self, *_: object) -> None:
        return None


class _Hashing(io.RawIOBase):
    """A file that hashes what is written to it (``measure``: only counts it)."""

    def __init__(self, fh, measure: bool = False) -> None:
        self.fh, self.sha, self.size, self.measure = fh, hashlib.sha256(), 0, measure

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data) -> int:
        if not self.measure:
            self.sha.update(data)
        self.size += len(data)
        return self.fh.write(data) if self.fh is not None else len(data)


MAX_ID = 65534  # RunPod's hosts remap user namespaces: an owner above this fails the pull (dstackai/dstack#2729)
MAX_FOLDERS_JSON = 16 << 20  # dirs.json names the folders of one layer: kilobytes


def _open_root(root: Path) -> int:
    """A descriptor of the staged ``root``: its folder may be any path of this user's, ``root`` itself must be a
    folder, never a link (a step that made it one would have the host copy what it points to into the layer)."""
    root = Path(root)
    with foreign_files.folder(root.parent if root.name else root) as parent:
        return foreign_files.open_dir(root.name or ".", dir_fd=parent)


def write_layer(root: Path, out, epoch: int, folders: dict[str, list[int]] | None = None) -> tuple[str, int]:
    """Write the layer tar of everything under ``root`` to the binary file ``out`` (None: nowhere, only hashed);
    returns (diff id, size). What a build step left there is read as another party's files
    (`foreign_files.walk`): no link followed, ``root`` a folder, and a FIFO, a device, a socket, a setuid or setgid
    file, an owner above 65534 or a folder that cannot be listed refused by name (``foreign_files.Refused``)."""
    sink = _Hashing(out)
    _write(root, sink, epoch, folders or {}, measure=False)
    return f"sha256:{sink.sha.hexdigest()}", sink.size


def measure_layer(root: Path, epoch: int, folders: dict[str, list[int]] | None = None) -> int:
    """The size of ``root``'s layer tar from its entries alone (no file's bytes read, nothing hashed): what
    `docker load`'s archive must say before the tar streams in. The same walk and refusals as ``write_layer``."""
    sink = _Hashing(None, measure=True)
    _write(root, sink, epoch, folders or {}, measure=True)
    return sink.size


def _write(root: Path, sink: _Hashing, epoch: int, folders: dict, measure: bool) -> None:
    seen: dict[tuple[int, int], str] = {}
    fd = _open_root(root)
    try:
        with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT, copybufsize=CHUNK) as tar:  # type: ignore[call-overload]
            for entry in foreign_files.walk(fd):
                _add(tar, entry, epoch, folders, seen, measure)
    finally:
        os.close(fd)


def _add(
    tar: tarfile.TarFile, entry: foreign_files.Entry, epoch: int, folders: dict, seen: dict, measure: bool
) -> None:
    st, rel = entry.info, entry.rel
    if foreign_files.privileged(st):
        raise foreign_files.Refused(rel, f"is setuid or setgid (mode {stat.S_IMODE(st.st_mode):o})")
    if st.st_uid > MAX_ID or st.st_gid > MAX_ID:
        raise foreign_files.Refused(rel, f"belongs to {st.st_uid}:{st.st_gid}, above {MAX_ID}")
    info = tarfile.TarInfo(rel)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid, info.uname, info.gname = st.st_uid, st.st_gid, "", ""
    info.mtime = min(int(st.st_mtime), epoch)
    if entry.is_dir:
        info.type = tarfile.DIRTYPE
        if rel in folders:
            info.mode, info.uid, info.gid = folders[rel]
        tar.addfile(info)
    elif entry.link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, entry.link
        tar.addfile(info)
    else:
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in seen:
            info.type, info.linkname = tarfile.LNKTYPE, seen[key]
            tar.addfile(info)
            return
        seen[key] = rel
        info.size = st.st_size
        with _Zeros() if measure else entry.open() as src:
            tar.addfile(info, src)


class Streamed:
    """The layer tar of a staged folder as chunks, hashed on the way (a thread writes it into a pipe): for `docker
    load`, after ``measure_layer`` gave its size, so the tar is never written to disk and the folder is read once.
    ``diff_id`` is known once every chunk was taken. Raises ``ValueError`` at the end when the tar came out another
    size than measured (the folder changed between the two)."""

    def __init__(self, root: Path, epoch: int, folders: dict[str, list[int]] | None, size: int) -> None:
        self.root, self.epoch, self.folders, self.size = root, epoch, folders, size
        self.diff_id: str | None = None

    def __iter__(self) -> Iterator[bytes]:
        import threading

        read_fd, write_fd = os.pipe()
        failure: list[BaseException] = []
        made: list[tuple[str, int]] = []

        def produce() -> None:
            try:
                with open(write_fd, "wb", buffering=CHUNK) as out:
                    made.append(write_layer(self.root, out, self.epoch, self.folders))
            except BaseException as exc:  # handed to the reader
                failure.append(exc)

        worker = threading.Thread(target=produce, daemon=True)
        worker.start()
        got = 0
        with open(read_fd, "rb", buffering=0) as src:
            while chunk := src.read(CHUNK):
                got += len(chunk)
                if got > self.size:
                    break  # the reader stops; the writer's next write fails on the closed pipe
                yield chunk
        worker.join()
        if failure and not isinstance(failure[0], BrokenPipeError):
            raise failure[0]
        if got != self.size or not made:
            raise ValueError(f"{self.root} gave a layer tar of another size than the {self.size} bytes measured a "
                             "moment before: it changed")  # fmt: skip
        self.diff_id = made[0][0]


def stream_layer(root: Path, epoch: int, folders: dict[str, list[int]] | None, size: int) -> Streamed:
    """The layer tar of ``root`` as chunks of ``size`` bytes in all (``Streamed``: its diff id once read)."""
    return Streamed(root, epoch, folders, size)


def read_folders(stage: Path) -> dict[str, list[int]]:
    """install-layer's ``dirs.json``: owner and mode of the staged folders the image already has. Written inside the
    step, so another party's file: a regular file (no link, no FIFO), bounded, each entry a relative path and a
    mode without setuid, owners up to 65534. Raises ``foreign_files.Refused`` (a ValueError) otherwise."""
    with foreign_files.folder(stage) as fd:
        try:
            raw = foreign_files.read_bytes("dirs.json", MAX_FOLDERS_JSON, dir_fd=fd)
        except foreign_files.Refused as exc:
            if not os.path.lexists(Path(stage) / "dirs.json"):
                return {}
            raise foreign_files.Refused("dirs.json", exc.why) from None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or not all(_folder_entry(k, v) for k, v in doc.items()):
        raise foreign_files.Refused("dirs.json", "is not a map of relative folder to [mode, uid, gid] (mode without "
                                                 f"setuid, owners up to {MAX_ID})")  # fmt: skip
    return doc


def _folder_entry(rel: object, value: object) -> bool:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        return False
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return False
    if not (isinstance(value, list) and len(value) == 3 and all(type(n) is int and n >= 0 for n in value)):
        return False
    mode, uid, gid = value
    return mode <= 0o7777 and not mode & stat.S_ISUID and uid <= MAX_ID and gid <= MAX_ID


def load_archive(
    config: bytes | Callable[[], bytes],
    layer: tuple[int, Iterable[bytes]] | None,
    layer_count: int,
    tags: list[str] | None = None,
) -> Iterator[bytes]:
    """`docker load`'s input: the last layer's tar (``layer``: its size and its chunks; None: the engine holds every
    layer), then the config and a manifest naming ``layer_count`` layers. The engine reads no file of a layer whose
    chain it holds, and reads the manifest only once the whole archive is in, so ``config`` may be a function called
    after the layer's chunks were taken (a config that names the diff id the stream just hashed)."""
    names = [f"{i}/layer.tar" for i in range(layer_count)]

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
    config = config() if callable(config) else config
    digest = hashlib.sha256(config).hexdigest()
    manifest = json.dumps([{"Config": f"{digest}.json", "RepoTags": tags or [], "Layers": names}]).encode()
    for name, data in ((f"{digest}.json", config), ("manifest.json", manifest)):
        yield header(name, len(data)) + data + pad(len(data))
    yield b"\0" * 1024
