"""A live pod from a script: run a command, run the image's doctor, copy files with a sha256 compared on both ends.

Over a full SSH server commands use the exec channel and copies use SFTP; over a terminal-only gateway (RunPod's
proxy) both go through the terminal (effects/ssh.Shell): copies in verified chunks, resumed after a dropped
connection, never a silently truncated file.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shlex
import shutil
import stat
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from imagekit import podwire, render, untrusted
from imagekit.effects.ssh import Connection, ConnectionLost
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.podwire import CHUNK, Target, q

Log = Callable[[str], None]
Progress = Callable[[int, int], None]  # (bytes done, bytes in all)
RECONNECTS = 5
CHUNK_TRIES = 3
# The stdlib doctor sent to a pod without one: the program and the sibling modules it imports.
DOCTOR_FILES = ("imagekit_doctor.py", "facts.py")


@dataclass(frozen=True)
class PodOptions:
    key: Path | None = None
    host_keys: str = "strict"  # strict | accept-new | insecure
    timeout: float = 3600.0  # per remote command
    connect_timeout: float = 20.0
    force_pty: bool = False  # use the terminal path even where exec/SFTP work (tests, benchmarks)
    force: bool = False  # a download may replace an existing file or folder of the same kind
    dereference: bool = False  # a folder is packed with what its symlinks point to, not the links


@dataclass
class CopyResult:
    direction: str  # upload | download
    path: str  # what was copied
    size: int
    sha256: str
    mode: str  # sftp | pty
    sent: int = 0  # payload bytes that crossed the wire (less than size after a resume)
    resumed: int = 0  # reconnections
    seconds: float = 0.0
    files: int = 1
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def connect(target: Target, opts: PodOptions, warn: Log) -> Connection:
    return Connection(target, key=opts.key, host_keys=opts.host_keys, timeout=opts.connect_timeout, warn=warn)


def _uses_exec(conn: Connection, opts: PodOptions) -> bool:
    return not opts.force_pty and conn.exec_works


def _capture(conn: Connection, opts: PodOptions, command: str, timeout: float = 300.0) -> tuple[int, str]:
    if _uses_exec(conn, opts):
        return conn.capture(command, timeout)
    return conn.shell().capture(command, timeout)


def _checked(conn: Connection, opts: PodOptions, command: str, what: str, timeout: float = 300.0) -> str:
    code, out = _capture(conn, opts, command, timeout)
    if code != 0:
        said = untrusted.printable(out.strip()[-2000:], 300)
        raise EnvironmentFailure(
            f"{what} failed on the pod (exit {code})" + (f": {said}" if said else ""), "check the path"
        )
    return out


# ---- exec ------------------------------------------------------------------------------------------------
def run_command(target: Target, command: str, opts: PodOptions, out: Log, err: Log, warn: Log) -> tuple[int, str]:
    """Run ``command`` on the pod; (its exit code, the transport used)."""
    with connect(target, opts, warn) as conn:
        if _uses_exec(conn, opts):
            return conn.run(command, opts.timeout, out, err), "exec"
        return conn.shell().run(command, opts.timeout, out), "pty"


# ---- doctor ----------------------------------------------------------------------------------------------
_FIND_PYTHON = (
    'for p in python3 python; do if command -v "$p" >/dev/null 2>&1 && "$p" -c '
    "'import sys; sys.exit(0 if sys.version_info >= (3, 8) else 1)' 2>/dev/null; then command -v \"$p\"; exit 0; "
    "fi; done; exit 1"
)


def run_doctor(
    target: Target, args: list[str], expect: Path | None, opts: PodOptions, out: Log, err: Log, log: Log
) -> tuple[int, str]:
    """The image's own doctor when the pod has it; else the stdlib doctor sent over (checksum verified), run with
    the pod's Python (>= 3.8) and removed afterwards. (exit code, how it ran)."""
    with connect(target, opts, log) as conn:
        code, found = _capture(conn, opts, "command -v imagekit-doctor", 30)
        own = code == 0 and found.strip().endswith("imagekit-doctor")
        code, tmp = _capture(conn, opts, "mktemp -d /tmp/imagekit-doctor.XXXXXX", 30)
        tmp = tmp.strip().splitlines()[-1] if code == 0 and tmp.strip() else ""
        if not tmp.startswith("/tmp/imagekit-doctor."):
            raise EnvironmentFailure(f"cannot make a temporary directory on {target}", "is /tmp writable there?")
        try:
            argv = list(args)
            if expect is not None:
                remote_expect = f"{tmp}/{expect.name}"
                _put_file(conn, opts, expect, remote_expect, lambda d, t: None, log)
                argv += ["--expect", remote_expect]
            if own:
                program, how = "imagekit-doctor", "the image's doctor"
            else:
                code, python = _capture(conn, opts, _FIND_PYTHON, 30)
                if code != 0:
                    raise EnvironmentFailure(
                        f"{target} has no Python >= 3.8 to run the doctor with", "install python3 on the pod"
                    )
                for name in DOCTOR_FILES:
                    _put_file(conn, opts, render.sources().program(name), f"{tmp}/{name}", lambda d, t: None, log)
                python = python.strip().splitlines()[-1] if python.strip() else ""
                if not python.startswith("/") or untrusted.printable(python, 4096) != python:
                    raise EnvironmentFailure(
                        f"{target} named no usable Python (got {untrusted.printable(python, 80)!r})",
                        "install python3 on the pod",
                    )
                program = f"{q(python)} -I {q(tmp + '/imagekit_doctor.py')}"
                how = f"the stdlib doctor sent over, run with {untrusted.printable(python, 200)}"
            command = f"{program} {shlex.join(argv)}".strip()
            if _uses_exec(conn, opts):
                code = conn.run(command, opts.timeout, out, err)
            else:
                code = conn.shell().run(command, opts.timeout, out)
            return code, how
        finally:
            try:
                _capture(conn, opts, f"rm -rf {q(tmp)}", 30)
            except EnvironmentFailure:
                pass


