"""Atomic file writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import glob
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from imagekit.errors import UsageError

if TYPE_CHECKING:
    from imagekit.image.code_layer import CodeLayer, CopySpec

MAX_INPUT_BYTES = 64 * 2**20  # a matrix, a release index or a lock is kilobytes; a bigger file is the wrong one


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder, fsync, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_tree_atomic(root: Path, files: dict[str, str | bytes], modes: dict[str, int] | None = None) -> None:
    """Write every file of ``files`` (relative paths) under ``root``, each atomically."""
    for rel, data in sorted(files.items()):
        write_atomic(root / rel, data, (modes or {}).get(rel, 0o644))


def replace_tree(
    root: Path, files: dict[str, str | bytes], modes: dict[str, int] | None = None, keep: tuple[str, ...] = ()
) -> None:
    """Write ``files`` into a fresh sibling folder and swap it in for ``root``: nothing is left over from an
    earlier or a killed write, and a reader never sees a half-written folder. ``keep``: top-level folders of the
    old ``root`` carried over as they are (a build context's fetched wheels)."""
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".tmp", dir=root.parent))
    old = root.with_name(f".{root.name}.{os.getpid()}.old")
    try:
        os.chmod(tmp, 0o755)
        write_tree_atomic(tmp, files, modes)
        for name in keep:
            if (root / name).is_dir() and not (root / name).is_symlink() and not (tmp / name).exists():
                os.replace(root / name, tmp / name)
        if root.exists():
            os.replace(root, old)
        os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not root.exists():
            os.replace(old, root)
        raise
    shutil.rmtree(old, ignore_errors=True)


STALE_STAGING_S = 3600  # a staging folder this old belongs to no live run (a run swaps its folder in seconds)


def refuse_links(path: Path, levels: int, what: str, hint: str) -> Path:
    """``path`` when neither it nor its ``levels - 1`` nearest parents is a symbolic link or a non-folder: the
    folders imagekit owns and replaces whole (``DIR/<cell>/wheels``: the cell folder and the wheels folder). A link
    there is refused, never followed: replacing it would empty the folder it points to. Missing is fine."""
    path = Path(path)
    for level in [path, *path.parents][:levels]:
        try:
            info = os.lstat(level)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise UsageError(f"cannot use {what} {path}: {level}: {exc.strerror or exc}", hint) from None
        where = f"{what} {path}" if level == path else f"{what} {path}: its folder {level}"
        if stat.S_ISLNK(info.st_mode):
            raise UsageError(
                f"{where} is a symbolic link; imagekit replaces that folder whole and never follows a link there "
                "(it would empty the folder the link points to)",
                f"remove the link {level} (what it points to is left alone), or pass another folder",
            )
        if not stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{where} is not a folder", hint)
    return path


def replace_folder(root: Path, fill: Callable[[Path], None]) -> None:
    """Fill a fresh staging folder beside ``root`` (``fill(staging)``), then swap it in for ``root``: a reader sees
    the old folder or the new one, a failure leaves the old one, and a link at ``root`` is never followed (the
    caller refuses one first: `refuse_links`; a link put there meanwhile is moved aside, its target untouched).
    Staging and old folders that a killed run left beside it are swept once they are an hour old."""
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    _sweep_staging(root)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".tmp", dir=root.parent))
    old = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".old", dir=root.parent))
    moved = False
    try:
        os.chmod(tmp, 0o755)
        fill(tmp)
        if os.path.lexists(root):
            # a folder renamed onto the empty one; anything else there (a link put in meanwhile) makes rename fail
            os.replace(root, old)
            moved = True
        os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if moved and not os.path.lexists(root):
            os.replace(old, root)
        _remove(old)
        raise
    _remove(old)


def _remove(path: Path) -> None:
    """A folder imagekit made (its links removed as links), or a link itself."""
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        os.unlink(path)
    elif os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)  # never follows a link inside (fd-based on Linux)


