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
``IMAGEKIT_GUARD_DRY_RUN=1`` logs what it would do and does nothing. RunPod: ``RUNPOD_POD_ID`` and ``RUNPOD_API_KEY``
(REST ``POST /pods/{id}/stop``, ``DELETE /pods/{id}``); Vast.ai: ``CONTAINER_ID`` and ``CONTAINER_API_KEY`` (``PUT
/instances/{id}/`` with ``{"state": "stopped"}``, ``DELETE /instances/{id}/``); ``IMAGEKIT_RUNPOD_API`` and
``IMAGEKIT_VAST_API`` replace the bases. The key goes in a header only: never in a log line, an argument or a file.
A failed call is logged and retried until it succeeds; the pod stays up meanwhile.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request

if __package__:  # imported from the host's package, imagekit.in_image
    from . import facts
else:  # the program in the image: its siblings lie beside it (-I leaves the script's folder off sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import facts

RUNPOD_API = "https://rest.runpod.io/v1"
VAST_API = "https://console.vast.ai/api/v0"
HEARTBEAT = "/run/imagekit/heartbeat"
BLOCKED = "/run/imagekit/blocked"
LOG = "/var/log/imagekit-guard.log"
ACTIONS = facts.GUARD_ACTIONS
GuardError = facts.SettingError
parse_duration = facts.parse_duration
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


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
                s[key] = parse_duration(environ[name], name)
            except GuardError as exc:
                problems.append(str(exc))
    for name, key in (("IMAGEKIT_ON_BLOCKER", "on_blocker"), ("IMAGEKIT_ON_EXIT", "on_exit"),
                      ("IMAGEKIT_GUARD_ACTION", "action")):
        value = environ.get(name)
        if value:
            if value in ACTIONS:
                s[key] = value
            else:
                problems.append(f"{name}={value[:40]!r} is not stop or terminate")
    if environ.get("IMAGEKIT_IDLE_GPU_UTIL"):
        value = environ["IMAGEKIT_IDLE_GPU_UTIL"]
        if value.isdigit() and int(value) <= 100:
            s["gpu_util"] = int(value)
        else:
            problems.append(f"IMAGEKIT_IDLE_GPU_UTIL={value[:40]!r} is not a percentage (0-100)")
    s["outputs"] = [p for p in (environ.get("IMAGEKIT_OUTPUTS") or "").split(":") if p]
    return s, problems


def armed(s):
    """Does anything in ``s`` ask for the guard's process (on-exit is podstart's own, after the job)?"""
    return bool(s["max_runtime"] or s["idle_stop"] or s["on_blocker"] or s["gpu_idle_stop"])


def provider(environ):
    """(name, API base, pod id, key) from the provider's in-pod variables, or None."""
    for name, id_var, key_var, base_var, default in (
        ("runpod", "RUNPOD_POD_ID", "RUNPOD_API_KEY", "IMAGEKIT_RUNPOD_API", RUNPOD_API),
        ("vast", "CONTAINER_ID", "CONTAINER_API_KEY", "IMAGEKIT_VAST_API", VAST_API),
    ):
        pod, key = environ.get(id_var, ""), environ.get(key_var, "")
        if pod and key:
            if not _ID.match(pod):
                raise GuardError(f"{id_var} is not a pod id (letters, digits, - and _)")
            if any(c in key for c in "\r\n") or not key.isprintable():
                raise GuardError(f"{key_var} has characters a header cannot carry")
            return name, (environ.get(base_var) or default).rstrip("/"), pod, key
    return None