# ---- copy ------------------------------------------------------------------------------------------------
def _sha256_file(path: Path, limit: int | None = None) -> str:
    h, left = hashlib.sha256(), limit
    with path.open("rb") as fh:
        while left is None or left > 0:
            block = fh.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


def _remote_sha(conn: Connection, opts: PodOptions, path: str, limit: int | None = None) -> str:
    source = f"head -c {limit} {q(path)}" if limit is not None else f"cat {q(path)}"
    out = _checked(conn, opts, f"{source} | sha256sum | cut -c1-64", f"sha256 of {path}", 3600)
    last = out.strip().splitlines()[-1].lower() if out.strip() else ""
    return last if len(last) == 64 and all(c in "0123456789abcdef" for c in last) else ""


def _put_file(conn: Connection, opts: PodOptions, local: Path, remote: str, progress: Progress, log: Log) -> int:
    """Upload one file to ``remote`` (through ``remote.imkpart``, renamed only once its sha256 matches); returns
    the payload bytes sent. Resumes from an earlier partial upload."""
    total, sha = local.stat().st_size, _sha256_file(local)
    part = remote + ".imkpart"
    parent = str(PurePosixPath(remote).parent)
    sftp = conn.sftp() if _uses_exec(conn, opts) else None
    if sftp is not None:
        _checked(conn, opts, f"mkdir -p {q(parent)}", f"mkdir {parent}")
        try:
            sftp.put(str(local), part, callback=progress, confirm=True)
        except (OSError, EOFError) as exc:
            raise ConnectionLost(f"SFTP upload of {local} failed: {exc}", "run the copy again") from None
        sent = total
    else:
        shell = conn.shell()
        out = _checked(
            conn, opts, f"mkdir -p {q(parent)} && {{ wc -c < {q(part)} 2>/dev/null || echo 0; }}", f"mkdir {parent}"
        )
        have = int(out.split()[-1]) if out.split() and out.split()[-1].isdigit() else 0
        start = 0 if have > total else have // CHUNK * CHUNK
        if start:
            _checked(conn, opts, f"truncate -s {start} {q(part)}", "resume")
            if _remote_sha(conn, opts, part) != _sha256_file(local, start):
                start = 0
            else:
                log(f"resuming {remote} at {start:,} of {total:,} bytes")
        if not start:
            _checked(conn, opts, f": > {q(part)}", f"create {part}")
        progress(start, total)
        sent = 0
        with local.open("rb") as fh:
            fh.seek(start)
            index, done = start // CHUNK, start
            while done < total:
                data = fh.read(CHUNK)
                for _ in range(CHUNK_TRIES):
                    if shell.upload_chunk(part, data, 600):
                        break
                    log(f"chunk {index} of {local} arrived corrupted; sending it again")
                else:
                    _capture(conn, opts, f"rm -f {q(part)}", 30)
                    raise CheckFailed(
                        f"chunk {index} of {local} arrived corrupted {CHUNK_TRIES} times: nothing was written",
                        "the terminal alters what is typed into it; check the pod's stty settings",
                    )
                done += len(data)
                sent += len(data)
                index += 1
                progress(done, total)
    got = _remote_sha(conn, opts, part)
    if got != sha:
        _capture(conn, opts, f"rm -f {q(part)}", 30)
        raise CheckFailed(
            f"{remote}: sha256 on the pod is {got or 'unreadable'}, here {sha}: the copy is corrupt and was removed",
            "run the copy again",
        )
    _checked(conn, opts, f"mv -f {q(part)} {q(remote)}", f"rename {part}")
    return sent


