"""The lifetime guard: every billed minute is GPU work, or the pod ends (standard library only, Python >= 3.8).

Started by the entrypoint (pod and job mode) when the env asks for it; off otherwise. It ends the pod through the
provider's in-pod credentials, the only way that ends the billing (`kill 1` does not: the platform restarts the
container, or keeps the stopped one billed):

- ``IMAGEKIT_MAX_RUNTIME=6h``: a deadline, armed before anything else runs, counted from the first arm time (kept on
  the volume, root's alone: a crash-looping container reaches it; see ``State``);
- ``IMAGEKIT_IDLE_STOP=30m``: idle for the whole window: no GPU above ``IMAGEKIT_IDLE_GPU_UTIL`` % (default 5), no
  GPU compute process, no process on the pod making progress (``JOB_CPU`` % of a core, or ``JOB_IO`` bytes a second
  written: ``Guard._progress``; a stalled or polling one does not count), no input at the terminal of a logged-in SSH
  session within the window (the TTY's access time, as `w` reads it: a session left open at a prompt does not count;
  ``ssh_sessions``), no Jupyter kernel or terminal activity its server reports to its token (``jupyter_activity``), and
  the heartbeat file (``IMAGEKIT_HEARTBEAT``, default /run/imagekit/heartbeat: `touch` it from a training loop) not
  touched; a TCP connection counts for nothing (anyone can open one); the log line that explains a stop lists each;
- ``IMAGEKIT_HUNG_STOP=60m``: idle in every sign but one, a process holding GPU memory, that long (every GPU at or
  under the threshold, nothing making progress, no input): a hung job; a warning (and the login banner) after
  ``IMAGEKIT_GPU_IDLE_WARN``, then the pod ends;
- ``IMAGEKIT_ON_BLOCKER=stop|terminate``: the start check found a blocker and it is still there after
  ``IMAGEKIT_BLOCKER_GRACE`` (default 15m, to look around first);
- ``IMAGEKIT_ON_EXIT=stop|terminate``: the pod is done: a job-mode command or a `pod run` run ended since this start,
  none is running any more, and the pod stayed quiet for ``IMAGEKIT_EXIT_GRACE`` (default 10m) since the last exit:
  every idle sign absent and no imagekit client connected (`pod wait`, `pod logs`, `pod cp`: ``client_leases``), so
  `pod run && pod wait && pod cp && pod terminate` finishes before the stop; then the declared outputs
  (``IMAGEKIT_OUTPUTS``, paths separated by ``:``) must exist, their sha256s written beside them (``<path>.sha256``,
  `sha256sum -c` format); a missing output keeps the pod up, saying so;
- ``IMAGEKIT_GPU_IDLE_WARN=10m``: GPUs under the threshold that long while a job runs (job mode, or a run `imagekit
  pod run` started; each known by its boot id, pid and start time, never by a pid alone), or, with no job, on a pod
  that expects a GPU, a process burning CPU (``IMAGEKIT_CPU_BURN`` % of a core, default 90) that long: a warning with
  the evidence, also in the login banner, and printed by `pod run`, `pod logs -f` and `pod wait`;
  ``IMAGEKIT_GPU_IDLE_STOP=30m``, only when asked: the pod ends.

The deadline, idle and hung stops ``stop`` the pod unless ``IMAGEKIT_GUARD_ACTION=terminate``. Stop keeps the volume
(and bills it); terminate deletes the pod and its volume disk (only a network volume survives).
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
# 10m after the last run or job ended, with nothing running, nobody typing and no imagekit client connected: long
# enough for a script's next step (`pod wait` returns within a second, `pod cp` starts at once and counts while it
# copies) and for a person who watched `pod logs -f` end to start copying; short enough that a finished pod bills at
# most ten minutes more ($0.07 on a $0.44/h 3090).
EXIT_GRACE = 600
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


def _moved(before, usage, seconds):
    """(% of one core, bytes written a second) of the processes ``usage`` ({key: [ticks, bytes written, ...]}) since
    ``before`` (the same, at the last look), over ``seconds``; a process not there then counts with all it used."""
    ticks = sum(max(0, v[0] - before.get(k, (0, 0))[0]) for k, v in usage.items())
    moved = sum(max(0, v[1] - before.get(k, (0, 0))[1]) for k, v in usage.items())
    return ticks * 100 / CLK_TCK / seconds, moved / seconds


def _stamp(now):
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(now))


def settings(environ):
    """(settings, problems) from the env: a bad value is a problem (logged loudly), never a crash, and its trigger
    stays off; the others are armed."""
    s = {
        "max_runtime": None, "idle_stop": None, "on_blocker": None, "blocker_grace": 900, "on_exit": None,
        "exit_grace": EXIT_GRACE, "hung_stop": None,
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
                 ("IMAGEKIT_GPU_IDLE_STOP", "gpu_idle_stop"), ("IMAGEKIT_GUARD_INTERVAL", "interval"),
                 ("IMAGEKIT_EXIT_GRACE", "exit_grace"), ("IMAGEKIT_HUNG_STOP", "hung_stop"))
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
    """Does anything in ``s`` ask for the guard's process? (On-exit does too: the guard, not the run that ended,
    decides when the pod is done.)"""
    return bool(s["max_runtime"] or s["idle_stop"] or s["on_blocker"] or s["gpu_idle_stop"] or s["hung_stop"]
                or s["on_exit"])


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
    if len(key) > 4096:
        raise GuardError(f"{row.pod_key} is longer than 4096 characters: not a provider's key")
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


# Signs of work, by kind: a trigger that waits for the pod to be quiet waits for all of them (the hung stop for all but
# "gpu-procs", the exit stop for "client" too). Input, Jupyter activity and the heartbeat are times: a window counts
# from the latest of them.
TIME_SIGNS = ("input", "jupyter-age", "heartbeat")


def signs(sample, threshold, window=0, clients=False):
    """(busy, evidence) of one ``sample``: ``busy``, [(kind, line)] for each sign of work present; ``evidence``, a
    line for each absent one (a sign that cannot be read counts as absent, and says so). A time sign (the last input
    at an SSH terminal, Jupyter's last activity, the heartbeat) is busy when younger than ``window`` (0: never here:
    the triggers count their windows from it). ``clients``: imagekit clients connected (`pod wait`, `pod logs`, `pod
    cp`) count too: the exit stop waits for them, the idle stop does not (one waiting on a stalled run is no work)."""
    busy, evidence = [], []

    def sign(kind, present, line):
        (busy.append((kind, line)) if present else evidence.append(line))

    utils = sample.get("gpu_util")
    if utils is None:
        evidence.append("GPU utilisation: no nvidia-smi answer")
    else:
        sign("gpu", any(u > threshold for u in utils),
             f"GPU utilisation {'/'.join(str(u) for u in utils) or 'none'} % (threshold {threshold} %)")
    procs = sample.get("gpu_procs") or 0
    sign("gpu-procs", procs, f"{procs} GPU compute process(es)")
    job = sample.get("job")  # Guard._job: None (no job), or (made progress since the last look, what it did)
    if job is not None:
        sign("progress", job[0], job[1])
    progress = sample.get("progress")  # Guard._progress: None (not measured yet), or the processes that made some
    if progress is not None:
        sign("progress", progress, "; ".join(progress[:3]) if progress else
             f"no process made progress (under {JOB_CPU} % of a core and {_rate(JOB_IO)} written)")
    n, held, ages = sample.get("ssh") or 0, sample.get("connections") or 0, sample.get("ssh_input") or []
    recent = [a for a in ages if a < window]
    said = f"{n} SSH session(s) logged in" + (f", the last input at a terminal {say(min(ages))} ago" if ages else "")
    sign("input", recent, said if not recent else f"input at an SSH terminal {int(min(recent))} s ago")
    if held and not recent:
        evidence[-1] += f" ({held} TCP connection(s) to :22 or :8888: a connection is not a login)"
    n = sample.get("jupyter") or 0
    sign("jupyter", n, f"{n} Jupyter kernel(s) running a cell")
    age = sample.get("jupyter_age")
    sign("jupyter-age", age is not None and age < window,
         f"Jupyter activity {int(age or 0)} s ago" if age is not None and age < window else
         "Jupyter: " + (sample.get("jupyter_problem") or "no kernel or terminal" if age is None
                        else f"last kernel or terminal activity {int(age)} s ago"))
    age = sample.get("heartbeat_age")
    sign("heartbeat", age is not None and age < window,
         f"heartbeat {int(age or 0)} s ago" if age is not None and age < window else
         "heartbeat " + (sample.get("heartbeat_problem") or "never touched" if age is None else f"{int(age)} s ago"))
    if clients:
        n = sample.get("clients") or 0
        sign("client", n, f"{n} imagekit client(s) connected (pod wait, pod logs, pod cp)")
    return busy, evidence


def idle_reasons(sample, threshold, heartbeat_window):
    """(idle, evidence lines) of one ``sample``: idle only when every sign of work is absent (:func:`signs`)."""
    busy, evidence = signs(sample, threshold, heartbeat_window)
    return (not busy), ([line for _, line in busy] or evidence)


def time_ages(sample):
    """The ages of the time signs of ``sample`` (seconds since the last input at an SSH terminal, since Jupyter's
    last activity, since the heartbeat's last touch)."""
    ages = list(sample.get("ssh_input") or [])
    return ages + [a for a in (sample.get("jupyter_age"), sample.get("heartbeat_age")) if a is not None]


def worst_exit(exits):
    """The exit code that decides ``IMAGEKIT_ON_EXIT`` for several runs: the first failure's, else 0."""
    return next((code for _, code in exits if code != 0), 0)


class Guard:
    """The triggers' state over time (pure: the caller samples and acts)."""

    def __init__(self, s, started):
        self.s = s
        self.started = started
        self.quiet = {}  # trigger -> the first look in a row at which the pod was quiet for it
        self.latest = None  # the latest time sign seen (input, Jupyter activity, a heartbeat, an exit): it outlives
        # the session or file that showed it (a user who typed, then logged out, was there until then)
        self.blocked_since = None
        self.gpu_quiet_since = None
        self.warned = False
        self.cpu_prev, self.burn_since, self.cpu_warned, self.banner = None, {}, False, None
        self.job_prev, self.usage_prev = None, None
        self.hung_warned, self.job_banner, self.hung_banner = False, None, None
        self.exit_said, self.exit_refused = None, None  # the exits last announced, the exits an outputs check refused
        self.warnings, self.notes = [], []

    @property
    def idle_since(self):
        return self.quiet.get("idle")

    def banner_text(self):
        """What the login banner, `pod run`, `pod logs -f` and `pod wait` show of the guard's warnings (None: none)."""
        return "\n".join(b for b in (self.banner, self.job_banner, self.hung_banner) if b) or None

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
        cpu, rate = _moved(prev[1], usage, now - prev[0])
        progress = cpu >= JOB_CPU or rate >= JOB_IO
        return progress, (f"a job's {len(usage)} process(es) used {cpu:.0f} % CPU and wrote {_rate(rate)} since "
                          "the last look" + ("" if progress else ": no progress (stalled?)"))

    def _progress(self, now, usage):
        """The processes of the pod that made progress since the last look (each alone: JOB_CPU % of a core, its
        waited-for children included, or JOB_IO bytes a second written), as lines, busiest first; None at the first
        look (nothing to compare with) or when the processes could not be read."""
        prev, self.usage_prev = self.usage_prev, (now, usage)
        if usage is None or prev is None or prev[1] is None or now <= prev[0]:
            return None
        seconds, found = now - prev[0], []
        for key, value in usage.items():
            cpu, rate = _moved(prev[1], {key: value}, seconds)
            if cpu >= JOB_CPU or rate >= JOB_IO:
                found.append((cpu, rate, key.split()[0], value[2] if len(value) > 2 else "?"))
        found.sort(key=lambda f: (-f[0], -f[1]))
        return [f"process {pid} ({comm}) used {cpu:.0f} % CPU and wrote {_rate(rate)} since the last look"
                for cpu, rate, pid, comm in found]

    def _window(self, name, now, quiet, ages=()):
        """Seconds the pod has been quiet for the trigger ``name`` (None: not quiet now): from the first quiet look in
        a row, or the latest time sign (``ages``, and those seen before), whichever is later (not the heartbeat's
        window and then a whole window after it: that stopped a pod up to twice the window after the last touch)."""
        if not quiet:
            self.quiet.pop(name, None)
            return None
        first = self.quiet.setdefault(name, now)
        return now - max([first] + [now - a for a in ages] + ([self.latest] if self.latest is not None else []))

    def step(self, now, sample, blocked, job_running=False):
        """(trigger, action, message) when a trigger fires now, else None; warnings go to ``self.warnings``, what is
        worth a log line but no warning to ``self.notes``."""
        s = self.s
        self.warnings, self.notes = [], []
        sample = {**sample, "job": self._job(now, sample.get("job_usage")),
                  "progress": self._progress(now, sample.get("usage"))}
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
        busy, evidence = signs(sample, s["gpu_util"])
        ages = time_ages(sample)
        self.latest = max([now - a for a in ages] + ([self.latest] if self.latest is not None else []), default=None)
        if self.latest is not None:
            self.latest = min(self.latest, now)
        fired = self._idle(now, busy, evidence, ages) or self._hung(now, sample, busy, evidence, ages)
        fired = fired or self._exit(now, sample, job_running, ages)
        if fired:
            return fired
        fired = self._cpu_fallback(now, sample, None if job_running else blocked or "")
        return self._gpu_idle(now, sample, job_running) or fired

    def _idle(self, now, busy, evidence, ages):
        """The idle trigger, or None."""
        s = self.s
        quiet = self._window("idle", now, not busy, ages) if s["idle_stop"] else None
        if quiet is None or quiet < s["idle_stop"]:
            return None
        return ("idle", s["action"],
                f"idle for {say(quiet)} (IMAGEKIT_IDLE_STOP={say(s['idle_stop'])}): " + "; ".join(evidence))

    def _hung(self, now, sample, busy, evidence, ages):
        """The hung trigger, or None: a process holds GPU memory while the pod is idle in every other sign (every
        GPU at or under the threshold, nothing making progress, nobody typing): after IMAGEKIT_GPU_IDLE_WARN a
        warning (and the banner), after IMAGEKIT_HUNG_STOP the pod ends."""
        s = self.s
        holding = bool(busy) and all(kind == "gpu-procs" for kind, _ in busy)
        quiet = self._window("hung", now, holding, ages) if s["hung_stop"] else None
        if quiet is None:
            self.hung_warned, self.hung_banner = False, None
            return None
        what = (f"{sample.get('gpu_procs')} process(es) held GPU memory for {say(quiet)} while every GPU idled and "
                f"nothing made progress ({'; '.join(evidence)})")
        if quiet >= s["gpu_idle_warn"] and not self.hung_warned:
            self.hung_warned = True
            self.warnings.append(f"{what}: hung?")
            self.hung_banner = (f"imagekit-guard, {_stamp(now)}: a process holds GPU memory while every GPU idles and "
                                f"nothing makes progress: a hung job? the pod stops after IMAGEKIT_HUNG_STOP="
                                f"{say(s['hung_stop'])} of this (`nvidia-smi` names it)")
        if quiet < s["hung_stop"]:
            return None
        return "hung", s["action"], f"{what} (IMAGEKIT_HUNG_STOP={say(s['hung_stop'])})"

    def _exit(self, now, sample, job_running, ages):
        """The exit trigger, or None: every run and job that ended since this start has ended (none runs now), and
        the pod stayed quiet for IMAGEKIT_EXIT_GRACE since the last exit: every sign of work absent and no imagekit
        client connected (`pod wait`, `pod logs`, `pod cp`)."""
        s = self.s
        exits = [e for e in sample.get("exits") or () if isinstance(e, (list, tuple)) and len(e) == 2]
        if not s["on_exit"] or not exits or job_running or exits == self.exit_refused:
            self._window("exit", now, False)
            return None
        last = max(t for t, _ in exits)
        if self.exit_said != exits:
            self.exit_said = exits
            self.notes.append(f"{len(exits)} run(s) or job(s) ended since this start, none runs now (last exit code "
                              f"{exits[-1][1]}): IMAGEKIT_ON_EXIT={s['on_exit']} once the pod stays quiet for "
                              f"{say(s['exit_grace'])} (nothing running or making progress, no input, no imagekit "
                              "client connected)")
        busy, evidence = signs(sample, s["gpu_util"], clients=True)
        quiet = self._window("exit", now, not busy, [*ages, max(0.0, now - last)])
        if quiet is None or quiet < s["exit_grace"]:
            return None
        code = worst_exit(exits)
        return ("exit", exit_action(s["on_exit"], code),
                f"every run and job ended (exit code {code}{' of the first that failed' if code else ''}) and the pod "
                f"was quiet for {say(quiet)} (IMAGEKIT_EXIT_GRACE={say(s['exit_grace'])}): " + "; ".join(evidence))

    def refuse_exit(self, exits):
        """The exit stop's outputs were not all there: it waits for another exit (a new run may write them)."""
        self.exit_refused = list(exits)

    def _gpu_idle(self, now, sample, job_running):
        """A job running while every GPU idles: a warning once (and the banner), a stop only when asked."""
        s, utils = self.s, sample.get("gpu_util")
        if not (job_running and utils and max(utils) <= s["gpu_util"]):
            self.gpu_quiet_since, self.warned, self.job_banner = None, False, None
            return None
        self.gpu_quiet_since = self.gpu_quiet_since if self.gpu_quiet_since is not None else now
        job = sample.get("job")
        doing = f"; {job[1]}" if job and job[0] and "%" in job[1] else ""
        quiet = (f"a job runs, but the GPUs were at or under {s['gpu_util']} % for "
                 f"{say(now - self.gpu_quiet_since)} (GPU utilisation {'/'.join(str(u) for u in utils)} %){doing}")
        if now - self.gpu_quiet_since >= s["gpu_idle_warn"] and not self.warned:
            self.warned = True
            self.warnings.append(f"{quiet}: a CPU fallback or a hang?")
            self.job_banner = (f"imagekit-guard, {_stamp(now)}: {quiet}: training on the CPU at GPU rates (a device "
                               "set to cpu, a CPU fallback) or a hang? `imagekit-doctor` says what torch sees"
                               + (f"; the pod stops after IMAGEKIT_GPU_IDLE_STOP={say(s['gpu_idle_stop'])}"
                                  if s["gpu_idle_stop"] else ""))
        if s["gpu_idle_stop"] and now - self.gpu_quiet_since >= s["gpu_idle_stop"]:
            return "gpu-idle", s["action"], f"{quiet} (IMAGEKIT_GPU_IDLE_STOP={say(s['gpu_idle_stop'])})"
        return None

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
            self.banner = (f"imagekit-guard, {_stamp(now)}: {what}: "
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
    sessions = ssh_session_list()
    out["ssh"] = len(sessions)  # evidence: a session counts by the input at its terminal, and what runs in it
    out["ssh_input"] = [a for a in (input_age(tty, now) for _, tty in sessions if tty) if a is not None]
    out["jupyter"], out["jupyter_age"], problem = jupyter_activity(s["jupyter_token"], now)
    if problem:
        out["jupyter_problem"] = problem
    out["usage"] = process_usage()
    out["cpu"] = {k: [v[3], v[2]] for k, v in out["usage"].items()}
    out["clients"] = client_leases()
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
        method, url, body = request(found, action)
        log(f"dry run (IMAGEKIT_GUARD_DRY_RUN=1): would send {method} {url}"
            + (f" {json.dumps(body, sort_keys=True)}" if body is not None else ""))
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
        return pid if same_process(text) and text.split()[1:2] == [str(pid)] else 0
    return pid if started_by(pid, written) else 0


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
            if same_process(text):
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
    pids = [int(job.split()[1])] if same_process(job) else []
    return pids + live_runs(environ.get("IMAGEKIT_RUNS") or RUNS)


def job_running(environ):
    """A job-mode command or a run `imagekit pod run` started is still running."""
    return bool(job_pids(environ))


def describe(s):
    """What ``s`` arms, as the guard's first line says it."""
    parts = [f"deadline in {say(s['max_runtime'])}" if s["max_runtime"] else "",
             f"idle stop after {say(s['idle_stop'])}" if s["idle_stop"] else "",
             f"hung stop after {say(s['hung_stop'])}" if s["hung_stop"] else "",
             f"{s['on_blocker']} on a blocker after {say(s['blocker_grace'])}" if s["on_blocker"] else "",
             f"{s['on_exit']} once every run has ended and the pod was quiet for {say(s['exit_grace'])}"
             if s["on_exit"] else "",
             f"stop when a job's GPUs idle for {say(s['gpu_idle_stop'])}" if s["gpu_idle_stop"] else ""]
    return ", ".join(p for p in parts if p)


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
    log("armed: " + describe(s) + f" (action: {s['action']}; "
        + (f"{found[0]} pod {found[2]}" if found else f"{refused.split(' ')[0]} refused: it can only log" if refused
           else "no provider credentials: it can only log") + ")"
        + (" [dry run]" if s["dry_run"] else ""))
    this_start = started  # runs and jobs that ended before it were another start's
    store = State()
    started, blocked_since, said = resume(store.load(), started, s)
    if said:
        log(said)
    guard = Guard(s, started)
    guard.blocked_since = blocked_since
    while True:
        t = now()
        jobs = job_pids(environ)
        looked = sample(s, t, jobs)
        looked["exits"] = exits_since(environ, this_start) if s["on_exit"] else []
        fired = guard.step(t, looked, current_blocker(), job_running=bool(jobs))
        for note in guard.notes:
            log(note)
        for warning in guard.warnings:
            log(f"warning: {warning}")
        show_banner(guard.banner_text())
        store.save(guard, t)
        if fired and fired[0] == "exit" and not _outputs_ready(s):
            guard.refuse_exit(looked["exits"])
            fired = None
        if fired:
            done = act(environ, s, *fired)
            if done and not s["dry_run"]:
                store.save(guard, t, ended=True)  # the pod was ended: its next start is a new one
            return 0 if done else 1  # done, or nothing can be done (said why)
        sleep(s["interval"])


def _outputs_ready(s):
    """The declared outputs checksummed (each line logged); False, said, when one is not there to end the pod on."""
    ok, lines = checksum_outputs(s["outputs"])
    for line in lines:
        log(f"outputs: {line}")
    if not ok:
        log(f"not ending the pod (IMAGEKIT_ON_EXIT={s['on_exit']}): the outputs are not all there; it stays up so you "
            "can look (the idle stop still holds, and the next run that ends tries again)")
    return ok


def after_run(environ, code):
    """A run `imagekit pod run` started ended with ``code``: its outputs checksummed now (their .sha256 files are
    there for `pod cp` at once), and what IMAGEKIT_ON_EXIT will do said. The guard, not this, ends the pod: once
    every run has ended and the pod stayed quiet for IMAGEKIT_EXIT_GRACE (a `pod wait && pod cp` goes first)."""
    s, problems = settings(environ)
    for p in problems:
        log(f"ignored: {p}")
    if not s["on_exit"]:
        return 0
    ok, lines = checksum_outputs(s["outputs"])
    for line in lines:
        log(f"outputs: {line}")
    if not ok:
        log(f"the outputs are not all there: IMAGEKIT_ON_EXIT={s['on_exit']} will not end the pod on this run")
        return 1
    log(f"the run exited {code}: the guard will {exit_action(s['on_exit'], code, quiet=True)} this pod once every run "
        f"has ended and it stayed quiet for {say(s['exit_grace'])} (no input, nothing making progress, no `pod cp`, "
        "`pod wait` or `pod logs` connected)")
    return 0


def exit_action(on_exit, code, quiet=False):
    """What IMAGEKIT_ON_EXIT does after an exit with ``code``: `terminate` only after a success (a failed run's pod is
    stopped instead, its volume and log kept for a look), `terminate-always` after any exit."""
    if on_exit == "terminate-always":
        return "terminate"
    if on_exit == "terminate" and code != 0:
        if not quiet:
            log(f"the exit code is {code}: stopping instead of terminating (IMAGEKIT_ON_EXIT=terminate ends a pod for "
                "good after a success only; terminate-always after any exit)")
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
