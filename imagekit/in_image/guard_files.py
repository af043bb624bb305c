"""The files the lifetime guard reads and writes (standard library only, Python >= 3.8): its log, its state on the
volume (what a restart keeps), the declared outputs it checksums, the start check's markers and the login banner, and
what tells it of work: job mode's marker, the runs `imagekit pod run` started, the exits since this start, the leases
of connected imagekit clients. It runs as root among files other users of the pod can touch: every file is opened
without following a link, without blocking, read to a bound (nofollow.py); what it writes is a new file renamed into
place; a folder another user could change is not trusted (``trusted_folder``)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import sys
import time

if __package__:  # imported from the host's package, imagekit.in_image
    from . import facts, guard_signs, nofollow
else:  # the program in the image: its siblings lie beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import facts
    import guard_signs
    import nofollow


BLOCKED = "/run/imagekit/blocked"

say = facts.say


LOG = "/var/log/imagekit-guard.log"


MAX_MARKER = 1 << 20  # bytes read of the start check's report


SECRETS = []  # the provider's key, once read: taken out of every line logged whatever carries it


def log(message):
    line = f"imagekit-guard: {nofollow.clean(message, SECRETS)}"
    print(line, file=sys.stderr, flush=True)
    try:
        fd = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write(time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + line + "\n")
    except OSError:
        pass


def blocker():
    """The start check's blocker, from the login banner it wrote (its first report line), or ''. A marker that is
    there but cannot be read as a file still says blocked, and why it cannot be read."""
    try:
        data = nofollow.read_bytes(BLOCKED, MAX_MARKER)
    except OSError as exc:
        return f"the start check's report {BLOCKED} cannot be read ({getattr(exc, 'reason', exc.strerror)})"[:300]
    if data is None:
        return ""
    text = data.decode("utf-8", "replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("====")]
    return (lines[0] if lines else "blocked")[:300]


def checksum_outputs(paths):
    """(ok, lines): each declared output must exist; each gets ``<path>.sha256`` (sha256sum -c format) of its files.
    An output, or anything inside an output folder, that is a link, a FIFO or a device is refused (the guard runs as
    root: a link is never followed to what another user points it at, a FIFO never blocks it), as is a file still
    growing while it is hashed; the manifest is a new file renamed into place, never written through a link."""
    lines = []
    for path in paths:
        ok, line = _checksum_one(path)
        if not ok:
            return False, [line]
        lines.append(line)
    return True, lines


MAX_DEPTH = 64  # folders inside a declared output


def _checksum_one(path):
    """(ok, the log line) for one declared output."""
    trimmed = path.rstrip("/") or "/"
    folder, name = os.path.split(trimmed)
    if not name or name in (".", ".."):
        return False, f"declared output {path} is not a file or folder of its own to checksum"
    try:  # the folder it lies in, as the path names it (links above the output are the declared path's own)
        dir_fd = nofollow.open_dir(folder or ".")
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return False, f"declared output {path} does not exist"
        return False, f"declared output {path}: cannot open its folder: {exc.strerror}"
    try:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False, f"declared output {path} does not exist"
        if stat.S_ISLNK(st.st_mode):
            return False, (
                f"declared output {path} is a symbolic link: not followed (it could point at another "
                "user's files or a device); declare the file or folder it points to"
            )
        if stat.S_ISREG(st.st_mode):
            sums = [(_sha256(name, dir_fd, trimmed), name)]
        elif stat.S_ISDIR(st.st_mode):
            sums = sorted(((d, f"{name}/{rel}") for d, rel in _tree_sums(name, dir_fd, trimmed)), key=lambda x: x[1])
        else:
            return False, f"declared output {path} is {nofollow.kind(st.st_mode)}, not a file or folder to checksum"
        manifest = name + ".sha256"
        nofollow.write_replace(dir_fd, manifest, "".join(_sum_line(d, n) for d, n in sums).encode(), 0o644)
    except nofollow.Refused as exc:
        return False, f"declared output {path}: {exc}"
    except OSError as exc:
        return False, f"declared output {path}: {exc.strerror or exc} ({exc.filename or name})"
    finally:
        os.close(dir_fd)
    return True, f"{path}: {len(sums)} file(s), sha256s in {trimmed}.sha256"


def _tree_sums(name, parent_fd, folder_path, depth=0):
    """[(sha256, path relative to the folder)] of every file under the folder ``name`` of ``parent_fd``, walked
    through descriptors without following a link; a link or a special file inside is :class:`nofollow.Refused`
    naming its path."""
    if depth > MAX_DEPTH:
        raise nofollow.Refused(folder_path, f"folders nested more than {MAX_DEPTH} deep")
    fd = nofollow.open_dir(name, dir_fd=parent_fd, follow=False)
    out = []
    try:
        for entry in sorted(os.listdir(fd)):
            where = f"{folder_path}/{entry}"
            mode = os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode
            if stat.S_ISREG(mode):
                out.append((_sha256(entry, fd, where), entry))
            elif stat.S_ISDIR(mode):
                out += [(d, f"{entry}/{rel}") for d, rel in _tree_sums(entry, fd, where, depth + 1)]
            else:
                raise nofollow.Refused(
                    where, f"{nofollow.kind(mode)} inside the output: refused (not followed, not read)"
                )
    finally:
        os.close(fd)
    return out


def _sha256(name, dir_fd, shown=None):
    """The sha256 of the regular file ``name`` in ``dir_fd``: never through a link, never a FIFO or a device; a file
    that grows while it is read (still being written) is refused rather than given a sum of no final content."""
    try:
        fd, st = nofollow.open_regular(name, dir_fd)
    except nofollow.Refused as exc:
        raise nofollow.Refused(shown or name, exc.reason) from None
    h, size = hashlib.sha256(), 0
    try:
        while True:
            block = os.read(fd, 1 << 20)
            if not block:
                break
            size += len(block)
            if size > st.st_size:
                raise nofollow.Refused(shown or name, "grew while it was hashed (still being written?)")
            h.update(block)
    finally:
        os.close(fd)
    return h.hexdigest()


def _sum_line(digest, name):
    """One line of `sha256sum` output: a name with a backslash or a newline is escaped, as sha256sum escapes it."""
    if "\\" in name or "\n" in name:
        return "\\" + digest + "  " + name.replace("\\", "\\\\").replace("\n", "\\n") + "\n"
    return f"{digest}  {name}\n"


STATE_DIR = "/workspace/.imagekit/guard"  # on the volume: a container restart (a crash loop) keeps it


STATE_FALLBACK = "/var/lib/imagekit/guard"  # the container's own disk, where the volume's path is not root's alone


STATE = "state.json"


MAX_STATE = 1 << 16


RESUME_GAP = 900  # s: state last saved longer ago than this (or by a guard that ended the pod) is a new start


CHECKED = "/run/imagekit/checked"  # podstart.py: the start check has said (a blocker is in BLOCKED, or none is)


WARNING = "/run/imagekit/guard-warning"  # what the login banner shows besides BLOCKED (profile.sh)


def _root_only(path):
    """'' when every folder from / down to ``path`` (links resolved) is the guard's user's (root's) or root's and
    writable by no one else, or sticky: no other user can rename, replace or empty it; else what is wrong."""
    me, real = os.geteuid(), os.path.realpath(path)
    walked = "/"
    for part in [""] + [p for p in real.split("/") if p]:
        walked = os.path.join(walked, part)
        st = os.stat(walked, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, me):
            return f"{walked} is not a folder of root's"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{walked} is writable by other users"
    return ""


class State:
    """The guard's state file (``state.json``, 0600, in a folder 0700 that only root can change), read without
    following a link, as a regular file, bounded; written as a new file renamed into place. The volume's folder
    first; where that is not root's alone (a non-root user could rename it away, resetting the deadline), the
    container's disk; where neither can be used, none (said once: the deadline then counts from this start)."""

    def __init__(self, folders=None):
        self.fd, self.path = None, None
        why = []
        for folder in folders or (STATE_DIR, STATE_FALLBACK):
            try:
                if not os.path.isdir(os.path.dirname(os.path.dirname(folder))):
                    raise FileNotFoundError(errno.ENOENT, "no such folder", os.path.dirname(folder))
                os.makedirs(folder, mode=0o700, exist_ok=True)
                problem = _root_only(folder)
                if problem:
                    why.append(f"{folder}: {problem}")
                    continue
                self.fd = nofollow.open_dir(folder, follow=False)
                os.fchmod(self.fd, 0o700)
                self.path = folder
                return
            except OSError as exc:
                why.append(f"{folder}: {exc.strerror or exc}")
        log("no state kept across restarts (" + "; ".join(why) + "): a deadline counts from this start")

    def load(self):
        if self.fd is None:
            return None
        try:
            data = nofollow.read_bytes(STATE, MAX_STATE, dir_fd=self.fd)
            return None if data is None else json.loads(data.decode("utf-8"))
        except (OSError, ValueError) as exc:
            log(f"the state in {self.path}/{STATE} cannot be read ({exc}): a new start")
            return None

    def save(self, guard, now, ended=False):
        if self.fd is None:
            return
        s = guard.s
        state = {
            "armed": guard.started,
            "deadline": guard.started + s["max_runtime"] if s["max_runtime"] else None,
            "blocked_since": guard.blocked_since,
            "seen": now,
            "ended": ended,
        }
        try:
            nofollow.write_replace(self.fd, STATE, json.dumps(state).encode(), 0o600)
        except OSError as exc:
            log(f"cannot save the state in {self.path}: {exc}")


def _time(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def resume(prev, now, s):
    """(arm time, blocker's first sighting, log line or None) from what a previous start of this container saved.
    It is a restart (a crash loop too) when that guard looked at most RESUME_GAP ago and did not end the pod: the
    deadline counts from its arm time, the blocker's grace from its first sighting. Older, or ended: a new start
    (the pod was stopped, by the guard or by hand, and started again)."""
    armed, seen = _time((prev or {}).get("armed")), _time((prev or {}).get("seen"))
    if armed is None or seen is None or not armed <= seen <= now + 5:
        return now, None, None
    if prev.get("ended") is not False:
        return now, None, "a new start: the last start's guard ended the pod"
    if now - seen > max(RESUME_GAP, 3 * s["interval"]):
        return now, None, f"a new start: the last start's guard was last seen {say(now - seen)} ago"
    blocked = _time(prev.get("blocked_since"))
    left = f"; the deadline in {say(max(0, armed + s['max_runtime'] - now))}" if s["max_runtime"] else ""
    return (
        armed,
        blocked if blocked is not None and blocked <= now else None,
        (f"restarted: armed {say(now - armed)} ago, that time already used (last seen {say(now - seen)} ago){left}"),
    )


def current_blocker():
    """The start check's blocker; None while it has not said yet (a restarted container: keep what was seen)."""
    found = blocker()
    return found if found or os.path.exists(CHECKED) else None


_BANNER = [None]  # what show_banner last wrote


def show_banner(text):
    """The watchdog's warning in the login banner's folder (profile.sh shows it), or gone once it no longer holds."""
    if text == _BANNER[0]:
        return
    _BANNER[0] = text
    try:
        if text:
            fd = nofollow.open_dir(os.path.dirname(WARNING), follow=False)
            try:
                nofollow.write_replace(fd, os.path.basename(WARNING), (text + "\n").encode(), 0o644)
            finally:
                os.close(fd)
        elif os.path.lexists(WARNING):
            os.unlink(WARNING)
    except OSError:
        pass


JOB = "/run/imagekit/job"  # while a job-mode command runs (podstart.py): the identity of its process


RUNS = "/workspace/.imagekit/runs"  # where `imagekit pod run` keeps its runs ($IMAGEKIT_RUNS): <id>/pid, identity, exit


_PID = re.compile(rb"\s*([0-9]{1,10})\s*")


def a_run_is_alive(runs):
    """Is a run `imagekit pod run` started still going (``live_runs``)?"""
    return bool(live_runs(runs))


def live_runs(runs):
    """The pids of the runs `imagekit pod run` started that are still going: a folder with a pid, no exit file yet,
    and its process there: the one its identity file names (boot id, pid, start time), not whatever has that pid
    after a restart. Read through descriptors: a run folder or pid file that is a link, a FIFO or garbage is no run;
    a runs folder another user of the pod could change is not read (``trusted_folder``)."""
    if not trusted_folder(runs):
        return []
    try:
        runs_fd = nofollow.open_dir(runs)  # $IMAGEKIT_RUNS as the pod's env names it
    except OSError:
        return []
    try:
        names = os.listdir(runs_fd)
    except OSError:
        names = []
    try:
        return [pid for pid in (_run_pid(name, runs_fd) for name in names if name != "latest") if pid]
    finally:
        os.close(runs_fd)


def _run_pid(name, runs_fd):
    """The run folder ``name``'s pid, or 0: no exit file, and its pid file names a process that is there and is the
    run's: the one ``identity`` names, or (a run an older `pod run` started, no identity) one that started before the
    pid file was written."""
    try:
        run_fd = nofollow.open_dir(name, dir_fd=runs_fd, follow=False)
    except OSError:
        return 0
    try:
        try:
            os.stat("exit", dir_fd=run_fd, follow_symlinks=False)
            return 0  # it ended
        except FileNotFoundError:
            pass
        m = _PID.fullmatch(nofollow.read_bytes("pid", 64, dir_fd=run_fd) or b"")
        written = os.stat("pid", dir_fd=run_fd, follow_symlinks=False).st_mtime
        named = nofollow.read_bytes("identity", 256, dir_fd=run_fd)
    except OSError:
        return 0
    finally:
        os.close(run_fd)
    pid = int(m.group(1)) if m else 0
    if pid <= 1:  # 0 and -1 are no process; 1 is tini, never a run
        return 0
    if named is not None:
        text = named.decode("ascii", "replace")
        return pid if guard_signs.same_process(text) and text.split()[1:2] == [str(pid)] else 0
    return pid if guard_signs.started_by(pid, written) else 0


CLIENTS = "/run/imagekit/clients"  # `pod wait`, `pod logs`, `pod cp`: the identity of their connection's process


JOB_EXIT = "/run/imagekit/job-exit"  # podstart.py: the exit code of a job-mode command IMAGEKIT_ON_EXIT waits on


MAX_RUNS = 512  # the newest run folders read for exits at each look (their ids sort by start time)


def trusted_folder(path):
    """Is ``path`` a folder only root can change (``_root_only``: itself and every folder above it)? What another user
    of the pod could write there (a run's pid or exit code, a client's lease) would otherwise keep the pod up or end
    it on their word."""
    try:
        return os.path.isdir(path) and not _root_only(path)
    except OSError:
        return False


def client_leases(folder=None):
    """How many imagekit clients are connected now: `pod wait`, `pod logs` and `pod cp` write, on connecting, a lease
    naming their connection's process (boot id, pid, start time) in a folder root's alone; it holds while that
    process runs (the SSH connection's own: it ends when the connection does). A lease whose process is gone is
    removed; names other than a pid are not leases (a lease being written is a hidden temporary name)."""
    folder = folder or CLIENTS
    if not trusted_folder(folder):
        return 0
    try:
        fd = nofollow.open_dir(folder, follow=False)
    except OSError:
        return 0
    count = 0
    try:
        for name in sorted(os.listdir(fd))[:256]:
            if not re.fullmatch(r"[0-9]{1,10}", name):
                continue
            try:
                text = (nofollow.read_bytes(name, 256, dir_fd=fd) or b"").decode("ascii", "replace")
            except OSError:
                continue
            if guard_signs.same_process(text):
                count += 1
            else:
                try:
                    os.unlink(name, dir_fd=fd)
                except OSError:
                    pass
    except OSError:
        pass
    finally:
        os.close(fd)
    return count


def _exit_code(data):
    m = re.fullmatch(rb"\s*([0-9]{1,3})(?:\s+[0-9.]{1,20})?\s*", data or b"")
    return int(m.group(1)) if m and int(m.group(1)) <= 255 else None


def exits_since(environ, since):
    """[(time, exit code)] of what ended at or after ``since`` (this guard's start: what ended before was another
    start's), oldest first: each run `imagekit pod run` started (its ``exit`` file, written when it ended) and the
    job-mode command (``JOB_EXIT``). Read through descriptors, regular files only, bounded; a runs folder another
    user could write is not read (``trusted_folder``)."""
    found = []
    try:
        st = os.stat(JOB_EXIT, follow_symlinks=False)
        code = _exit_code(nofollow.read_bytes(JOB_EXIT, 64)) if stat.S_ISREG(st.st_mode) else None
        if code is not None and st.st_mtime >= since:
            found.append((st.st_mtime, code))
    except OSError:
        pass
    runs = environ.get("IMAGEKIT_RUNS") or RUNS
    if not trusted_folder(runs):
        return sorted(found)
    try:
        runs_fd = nofollow.open_dir(runs)
    except OSError:
        return sorted(found)
    try:
        names = sorted(n for n in os.listdir(runs_fd) if n != "latest")[-MAX_RUNS:]
        for name in names:
            try:
                run_fd = nofollow.open_dir(name, dir_fd=runs_fd, follow=False)
            except OSError:
                continue
            try:
                st = os.stat("exit", dir_fd=run_fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_mtime >= since:
                    code = _exit_code(nofollow.read_bytes("exit", 64, dir_fd=run_fd))
                    if code is not None:
                        found.append((st.st_mtime, code))
            except OSError:
                pass
            finally:
                os.close(run_fd)
    except OSError:
        pass
    finally:
        os.close(runs_fd)
    return sorted(found)


def job_pids(environ):
    """The pids of a job-mode command (its identity in ``JOB``) and of the runs `imagekit pod run` started that are
    still running."""
    try:
        job = (nofollow.read_bytes(JOB, 256) or b"").decode("ascii", "replace")
    except OSError:
        job = ""
    pids = [int(job.split()[1])] if guard_signs.same_process(job) else []
    return pids + live_runs(environ.get("IMAGEKIT_RUNS") or RUNS)


def job_running(environ):
    """A job-mode command or a run `imagekit pod run` started is still running."""
    return bool(job_pids(environ))