def _open_part(part: Path, keep: bool) -> tuple[int, int]:
    """Open the partial download ``part`` (created if missing): (fd, bytes already there, 0 unless ``keep``).
    Never through a link: a symlink, a hardlink or anything but a plain file planted there is refused."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(part, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(
                f"{part} is a symlink, not a partial download: nothing was written", "remove it, then copy again"
            ) from None
        raise EnvironmentFailure(f"cannot write {part}: {exc.strerror}", "check the destination folder") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = "a hardlink to another file" if stat.S_ISREG(st.st_mode) else "not a plain file"
        raise UsageError(f"{part} is {what}, not a partial download: nothing was written", "remove it, then copy again")
    if not keep:
        os.ftruncate(fd, 0)
    return fd, st.st_size if keep else 0


def _get_file(conn: Connection, opts: PodOptions, remote: str, local: Path, progress: Progress, log: Log) -> int:
    """Download one file to ``local`` (through ``local.imkpart``); returns the payload bytes received."""
    out = _checked(conn, opts, f"wc -c < {q(remote)}", f"size of {remote}").split()
    if not out or not out[-1].isdigit() or len(out[-1]) > 18:
        raise EnvironmentFailure(f"cannot read the size of {remote} on the pod", "check the path")
    total = int(out[-1])
    sha = _remote_sha(conn, opts, remote)
    local.parent.mkdir(parents=True, exist_ok=True)
    part = local.with_name(local.name + ".imkpart")
    sftp = conn.sftp() if _uses_exec(conn, opts) else None
    received = 0
    fd, have = _open_part(part, keep=sftp is None)
    with os.fdopen(fd, "r+b") as fh:
        if sftp is not None:
            try:
                sftp.getfo(remote, fh, callback=progress)
            except (OSError, EOFError) as exc:
                raise ConnectionLost(
                    f"SFTP download of {remote} failed: {untrusted.printable(exc)}", "run the copy again"
                ) from None
            received = total
        else:
            received = _get_chunks(conn, opts, remote, part, fh, have, total, progress, log)
    got = _sha256_file(part)
    if got != sha:
        part.unlink(missing_ok=True)
        raise CheckFailed(
            f"{remote}: sha256 here is {got}, on the pod {sha or 'unreadable'}: the copy is "
            "corrupt and was removed (did the file change during the copy?)",
            "run the copy again",
        )
    os.replace(part, local)
    return received


def _get_chunks(
    conn: Connection,
    opts: PodOptions,
    remote: str,
    part: Path,
    fh,
    have: int,
    total: int,
    progress: Progress,
    log: Log,
) -> int:
    """The terminal path of :func:`_get_file`: verified chunks appended to ``fh``, resumed after the last whole
    chunk of an earlier try when those bytes still match the pod's (sha256 of the prefix on both ends)."""
    shell = conn.shell()
    start = 0 if have > total else have // CHUNK * CHUNK
    fh.truncate(start)
    if start:  # what is here already against the same bytes on the pod: a file changed since is read anew
        fh.seek(0)
        mine, left = hashlib.sha256(), start
        while left:
            block = fh.read(min(1 << 20, left))
            if not block:
                break
            mine.update(block)
            left -= len(block)
        if _remote_sha(conn, opts, remote, start) != mine.hexdigest():
            start = 0
            fh.truncate(0)
        else:
            log(f"resuming {part.with_name(part.name[: -len('.imkpart')])} at {start:,} of {total:,} bytes")
    progress(start, total)
    received = 0
    fh.seek(start)
    done, index = start, start // CHUNK
    while done < total:
        for _ in range(CHUNK_TRIES):
            command = podwire.chunk_download_command(remote, index)
            code, text = shell.capture_raw(command, 600, limit=podwire.chunk_text_limit())
            try:
                data, digest = podwire.parse_chunk(text)
            except ValueError:
                data, digest = b"", "unreadable"
            if code == 0 and data and len(data) <= CHUNK and hashlib.sha256(data).hexdigest() == digest:
                break
            log(f"chunk {index} of {remote} arrived corrupted; reading it again")
        else:
            part.unlink(missing_ok=True)
            raise CheckFailed(
                f"chunk {index} of {remote} arrived corrupted {CHUNK_TRIES} times: nothing was written",
                "the terminal alters what the pod prints; check the pod's stty settings",
            )
        fh.write(data)
        done += len(data)
        received += len(data)
        index += 1
        progress(done, total)
    return received


