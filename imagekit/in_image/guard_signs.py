"""What the lifetime guard reads of the machine it runs on (standard library only, Python >= 3.8): the GPUs
(`nvidia-smi`), the processes (which one a process is: its boot id, pid and start time; what each used and wrote; who
is logged in over SSH and when they last typed at their terminal), the TCP connections to the session ports, and what
Jupyter's own API says of its kernels and terminals. Everything is read as another party's: /proc without following a
link, bounded; Jupyter on loopback with its token, never through a redirect. guard.py decides from it."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
import urllib.error
import urllib.request

if __package__:  # imported from the host's package, imagekit.in_image
    from . import nofollow
else:  # the program in the image: its siblings lie beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import nofollow


_KEY = re.compile(r"[!-~]{1,4096}")  # printable ASCII: what an HTTP header carries as it is


PROC_TCP = ("/proc/net/tcp", "/proc/net/tcp6")


MAX_PROC_TABLE = 64 << 20


SESSION_PORTS = (22, 8888)  # sshd's and JupyterLab's: connections to them are shown, never counted as work


PROC = "/proc"  # processes: sessions, identities, CPU use (a test's own tree in its folder)


PASSWD = "/etc/passwd"


# The programs whose processes can be an authenticated SSH session: the image's sshd (OpenSSH before 9.8) and the
# session binary of 9.8 and later, where each distribution puts it. A copy elsewhere, or a title alone, is not one.
SSHD_EXES = (
    "/usr/sbin/sshd",
    "/usr/lib/openssh/sshd-session",
    "/usr/libexec/openssh/sshd-session",
    "/usr/libexec/sshd-session",
    "/usr/sbin/sshd-session",
)


# The title OpenSSH gives a session's process once its user is authenticated (session.c: "%s@%s", the user and
# the tty or notty). Before that a connection's processes are "USER [priv]", "USER [net]", "unknown [preauth]": the
# name a client sends is shown with a suffix, so a client naming itself "root@pts/0" is no session either.
_SSH_TITLE = re.compile(r"(?:sshd|sshd-session): ([a-z_][a-z0-9_.-]{0,31}\$?)@(?:pts/[0-9]{1,7}|notty)")


JUPYTER_URL = "http://127.0.0.1:8888"  # the image's JupyterLab (podstart.py), its token JUPYTER_PASSWORD


JUPYTER_RUNTIME = ("/root/.local/share/jupyter/runtime",)  # other servers' jpserver-*.json (url and token)


MAX_JUPYTER = 4 << 20  # bytes of one API answer


# Busy on the CPU with every GPU idle, and not training: builds, installs, archives, transfers (comm, 15 characters)
NOT_TRAINING = frozenset(
    (
        "cc1",
        "cc1plus",
        "cicc",
        "ptxas",
        "nvcc",
        "fatbinary",
        "nvlink",
        "ld",
        "ld.gold",
        "ld.lld",
        "as",
        "gcc",
        "g++",
        "c++",
        "cc",
        "clang",
        "clang++",
        "rustc",
        "cargo",
        "ninja",
        "make",
        "cmake",
        "dpkg",
        "apt",
        "apt-get",
        "tar",
        "gzip",
        "pigz",
        "xz",
        "zstd",
        "bzip2",
        "unzip",
        "git",
        "git-remote-http",
        "rsync",
        "scp",
        "sftp-server",
        "sshd",
        "curl",
        "wget",
        "sha256sum",
        "md5sum",
    )
)


def _nvidia_smi(args):
    import subprocess

    try:
        res = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def _connections(ports):
    """Established TCP connections to these local ports (/proc/net/tcp, tcp6): SSH and Jupyter sessions."""
    count = {p: 0 for p in ports}
    for table in PROC_TCP:
        try:
            lines = (nofollow.read_bytes(table, MAX_PROC_TABLE) or b"").decode("ascii", "replace").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            port = re.fullmatch(r"[0-9A-Fa-f]+:([0-9A-Fa-f]{4})", fields[1]) if len(fields) > 3 else None
            if port and fields[3] == "01":  # ESTABLISHED
                number = int(port.group(1), 16)
                if number in count:
                    count[number] += 1
    return count


_BOOT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


_IDENTITY = re.compile(r"\s*(" + _BOOT.pattern + r") ([0-9]{1,10}) ([0-9]{1,20})\s*")


_NUMBER = re.compile(r"[0-9]{1,20}")


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_text(path, limit=1 << 16):
    """A /proc file's text ('' when it cannot be read: the process is gone, or it is not a file to read)."""
    try:
        return (nofollow.read_bytes(path, limit) or b"").decode("utf-8", "replace")
    except OSError:
        return ""