def request(found, action):
    """(method, URL, JSON body or None) that ``action`` takes at the provider ``found``."""
    name, base, pod, _ = found
    if name == "runpod":
        return ("POST", f"{base}/pods/{pod}/stop", None) if action == "stop" else ("DELETE", f"{base}/pods/{pod}", None)
    if action == "stop":
        return "PUT", f"{base}/instances/{pod}/", {"state": "stopped"}
    return "DELETE", f"{base}/instances/{pod}/", None


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
        evidence.append("heartbeat " + ("never touched" if age is None else f"{int(age)} s ago"))
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
        idle, evidence = idle_reasons(sample, s["gpu_util"], s["idle_stop"] or s["interval"] * 2)
        if s["idle_stop"]:
            if idle:
                self.idle_since = self.idle_since if self.idle_since is not None else now
                if now - self.idle_since >= s["idle_stop"]:
                    return ("idle", s["action"],
                            f"idle for {say(now - self.idle_since)} (IMAGEKIT_IDLE_STOP={say(s['idle_stop'])}): "
                            + "; ".join(evidence))
            else:
                self.idle_since = None
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
    line = f"imagekit-guard: {message}"
    print(line, file=sys.stderr, flush=True)
    try:
        fd = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
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
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "01":  # ESTABLISHED
                port = int(fields[1].rsplit(":", 1)[1], 16)
                if port in count:
                    count[port] += 1
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
    try:
        out["heartbeat_age"] = max(0.0, now - os.stat(s["heartbeat"]).st_mtime)
    except OSError:
        out["heartbeat_age"] = None
    return out


def blocker():
    """The start check's blocker, from the login banner it wrote (its first report line), or ''."""
    try:
        with open(BLOCKED) as fh:
            lines = [ln.strip() for ln in fh.read().splitlines() if ln.strip() and not ln.startswith("====")]
    except OSError:
        return ""
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
        log(f"cannot {action} this pod: no RUNPOD_POD_ID/RUNPOD_API_KEY or CONTAINER_ID/CONTAINER_API_KEY in its env "
            "(the platform sets them); it keeps billing until you stop it")
        return False
    if s["dry_run"]:
        method, url, _ = request(found, action)
        log(f"dry run (IMAGEKIT_GUARD_DRY_RUN=1): would send {method} {url}")
        return True
    return call(found, action, attempts)


def checksum_outputs(paths):
    """(ok, lines): each declared output must exist; each gets ``<path>.sha256`` (sha256sum -c format) of its files."""
    lines = []
    for path in paths:
        if not os.path.exists(path):
            return False, [f"declared output {path} does not exist"]
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
        sums = []
        for name in files:
            h = hashlib.sha256()
            with open(name, "rb") as fh:
                for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    h.update(block)
            sums.append(f"{h.hexdigest()}  {os.path.relpath(name, os.path.dirname(path.rstrip('/')) or '/')}\n")
        manifest = path.rstrip("/") + ".sha256"
        tmp = f"{manifest}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            fh.writelines(sums)
        os.replace(tmp, manifest)
        lines.append(f"{path}: {len(files)} file(s), sha256s in {manifest}")
    return True, lines


JOB = "/run/imagekit/job"  # present while a job-mode command runs (podstart.py)
RUNS = "/workspace/.imagekit/runs"  # where `imagekit pod run` keeps its runs ($IMAGEKIT_RUNS), each <id>/pid, exit


def a_run_is_alive(runs):
    """Is a run `imagekit pod run` started still going: a folder with a pid, no exit file yet, the process there?"""
    try:
        names = os.listdir(runs)
    except OSError:
        return False
    for name in names:
        folder = os.path.join(runs, name)
        if name == "latest" or os.path.exists(os.path.join(folder, "exit")):
            continue
        try:
            with open(os.path.join(folder, "pid")) as fh:
                pid = int(fh.read().strip()[:12])
            os.kill(pid, 0)
        except (OSError, ValueError):
            continue
        return True
    return False


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
    try:
        found = provider(environ)
    except GuardError as exc:
        found = None
        log(f"{exc}: the guard cannot end this pod")
    parts = [f"deadline in {say(s['max_runtime'])}" if s["max_runtime"] else "",
             f"idle stop after {say(s['idle_stop'])}" if s["idle_stop"] else "",
             f"{s['on_blocker']} on a blocker after {say(s['blocker_grace'])}" if s["on_blocker"] else "",
             f"stop when a job's GPUs idle for {say(s['gpu_idle_stop'])}" if s["gpu_idle_stop"] else ""]
    log("armed: " + ", ".join(p for p in parts if p) + f" (action: {s['action']}; "
        + (f"{found[0]} pod {found[2]}" if found else "no provider credentials: it can only log") + ")"
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
    if len(argv) == 2 and argv[0] == "--after-run" and argv[1].isdigit():
        return after_run(dict(os.environ), int(argv[1]))
    return run(dict(os.environ))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