def _kind(conn: Connection, opts: PodOptions, path: str) -> str:
    """``file`` (a regular file), ``dir``, ``other`` (a FIFO, a device, a socket: never copied) or ``none``."""
    p = q(path)
    out = _checked(
        conn,
        opts,
        f"if [ -d {p} ]; then echo dir; elif [ -f {p} ]; then echo file; elif [ -e {p} ]; then echo other; "
        "else echo none; fi",
        f"look at {path}",
    )
    kind = out.split()[-1] if out.split() else "none"
    return kind if kind in ("dir", "file", "other", "none") else "none"


def _download_target(remote: str, local: Path, force: bool) -> Path:
    """Where a download lands, as with cp: into an existing folder as ``LOCAL/<name>``, else at ``LOCAL``. What is
    there already is never overwritten unless ``force``."""
    name = PurePosixPath(remote).name
    if local.is_dir():
        if not name or name in (".", ".."):
            raise UsageError(f"{remote} has no name to give the copy in {local}", "name the destination: LOCAL/NAME")
        local = local / name
    if os.path.lexists(local) and not force:
        raise UsageError(f"{local} exists: nothing was copied", "give another destination, or --force to replace it")
    return local


def copy(src: str, dst: str, opts: PodOptions, progress: Progress, log: Log) -> CopyResult:
    """``imagekit pod cp``: exactly one side is ``TARGET:PATH``. A directory goes as one tar stream."""
    remote_src, remote_dst = podwire.split_remote(src), podwire.split_remote(dst)
    if (remote_src is None) == (remote_dst is None):
        raise UsageError(
            "exactly one side of `pod cp` must be on the pod (TARGET:PATH)",
            "e.g. imagekit pod cp ./data root@host:/workspace/data, or root@host:/workspace/out ./out",
        )
    started = time.monotonic()
    if remote_dst is not None:
        target, path = remote_dst
        local = Path(src)
        if not local.exists():
            raise UsageError(f"{src}: no such file or directory", "check the local path")
        result = _retrying(target, opts, log, lambda conn, again: _upload(conn, opts, local, path, progress, log))
    else:
        assert remote_src is not None
        target, path = remote_src
        local = _download_target(path, Path(dst), opts.force)
        result = _retrying(
            target, opts, log, lambda conn, again: _download(conn, opts, path, local, progress, log, again)
        )
    result.seconds = round(time.monotonic() - started, 3)
    return result


