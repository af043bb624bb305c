"""The lifetime guard: every billed minute is GPU work, or the pod ends (standard library only, Python >= 3.8).

Started by the entrypoint (pod and job mode) when the env asks for it; off otherwise. It ends the pod through the
provider's in-pod credentials, the only way that ends the billing (`kill 1` does not: the platform restarts the
container, or keeps the stopped one billed):

- ``IMAGEKIT_MAX_RUNTIME=6h``: a deadline, armed before anything else runs, counted from the first arm time (kept on
  the volume, root's alone: a crash-looping container reaches it; see ``State``);
- ``IMAGEKIT_IDLE_STOP=30m``: idle for the whole window: no GPU above ``IMAGEKIT_IDLE_GPU_UTIL`` % (default 5), no
  GPU compute process, no logged-in SSH session (OpenSSH's own session process: ``ssh_sessions``), no Jupyter kernel
  or terminal activity its server reports to its token (``jupyter_activity``), no job (job mode's command or a
  `pod run` run) making progress (CPU or writes: ``Guard._job``; a stalled one does not count), and the
  heartbeat file (``IMAGEKIT_HEARTBEAT``, default /run/imagekit/heartbeat: `touch` it from a training loop) not
  touched; a TCP connection counts for nothing (anyone can open one); the log line that explains a stop lists each;
- ``IMAGEKIT_ON_BLOCKER=stop|terminate``: the start check found a blocker and it is still there after
  ``IMAGEKIT_BLOCKER_GRACE`` (default 15m, to look around first);
- ``IMAGEKIT_ON_EXIT=stop|terminate``: a job-mode command ended (podstart.py runs it, then asks this module), after
  the declared outputs (``IMAGEKIT_OUTPUTS``, paths separated by ``:``) exist and their sha256s are written beside
  them (``<path>.sha256``, `sha256sum -c` format); a missing output keeps the pod up, saying so;
- ``IMAGEKIT_GPU_IDLE_WARN=10m``: GPUs under the threshold that long while a job runs (job mode, or a run `imagekit
  pod run` started; each known by its boot id, pid and start time, never by a pid alone), or, with no job, on a pod
  that expects a GPU, a process burning CPU (``IMAGEKIT_CPU_BURN`` % of a core, default 90) that long: a warning with
  the evidence (that one also in the login banner); ``IMAGEKIT_GPU_IDLE_STOP=30m``, only when asked: the pod ends.

The deadline and idle stop ``stop`` the pod unless ``IMAGEKIT_GUARD_ACTION=terminate``. Stop keeps the volume (and
bills it); terminate deletes the pod and its volume disk (only a network volume survives).
``IMAGEKIT_GUARD_DRY_RUN=1`` logs what it would do and does nothing. The provider is the one the doctor names: its
row of ``facts.PROVIDERS`` gives the pod id and key variables, the API base and its override, the calls. The key goes
in a header only: never in a log line, an argument or a file. A failed call is logged and retried until it succeeds;
the pod stays up meanwhile.

It runs as root among files other users of the pod can touch (the volume, the runs folder): every file it reads is
opened without following a link, without blocking, and read to a bound (nofollow.py); what it writes is a new file
renamed into place; a declared output that is a link (or holds one) is refused, not followed; every line it logs has
URL credentials and the provider's key taken out. A setting it cannot use is logged by name and leaves that trigger
(or, for the provider's variables, the call) off: never a traceback, never a request with a malformed id.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import sys
import time
import urllib.error
import urllib.request

if __package__:  # imported from the host's package, imagekit.in_image
    from . import facts, nofollow
else:  # the program in the image: its siblings lie beside it (-I leaves the script's folder off sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import facts
    import nofollow

HEARTBEAT = "/run/imagekit/heartbeat"
BLOCKED = "/run/imagekit/blocked"
LOG = "/var/log/imagekit-guard.log"
ACTIONS = facts.GUARD_ACTIONS
GuardError = facts.SettingError
parse_duration = facts.parse_duration
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # fullmatch: `$` would let a trailing newline into the URL's path
_KEY = re.compile(r"[!-~]{1,4096}")  # printable ASCII: what an HTTP header carries as it is
_PERCENT = re.compile(r"[0-9]{1,3}")  # ASCII digits only: str.isdigit() says yes to '²', int() to '١'
MAX_INTERVAL = 3600  # seconds between looks: longer, and a deadline is late by that much (time.sleep overflows too)
MAX_MARKER = 1 << 20  # bytes read of the start check's report
PROC_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
MAX_PROC_TABLE = 64 << 20
SESSION_PORTS = (22, 8888)  # sshd's and JupyterLab's: connections to them are shown, never counted as work
PROC = "/proc"  # processes: sessions, identities, CPU use (a test's own tree in its folder)
PASSWD = "/etc/passwd"
# The programs whose processes can be an authenticated SSH session: the image's sshd (OpenSSH before 9.8) and the
# session binary of 9.8 and later, where each distribution puts it. A copy elsewhere, or a title alone, is not one.
SSHD_EXES = ("/usr/sbin/sshd", "/usr/lib/openssh/sshd-session", "/usr/libexec/openssh/sshd-session",
             "/usr/libexec/sshd-session", "/usr/sbin/sshd-session")
# The title OpenSSH gives a session's process once its user is authenticated (session.c: "%s@%s", the user and
# the tty or notty). Before that a connection's processes are "USER [priv]", "USER [net]", "unknown [preauth]": the
# name a client sends is shown with a suffix, so a client naming itself "root@pts/0" is no session either.
_SSH_TITLE = re.compile(r"(?:sshd|sshd-session): ([a-z_][a-z0-9_.-]{0,31}\$?)@(?:pts/[0-9]{1,7}|notty)")
JUPYTER_URL = "http://127.0.0.1:8888"  # the image's JupyterLab (podstart.py), its token JUPYTER_PASSWORD
JUPYTER_RUNTIME = ("/root/.local/share/jupyter/runtime",)  # other servers' jpserver-*.json (url and token)
MAX_JUPYTER = 4 << 20  # bytes of one API answer
# Busy on the CPU with every GPU idle, and not training: builds, installs, archives, transfers (comm, 15 characters)
NOT_TRAINING = frozenset((
    "cc1", "cc1plus", "cicc", "ptxas", "nvcc", "fatbinary", "nvlink", "ld", "ld.gold", "ld.lld", "as", "gcc", "g++",
    "c++", "cc", "clang", "clang++", "rustc", "cargo", "ninja", "make", "cmake", "dpkg", "apt", "apt-get", "tar",
    "gzip", "pigz", "xz", "zstd", "bzip2", "unzip", "git", "git-remote-http", "rsync", "scp", "sftp-server", "sshd",
    "curl", "wget", "sha256sum", "md5sum"))
JOB_CPU = 5  # % of one core between two looks: a job using at least this much makes progress (a stalled one that
# polls, starting a program every few seconds, stays under it)
JOB_IO = 4096  # bytes a second written by a job's processes (a slow download, a checkpoint): progress too (reads are
# not counted: every program a polling loop starts reads its libraries)
SECRETS = []  # the provider's key, once read: taken out of every line logged whatever carries it


def _shown(value, limit=40):
    """A setting's value as a log line quotes it: credentials out first, then cut."""
    return repr(nofollow.redact(value)[:limit])


