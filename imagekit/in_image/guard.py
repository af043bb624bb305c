"""The lifetime guard: every billed minute is GPU work, or the pod ends (standard library only, Python >= 3.8).

This module decides (its settings, ``Guard``'s triggers, pure) and acts (the provider's calls, the loop); what it
reads of the machine is guard_signs.py's, the files it reads and writes (its log and state, the outputs, the runs,
exits and leases) guard_files.py's.

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

import json
import os
import re
import stat
import sys
import time
import urllib.error
import urllib.request

if __package__:  # imported from the host's package, imagekit.in_image
    from . import facts, guard_files, guard_signs, nofollow
else:  # the program in the image: its siblings lie beside it (-I leaves the script's folder off sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import facts
    import guard_files
    import guard_signs
    import nofollow

HEARTBEAT = "/run/imagekit/heartbeat"
ACTIONS = facts.GUARD_ACTIONS
GuardError = facts.SettingError
parse_duration = facts.parse_duration
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # fullmatch: `$` would let a trailing newline into the URL's path
_PERCENT = re.compile(r"[0-9]{1,3}")  # ASCII digits only: str.isdigit() says yes to '²', int() to '١'
MAX_INTERVAL = 3600  # seconds between looks: longer, and a deadline is late by that much (time.sleep overflows too)
JOB_CPU = 5  # % of one core between two looks: a job using at least this much makes progress (a stalled one that
# polls, starting a program every few seconds, stays under it)
JOB_IO = 4096  # bytes a second written by a job's processes (a slow download, a checkpoint): progress too (reads are
# not counted: every program a polling loop starts reads its libraries)
# 10m after the last run or job ended, with nothing running, nobody typing and no imagekit client connected: long
# enough for a script's next step (`pod wait` returns within a second, `pod cp` starts at once and counts while it
# copies) and for a person who watched `pod logs -f` end to start copying; short enough that a finished pod bills at
# most ten minutes more ($0.07 on a $0.44/h 3090).
EXIT_GRACE = 600


def _shown(value, limit=40):
    """A setting's value as a log line quotes it: credentials out first, then cut."""
    return repr(nofollow.redact(value)[:limit])


say = facts.say
log = guard_files.log  # every line the guard says: the container's log and its own (guard_files.LOG)


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
    return ticks * 100 / guard_signs.CLK_TCK / seconds, moved / seconds


def _stamp(now):
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(now))


def settings(environ):
    """(settings, problems) from the env: a bad value is a problem (logged loudly), never a crash, and its trigger
    stays off; the others are armed."""
    s = {
        "max_runtime": None,
        "idle_stop": None,
        "on_blocker": None,
        "blocker_grace": 900,
        "on_exit": None,
        "exit_grace": EXIT_GRACE,
        "hung_stop": None,
        "outputs": [],
        "action": "stop",
        "dry_run": environ.get("IMAGEKIT_GUARD_DRY_RUN") == "1",
        "gpu_util": 5,
        "gpu_idle_warn": 600,
        "heartbeat": environ.get("IMAGEKIT_HEARTBEAT") or HEARTBEAT,
        "interval": 30,
        "gpu_idle_stop": None,
        "cpu_burn": 90,
        "require_gpu": environ.get("IMAGEKIT_REQUIRE_GPU") == "1",
        "jupyter_token": environ.get("JUPYTER_PASSWORD") or "",
    }
    if s["jupyter_token"] and s["jupyter_token"] not in guard_files.SECRETS:
        guard_files.SECRETS.append(s["jupyter_token"])
    problems = []
    durations = (
        ("IMAGEKIT_MAX_RUNTIME", "max_runtime"),
        ("IMAGEKIT_IDLE_STOP", "idle_stop"),
        ("IMAGEKIT_BLOCKER_GRACE", "blocker_grace"),
        ("IMAGEKIT_GPU_IDLE_WARN", "gpu_idle_warn"),
        ("IMAGEKIT_GPU_IDLE_STOP", "gpu_idle_stop"),
        ("IMAGEKIT_GUARD_INTERVAL", "interval"),
        ("IMAGEKIT_EXIT_GRACE", "exit_grace"),
        ("IMAGEKIT_HUNG_STOP", "hung_stop"),
    )
    for name, key in durations:
        if environ.get(name):
            try:
                s[key] = parse_duration(nofollow.redact(environ[name]), name)  # its errors quote the value
            except GuardError as exc:
                problems.append(str(exc))
    if s["interval"] > MAX_INTERVAL:
        problems.append(
            f"IMAGEKIT_GUARD_INTERVAL={_shown(environ['IMAGEKIT_GUARD_INTERVAL'])} is longer than "
            f"{say(MAX_INTERVAL)}: the guard would look too rarely (give 1s to {say(MAX_INTERVAL)})"
        )
        s["interval"] = 30
    for name, key in (
        ("IMAGEKIT_ON_BLOCKER", "on_blocker"),
        ("IMAGEKIT_ON_EXIT", "on_exit"),
        ("IMAGEKIT_GUARD_ACTION", "action"),
    ):
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
    return bool(
        s["max_runtime"] or s["idle_stop"] or s["on_blocker"] or s["gpu_idle_stop"] or s["hung_stop"] or s["on_exit"]
    )