def boot_id(proc=None):
    """This kernel's boot id, or None: a container restart keeps it (and starts pids again from 1), a reboot or
    another host changes it (and start times with it)."""
    text = _proc_text(f"{proc or PROC}/sys/kernel/random/boot_id", 64).strip()
    return text if _BOOT.fullmatch(text) else None


def _stat_fields(pid, proc=None):
    """/proc/PID/stat's fields after the command name (which may hold spaces and ')': it ends at the last ')'), so
    [0] is field 3 (the state) and [19] field 22 (the start time); None for no such process, or a zombie."""
    text = _proc_text(f"{proc or PROC}/{int(pid)}/stat", 4096)
    fields = text.rpartition(")")[2].split() if ")" in text else []
    return fields if len(fields) >= 20 and fields[0] not in ("Z", "X") else None


def start_time(pid, proc=None):
    """When the process ``pid`` started, in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    fields = _stat_fields(pid, proc)
    return int(fields[19]) if fields and _NUMBER.fullmatch(fields[19]) else None


def started_at(pid, proc=None, now=None):
    """When process ``pid`` started, in seconds since the epoch (its start in ticks since boot against
    /proc/uptime, to the hundredth), or None when either cannot be read."""
    start = start_time(pid, proc)
    m = re.match(r"([0-9]{1,12}(?:\.[0-9]{1,3})?) ", _proc_text(f"{proc or PROC}/uptime", 256))
    if start is None or not m:
        return None
    return (time.time() if now is None else now) - float(m.group(1)) + start / CLK_TCK


def identity(pid, proc=None):
    """The line that names process ``pid`` for good: ``BOOT_ID PID START_TIME``; None when it is not there. A pid
    alone names whatever has it now (after a container restart, some other process)."""
    boot, start = boot_id(proc), start_time(pid, proc)
    return None if boot is None or start is None else f"{boot} {int(pid)} {start}"


def same_process(text, proc=None):
    """Is the process an identity line names (:func:`identity`) still running: same boot, same pid, same start?"""
    m = _IDENTITY.fullmatch(text or "")
    if not m or int(m.group(2)) <= 1:  # 1 is tini, never a run or a job
        return False
    return identity(int(m.group(2)), proc) == f"{m.group(1)} {int(m.group(2))} {int(m.group(3))}"


def started_by(pid, when, proc=None):
    """Did process ``pid`` start by the time ``when`` (seconds since the epoch; a pid file's mtime)? A pid file with
    no identity beside it (a run an older `pod run` started) names its process only then: a pid reused after a
    restart belongs to a process that started later."""
    start = start_time(pid, proc)
    m = re.search(r"^btime ([0-9]{1,20})$", _proc_text(f"{proc or PROC}/stat", 1 << 20), re.M)
    return start is not None and m is not None and int(m.group(1)) + start / CLK_TCK <= when + 5


def _pids(proc):
    try:
        return [name for name in os.listdir(proc) if _NUMBER.fullmatch(name)]
    except OSError:
        return []


def _title(pid, proc):
    """A process's title as ps shows it: its command line up to the first NUL (setproctitle pads with NULs)."""
    return _proc_text(f"{proc}/{pid}/cmdline", 4096).split("\0", 1)[0].rstrip(" ")


def _exe(pid, proc):
    try:
        target = os.readlink(f"{proc}/{pid}/exe")
    except OSError:
        return ""
    return target[: -len(" (deleted)")] if target.endswith(" (deleted)") else target  # upgraded since it started


def _status(pid, proc, field):
    """A number from /proc/PID/status (``Uid``: the real uid; ``PPid``), or None."""
    m = re.search(rf"^{field}:\s+([0-9]{{1,10}})\s", _proc_text(f"{proc}/{pid}/status"), re.M)
    return int(m.group(1)) if m else None


def _of_sshd(pid, proc):
    """Is ``pid`` a process of an sshd program? Its /proc/PID/exe says, where root may read it; sshd makes its
    privilege-separated processes undumpable, and a container's root has no CAP_SYS_PTRACE, so a user's session
    (and its monitor) cannot be read: then the nearest ancestor that can be read must be sshd (the listener, for a
    session under its monitor). A process that sets its own title has its own parents: a shell, tini."""
    for _ in range(8):
        exe = _exe(pid, proc)
        if exe:
            return exe in SSHD_EXES
        pid = _status(pid, proc, "PPid")
        if not pid:  # 0: above the container's init
            return False
    return False


def _users(passwd):
    """{name: uid} of the passwd file."""
    users = {}
    for line in _proc_text(passwd, 4 << 20).splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and _NUMBER.fullmatch(parts[2]) and parts[0]:
            users.setdefault(parts[0], int(parts[2]))
    return users


def ssh_session_list(proc=None, passwd=None):
    """[(pid, tty or None)] of the logged-in SSH sessions: processes of an sshd program (``SSHD_EXES``, by
    /proc/PID/exe, see ``_of_sshd``: a title can be set by anyone) titled as OpenSSH titles a session once its user
    authenticated (``USER@pts/N`` or ``USER@notty``, no suffix), running as that USER (a root login's session runs as
    root; a user's, under privilege separation, as the user); the tty (``pts/N``) of an interactive one. A TCP
    connection that has not authenticated has processes titled ``[priv]``, ``[net]``, ``[accepted]``,
    ``[session-auth]`` or ``[preauth]`` only: it is no session, however long it is held open."""
    proc = proc or PROC
    users, found = _users(passwd or PASSWD), []
    for pid in _pids(proc):
        title = _title(pid, proc)
        m = _SSH_TITLE.fullmatch(title)
        if m and m.group(1) in users and _status(pid, proc, "Uid") == users[m.group(1)] and _of_sshd(pid, proc):
            tty = title.rpartition("@")[2]
            found.append((int(pid), tty if tty.startswith("pts/") else None))
    return found


def ssh_sessions(proc=None, passwd=None):
    """How many SSH sessions are logged in (``ssh_session_list``)."""
    return len(ssh_session_list(proc, passwd))


DEV = "/dev"  # where a session's terminal lies (a test's own folder)


def input_age(tty, now, dev=None):
    """Seconds since the last input at the terminal ``tty`` (``pts/N``): its device's access time, which the kernel
    sets when a program reads what was typed (at most every 8 seconds), as `w` reads a session's idle time; None
    when it is not a terminal device (a link, a file: not followed, not counted)."""
    if not re.fullmatch(r"pts/[0-9]{1,7}", tty or ""):
        return None
    try:
        st = os.stat(f"{dev or DEV}/{tty}", follow_symlinks=False)
    except OSError:
        return None
    return max(0.0, now - st.st_atime) if stat.S_ISCHR(st.st_mode) else None


def cpu_times(proc=None):
    """{"PID START_TIME": [CPU ticks used, command name]} of every process but the guard's own (a process is its pid
    and start time: a pid reused between two looks is another process); kernel threads (no command line) left out."""
    return {k: [v[3], v[2]] for k, v in process_usage(proc).items()}


def process_usage(proc=None):
    """{"PID START_TIME": [CPU ticks with the children it waited for, bytes written, command name, own CPU ticks]} of
    every process but the guard's own (its looks, nvidia-smi among them, end before this one and count in its own
    children's time); kernel threads (no command line) left out. Bytes written: /proc/PID/io ``wchar`` (0 where it
    cannot be read: another user's process, or sshd's, to a root without CAP_SYS_PTRACE, counts by its CPU alone)."""
    proc, out, me = proc or PROC, {}, os.getpid()
    for pid in _pids(proc):
        fields = _stat_fields(pid, proc) if int(pid) != me else None
        if not fields or not all(_NUMBER.fullmatch(f) for f in (fields[1], *fields[11:15], fields[19])):
            continue
        if not _title(pid, proc):
            continue
        comm = _proc_text(f"{proc}/{pid}/comm", 256).strip()[:64]
        io = _proc_text(f"{proc}/{pid}/io", 4096)
        moved = sum(int(v) for v in re.findall(r"^wchar:\s+([0-9]{1,20})\s*$", io, re.M))
        own = int(fields[11]) + int(fields[12])
        out[f"{int(pid)} {int(fields[19])}"] = [own + int(fields[13]) + int(fields[14]), moved, comm, own]
    return out


def tree_usage(roots, proc=None):
    """{"PID START_TIME": [CPU ticks, bytes written]} of the processes ``roots`` and every process under them: ticks
    of its own and of the children it waited for (a finished compiler's or downloader's time stays counted), bytes its
    write calls wrote (/proc/PID/io ``wchar``, children waited for included; 0 where it cannot be read: another
    user's process, to a root without CAP_SYS_PTRACE, counts by its CPU alone)."""
    proc, children, fields_of = proc or PROC, {}, {}
    for pid in _pids(proc):
        fields = _stat_fields(pid, proc)
        if fields and all(_NUMBER.fullmatch(f) for f in (fields[1], *fields[11:15], fields[19])):
            fields_of[int(pid)] = fields
            children.setdefault(int(fields[1]), []).append(int(pid))
    out, todo, seen = {}, [int(r) for r in roots if int(r) in fields_of], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        f = fields_of[pid]
        io = _proc_text(f"{proc}/{pid}/io", 4096)
        moved = sum(int(v) for v in re.findall(r"^wchar:\s+([0-9]{1,20})\s*$", io, re.M))
        out[f"{pid} {int(f[19])}"] = [sum(int(v) for v in f[11:15]), moved]
        todo.extend(children.get(pid, []))
    return out


_ISO = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?"
    r"(Z|[+-][0-9]{2}:[0-9]{2})?"
)