def say(seconds):
    """A duration as the settings write it (5400 -> '1h30m')."""
    out, rest = "", int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            out += f"{rest // size}{unit}"
            rest %= size
    return out + (f"{rest}s" if rest or not out else "")


def _rate(per_second):
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if per_second >= size:
            return f"{per_second / size:.1f} {unit}/s"
    return f"{per_second:.0f} B/s"


def settings(environ):
    """(settings, problems) from the env: a bad value is a problem (logged loudly), never a crash, and its trigger
    stays off; the others are armed."""
    s = {
        "max_runtime": None, "idle_stop": None, "on_blocker": None, "blocker_grace": 900, "on_exit": None,
        "outputs": [], "action": "stop", "dry_run": environ.get("IMAGEKIT_GUARD_DRY_RUN") == "1", "gpu_util": 5,
        "gpu_idle_warn": 600, "heartbeat": environ.get("IMAGEKIT_HEARTBEAT") or HEARTBEAT, "interval": 30,
        "gpu_idle_stop": None, "cpu_burn": 90, "require_gpu": environ.get("IMAGEKIT_REQUIRE_GPU") == "1",
        "jupyter_token": environ.get("JUPYTER_PASSWORD") or "",
    }
    if s["jupyter_token"] and s["jupyter_token"] not in SECRETS:
        SECRETS.append(s["jupyter_token"])
    problems = []
    durations = (("IMAGEKIT_MAX_RUNTIME", "max_runtime"), ("IMAGEKIT_IDLE_STOP", "idle_stop"),
                 ("IMAGEKIT_BLOCKER_GRACE", "blocker_grace"), ("IMAGEKIT_GPU_IDLE_WARN", "gpu_idle_warn"),
                 ("IMAGEKIT_GPU_IDLE_STOP", "gpu_idle_stop"), ("IMAGEKIT_GUARD_INTERVAL", "interval"))
    for name, key in durations:
        if environ.get(name):
            try:
                s[key] = parse_duration(nofollow.redact(environ[name]), name)  # its errors quote the value
            except GuardError as exc:
                problems.append(str(exc))
    if s["interval"] > MAX_INTERVAL:
        problems.append(f"IMAGEKIT_GUARD_INTERVAL={_shown(environ['IMAGEKIT_GUARD_INTERVAL'])} is longer than "
                        f"{say(MAX_INTERVAL)}: the guard would look too rarely (give 1s to {say(MAX_INTERVAL)})")
        s["interval"] = 30
    for name, key in (("IMAGEKIT_ON_BLOCKER", "on_blocker"), ("IMAGEKIT_ON_EXIT", "on_exit"),
                      ("IMAGEKIT_GUARD_ACTION", "action")):
        value = environ.get(name)
        allowed = facts.EXIT_ACTIONS if key == "on_exit" else ACTIONS
        if value:
            if value in allowed:
                s[key] = value
            else:
                problems.append(f"{name}={_shown(value)} is not {' or '.join(allowed)}")
    for name, key, top in (("IMAGEKIT_IDLE_GPU_UTIL", "gpu_util", 100), ("IMAGEKIT_CPU_BURN", "cpu_burn", 999)):
        value = environ.get(name)
        if value and _PERCENT.fullmatch(value) and int(value) <= top:
            s[key] = int(value)
        elif value:
            problems.append(f"{name}={_shown(value)} is not a percentage (0-{top}, ASCII digits)")
    s["outputs"] = [p for p in (environ.get("IMAGEKIT_OUTPUTS") or "").split(":") if p]
    return s, problems


