"""A live pod from a script: run a command, run the image's doctor, copy files with a sha256 compared on both ends.

Everything goes through one :class:`~imagekit.effects.ssh.ssh_transport.Transport` per connection: exec and SFTP over
a full SSH server, the terminal over a terminal-only gateway (RunPod's proxy), where copies travel in verified
chunks. What is decided here is the same for both: which doctor runs, where a copy lands, a folder as one tar
stream, reconnecting and resuming after a dropped connection, never a silently truncated file. ``dial`` (default
:func:`connect`) is how a test passes a fake transport (``tests/fakes.py``).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from imagekit.clouds import podwire
from imagekit.clouds.podwire import Target, q
from imagekit.effects import foreign_files
from imagekit.effects.ssh.ssh_connection import Connection
from imagekit.effects.ssh.ssh_copies import Progress, checked, sha256_file
from imagekit.effects.ssh.ssh_errors import ConnectionLost
from imagekit.effects.ssh.ssh_transport import Transport, open_transport
from imagekit.errors import CheckFailed as CheckFailed  # raised by the transport; callers catch it from here
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.image import render
from imagekit.trust import untrusted

Log = Callable[[str], None]
RECONNECTS = 5
# The stdlib doctor sent to a pod without one: the program and the sibling modules it imports.
DOCTOR_FILES = (
    "imagekit_doctor.py",
    "doctor_expect.py",
    "doctor_python.py",
    "doctor_gpu.py",
    "doctor_launch.py",
    "doctor_hub.py",
    "facts.py",
    "nofollow.py",
)


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


Dial = Callable[[Target, PodOptions, Log], AbstractContextManager[Transport]]


@contextmanager
def connect(target: Target, opts: PodOptions, warn: Log) -> Iterator[Transport]:
    """One SSH connection to ``target`` as a :class:`Transport` (exec or terminal, decided here once)."""
    conn = Connection(target, key=opts.key, host_keys=opts.host_keys, timeout=opts.connect_timeout, warn=warn)
    with conn:
        yield open_transport(conn, opts.force_pty)


# An imagekit client connected (`pod wait`, `pod logs`, `pod cp`): a lease naming the connection's own process (the
# SSH session's, or the terminal's shell: $PPID of what it runs), in the folder the guard reads; the exit stop waits
# while it is there (a `pod wait && pod cp` goes first). Written under a hidden name, then renamed: never half there.
LEASE = (
    'L="${IMAGEKIT_CLIENTS:-/run/imagekit/clients}"; if [ -d "$L" ] && [ -w "$L" ] && [ ! -L "$L" ]; then '
    "q=$PPID; t=$(sed 's/^.*[)] //' \"/proc/$q/stat\" 2>/dev/null | cut -d' ' -f20); "
    'b=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null); if [ -n "$t" ] && [ -n "$b" ]; then '
    'printf \'%s %s %s\\n\' "$b" "$q" "$t" >"$L/.$q.$$" && mv -f "$L/.$q.$$" "$L/$q"; fi; fi; '
)


def hold_lease(t: Transport) -> None:
    """Say, on an imagekit image, that this connection is an imagekit client (``LEASE``): until it closes, the
    lifetime guard's exit stop waits (a `pod cp` of the outputs after the run ended goes first). A subshell: the
    lease's names never reach the user's command. Nothing happens where the pod has no lease folder."""
    t.capture(f"( {LEASE})", 30.0)


# ---- exec ------------------------------------------------------------------------------------------------
# The image's start check writes its blocker here (in_image/podstart.py); the variable lets a test's sshd move it
_BLOCKED_PROBE = (
    'f="${IMAGEKIT_BLOCKED_FILE:-/run/imagekit/blocked}"; if [ -e "$f" ]; then echo BLOCKED; head -c 4000 "$f"; fi'
)


def refuse_if_blocked(t: Transport, what: str) -> None:
    """Refuse ``what`` (exit 1) on a pod whose start check found a blocker: training there would fail or run on the
    CPU. `pod exec` and `pod run` ask this first, unless told --ignore-blockers."""
    found = blocker(t)
    if found is not None:
        raise CheckFailed(
            f"the pod has a blocker; not {what}:\n{found}",
            "fix it (imagekit pod doctor TARGET says how), or pass --ignore-blockers to run it anyway",
        )


def blocker(t: Transport) -> str | None:
    """The pod's blocker, as its start check wrote it (untrusted text, made printable), or None."""
    _code, said = t.capture(_BLOCKED_PROBE, 30.0)
    if not said.startswith("BLOCKED"):
        return None
    lines = [ln.strip() for ln in said.splitlines()[1:] if ln.strip() and not ln.startswith("====")]
    return untrusted.printable("\n".join(lines[:12]), 1500) or "a blocker (no report)"