def _retrying(target: Target, opts: PodOptions, log: Log, fn: Callable[[Connection, bool], CopyResult]) -> CopyResult:
    """Run a copy; after a dropped connection, reconnect and resume (at most RECONNECTS times)."""
    drops = 0
    while True:
        try:
            with connect(target, opts, log) as conn:
                result = fn(conn, drops > 0)
                result.resumed = drops
                return result
        except ConnectionLost as exc:
            drops += 1
            if drops > RECONNECTS:
                raise
            log(f"{exc.message}; reconnecting and resuming ({drops}/{RECONNECTS})")
            time.sleep(min(0.2 * 2**drops, 5))
        except EnvironmentFailure:
            if drops == 0:
                raise
            drops += 1
            if drops > RECONNECTS:
                raise
            time.sleep(min(0.2 * 2**drops, 5))


def _upload(conn: Connection, opts: PodOptions, local: Path, remote: str, progress: Progress, log: Log) -> CopyResult:
    mode = "sftp" if _uses_exec(conn, opts) and conn.sftp() is not None else "pty"
    if local.is_dir():
        with tempfile.TemporaryDirectory(prefix="imagekit-cp-") as tmp:
            archive, files = _tar(local, Path(tmp) / "tree.tar")
            staged = f"/tmp/.imk-{_sha256_file(archive)[:20]}.tar"  # the same name again when resuming
            sent = _put_file(conn, opts, archive, staged, progress, log)
            _checked(
                conn,
                opts,
                f"mkdir -p {q(remote)} && tar -xf {staged} -C {q(remote)}; c=$?; rm -f {staged}; exit $c",
                f"unpack into {remote}",
            )
            return CopyResult("upload", remote, archive.stat().st_size, _sha256_file(archive), mode, sent, files=files)
    if _kind(conn, opts, remote) == "dir":  # like cp: into the directory
        remote = f"{remote.rstrip('/')}/{local.name}"
    sent = _put_file(conn, opts, local, remote, progress, log)
    return CopyResult("upload", remote, local.stat().st_size, _sha256_file(local), mode, sent)


def _download(
    conn: Connection, opts: PodOptions, remote: str, local: Path, progress: Progress, log: Log, resuming: bool
) -> CopyResult:
    mode = "sftp" if _uses_exec(conn, opts) and conn.sftp() is not None else "pty"
    kind = _kind(conn, opts, remote)
    if kind == "none":
        raise UsageError(f"{remote}: no such file or directory on the pod", "check the remote path")
    if kind == "other":
        raise UsageError(
            f"{remote} on the pod is not a regular file or a folder (a FIFO, a device or a socket)",
            "copy regular files and folders only",
        )
    if os.path.lexists(local) and os.path.isdir(local) != (kind == "dir"):
        have, got = ("a folder", "a file") if kind != "dir" else ("a file", "a folder")
        raise UsageError(f"{local} is {have}; {remote} is {got}: nothing was copied", "give another destination")
    if kind == "dir":
        staged = f"/tmp/.imk-{hashlib.sha256(f'{remote} {opts.dereference}'.encode()).hexdigest()[:20]}.tar"
        pack = f"tar -c{'h' if opts.dereference else ''}f {staged} -C {q(remote)} ."
        if resuming:  # the archive made before the connection dropped, so the partial download stays valid
            pack = f"[ -f {staged} ] || {pack}"
        _checked(conn, opts, pack, f"pack {remote}", 3600)
        archive = local.with_name(local.name + ".imktar")
        try:
            received = _get_file(conn, opts, staged, archive, progress, log)
            files = _untar(archive, local, remote, opts.force)
            return CopyResult(
                "download", str(local), archive.stat().st_size, _sha256_file(archive), mode, received, files=files
            )
        finally:
            if archive.is_file() and not archive.is_symlink():
                archive.unlink()
            try:
                _capture(conn, opts, f"rm -f {staged}", 30)
            except EnvironmentFailure:
                pass
    received = _get_file(conn, opts, remote, local, progress, log)
    return CopyResult("download", str(local), local.stat().st_size, _sha256_file(local), mode, received)