def armed(s):
    """Does anything in ``s`` ask for the guard's process (on-exit is podstart's own, after the job)?"""
    return bool(s["max_runtime"] or s["idle_stop"] or s["on_blocker"] or s["gpu_idle_stop"])


def provider(environ):
    """(name, API base, pod id, key) of the provider the doctor names too (``facts.detect_provider``), or None where
    that provider gives a pod no way to end itself or its id or key is not set."""
    row = facts.detect_provider(environ)
    pod, key = (environ.get(row.pod_id, ""), environ.get(row.pod_key, "")) if row and row.pod_id else ("", "")
    if not (pod and key):
        return None
    if key not in SECRETS:
        SECRETS.append(key)
    if not _ID.fullmatch(pod):
        raise GuardError(f"{row.pod_id} is not a pod id (1 to 64 ASCII letters, digits, - and _)")
    if not _KEY.fullmatch(key):
        raise GuardError(f"{row.pod_key} has characters a header cannot carry (printable ASCII, no spaces)")
    return row.name, api_base(environ.get(row.api_override) or row.api, row.api_override), pod, key


def api_base(value, var):
    """The provider's API base, ``http(s)://host[:port][/path]``: anything else (another scheme, credentials in it, a
    query, a fragment, a bad port, spaces or control characters) is a GuardError naming ``var``."""
    import urllib.parse

    shown = _shown(value, 80)
    if not value.isprintable() or any(c.isspace() for c in value):
        raise GuardError(f"{var}={shown} has spaces or control characters: give https://host[/path]")
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 -- raises ValueError on a port out of range
    except ValueError:
        raise GuardError(f"{var}={shown} is not a URL: give https://host[/path]") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GuardError(f"{var}={shown} is not an http(s) URL with a host: give https://host[/path]")
    if "@" in parts.netloc:
        raise GuardError(f"{var}={shown} has user:password@ in it: give the base alone (the provider's key travels "
                         "in the Authorization header)")
    if parts.query or parts.fragment or value.endswith(("?", "#")):
        raise GuardError(f"{var}={shown} has a query or a fragment: give the base alone (https://host[/path])")
    return value.rstrip("/")