def provider(environ):
    """(name, API base, pod id, key) of the provider the doctor names too (``facts.detect_provider``), or None where
    that provider gives a pod no way to end itself or its id or key is not set."""
    row = facts.detect_provider(environ)
    pod, key = (environ.get(row.pod_id, ""), environ.get(row.pod_key, "")) if row and row.pod_id else ("", "")
    if not (pod and key):
        return None
    if key not in guard_files.SECRETS:
        guard_files.SECRETS.append(key)
    if not _ID.fullmatch(pod):
        raise GuardError(f"{row.pod_id} is not a pod id (1 to 64 ASCII letters, digits, - and _)")
    if len(key) > 4096:
        raise GuardError(f"{row.pod_key} is longer than 4096 characters: not a provider's key")
    if not guard_signs._KEY.fullmatch(key):
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
        raise GuardError(
            f"{var}={shown} has user:password@ in it: give the base alone (the provider's key travels "
            "in the Authorization header)"
        )
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
        sign(
            "gpu",
            any(u > threshold for u in utils),
            f"GPU utilisation {'/'.join(str(u) for u in utils) or 'none'} % (threshold {threshold} %)",
        )
    procs = sample.get("gpu_procs") or 0
    sign("gpu-procs", procs, f"{procs} GPU compute process(es)")
    job = sample.get("job")  # Guard._job: None (no job), or (made progress since the last look, what it did)
    if job is not None:
        sign("progress", job[0], job[1])
    progress = sample.get("progress")  # Guard._progress: None (not measured yet), or the processes that made some
    if progress is not None:
        sign(
            "progress",
            progress,
            "; ".join(progress[:3])
            if progress
            else f"no process made progress (under {JOB_CPU} % of a core and {_rate(JOB_IO)} written)",
        )
    n, held, ages = sample.get("ssh") or 0, sample.get("connections") or 0, sample.get("ssh_input") or []
    recent = [a for a in ages if a < window]
    said = f"{n} SSH session(s) logged in" + (f", the last input at a terminal {say(min(ages))} ago" if ages else "")
    sign("input", recent, said if not recent else f"input at an SSH terminal {int(min(recent))} s ago")
    if held and not recent:
        evidence[-1] += f" ({held} TCP connection(s) to :22 or :8888: a connection is not a login)"
    n = sample.get("jupyter") or 0
    sign("jupyter", n, f"{n} Jupyter kernel(s) running a cell")
    age = sample.get("jupyter_age")
    sign(
        "jupyter-age",
        age is not None and age < window,
        f"Jupyter activity {int(age or 0)} s ago"
        if age is not None and age < window
        else "Jupyter: "
        + (
            sample.get("jupyter_problem") or "no kernel or terminal"
            if age is None
            else f"last kernel or terminal activity {int(age)} s ago"
        ),
    )
    age = sample.get("heartbeat_age")
    sign(
        "heartbeat",
        age is not None and age < window,
        f"heartbeat {int(age or 0)} s ago"
        if age is not None and age < window
        else "heartbeat "
        + (sample.get("heartbeat_problem") or "never touched" if age is None else f"{int(age)} s ago"),
    )
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
        return progress, (
            f"a job's {len(usage)} process(es) used {cpu:.0f} % CPU and wrote {_rate(rate)} since "
            "the last look" + ("" if progress else ": no progress (stalled?)")
        )

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
        return [
            f"process {pid} ({comm}) used {cpu:.0f} % CPU and wrote {_rate(rate)} since the last look"
            for cpu, rate, pid, comm in found
        ]

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
        sample = {
            **sample,
            "job": self._job(now, sample.get("job_usage")),
            "progress": self._progress(now, sample.get("usage")),
        }
        if s["max_runtime"] and now - self.started >= s["max_runtime"]:
            return "deadline", s["action"], f"IMAGEKIT_MAX_RUNTIME={say(s['max_runtime'])} reached"
        if s["on_blocker"] and blocked is not None:  # None: the start check has not said yet (keep what was seen)
            if blocked:
                self.blocked_since = self.blocked_since if self.blocked_since is not None else now
                if now - self.blocked_since >= s["blocker_grace"]:
                    return (
                        "blocker",
                        s["on_blocker"],
                        f"blocked for {say(now - self.blocked_since)} (IMAGEKIT_BLOCKER_GRACE="
                        f"{say(s['blocker_grace'])}): {blocked}",
                    )
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
        return (
            "idle",
            s["action"],
            f"idle for {say(quiet)} (IMAGEKIT_IDLE_STOP={say(s['idle_stop'])}): " + "; ".join(evidence),
        )

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
        what = (
            f"{sample.get('gpu_procs')} process(es) held GPU memory for {say(quiet)} while every GPU idled and "
            f"nothing made progress ({'; '.join(evidence)})"
        )
        if quiet >= s["gpu_idle_warn"] and not self.hung_warned:
            self.hung_warned = True
            self.warnings.append(f"{what}: hung?")
            self.hung_banner = (
                f"imagekit-guard, {_stamp(now)}: a process holds GPU memory while every GPU idles and "
                f"nothing makes progress: a hung job? the pod stops after IMAGEKIT_HUNG_STOP="
                f"{say(s['hung_stop'])} of this (`nvidia-smi` names it)"
            )
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
            self.notes.append(
                f"{len(exits)} run(s) or job(s) ended since this start, none runs now (last exit code "
                f"{exits[-1][1]}): IMAGEKIT_ON_EXIT={s['on_exit']} once the pod stays quiet for "
                f"{say(s['exit_grace'])} (nothing running or making progress, no input, no imagekit "
                "client connected)"
            )
        busy, evidence = signs(sample, s["gpu_util"], clients=True)
        quiet = self._window("exit", now, not busy, [*ages, max(0.0, now - last)])
        if quiet is None or quiet < s["exit_grace"]:
            return None
        code = worst_exit(exits)
        return (
            "exit",
            exit_action(s["on_exit"], code),
            f"every run and job ended (exit code {code}{' of the first that failed' if code else ''}) and the pod "
            f"was quiet for {say(quiet)} (IMAGEKIT_EXIT_GRACE={say(s['exit_grace'])}): " + "; ".join(evidence),
        )

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
        quiet = (
            f"a job runs, but the GPUs were at or under {s['gpu_util']} % for "
            f"{say(now - self.gpu_quiet_since)} (GPU utilisation {'/'.join(str(u) for u in utils)} %){doing}"
        )
        if now - self.gpu_quiet_since >= s["gpu_idle_warn"] and not self.warned:
            self.warned = True
            self.warnings.append(f"{quiet}: a CPU fallback or a hang?")
            self.job_banner = (
                f"imagekit-guard, {_stamp(now)}: {quiet}: training on the CPU at GPU rates (a device "
                "set to cpu, a CPU fallback) or a hang? `imagekit-doctor` says what torch sees"
                + (
                    f"; the pod stops after IMAGEKIT_GPU_IDLE_STOP={say(s['gpu_idle_stop'])}"
                    if s["gpu_idle_stop"]
                    else ""
                )
            )
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
        if (
            blocked is not None
            and expected
            and (not utils or max(utils) <= s["gpu_util"])
            and cpu
            and prev
            and prev[1]
            and now > prev[0]
        ):
            for key, (ticks, comm) in cpu.items():
                before = prev[1].get(key)
                percent = 0 if before is None else (ticks - before[0]) * 100 / guard_signs.CLK_TCK / (now - prev[0])
                if percent >= s["cpu_burn"] and comm not in guard_signs.NOT_TRAINING:
                    burning[key] = (self.burn_since.get(key, prev[0]), percent, comm)
        self.burn_since = {key: v[0] for key, v in burning.items()}
        if not burning:
            self.cpu_warned, self.banner = False, None
            return None
        key, (since, percent, comm) = min(burning.items(), key=lambda kv: kv[1][0])  # burning the longest
        pid = key.split()[0]
        gpus = f"GPU utilisation {'/'.join(str(u) for u in utils)} %" if utils else "no GPU answers nvidia-smi"
        what = (
            f"process {pid} ({comm}) used {percent:.0f} % CPU for {say(now - since)} while every GPU was idle "
            f"({gpus}, threshold {s['gpu_util']} %)"
        )
        if now - since >= s["gpu_idle_warn"] and not self.cpu_warned:
            self.cpu_warned = True
            self.warnings.append(f"{what}: training on the CPU at GPU rates?")
            self.banner = (
                f"imagekit-guard, {_stamp(now)}: {what}: "
                "training on the CPU at GPU rates? `imagekit-doctor` says why torch sees no GPU"
                + (
                    f"; the pod stops after IMAGEKIT_GPU_IDLE_STOP={say(s['gpu_idle_stop'])}"
                    if s["gpu_idle_stop"]
                    else ""
                )
            )
        if s["gpu_idle_stop"] and now - since >= s["gpu_idle_stop"]:
            return "cpu-fallback", s["action"], f"{what} (IMAGEKIT_GPU_IDLE_STOP={say(s['gpu_idle_stop'])})"
        return None


