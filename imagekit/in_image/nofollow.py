"""Files the in-image programs touch as root where another user may have put something, and the text they print
(standard library only, Python >= 3.8; it lies beside the guard and the doctor in /opt/imagekit/doctor/).

Reading: a file is opened (by path, or by name relative to a folder's descriptor) without following a link at its
last component (``O_NOFOLLOW``; ``follow=True`` for a path the user named on purpose), without blocking
(``O_NONBLOCK``: a FIFO without a writer opens at once), and must then be a regular file (``fstat``), read to at
most a bound of bytes (a /proc table says size 0; a sparse file says terabytes). A file that is not there is
``None``; anything else (a link, a FIFO, a device, a folder, more than the bound) is :class:`Refused`, an OSError
saying what, so callers that already treat an OSError as a failure keep doing so.

Writing: a new file under a random name in the target's folder (``O_CREAT|O_EXCL|O_NOFOLLOW``: a planted link is
never written through, a planted file never reused), its mode set whatever the umask, fsynced, then renamed over the
target: the target's name is replaced, never followed.

Printing: :func:`redact` takes credentials out of URLs (``user:password@``, secret-looking query values) and known
secrets out of any text; :func:`clean` also escapes control characters, for one log line.
"""

from __future__ import annotations

import errno
import os
import re
import stat

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_READ = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | _CLOEXEC
_NOT_THERE = (errno.ENOENT, errno.ENOTDIR)
CHUNK = 1 << 20


class Refused(OSError):
    """A path that is there but is not a regular file to read (or grew past its bound): what it is, by name."""

    def __init__(self, path, reason, code=errno.EINVAL):
        OSError.__init__(self, code, reason, path)
        self.reason = reason

    def __str__(self):
        return f"{self.filename}: {self.reason}"


def kind(mode):
    """What a file of ``mode`` is, in words."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def _shown(name, dir_fd):
    return name if dir_fd is None else f"{name} (in an open folder)"


def open_regular(name, dir_fd=None, follow=False):
    """(descriptor, stat) of the regular file ``name`` (relative to ``dir_fd`` when given), opened read-only without
    blocking; a link at the last component is refused unless ``follow``. Not there: FileNotFoundError (or
    NotADirectoryError); anything else that is not a regular file: :class:`Refused`. The caller closes it."""
    try:  # look first: a device is refused before it is opened at all (opening some has effects)
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=follow)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(name, "too many levels of symbolic links", errno.ELOOP) from None
        raise
    if not stat.S_ISREG(st.st_mode):
        raise Refused(name, f"{kind(st.st_mode)}" + (", not followed" if stat.S_ISLNK(st.st_mode) else "")
                      + ", not a regular file")
    try:
        fd = os.open(name, _READ | (0 if follow else os.O_NOFOLLOW), dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # swapped for a link since it was looked at
            raise Refused(name, "a symbolic link, not followed, not a regular file", errno.ELOOP) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped since it was looked at
            raise Refused(name, f"{kind(st.st_mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_bytes(name, limit, dir_fd=None, follow=False):
    """The bytes of the regular file ``name``, at most ``limit`` of them (more is :class:`Refused`); None when it
    is not there. Never blocks, never reads a device, never follows a link at the last component unless
    ``follow``."""
    try:
        fd, _ = open_regular(name, dir_fd, follow)
    except OSError as exc:
        if exc.errno in _NOT_THERE and not isinstance(exc, Refused):
            return None
        raise
    try:
        parts, size = [], 0
        while True:
            block = os.read(fd, min(CHUNK, limit + 1 - size))
            if not block:
                return b"".join(parts)
            parts.append(block)
            size += len(block)
            if size > limit:
                raise Refused(name, f"more than {limit} bytes")
    finally:
        os.close(fd)


def open_dir(path, dir_fd=None, follow=True):
    """A descriptor of the folder ``path`` (relative to ``dir_fd`` when given); ``follow=False`` refuses a link at
    its last component. A FIFO or anything else that is not a folder is an OSError at once. The caller closes it."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
    return os.open(path, flags | (0 if follow else os.O_NOFOLLOW), dir_fd=dir_fd)


def write_replace(dir_fd, name, data, mode):
    """``name`` in the folder ``dir_fd`` holds ``data`` with ``mode``: written to a new file of a random name there
    (never through a link, never into a file someone else made), fsynced, renamed over ``name`` (a link there is
    replaced, not followed). A folder at ``name`` is IsADirectoryError; the temporary file never stays behind."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
    for _ in range(16):
        tmp = f".{name[:40]}.{os.urandom(8).hex()}.tmp"
        try:
            fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    else:
        raise Refused(name, "no fresh temporary name beside it", errno.EEXIST)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    except OSError:
        pass


# ---- what is printed -----------------------------------------------------------------------------------------------
# scheme://userinfo@ : a user:password whose password has / or @ in it, written raw, up to the last @ of the word;
# else whatever stands before an @ in the authority
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)(?:[^\s/?#@:'\"<>]+:[^\s'\"<>]*|[^\s/?#@'\"<>]*)@")
# ?token=..., &api_key=..., X-Amz-Signature=...: the value of a query parameter whose name says it is a secret
_SECRET_QUERY = re.compile(
    r"(?i)([?&;][^=&#\s'\"<>]*(?:token|key|secret|passw|pwd|auth|sig|credential|session|cookie)[^=&#\s'\"<>]*=)"
    r"[^&#\s'\"<>\\]*"
)
MIN_SECRET = 6  # shorter "secrets" (a test's key "k") would star out letters everywhere


def redact(text, secrets=()):
    """``text`` with URL credentials (``user:password@``, secret-looking query values) and each of ``secrets``
    replaced by ``***``."""
    out = str(text)
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET:
            out = out.replace(secret, "***")
    out = _USERINFO.sub(lambda m: m.group(1) + "***@", out)
    return _SECRET_QUERY.sub(lambda m: m.group(1) + "***", out)


def clean(text, secrets=()):
    """One log line: :func:`redact`, then control characters escaped (a hostile value cannot forge lines, move the
    cursor or clear the screen)."""
    return "".join(ch if ch.isprintable() or ch == " " else repr(ch)[1:-1] for ch in redact(text, secrets))
