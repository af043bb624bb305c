"""Reading what another party wrote: a build step's staged folder, a pod's download, a state file, a file a user named.

One way for every host-side reader: open relative to a folder's descriptor, never follow a link (``O_NOFOLLOW`` on
every component imagekit opens, and a folder entered is checked to be the one listed), regular files only
(``O_NONBLOCK`` so a FIFO cannot block the open, then ``fstat``), bounded sizes, and a walk whose errors are failures
(a folder that cannot be listed is never written into a layer empty). A refusal is :class:`Refused`, naming the path
and why; callers turn it into their command's error.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAX_DEPTH = 256  # folders within folders: a wheel's deepest path is a few dozen; a 2,000-deep tree is an attack
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# what a layer of installs may not carry: a setuid/setgid program planted by a step runs as its owner on every pod
_PRIVILEGED = stat.S_ISUID | stat.S_ISGID


class Refused(ValueError):
    """``path`` is not what it must be (a link, a special file, too large, unreadable, too deep)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path or '.'}: {why}")
        self.path, self.why = path or ".", why


def _why(exc: OSError) -> str:
    import errno

    if exc.errno == errno.ELOOP:
        return "is a symbolic link (never followed)"
    if exc.errno == errno.ENOTDIR:
        return "is not a folder (a file or a link where a folder must be)"
    if exc.errno == errno.ENAMETOOLONG:
        return "is a name too long"
    return f"cannot be read ({exc.strerror or exc})"


def open_dir(path: str | Path, *, dir_fd: int | None = None) -> int:
    """A descriptor of the folder ``path`` (relative to ``dir_fd`` when given); its last component must be a folder,
    never a link. The caller closes it (or uses :func:`folder`)."""
    try:
        return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise Refused(str(path), _what_instead(path, dir_fd, exc)) from None


def _what_instead(path: str | Path, dir_fd: int | None, exc: OSError) -> str:
    """Why a folder could not be opened, naming what is there instead (a link, a file) when that is the reason."""
    import errno

    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        try:
            found = os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            return _why(exc)
        if stat.S_ISLNK(found):
            return "is a symbolic link (never followed)"
        if not stat.S_ISDIR(found):
            return f"is {kind(found)}, not a folder"
    return _why(exc)


@contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def folder(path: str | Path, *, dir_fd: int | None = None) -> Iterator[int]:
    fd = open_dir(path, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def open_regular(
    name: str | Path, *, dir_fd: int | None = None, limit: int | None = None, follow: bool = False
) -> BinaryIO:
    """``name`` opened for reading: a regular file (not a link, FIFO, device or socket), at most ``limit`` bytes.
    ``follow``: a link the user made to their own file is followed (a file a user named), still to a regular file."""
    try:
        fd = os.open(name, _FILE_FLAGS & ~os.O_NOFOLLOW if follow else _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise Refused(str(name), _why(exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(str(name), f"is not a regular file ({kind(info.st_mode)})")
        if limit is not None and info.st_size > limit:
            raise Refused(str(name), f"is {info.st_size} bytes, more than the {limit} it may be")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(name: str | Path, limit: int, *, dir_fd: int | None = None, follow: bool = False) -> bytes:
    """The bytes of the regular file ``name``; more than ``limit`` (it grew while read) is refused too."""
    with open_regular(name, dir_fd=dir_fd, limit=limit, follow=follow) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise Refused(str(name), f"holds more than the {limit} bytes it may")
    return data


def kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):  # fmt: skip
        if test(mode):
            return name
    return "of an unknown type"


@dataclass
class Entry:
    """One path of a walk: ``rel`` below the walked folder, its ``lstat``, and (for a link) its target. Valid to
    :meth:`open` only until the walk moves on."""

    rel: str
    info: os.stat_result
    link: str | None
    _parent: int
    _name: str

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.info.st_mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.info.st_mode)

    def open(self) -> BinaryIO:
        """The file itself (the same inode the walk listed: one swapped in meanwhile is refused)."""
        fh = open_regular(self._name, dir_fd=self._parent)
        now = os.fstat(fh.fileno())
        if (now.st_dev, now.st_ino) != (self.info.st_dev, self.info.st_ino) or now.st_size != self.info.st_size:
            fh.close()
            raise Refused(self.rel, "changed while it was read")
        return fh


def walk(dir_fd: int, *, max_depth: int = MAX_DEPTH, allow_special: bool = False) -> Iterator[Entry]:
    """Every path below the folder ``dir_fd``: a folder's entries in name order, then each subfolder's, in name
    order (so each folder comes before what it holds), whatever order the file system lists them in. Links are
    listed, never followed; a folder that cannot be listed, one deeper than ``max_depth``, and (unless
    ``allow_special``) a FIFO, a device or a socket are :class:`Refused`."""
    yield from _walk(dir_fd, "", 0, max_depth, allow_special)


def _walk(fd: int, prefix: str, depth: int, max_depth: int, allow_special: bool) -> Iterator[Entry]:
    if depth > max_depth:
        raise Refused(prefix, f"is more than {max_depth} folders deep")
    try:
        names = sorted(os.listdir(fd))
    except OSError as exc:
        raise Refused(prefix, f"cannot be listed ({exc.strerror or exc})") from None
    folders: list[tuple[str, os.stat_result]] = []
    for name in names:
        rel = f"{prefix}{name}"
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            link = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(info.st_mode) else None
        except OSError as exc:
            raise Refused(rel, _why(exc)) from None
        mode = info.st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode) or allow_special):
            raise Refused(rel, f"is {kind(mode)}; only files, folders and links may be here")
        yield Entry(rel, info, link, fd, name)
        if stat.S_ISDIR(mode):
            folders.append((name, info))
    for name, info in folders:
        rel = f"{prefix}{name}"
        try:
            sub = open_dir(name, dir_fd=fd)
        except Refused as exc:
            raise Refused(rel, "cannot be listed" + exc.why.removeprefix("cannot be read")) from None
        with _closing(sub):
            now = os.fstat(sub)
            if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
                raise Refused(rel, "was replaced while it was read")
            yield from _walk(sub, f"{rel}/", depth + 1, max_depth, allow_special)