def sample(s, now, jobs=()):
    """One look at every sign of work; ``jobs``: the pids of the running jobs (``job_pids``)."""
    out = {"job_usage": guard_signs.tree_usage(jobs) if jobs else None}
    text = guard_signs._nvidia_smi(["--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"])
    if text is not None:
        out["gpu_util"] = [int(v) for v in re.findall(r"^\s*([0-9]{1,3})\s*$", text, re.M)]
    apps = guard_signs._nvidia_smi(["--query-compute-apps=pid", "--format=csv,noheader"])
    out["gpu_procs"] = len(re.findall(r"^\s*[0-9]+\s*$", apps or "", re.M))
    # evidence only: anyone can open one
    out["connections"] = sum(guard_signs._connections(guard_signs.SESSION_PORTS).values())
    sessions = guard_signs.ssh_session_list()
    out["ssh"] = len(sessions)  # evidence: a session counts by the input at its terminal, and what runs in it
    out["ssh_input"] = [a for a in (guard_signs.input_age(tty, now) for _, tty in sessions if tty) if a is not None]
    out["jupyter"], out["jupyter_age"], problem = guard_signs.jupyter_activity(s["jupyter_token"], now)
    if problem:
        out["jupyter_problem"] = problem
    out["usage"] = guard_signs.process_usage()
    out["cpu"] = {k: [v[3], v[2]] for k, v in out["usage"].items()}
    out["clients"] = guard_files.client_leases()
    out["heartbeat_age"] = None
    try:  # touched, not read: a regular file's own mtime (a link's target or a FIFO is not the heartbeat)
        st = os.stat(s["heartbeat"], follow_symlinks=False)
    except OSError:
        return out
    if stat.S_ISREG(st.st_mode):
        out["heartbeat_age"] = max(0.0, now - st.st_mtime)
    else:
        out["heartbeat_problem"] = (
            f"{s['heartbeat']} is {nofollow.kind(st.st_mode)}, not a regular file: not counted (touch a plain file)"
        )
    return out


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
            with urllib.request.build_opener(guard_signs._NoRedirect).open(req, timeout=30) as resp:
                status = resp.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except (OSError, ValueError) as exc:
            status = f"no answer ({type(exc).__name__})"
        if isinstance(status, int) and 200 <= status < 300:
            log(f"{method} {url}: HTTP {status}: the {found[0]} pod {found[2]} is asked to {action}")
            return True
        log(
            f"{method} {url} failed: {status if isinstance(status, str) else f'HTTP {status}'} "
            f"(try {tried}); retrying in {pause:g} s"
        )
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
        log(
            f"cannot {action} this pod: no {wanted} in its env (the platform sets them); it keeps billing until you "
            "stop it"
        )
        return False
    if s["dry_run"]:
        method, url, body = request(found, action)
        log(
            f"dry run (IMAGEKIT_GUARD_DRY_RUN=1): would send {method} {url}"
            + (f" {json.dumps(body, sort_keys=True)}" if body is not None else "")
        )
        return True
    return call(found, action, attempts)