def request(found, action):
    """(method, URL, JSON body or None) that ``action`` takes at the provider ``found``."""
    name, base, pod, _ = found
    call = getattr(facts.provider_named(name), action)
    return call.method, base + call.path.replace("{id}", pod), None if call.body is None else dict(call.body)


def idle_reasons(sample, threshold, heartbeat_window):
    """(idle, evidence lines) of one ``sample``: idle only when every sign of work is absent (a sign that cannot be
    read counts as absent, and says so)."""
    busy, evidence = [], []
    utils = sample.get("gpu_util")
    if utils is None:
        evidence.append("GPU utilisation: no nvidia-smi answer")
    else:
        high = [u for u in utils if u > threshold]
        (busy if high else evidence).append(f"GPU utilisation {'/'.join(str(u) for u in utils) or 'none'} % "
                                            f"(threshold {threshold} %)")
    procs = sample.get("gpu_procs") or 0
    (busy if procs else evidence).append(f"{procs} GPU compute process(es)")
    job = sample.get("job")  # Guard._job: None (no job), or (made progress since the last look, what it did)
    if job is not None:
        (busy if job[0] else evidence).append(job[1])
    n, held = sample.get("ssh") or 0, sample.get("connections") or 0
    (busy if n else evidence).append(f"{n} SSH session(s) logged in" + (
        f" ({held} TCP connection(s) to :22 or :8888: a connection is not a login)" if held else ""))
    n = sample.get("jupyter") or 0
    (busy if n else evidence).append(f"{n} Jupyter kernel(s) running a cell")
    age = sample.get("jupyter_age")
    if age is not None and age < heartbeat_window:
        busy.append(f"Jupyter activity {int(age)} s ago")
    else:
        evidence.append("Jupyter: " + (sample.get("jupyter_problem") or "no kernel or terminal" if age is None
                                       else f"last kernel or terminal activity {int(age)} s ago"))
    age = sample.get("heartbeat_age")
    if age is not None and age < heartbeat_window:
        busy.append(f"heartbeat {int(age)} s ago")
    else:
        evidence.append("heartbeat " + (sample.get("heartbeat_problem") or "never touched" if age is None
                                        else f"{int(age)} s ago"))
    return (not busy), (busy or evidence)


