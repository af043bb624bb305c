"""The lifetime guard: every billed minute is GPU work, or the pod ends (standard library only, Python >= 3.8).

Started by the entrypoint (pod and job mode) when the env asks for it; off otherwise. It ends the pod through the
provider's in-pod credentials, the only way that ends the billing (`kill 1` does not: the platform restarts the
container, or keeps the stopped one billed):

- ``IMAGEKIT_MAX_RUNTIME=6h``: a deadline, armed before anything else runs;
- ``IMAGEKIT_IDLE_STOP=30m``: idle for the whole window: no GPU above ``IMAGEKIT_IDLE_GPU_UTIL`` % (default 5), no
  GPU compute process, no SSH or Jupyter connection, and the heartbeat file (``IMAGEKIT_HEARTBEAT``, default
  /run/imagekit/heartbeat: `touch` it from a training loop) not touched; the log line that explains a stop lists each;
- ``IMAGEKIT_ON_BLOCKER=stop|terminate``: the start check found a blocker and it is still there after
  ``IMAGEKIT_BLOCKER_GRACE`` (default 15m, to look around first);
- ``IMAGEKIT_ON_EXIT=stop|terminate``: a job-mode command ended (podstart.py runs it, then asks this module), after
  the declared outputs (``IMAGEKIT_OUTPUTS``, paths separated by ``:``) exist and their sha256s are written beside
  them (``<path>.sha256``, `sha256sum -c` format); a missing output keeps the pod up, saying so;
- ``IMAGEKIT_GPU_IDLE_WARN=10m``: GPUs under the threshold that long while a job runs (job mode, or a run `imagekit
  pod run` started): a warning with the evidence; ``IMAGEKIT_GPU_IDLE_STOP=30m``, only when asked: the pod ends.

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


def settings(environ):
    """(settings, problems) from the env: a bad value is a problem (logged loudly), never a crash, and its trigger
    stays off; the others are armed."""
    s = {
        "max_runtime": None, "idle_stop": None, "on_blocker": None, "blocker_grace": 900, "on_exit": None,
        "outputs": [], "action": "stop", "dry_run": environ.get("IMAGEKIT_GUARD_DRY_RUN") == "1", "gpu_util": 5,
        "gpu_idle_warn": 600, "heartbeat": environ.get("IMAGEKIT_HEARTBEAT") or HEARTBEAT, "interval": 30,
        "gpu_idle_stop": None,
    }
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
        if value:
            if value in ACTIONS:
                s[key] = value
            else:
                problems.append(f"{name}={_shown(value)} is not stop or terminate")
    if environ.get("IMAGEKIT_IDLE_GPU_UTIL"):
        value = environ["IMAGEKIT_IDLE_GPU_UTIL"]
        if _PERCENT.fullmatch(value) and int(value) <= 100:
            s["gpu_util"] = int(value)
        else:
            problems.append(f"IMAGEKIT_IDLE_GPU_UTIL={_shown(value)} is not a percentage (0-100, ASCII digits)")
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
    for what in ("ssh", "jupyter"):
        n = sample.get(what) or 0
        (busy if n else evidence).append(f"{n} {'SSH' if what == 'ssh' else 'Jupyter'} connection(s)")
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
        age = sample.get("heartbeat_age")
        since = self.idle_since if age is None else max(self.idle_since, now - age)
        if now - since < s["idle_stop"]:
            return None
        return ("idle", s["action"],
                f"idle for {say(now - since)} (IMAGEKIT_IDLE_STOP={say(s['idle_stop'])}): " + "; ".join(evidence))

    def step(self, now, sample, blocked, job_running=False):
        """(trigger, action, message) when a trigger fires now, else None; warnings go to ``self.warnings``."""
        s = self.s
        self.warnings = []
        if s["max_runtime"] and now - self.started >= s["max_runtime"]:
            return "deadline", s["action"], f"IMAGEKIT_MAX_RUNTIME={say(s['max_runtime'])} reached"
        if s["on_blocker"]:
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


def sample(s, now):
    out = {}
    text = _nvidia_smi(["--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"])
    if text is not None:
        out["gpu_util"] = [int(v) for v in re.findall(r"^\s*([0-9]{1,3})\s*$", text, re.M)]
    apps = _nvidia_smi(["--query-compute-apps=pid", "--format=csv,noheader"])
    out["gpu_procs"] = len(re.findall(r"^\s*[0-9]+\s*$", apps or "", re.M))
    conns = _connections((22, 8888))
    out["ssh"], out["jupyter"] = conns[22], conns[8888]
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


JOB = "/run/imagekit/job"  # present while a job-mode command runs (podstart.py)
RUNS = "/workspace/.imagekit/runs"  # where `imagekit pod run` keeps its runs ($IMAGEKIT_RUNS), each <id>/pid, exit


_PID = re.compile(rb"\s*([0-9]{1,10})\s*")


def a_run_is_alive(runs):
    """Is a run `imagekit pod run` started still going: a folder with a pid, no exit file yet, the process there?
    Read through descriptors: a run folder or pid file that is a link, a FIFO or garbage is no run."""
    try:
        runs_fd = nofollow.open_dir(runs)  # $IMAGEKIT_RUNS as the pod's env names it
    except OSError:
        return False
    try:
        names = os.listdir(runs_fd)
    except OSError:
        names = []
    try:
        return any(name != "latest" and _run_pid_lives(name, runs_fd) for name in names)
    finally:
        os.close(runs_fd)


def _run_pid_lives(name, runs_fd):
    """The run folder ``name``: no exit file, and its pid file names a process that is there."""
    try:
        run_fd = nofollow.open_dir(name, dir_fd=runs_fd, follow=False)
    except OSError:
        return False
    try:
        try:
            os.stat("exit", dir_fd=run_fd, follow_symlinks=False)
            return False  # it ended
        except FileNotFoundError:
            pass
        m = _PID.fullmatch(nofollow.read_bytes("pid", 64, dir_fd=run_fd) or b"")
    except OSError:
        return False
    finally:
        os.close(run_fd)
    pid = int(m.group(1)) if m else 0
    if pid <= 1:  # 0 and -1 would ask the whole process group or every process; 1 is tini, never a run
        return False
    try:
        os.kill(pid, 0)
    except (OSError, OverflowError):
        return False
    return True


def job_running(environ):
    return os.path.exists(JOB) or a_run_is_alive(environ.get("IMAGEKIT_RUNS") or RUNS)


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
    guard = Guard(s, started)
    while True:
        t = now()
        fired = guard.step(t, sample(s, t), blocker(), job_running=job_running(environ))
        for warning in guard.warnings:
            log(f"warning: {warning}")
        if fired:
            return 0 if act(environ, s, *fired) else 1  # done, or nothing can be done (said why)
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
    return 0 if act(environ, s, "exit", s["on_exit"], f"the run exited {code}") else 1


def main(argv):
    if len(argv) == 2 and argv[0] == "--after-run" and re.fullmatch(r"[0-9]{1,3}", argv[1]):
        return after_run(dict(os.environ), int(argv[1]))
    if argv:
        log(f"usage: guard.py [--after-run EXIT_CODE]; got {' '.join(argv)[:80]!r}")
        return 2
    return run(dict(os.environ))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