def privileged(info: os.stat_result) -> bool:
    """A file that runs with its owner's or group's rights (setuid or setgid). A setgid folder only hands its group
    down to what is made in it (Debian's /usr/local/lib/pythonX.Y is one): not privileged."""
    return bool(info.st_mode & _PRIVILEGED) and not (stat.S_ISDIR(info.st_mode) and not info.st_mode & stat.S_ISUID)


def private_dir(path: Path, levels: int = 1) -> Path:
    """``path`` made (if missing) and, with its ``levels - 1`` nearest parents, owned by this user and 0700: what a
    build step writes there (a setuid program, the host's secrets) is reachable by no other local user. A link or a
    folder of another owner on the way is refused."""
    path = Path(path)
    chain = [path, *path.parents][:levels]
    chain[-1].parent.mkdir(parents=True, exist_ok=True)
    for level in reversed(chain):
        try:
            os.mkdir(level, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise Refused(str(level), _why(exc)) from None
        info = os.lstat(level)
        if not stat.S_ISDIR(info.st_mode):
            raise Refused(str(level), f"is {kind(info.st_mode)}, not a folder")
        if info.st_uid != os.geteuid():
            raise Refused(str(level), f"belongs to user {info.st_uid}, not to this user ({os.geteuid()})")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(level, 0o700)  # a folder of this user's (checked above): no link to follow
    return path


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A folder another party writes (a container's output, mounted read-write): the one rule for every such folder.
    Made by imagekit, inside a parent of this user's that is 0700 (a setuid program planted there, or the folder
    made 0777, is reachable by no other local user), read by the caller with this module's readers (bounded, no
    link followed), and removed afterwards with all it holds, without recursion and without following a link
    (:func:`remove_tree`: a 2,000-deep tree, a FIFO, a folder made unreadable are removed too)."""
    import tempfile

    parent = private_dir(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        folder = parent / "out"
        folder.mkdir(0o700)
        yield folder
    finally:
        remove_tree(parent)


def inside(root: Path, path: Path) -> Path | None:
    """``path`` resolved (every link followed) when it stays inside ``root`` resolved; None when it leads out."""
    base = Path(root).resolve()
    try:
        found = Path(path).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return found if found == base or found.is_relative_to(base) else None


def _opened_up(name: str, dir_fd: int) -> bool:
    """Whether ``name`` is a folder (not a link); one of this user's that its writer made unreadable or unwritable
    (chmod 000, 500) is made 0700 first, so it can be emptied and moved. Called once the writer has finished (its
    container is gone): nothing swaps the folder for a link meanwhile."""
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(info.st_mode):
        return False
    if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & 0o700 != 0o700:
        os.chmod(name, 0o700, dir_fd=dir_fd)
    return True


def remove_tree(path: Path) -> None:
    """Remove the folder ``path`` and all it holds, however deep (a step may leave 2,000 nested folders, past
    Python's recursion limit and the open-file limit): each folder's subfolders are moved up beside the top before it
    is emptied, so two descriptors do. Links are removed as links. Missing is fine; a link at ``path`` is removed,
    never followed."""
    path = Path(path)
    try:
        top = open_dir(path)
    except Refused:
        if os.path.islink(path):
            os.unlink(path)
            return
        if not os.path.lexists(path):
            return
        raise
    moved, token = 0, os.urandom(6).hex()  # a name no step can have planted beside the top
    try:
        while names := os.listdir(top):
            for name in names:
                if not _opened_up(name, top):
                    os.unlink(name, dir_fd=top)
                    continue
                with folder(name, dir_fd=top) as sub:
                    for child in os.listdir(sub):
                        if _opened_up(child, sub):
                            moved += 1
                            os.rename(child, f".imagekit-rm-{token}-{moved}", src_dir_fd=sub, dst_dir_fd=top)
                        else:
                            os.unlink(child, dir_fd=sub)
                os.rmdir(name, dir_fd=top)
    finally:
        os.close(top)
    os.rmdir(path)