class Guard:
    """The triggers' state over time (pure: the caller samples and acts)."""

    def __init__(self, s, started):
        self.s = s
        self.started = started
        self.idle_since = None
        self.blocked_since = None
        self.gpu_quiet_since = None
        self.warned = False
        self.cpu_prev, self.burn_since, self.cpu_warned, self.banner = None, {}, False, None
        self.job_prev = None
        self.warnings = []

    def _job(self, now, usage):
        """None when no job runs; else (it made progress since the last look, what its processes did). Progress: the
        job's processes (``tree_usage``) used at least JOB_CPU % of one core or wrote JOB_IO bytes a second: a
        download, a pip install, a checkpoint being written. A job that does neither (asleep, blocked on a dead peer or
        a lock, polling it) is stalled: it does not keep the pod up. A process that was not there at the last look
        counts with all its time (it started since)."""
        prev, self.job_prev = self.job_prev, (now, usage)
        if usage is None:
            return None
        if prev is None or prev[1] is None or now <= prev[0]:
            return True, "a job started since the last look"
        seconds, before = now - prev[0], prev[1]
        ticks = sum(max(0, v[0] - before.get(k, (0, 0))[0]) for k, v in usage.items())
        moved = sum(max(0, v[1] - before.get(k, (0, 0))[1]) for k, v in usage.items())
        cpu, rate = ticks * 100 / CLK_TCK / seconds, moved / seconds
        progress = cpu >= JOB_CPU or rate >= JOB_IO
        return progress, (f"a job's {len(usage)} process(es) used {cpu:.0f} % CPU and wrote {_rate(rate)} since "
                          "the last look" + ("" if progress else ": no progress (stalled?)"))

    def _idle(self, now, sample):
        """The idle trigger, or None. The heartbeat is a time, not a state: the window counts from its last touch or
        from the first sample in which every other sign was absent, whichever is later (not the heartbeat's window
        and then a whole idle window after it: that stopped a pod up to twice the window after the last touch)."""
        s = self.s
        idle, evidence = idle_reasons(sample, s["gpu_util"], 0)  # every sign but the heartbeat's age
        if not idle:
            self.idle_since = None
            return None
        self.idle_since = self.idle_since if self.idle_since is not None else now
        ages = [a for a in (sample.get("heartbeat_age"), sample.get("jupyter_age")) if a is not None]
        since = max([self.idle_since] + [now - a for a in ages])
        if now - since < s["idle_stop"]:
            return None
        return ("idle", s["action"],
                f"idle for {say(now - since)} (IMAGEKIT_IDLE_STOP={say(s['idle_stop'])}): " + "; ".join(evidence))

    def step(self, now, sample, blocked, job_running=False):
        """(trigger, action, message) when a trigger fires now, else None; warnings go to ``self.warnings``."""
        s = self.s
        self.warnings = []
        sample = {**sample, "job": self._job(now, sample.get("job_usage"))}
        if s["max_runtime"] and now - self.started >= s["max_runtime"]:
            return "deadline", s["action"], f"IMAGEKIT_MAX_RUNTIME={say(s['max_runtime'])} reached"
        if s["on_blocker"] and blocked is not None:  # None: the start check has not said yet (keep what was seen)
            if blocked:
                self.blocked_since = self.blocked_since if self.blocked_since is not None else now
                if now - self.blocked_since >= s["blocker_grace"]:
                    return ("blocker", s["on_blocker"],
                            f"blocked for {say(now - self.blocked_since)} (IMAGEKIT_BLOCKER_GRACE="
                            f"{say(s['blocker_grace'])}): {blocked}")
            else:
                self.blocked_since = None
        fired = self._idle(now, sample) if s["idle_stop"] else None
        if fired:
            return fired
        fired = self._cpu_fallback(now, sample, None if job_running else blocked or "")
        utils = sample.get("gpu_util")
        if job_running and utils and max(utils) <= s["gpu_util"]:
            self.gpu_quiet_since = self.gpu_quiet_since if self.gpu_quiet_since is not None else now
            quiet = (f"a job runs, but the GPUs were at or under {s['gpu_util']} % for "
                     f"{say(now - self.gpu_quiet_since)} (GPU utilisation {'/'.join(str(u) for u in utils)} %)")
            if now - self.gpu_quiet_since >= s["gpu_idle_warn"] and not self.warned:
                self.warned = True
                self.warnings.append(f"{quiet}: a CPU fallback or a hang?")
            if s["gpu_idle_stop"] and now - self.gpu_quiet_since >= s["gpu_idle_stop"]:
                return "gpu-idle", s["action"], f"{quiet} (IMAGEKIT_GPU_IDLE_STOP={say(s['gpu_idle_stop'])})"
        else:
            self.gpu_quiet_since, self.warned = None, False
        return fired

    def _cpu_fallback(self, now, sample, blocked):
        """Pod mode's CPU-fallback watchdog (``blocked`` None: a job runs, and the job's own watchdog looks): on a pod
        that expects a GPU (IMAGEKIT_REQUIRE_GPU=1, GPUs that nvidia-smi lists, or a start check that found none),
        every GPU at or under the threshold while one process used at least IMAGEKIT_CPU_BURN % of a core (default
        90) between every two looks: after IMAGEKIT_GPU_IDLE_WARN, a warning with the evidence (``self.banner``, for
        the login banner); after IMAGEKIT_GPU_IDLE_STOP, only when set, the pod ends. Builds and installs (compilers,
        archivers, package managers) are not training, and are left out."""
        s, cpu, utils = self.s, sample.get("cpu"), sample.get("gpu_util")
        prev, self.cpu_prev = self.cpu_prev, (now, cpu)
        expected = s["require_gpu"] or bool(utils) or "GPU" in (blocked or "")
        burning = {}
        if blocked is not None and expected and (not utils or max(utils) <= s["gpu_util"]) and cpu and prev \
                and prev[1] and now > prev[0]:
            for key, (ticks, comm) in cpu.items():
                before = prev[1].get(key)
                percent = 0 if before is None else (ticks - before[0]) * 100 / CLK_TCK / (now - prev[0])
                if percent >= s["cpu_burn"] and comm not in NOT_TRAINING:
                    burning[key] = (self.burn_since.get(key, prev[0]), percent, comm)
        self.burn_since = {key: v[0] for key, v in burning.items()}
        if not burning:
            self.cpu_warned, self.banner = False, None
            return None
        key, (since, percent, comm) = min(burning.items(), key=lambda kv: kv[1][0])  # burning the longest
        pid = key.split()[0]
        gpus = f"GPU utilisation {'/'.join(str(u) for u in utils)} %" if utils else "no GPU answers nvidia-smi"
        what = (f"process {pid} ({comm}) used {percent:.0f} % CPU for {say(now - since)} while every GPU was idle "
                f"({gpus}, threshold {s['gpu_util']} %)")
        if now - since >= s["gpu_idle_warn"] and not self.cpu_warned:
            self.cpu_warned = True
            self.warnings.append(f"{what}: training on the CPU at GPU rates?")
            self.banner = (f"imagekit-guard, {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(now))}: {what}: "
                           "training on the CPU at GPU rates? `imagekit-doctor` says why torch sees no GPU"
                           + (f"; the pod stops after IMAGEKIT_GPU_IDLE_STOP={say(s['gpu_idle_stop'])}"
                              if s["gpu_idle_stop"] else ""))
        if s["gpu_idle_stop"] and now - since >= s["gpu_idle_stop"]:
            return "cpu-fallback", s["action"], f"{what} (IMAGEKIT_GPU_IDLE_STOP={say(s['gpu_idle_stop'])})"
        return None