def _tar(root: Path, archive: Path) -> tuple[Path, int]:
    files = 0
    with tarfile.open(archive, "w") as tar:
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=path.relative_to(root).as_posix(), recursive=False)
            files += path.is_file()
    return archive, files


def _untar(archive: Path, dest: Path, remote: str, replace: bool) -> int:
    """Unpack the pod's tar of ``remote`` to ``dest``. The archive is never trusted (nor ``tarfile``'s filters,
    which symlink chains bypass on older Pythons, CVE-2025-4517): every member is checked first
    (:func:`untrusted.tree_members`), then written into a fresh staging folder next to ``dest`` by name, never
    through a link (links are made last), and the folder moved into place whole. Returns the number of files."""
    try:
        with tarfile.open(archive) as tar:
            members = untrusted.tree_members(tar.getmembers())
    except untrusted.LinkLeaves as exc:
        raise EnvironmentFailure(
            f"{remote} on the pod holds a link that points outside it: {untrusted.printable(exc.first, 200)}"
            + (f" (and {exc.count - 1} more)" if exc.count > 1 else "")
            + "; nothing was written",
            "copy it with --dereference to bring what the links point to, or remove those links on the pod",
        ) from None
    except untrusted.UntrustedData as exc:
        raise EnvironmentFailure(
            f"the pod sent an archive of {remote} that cannot be unpacked safely: {exc}; nothing was written",
            "a folder on the pod holds only files, folders and links inside it: check what runs as tar there",
        ) from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise EnvironmentFailure(
            f"the pod sent an unreadable archive of {remote} ({untrusted.printable(exc, 120)}); nothing was written",
            "run the copy again; check what runs as tar on the pod",
        ) from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.imkstage-", dir=dest.parent))
    try:
        _unpack(archive, members, staging)
        _move_into_place(staging, dest, replace)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sum(1 for m in members if m.kind in ("file", "hardlink"))


def _unpack(archive: Path, members: list[untrusted.TreeMember], staging: Path) -> None:
    nofollow = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    with tarfile.open(archive) as tar:
        for m in members:
            path = staging.joinpath(*m.path.parts)
            if m.kind == "dir":
                path.mkdir(mode=0o755, parents=True, exist_ok=True)
                continue
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            if m.kind == "file":
                src = tar.extractfile(m.source)
                with os.fdopen(os.open(path, nofollow, 0o600), "wb") as out:
                    if src is not None:
                        shutil.copyfileobj(src, out, 1 << 20)
                os.chmod(path, m.mode)
                mtime = m.source.mtime
                if isinstance(mtime, (int, float)) and 0 <= mtime < 2**33:
                    os.utime(path, (mtime, mtime))
            elif m.kind == "hardlink":
                os.link(staging.joinpath(*PurePosixPath(m.link).parts), path, follow_symlinks=False)
        for m in members:  # links last: nothing above was written through one
            if m.kind == "symlink":
                os.symlink(m.link, staging.joinpath(*m.path.parts))
        for m in members:
            if m.kind == "dir":
                os.chmod(staging.joinpath(*m.path.parts), 0o755)
    os.chmod(staging, 0o755)


def _move_into_place(staging: Path, dest: Path, replace: bool) -> None:
    if not os.path.lexists(dest):
        os.rename(staging, dest)
        return
    if not replace:
        raise UsageError(f"{dest} exists: nothing was copied", "give another destination, or --force to replace it")
    old = dest.with_name(f".{dest.name}.imkold-{os.getpid()}")
    os.rename(dest, old)
    try:
        os.rename(staging, dest)
    except BaseException:
        os.rename(old, dest)
        raise
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink()