def iso_time(text):
    """Seconds since the epoch of an ISO 8601 UTC time as Jupyter writes it (``2026-12-04T21:00:00.123456Z``), or
    None."""
    import calendar

    m = _ISO.fullmatch(text.strip()) if isinstance(text, str) else None
    if not m:
        return None
    y, mo, d, h, mi, sec = (int(g) for g in m.groups()[:6])
    if not (1 <= mo <= 12 and 1 <= d <= 31 and h < 24 and mi < 60 and sec < 61):
        return None
    t = calendar.timegm((y, mo, d, h, mi, sec, 0, 0, 0)) + (float(m.group(7)) if m.group(7) else 0.0)
    zone = m.group(8) or "Z"
    if zone != "Z":
        t -= (1 if zone[0] == "+" else -1) * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return t


def jupyter_servers(token, runtime=None):
    """[(base URL on loopback, token)]: the image's JupyterLab (its token, JUPYTER_PASSWORD, from the env), and each
    server root's runtime folder lists (``jpserver-*.json``, read without following a link, bounded)."""
    servers = [(JUPYTER_URL, token)] if token else []
    for folder in JUPYTER_RUNTIME if runtime is None else runtime:
        try:
            fd = nofollow.open_dir(folder, follow=False)
        except OSError:
            continue
        try:
            for name in sorted(os.listdir(fd))[:64]:
                if re.fullmatch(r"jpserver-[0-9]{1,10}\.json", name):
                    servers += _jupyter_info(name, fd)
        except OSError:
            pass
        finally:
            os.close(fd)
    seen = set()
    return [s for s in servers if not (s[0] in seen or seen.add(s[0]))]