# ---- effects -------------------------------------------------------------------------------------------------------
def log(message):
    line = f"imagekit-guard: {nofollow.clean(message, SECRETS)}"
    print(line, file=sys.stderr, flush=True)
    try:
        fd = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write(time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + line + "\n")
    except OSError:
        pass


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


# ---- processes: which one it is, who is logged in, what burns CPU -------------------------------------------------
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


def ssh_sessions(proc=None, passwd=None):
    """Logged-in SSH sessions: processes of an sshd program (``SSHD_EXES``, by /proc/PID/exe, see ``_of_sshd``: a
    title can be set by anyone) titled as OpenSSH titles a session once its user authenticated (``USER@pts/N`` or
    ``USER@notty``, no suffix), running as that USER (a root login's session runs as root; a user's, under privilege
    separation, as the user). A TCP connection that has not authenticated has processes titled ``[priv]``,
    ``[net]``, ``[accepted]``, ``[session-auth]`` or ``[preauth]`` only: it is no session, however long it is held
    open."""
    proc = proc or PROC
    users, count = _users(passwd or PASSWD), 0
    for pid in _pids(proc):
        m = _SSH_TITLE.fullmatch(_title(pid, proc))
        if m and m.group(1) in users and _status(pid, proc, "Uid") == users[m.group(1)] and _of_sshd(pid, proc):
            count += 1
    return count


def cpu_times(proc=None):
    """{"PID START_TIME": [CPU ticks used, command name]} of every process but the guard's own (a process is its pid
    and start time: a pid reused between two looks is another process); kernel threads (no command line) left out."""
    proc, out, me = proc or PROC, {}, str(os.getpid())
    for pid in _pids(proc):
        fields = _stat_fields(pid, proc) if pid != me else None
        if not fields or not all(_NUMBER.fullmatch(f) for f in (fields[11], fields[12], fields[19])):
            continue
        if not _title(pid, proc):
            continue
        comm = _proc_text(f"{proc}/{pid}/comm", 256).strip()[:64]
        out[f"{int(pid)} {int(fields[19])}"] = [int(fields[11]) + int(fields[12]), comm]
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


# ---- Jupyter: its own API says when a kernel or a terminal last did something ----------------------------------
_ISO = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?"
                  r"(Z|[+-][0-9]{2}:[0-9]{2})?")


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