def run_command(
    target: Target,
    command: str,
    opts: PodOptions,
    out: Log,
    err: Log,
    warn: Log,
    dial: Dial = connect,
    ignore_blockers: bool = False,
) -> tuple[int, str]:
    """Run ``command`` on the pod; (its exit code, the transport used: exec | pty). A pod whose start check found a
    blocker refuses (exit 1) unless ``ignore_blockers``: training there would fail or run on the CPU."""
    with dial(target, opts, warn) as t:
        hold_lease(t)
        if not ignore_blockers:
            refuse_if_blocked(t, "running the command")
        return t.run(command, opts.timeout, out, err), t.mode


# ---- doctor ----------------------------------------------------------------------------------------------
_FIND_PYTHON = (
    'for p in python3 python; do if command -v "$p" >/dev/null 2>&1 && "$p" -c '
    "'import sys; sys.exit(0 if sys.version_info >= (3, 8) else 1)' 2>/dev/null; then command -v \"$p\"; exit 0; "
    "fi; done; exit 1"
)


def run_doctor(
    target: Target,
    args: list[str],
    expect: Path | None,
    opts: PodOptions,
    out: Log,
    err: Log,
    log: Log,
    dial: Dial = connect,
) -> tuple[int, str]:
    """The image's own doctor when the pod has it; else the stdlib doctor sent over (checksum verified), run with
    the pod's Python (>= 3.8) and removed afterwards. (exit code, how it ran)."""
    with dial(target, opts, log) as t:
        code, found = t.capture("command -v imagekit-doctor", 30)
        own = code == 0 and found.strip().endswith("imagekit-doctor")
        code, tmp = t.capture("mktemp -d /tmp/imagekit-doctor.XXXXXX", 30)
        tmp = tmp.strip().splitlines()[-1] if code == 0 and tmp.strip() else ""
        if not tmp.startswith("/tmp/imagekit-doctor."):
            raise EnvironmentFailure(f"cannot make a temporary directory on {target}", "is /tmp writable there?")
        try:
            argv = list(args)
            if expect is not None:
                remote_expect = f"{tmp}/{expect.name}"
                t.put(expect, remote_expect, _quiet, log)
                argv += ["--expect", remote_expect]
            if own:
                program, how = "imagekit-doctor", "the image's doctor"
            else:
                code, python = t.capture(_FIND_PYTHON, 30)
                if code != 0:
                    raise EnvironmentFailure(
                        f"{target} has no Python >= 3.8 to run the doctor with", "install python3 on the pod"
                    )
                for name in DOCTOR_FILES:
                    t.put(render.sources().program(name), f"{tmp}/{name}", _quiet, log)
                python = python.strip().splitlines()[-1] if python.strip() else ""
                if not python.startswith("/") or untrusted.printable(python, 4096) != python:
                    raise EnvironmentFailure(
                        f"{target} named no usable Python (got {untrusted.printable(python, 80)!r})",
                        "install python3 on the pod",
                    )
                program = f"{q(python)} -I {q(tmp + '/imagekit_doctor.py')}"
                how = f"the stdlib doctor sent over, run with {untrusted.printable(python, 200)}"
            command = f"{program} {shlex.join(argv)}".strip()
            return t.run(command, opts.timeout, out, err), how
        finally:
            try:
                t.capture(f"rm -rf {q(tmp)}", 30)
            except EnvironmentFailure:
                pass