def _sweep_staging(root: Path) -> None:
    cutoff = time.time() - STALE_STAGING_S
    for leftover in root.parent.glob(f".{glob.escape(root.name)}.*"):
        if leftover.name.endswith((".tmp", ".old")):
            try:
                if os.lstat(leftover).st_mtime < cutoff:
                    _remove(leftover)
            except OSError:
                pass


def read_input(path: Path, what: str, hint: str | None = None, *, missing_ok: bool = False) -> str | None:
    """The text of a file the user named; anything but a readable regular UTF-8 file is a UsageError.

    A FIFO or a device is refused before it is opened: reading one blocks or never ends. ``missing_ok``: a file
    that does not exist (a dangling link included) is None.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        if missing_ok:
            return None
        raise UsageError(f"{what} {path} does not exist", hint) from None
    except (OSError, ValueError) as exc:  # a file where a folder is on the path, a name too long, a loop
        raise UsageError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}", hint) from None
    if stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{what} {path} is a folder, not a file", hint)
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{what} {path} is not a regular file (a FIFO, a socket or a device)", hint)
    if info.st_size > MAX_INPUT_BYTES:
        raise UsageError(f"{what} {path} is {info.st_size} bytes: too large to be one", hint)
    from imagekit.effects import foreign_files

    try:  # opened as a regular file again: one swapped for a FIFO since the check above is refused, never read
        data = foreign_files.read_bytes(path, MAX_INPUT_BYTES, follow=True)
    except foreign_files.Refused as exc:
        raise UsageError(f"cannot read {what} {path}: it {exc.why}", hint) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} {path} is not UTF-8 text ({exc.reason} at byte {exc.start})", hint) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as a text-mode read gives


def content_mtime(data: bytes, epoch: int) -> int:
    """A file's mtime in a build context: at or before ``epoch``, by up to about 12 days, taken from its sha256.

    COPY keeps mtimes, so they must not depend on when the context was written. They must not be one value for every
    file either: BuildKit's context transfer sends a file again only when its size or mtime changed, so a re-rendered
    file of the same size (a Dockerfile whose registry port changed) would be built from the stale copy. Same bytes,
    same mtime; other bytes, another mtime (but for a 1 in 2**20 chance). At or before ``epoch``, so the layer's
    `finalize-layer` (which clamps what is newer than ``epoch``) leaves the copied files alone."""
    import hashlib

    return epoch - int.from_bytes(hashlib.sha256(data).digest()[:4], "big") % (1 << 20)


def clamp_mtimes(root: Path, epoch: int, skip: tuple[str, ...] = ()) -> None:
    """Clamp a build context so identical inputs give identical layers: folders to ``epoch``, files to
    `content_mtime`. ``skip``: top-level folders left alone (fetched wheels: hard links into the cache, mounted)."""
    root = Path(root)
    for path in sorted(root.rglob("*"), reverse=True):
        rel = path.relative_to(root).parts
        if rel and rel[0] in skip:
            continue
        stamp = content_mtime(path.read_bytes(), epoch) if path.is_file() and not path.is_symlink() else epoch
        os.utime(path, (stamp, stamp), follow_symlinks=False)
    os.utime(root, (epoch, epoch))


def read_code(spec: CopySpec) -> CodeLayer:
    """The folder `[image] copy` names, as the code layer holds it: regular files only, with what its excludes and
    its own `.dockerignore` leave out left out. The folder itself, its links resolved, must stay inside the project
    (the matrix file's folder): a cloned repository whose `src` links to the home folder is refused, never copied. A
    link inside is followed only to a file within the folder that the excludes keep; one that leads out of it, to a
    left-out file, in a loop or nowhere, and anything but files and folders, is refused, as is a folder past the code
    layer's size limits. Files are opened without following a link and only as regular files (a FIFO never blocks)."""
    from imagekit.effects import foreign_files
    from imagekit.image import code_layer
    from imagekit.trust.untrusted import printable

    root = Path(spec.source)
    hint = "check `[image] copy` in the matrix file (`from` is relative to the matrix file's folder)"
    project = Path(spec.project if spec.project is not None else spec.source)
    if not root.is_dir():
        raise UsageError(f"[image] copy: {printable(str(root), 200)} is not a folder", hint)
    real_root = foreign_files.inside(project, root)
    if real_root is None:
        raise UsageError(
            f"[image] copy: {printable(str(root), 200)} leads out of the project ({printable(str(project), 200)}) "
            f"through a link: it is {printable(str(root.resolve()), 200)}",
            "copy a folder that is inside the project itself (replace the link by the folder, or point `from` at it)",
        )

    def refuse(rel: str, why: str, fix: str = "exclude it (`exclude = [...]` or the folder's .dockerignore)") -> None:
        raise UsageError(f"[image] copy: {printable(rel, 200)} {why}", fix)

    def read(rel: str, path: Path, limit: int) -> bytes:
        try:
            return foreign_files.read_bytes(path, limit)
        except foreign_files.Refused as exc:
            refuse(rel, exc.why)
            raise  # unreachable: refuse raises

    patterns = spec.exclude
    ignore = real_root / ".dockerignore"
    if os.path.lexists(ignore):
        text = read(".dockerignore", ignore, code_layer.MAX_IGNORE_BYTES).decode(errors="replace")
        patterns = (*code_layer.dockerignore_lines(text), *patterns)
    patterns = code_layer.bounded_patterns(patterns, ".dockerignore and exclude together")
    walk_excluded = code_layer.may_bring_back(patterns)  # a `!` line may bring back a file in an excluded folder
    files: list[tuple[str, bytes, int]] = []
    total = 0

    def walk_error(exc: OSError) -> None:  # a folder that cannot be listed is never copied empty
        name = Path(exc.filename or "").relative_to(real_root).as_posix() if exc.filename else "?"
        refuse(name, f"cannot be read ({exc.strerror})")

    for folder, dirs, names in os.walk(real_root, followlinks=False, onerror=walk_error):
        here = Path(folder)
        rel_dir = here.relative_to(real_root).as_posix()
        dirs[:] = sorted(
            d
            for d in dirs
            if not code_layer.always_excluded(_rel(rel_dir, d))
            and (walk_excluded or not code_layer.excluded(_rel(rel_dir, d), patterns))
        )
        for d in dirs:
            if (here / d).is_symlink():
                refuse(_rel(rel_dir, d), "is a link to a folder", "copy the folder itself, or exclude the link")
        for name in sorted(names):
            rel = _rel(rel_dir, name)
            if code_layer.excluded(rel, patterns):
                continue
            path = here / name
            if path.is_symlink():
                try:
                    target = path.resolve(strict=True)
                except (OSError, RuntimeError):
                    refuse(rel, "is a link that leads nowhere (dangling, or a loop)")
                if not target.is_relative_to(real_root):
                    refuse(rel, "links outside the folder", "copy the file into the folder, or exclude the link")
                if code_layer.excluded(target.relative_to(real_root).as_posix(), patterns):
                    refuse(rel, "links to a file the excludes leave out", "exclude the link too, or keep its target")
                path = target
            try:
                info = os.lstat(path)
            except OSError as exc:
                refuse(rel, f"cannot be read ({exc.strerror})")
            if not stat.S_ISREG(info.st_mode):
                refuse(rel, "is not a regular file")
            total += info.st_size
            if len(files) >= code_layer.MAX_FILES or total > code_layer.MAX_BYTES:
                raise UsageError(
                    f"[image] copy: {printable(str(root), 200)} holds more than {code_layer.MAX_FILES} files or "
                    f"{code_layer.MAX_BYTES >> 20} MB",
                    "exclude data, checkpoints and outputs (they belong on the pod's volume or the Hub)",
                )
            files.append((rel, read(rel, path, info.st_size), info.st_mode & 0o777))
    return code_layer.CodeLayer(spec.to, tuple(sorted(files)))


def _rel(folder: str, name: str) -> str:
    return name if folder in ("", ".") else f"{folder}/{name}"