def sample(s, now, jobs=()):
    """One look at every sign of work; ``jobs``: the pids of the running jobs (``job_pids``)."""
    out = {"job_usage": tree_usage(jobs) if jobs else None}
    text = _nvidia_smi(["--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"])
    if text is not None:
        out["gpu_util"] = [int(v) for v in re.findall(r"^\s*([0-9]{1,3})\s*$", text, re.M)]
    apps = _nvidia_smi(["--query-compute-apps=pid", "--format=csv,noheader"])
    out["gpu_procs"] = len(re.findall(r"^\s*[0-9]+\s*$", apps or "", re.M))
    out["connections"] = sum(_connections(SESSION_PORTS).values())  # evidence only: anyone can open one
    out["ssh"] = ssh_sessions()
    out["jupyter"], out["jupyter_age"], problem = jupyter_activity(s["jupyter_token"], now)
    if problem:
        out["jupyter_problem"] = problem
    out["cpu"] = cpu_times()
    out["heartbeat_age"] = None
    try:  # touched, not read: a regular file's own mtime (a link's target or a FIFO is not the heartbeat)
        st = os.stat(s["heartbeat"], follow_symlinks=False)
    except OSError:
        return out
    if stat.S_ISREG(st.st_mode):
        out["heartbeat_age"] = max(0.0, now - st.st_mtime)
    else:
        out["heartbeat_problem"] = (f"{s['heartbeat']} is {nofollow.kind(st.st_mode)}, not a regular file: not "
                                    "counted (touch a plain file)")
    return out


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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is a failure: the key stays with the host it was meant for."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


RETRY_PAUSE = 5.0  # seconds before the first retry; doubled each time, up to five minutes


def call(found, action, attempts=None):
    """Send ``action`` to the provider; True once it answers 2xx. Each failure is logged (never the key) and
    retried, ``attempts`` times (None: until it succeeds), the pause doubling up to five minutes."""
    method, url, body = request(found, action)
    key = found[3]
    tried, pause = 0, RETRY_PAUSE
    while True:
        tried += 1
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {key}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.build_opener(_NoRedirect).open(req, timeout=30) as resp:
                status = resp.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except (OSError, ValueError) as exc:
            status = f"no answer ({type(exc).__name__})"
        if isinstance(status, int) and 200 <= status < 300:
            log(f"{method} {url}: HTTP {status}: the {found[0]} pod {found[2]} is asked to {action}")
            return True
        log(f"{method} {url} failed: {status if isinstance(status, str) else f'HTTP {status}'} "
            f"(try {tried}); retrying in {pause:g} s")
        if attempts is not None and tried >= attempts:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 300.0)


def act(environ, s, trigger, action, message, attempts=None):
    """End the pod for ``trigger``: through the provider's API, or (dry run) only say so."""
    log(f"{trigger}: {message}; action: {action}")
    try:
        found = provider(environ)
    except GuardError as exc:
        log(f"cannot {action} this pod: {exc}")
        return False
    if found is None:
        wanted = " or ".join(f"{row.pod_id}/{row.pod_key}" for row in facts.PROVIDERS if row.pod_id)
        log(f"cannot {action} this pod: no {wanted} in its env (the platform sets them); it keeps billing until you "
            "stop it")
        return False
    if s["dry_run"]:
        method, url, _ = request(found, action)
        log(f"dry run (IMAGEKIT_GUARD_DRY_RUN=1): would send {method} {url}")
        return True
    return call(found, action, attempts)


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
            return False, (f"declared output {path} is a symbolic link: not followed (it could point at another "
                           "user's files or a device); declare the file or folder it points to")
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
                raise nofollow.Refused(where, f"{nofollow.kind(mode)} inside the output: refused (not followed, not "
                                              "read)")
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