def describe(s):
    """What ``s`` arms, as the guard's first line says it."""
    parts = [
        f"deadline in {say(s['max_runtime'])}" if s["max_runtime"] else "",
        f"idle stop after {say(s['idle_stop'])}" if s["idle_stop"] else "",
        f"hung stop after {say(s['hung_stop'])}" if s["hung_stop"] else "",
        f"{s['on_blocker']} on a blocker after {say(s['blocker_grace'])}" if s["on_blocker"] else "",
        f"{s['on_exit']} once every run has ended and the pod was quiet for {say(s['exit_grace'])}"
        if s["on_exit"]
        else "",
        f"stop when a job's GPUs idle for {say(s['gpu_idle_stop'])}" if s["gpu_idle_stop"] else "",
    ]
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
    log(
        "armed: "
        + describe(s)
        + f" (action: {s['action']}; "
        + (
            f"{found[0]} pod {found[2]}"
            if found
            else f"{refused.split(' ')[0]} refused: it can only log"
            if refused
            else "no provider credentials: it can only log"
        )
        + ")"
        + (" [dry run]" if s["dry_run"] else "")
    )
    # runs and jobs that ended before this start of the pod were another start's. The start is the container's (its
    # PID 1's), not this process's: a job of a moment ends before a guard slow to start (a loaded host) reads its
    # clock, and its exit is this start's all the same
    container = guard_signs.started_at(1, now=started)
    this_start = started if container is None else min(started, container)
    store = guard_files.State()
    started, blocked_since, said = guard_files.resume(store.load(), started, s)
    if said:
        log(said)
    guard = Guard(s, started)
    guard.blocked_since = blocked_since
    while True:
        t = now()
        jobs = guard_files.job_pids(environ)
        looked = sample(s, t, jobs)
        looked["exits"] = guard_files.exits_since(environ, this_start) if s["on_exit"] else []
        fired = guard.step(t, looked, guard_files.current_blocker(), job_running=bool(jobs))
        for note in guard.notes:
            log(note)
        for warning in guard.warnings:
            log(f"warning: {warning}")
        guard_files.show_banner(guard.banner_text())
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
    ok, lines = guard_files.checksum_outputs(s["outputs"])
    for line in lines:
        log(f"outputs: {line}")
    if not ok:
        log(
            f"not ending the pod (IMAGEKIT_ON_EXIT={s['on_exit']}): the outputs are not all there; it stays up so you "
            "can look (the idle stop still holds, and the next run that ends tries again)"
        )
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
    ok, lines = guard_files.checksum_outputs(s["outputs"])
    for line in lines:
        log(f"outputs: {line}")
    if not ok:
        log(f"the outputs are not all there: IMAGEKIT_ON_EXIT={s['on_exit']} will not end the pod on this run")
        return 1
    log(
        f"the run exited {code}: the guard will {exit_action(s['on_exit'], code, quiet=True)} this pod once every run "
        f"has ended and it stayed quiet for {say(s['exit_grace'])} (no input, nothing making progress, no `pod cp`, "
        "`pod wait` or `pod logs` connected)"
    )
    return 0


def exit_action(on_exit, code, quiet=False):
    """What IMAGEKIT_ON_EXIT does after an exit with ``code``: `terminate` only after a success (a failed run's pod is
    stopped instead, its volume and log kept for a look), `terminate-always` after any exit."""
    if on_exit == "terminate-always":
        return "terminate"
    if on_exit == "terminate" and code != 0:
        if not quiet:
            log(
                f"the exit code is {code}: stopping instead of terminating (IMAGEKIT_ON_EXIT=terminate ends a pod for "
                "good after a success only; terminate-always after any exit)"
            )
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