def _jupyter_info(name, dir_fd):
    try:
        info = json.loads(nofollow.read_bytes(name, 1 << 16, dir_fd=dir_fd) or b"null")
    except (OSError, ValueError):
        return []
    if not isinstance(info, dict) or not isinstance(info.get("token"), str) or not _KEY.fullmatch(info["token"]):
        return []
    port, base = info.get("port"), info.get("base_url") or "/"
    if not (isinstance(port, int) and 0 < port < 65536 and isinstance(base, str) and re.fullmatch(r"/[!-~]*", base)):
        return []
    return [(f"http://127.0.0.1:{port}{base.rstrip('/')}", info["token"])]


def _jupyter_get(url, token):
    """(parsed JSON, None) or (None, what went wrong): an authenticated GET on loopback, no redirect, bounded."""
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.build_opener(_NoRedirect).open(req, timeout=5) as resp:
            data = resp.read(MAX_JUPYTER + 1)
    except urllib.error.HTTPError as exc:
        return None, f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return None, f"no answer ({type(exc).__name__})"
    if len(data) > MAX_JUPYTER:
        return None, f"an answer over {MAX_JUPYTER} bytes"
    try:
        return json.loads(data), None
    except ValueError:
        return None, "an answer that is not JSON"


def jupyter_activity(token, now, runtime=None):
    """(kernels running a cell now, seconds since a kernel or terminal last reported activity or None, problem or
    None), from each server's own API asked with its token (``no_track_activity``: the guard's own requests are
    not activity). A connection to :8888 without the token sees nothing, and changes nothing here."""
    busy, last, problems = 0, None, []
    for base, tok in jupyter_servers(token, runtime):
        for kind in ("kernels", "terminals"):
            items, problem = _jupyter_get(f"{base}/api/{kind}?no_track_activity=1", tok)
            if problem:
                problems.append(f"Jupyter at {base}: /api/{kind}: {problem}")
                continue
            for item in items if isinstance(items, list) else []:
                if not isinstance(item, dict):
                    continue
                busy += item.get("execution_state") == "busy"
                t = iso_time(item.get("last_activity"))
                if t is not None:
                    last = t if last is None else max(last, t)
    return busy, None if last is None else max(0.0, now - last), "; ".join(problems)[:300] or None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is a failure: the key stays with the host it was meant for."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None