# ---- copy ------------------------------------------------------------------------------------------------
def _quiet(done: int, total: int) -> None:
    """No progress shown (the doctor's small files)."""


def _kind(t: Transport, path: str) -> str:
    """``file`` (a regular file), ``dir``, ``other`` (a FIFO, a device, a socket: never copied), ``pseudo`` (a file of
    /proc or /sys, also through a link: its size is known only by reading it, and reading /proc/kmsg never ends) or
    ``none``."""
    p = q(path)
    out = checked(
        t,
        f"if [ -d {p} ]; then echo dir; elif [ -f {p} ]; then r=$(readlink -f {p} 2>/dev/null | head -c 4096); "
        'case "$r" in /proc/*|/sys/*) echo pseudo;; *) echo file;; esac; '
        f"elif [ -e {p} ]; then echo other; else echo none; fi",
        f"look at {path}",
    )
    kind = out.split()[-1] if out.split() else "none"
    return kind if kind in ("dir", "file", "other", "pseudo", "none") else "none"


SPECIAL_SHOWN = 3  # special files named in the error


def _specials(t: Transport, path: str, dereference: bool) -> list[str]:
    """The FIFOs, devices and sockets inside the folder ``path`` on the pod (reached through its links too with
    ``dereference``, as ``tar -h`` would read them), at most ``SPECIAL_SHOWN`` + 1, relative to it, as plain text.
    A pod without ``find`` says nothing here (the archive's own check still refuses such members)."""
    p = q(path.rstrip("/") or "/")
    found = checked(
        t,
        f"command -v find >/dev/null 2>&1 || exit 0; cd {p} && "
        f"find {'-L ' if dereference else ''}. \\( -type p -o -type c -o -type b -o -type s \\) -print 2>/dev/null "
        f"| head -n {SPECIAL_SHOWN + 1}; exit 0",
        f"look inside {path}",
    )
    names = [line.removeprefix("./") for line in found.splitlines() if line.startswith("./")]
    return [untrusted.printable(name, 200) for name in names[: SPECIAL_SHOWN + 1]]


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


def copy(src: str, dst: str, opts: PodOptions, progress: Progress, log: Log, dial: Dial = connect) -> CopyResult:
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
        _uploadable(local, src)
        result = _retrying(target, opts, log, dial, lambda t, again: _upload(t, local, path, progress, log))
    else:
        assert remote_src is not None
        target, path = remote_src
        local = _download_target(path, Path(dst), opts.force)
        result = _retrying(
            target, opts, log, dial, lambda t, again: _download(t, opts, path, local, progress, log, again)
        )
    result.seconds = round(time.monotonic() - started, 3)
    return result


def _uploadable(local: Path, src: str) -> None:
    """What `pod cp` sends is a folder or a regular file: a FIFO, a device (/dev/zero) or a socket is refused here,
    before anything connects, as scp does (it would be read for ever, or never end)."""
    import stat

    shown = untrusted.printable(src, 300)
    try:
        info = local.stat()
    except FileNotFoundError:
        raise UsageError(f"{shown}: no such file or directory", "check the local path") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{shown}: {getattr(exc, 'strerror', None) or exc}", "check the local path") from None
    if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        raise UsageError(
            f"{shown} is not a regular file ({foreign_files.kind(info.st_mode)})",
            "copy a file or a folder; nothing was sent",
        )


def _retrying(
    target: Target, opts: PodOptions, log: Log, dial: Dial, fn: Callable[[Transport, bool], CopyResult]
) -> CopyResult:
    """Run a copy; after a dropped connection, reconnect and resume (at most RECONNECTS times)."""
    drops = 0
    while True:
        try:
            with dial(target, opts, log) as t:
                hold_lease(t)
                result = fn(t, drops > 0)
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