# ---- state that outlives the container: arm time, deadline, the blocker's first sighting -------------------------
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
        state = {"armed": guard.started, "deadline": guard.started + s["max_runtime"] if s["max_runtime"] else None,
                 "blocked_since": guard.blocked_since, "seen": now, "ended": ended}
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
    left = (f"; the deadline in {say(max(0, armed + s['max_runtime'] - now))}" if s["max_runtime"] else "")
    return armed, blocked if blocked is not None and blocked <= now else None, (
        f"restarted: armed {say(now - armed)} ago, that time already used (last seen {say(now - seen)} ago){left}")


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
    after a restart. Read through descriptors: a run folder or pid file that is a link, a FIFO or garbage is no run."""
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
        return pid if same_process(text) and text.split()[1:2] == [str(pid)] else 0
    return pid if started_by(pid, written) else 0


def job_pids(environ):
    """The pids of a job-mode command (its identity in ``JOB``) and of the runs `imagekit pod run` started that are
    still running."""
    try:
        job = (nofollow.read_bytes(JOB, 256) or b"").decode("ascii", "replace")
    except OSError:
        job = ""
    pids = [int(job.split()[1])] if same_process(job) else []
    return pids + live_runs(environ.get("IMAGEKIT_RUNS") or RUNS)


def job_running(environ):
    """A job-mode command or a run `imagekit pod run` started is still running."""
    return bool(job_pids(environ))


def run(environ, now=time.time, sleep=time.sleep):
    """The guard's loop (its own process, started by podstart.py)."""
    s, problems = settings(environ)
    for p in problems:
        log(f"ignored: {p}")
    started = now()
    if not armed(s):
        return 0
    refused = ""
    try:
        found = provider(environ)
    except GuardError as exc:
        found, refused = None, str(exc)
        log(f"{exc}: the guard cannot end this pod")
    parts = [f"deadline in {say(s['max_runtime'])}" if s["max_runtime"] else "",
             f"idle stop after {say(s['idle_stop'])}" if s["idle_stop"] else "",
             f"{s['on_blocker']} on a blocker after {say(s['blocker_grace'])}" if s["on_blocker"] else "",
             f"stop when a job's GPUs idle for {say(s['gpu_idle_stop'])}" if s["gpu_idle_stop"] else ""]
    log("armed: " + ", ".join(p for p in parts if p) + f" (action: {s['action']}; "
        + (f"{found[0]} pod {found[2]}" if found else f"{refused.split(' ')[0]} refused: it can only log" if refused
           else "no provider credentials: it can only log") + ")"
        + (" [dry run]" if s["dry_run"] else ""))
    store = State()
    started, blocked_since, said = resume(store.load(), started, s)
    if said:
        log(said)
    guard = Guard(s, started)
    guard.blocked_since = blocked_since
    while True:
        t = now()
        jobs = job_pids(environ)
        fired = guard.step(t, sample(s, t, jobs), current_blocker(), job_running=bool(jobs))
        for warning in guard.warnings:
            log(f"warning: {warning}")
        show_banner(guard.banner)
        store.save(guard, t)
        if fired:
            done = act(environ, s, *fired)
            if done and not s["dry_run"]:
                store.save(guard, t, ended=True)  # the pod was ended: its next start is a new one
            return 0 if done else 1  # done, or nothing can be done (said why)
        sleep(s["interval"])


def after_run(environ, code):
    """IMAGEKIT_ON_EXIT for a run `imagekit pod run` started: its outputs checksummed, then the pod ended."""
    s, problems = settings(environ)
    for p in problems:
        log(f"ignored: {p}")
    if not s["on_exit"]:
        return 0
    ok, lines = checksum_outputs(s["outputs"])
    for line in lines:
        log(f"outputs: {line}")
    if not ok:
        log(f"not ending the pod (IMAGEKIT_ON_EXIT={s['on_exit']}): the outputs are not all there")
        return 1
    return 0 if act(environ, s, "exit", exit_action(s["on_exit"], code), f"the run exited {code}") else 1


def exit_action(on_exit, code):
    """What IMAGEKIT_ON_EXIT does after an exit with ``code``: `terminate` only after a success (a failed run's pod is
    stopped instead, its volume and log kept for a look), `terminate-always` after any exit."""
    if on_exit == "terminate-always":
        return "terminate"
    if on_exit == "terminate" and code != 0:
        log(f"the exit code is {code}: stopping instead of terminating (IMAGEKIT_ON_EXIT=terminate ends a pod for good "
            "after a success only; terminate-always after any exit)")
        return "stop"
    return on_exit


def main(argv):
    if len(argv) == 2 and argv[0] == "--after-run" and re.fullmatch(r"[0-9]{1,3}", argv[1]):
        return after_run(dict(os.environ), int(argv[1]))
    if argv:
        log(f"usage: guard.py [--after-run EXIT_CODE]; got {' '.join(argv)[:80]!r}")
        return 2
    return run(dict(os.environ))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