def _upload(t: Transport, local: Path, remote: str, progress: Progress, log: Log) -> CopyResult:
    mode = t.copy_mode
    if local.is_dir():
        with tempfile.TemporaryDirectory(prefix="imagekit-cp-") as tmp:
            archive, files = _tar(local, Path(tmp) / "tree.tar")
            staged = f"/tmp/.imk-{sha256_file(archive)[:20]}.tar"  # the same name again when resuming
            sent = t.put(archive, staged, progress, log)
            checked(
                t,
                f"mkdir -p {q(remote)} && tar -xf {staged} -C {q(remote)}; c=$?; rm -f {staged}; exit $c",
                f"unpack into {remote}",
            )
            return CopyResult("upload", remote, archive.stat().st_size, sha256_file(archive), mode, sent, files=files)
    if _kind(t, remote) == "dir":  # like cp: into the directory
        remote = f"{remote.rstrip('/')}/{local.name}"
    sent = t.put(local, remote, progress, log)
    return CopyResult("upload", remote, local.stat().st_size, sha256_file(local), mode, sent)


def _download(
    t: Transport, opts: PodOptions, remote: str, local: Path, progress: Progress, log: Log, resuming: bool
) -> CopyResult:
    mode = t.copy_mode
    kind = _kind(t, remote)
    if kind == "none":
        raise UsageError(f"{remote}: no such file or directory on the pod", "check the remote path")
    if kind == "other":
        raise UsageError(
            f"{remote} on the pod is not a regular file or a folder (a FIFO, a device or a socket)",
            "copy regular files and folders only",
        )
    if kind == "pseudo":
        raise UsageError(
            f"{remote} on the pod is a file of /proc or /sys: its size is known only by reading it, and reading some "
            "(/proc/kmsg) never ends; nothing was copied",
            f"print it instead, with a time limit: imagekit pod exec TARGET --timeout 60 -- cat {q(remote)} > FILE",
        )
    if os.path.lexists(local) and os.path.isdir(local) != (kind == "dir"):
        have, got = ("a folder", "a file") if kind != "dir" else ("a file", "a folder")
        raise UsageError(f"{local} is {have}; {remote} is {got}: nothing was copied", "give another destination")
    if kind == "dir":
        specials = _specials(t, remote, opts.dereference)
        if specials:
            more = ", ..." if len(specials) > SPECIAL_SHOWN else ""
            raise UsageError(
                f"{remote} on the pod holds what is not a regular file, a folder or a link (a FIFO, a device or a "
                f"socket{', reached through a link' if opts.dereference else ''}): "
                f"{', '.join(specials[:SPECIAL_SHOWN])}{more}; nothing was copied",
                "move them out of the folder on the pod (find DIR -type p -o -type c -o -type b -o -type s lists "
                "them)"
                + (", copy without --dereference" if opts.dereference else "")
                + ", or copy the files you need one by one",
            )
        staged = f"/tmp/.imk-{hashlib.sha256(f'{remote} {opts.dereference}'.encode()).hexdigest()[:20]}.tar"
        pack = f"tar -c{'h' if opts.dereference else ''}f {staged} -C {q(remote)} ."
        if resuming:  # the archive made before the connection dropped, so the partial download stays valid
            pack = f"[ -f {staged} ] || {pack}"
        archive = local.with_name(local.name + ".imktar")
        try:
            checked(t, pack, f"pack {remote}", 3600)
            made = _kind(t, staged)
            if made != "file":  # a link to /dev/zero, a FIFO: never read (it would never end)
                raise EnvironmentFailure(
                    f"the pod's tar left {staged} as {'nothing' if made == 'none' else 'not a regular file'} where "
                    f"the archive of {remote} goes; nothing was copied",
                    "check what runs as tar on the pod (command -v tar)",
                )
            received = t.get(staged, archive, progress, log)
            files = _untar(archive, local, remote, opts.force)
            return CopyResult(
                "download", str(local), archive.stat().st_size, sha256_file(archive), mode, received, files=files
            )
        finally:
            if archive.is_file() and not archive.is_symlink():
                archive.unlink()
            try:
                t.capture(f"rm -f {staged}", 30)
            except EnvironmentFailure:
                pass
    received = t.get(remote, local, progress, log)
    return CopyResult("download", str(local), local.stat().st_size, sha256_file(local), mode, received)


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
