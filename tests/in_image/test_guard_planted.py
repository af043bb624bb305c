"""The lifetime guard's decisions that bugs planted on purpose changed unnoticed by every tier without Docker: which
action a blocker takes, which connections count as sessions, which GPU says a job works, the on-exit paths with a
declared output missing (`pod run`'s and job mode's), runs `pod run` started as jobs, a dry run only when asked, and
idle stop one window after the last heartbeat (not two).

Each test names the bug it guards (as tests/test_planted_bugs.py does); each was run with its bug planted (and
failed) and without it (and passed). In this process: the loop runs on an injected clock, `nvidia-smi` and the
connection tables are stand-ins, the provider's call is recorded instead of sent.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from imagekit.in_image import guard, guard_files, guard_signs, podstart

KEY = "rpa_SECRETKEY0123456789"
RUNPOD = {"RUNPOD_POD_ID": "abc123xyz", "RUNPOD_API_KEY": KEY}
IDLE = {"gpu_util": [0, 3], "gpu_procs": 0, "ssh": 0, "jupyter": 0, "heartbeat_age": None}
HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
HEADER6 = ("  sl  local_address                         remote_address                        st tx_queue rx_queue tr "
           "tm->when retrnsmt   uid  timeout inode\n")  # fmt: skip


class Stopped(Exception):
    """The loop ran longer than the test allows: the trigger it waits for never fired."""


@pytest.fixture
def pod(monkeypatch, tmp_path):
    """A quiet pod around the guard: no blocker, no job, no session, GPUs at 0 % with no process, no heartbeat;
    ``pod.gpus`` and ``pod.apps`` are what `nvidia-smi` answers, ``pod.calls`` the provider calls asked for."""

    class Pod:
        gpus, apps, calls = "0\n0\n", "", []

    p = Pod()
    monkeypatch.setattr(guard_files, "LOG", str(tmp_path / "guard.log"))
    monkeypatch.setattr(guard, "RETRY_PAUSE", 0.01)
    monkeypatch.setattr(guard_files, "BLOCKED", str(tmp_path / "blocked"))
    monkeypatch.setattr(guard_files, "JOB", str(tmp_path / "job"))
    (tmp_path / "tcp").write_text(HEADER)
    (tmp_path / "tcp6").write_text(HEADER6)
    monkeypatch.setattr(guard_signs, "PROC_TCP", (str(tmp_path / "tcp"), str(tmp_path / "tcp6")))
    monkeypatch.setattr(
        guard_signs, "_nvidia_smi", lambda args: p.gpus if "--query-gpu=utilization.gpu" in args else p.apps
    )

    def call(found, action, attempts=None):
        p.calls.append((found[0], found[2], action))
        return True

    monkeypatch.setattr(guard, "call", call)
    return p


def _env(tmp_path, **extra):
    return {**RUNPOD, "IMAGEKIT_HEARTBEAT": str(tmp_path / "heartbeat"), "IMAGEKIT_RUNS": str(tmp_path / "runs"),
            "IMAGEKIT_GUARD_INTERVAL": "30s", **extra}  # fmt: skip


def _drive(environ, start, until, tick=None):
    """guard.run on a clock that starts at ``start`` and that only its sleeps move; ``tick(now)`` after each sleep
    (what the pod does meanwhile). (exit code, the time it returned); past ``until`` it is :class:`Stopped`."""
    clock = [float(start)]

    def sleep(seconds):
        clock[0] += seconds
        if clock[0] > until:
            raise Stopped(f"still running at t={clock[0]:g}")
        if tick:
            tick(clock[0])

    return guard.run(environ, now=lambda: clock[0], sleep=sleep), clock[0]


def _log(tmp_path):
    return (tmp_path / "guard.log").read_text()


# ---- the bug today: idle stop one window after the last heartbeat, not two ------------------------------------------
@pytest.mark.seconds
@pytest.mark.parametrize("offset", [0, 5, 29])
def test_idle_stop_fires_one_window_after_the_last_heartbeat_not_two(pod, tmp_path, offset):
    """A training loop touches the heartbeat until t=0, then stops (hung, or done without ending the pod): with 30m
    the pod ends between 30m and 30m plus two samples later (it ended at 60m, saying "idle for 30m")."""
    beat = tmp_path / "heartbeat"
    beat.write_text("")

    def loop(now):  # touched on every step of the loop until t=0
        os.utime(beat, (min(now, 0.0), min(now, 0.0)))

    loop(-600.0)
    code, ended = _drive(_env(tmp_path, IMAGEKIT_IDLE_STOP="30m"), start=-600 + offset, until=4 * 3600, tick=loop)
    assert code == 0 and pod.calls == [("runpod", "abc123xyz", "stop")]
    assert 1800 <= ended <= 1800 + 2 * 30, f"stopped {ended:g} s after the last heartbeat"
    line = next(ln for ln in _log(tmp_path).splitlines() if "idle: idle for" in ln)
    word = line.split("idle for ")[1].split(" ")[0]  # as guard.say writes it: 30m15s
    said = sum(int(n) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"(\d+)([dhms])", word))
    assert said == int(ended), line  # what it says is the time since the last sign of work
    assert "heartbeat 18" in line and "0 SSH session(s) logged in" in line


def test_the_idle_window_counts_from_the_last_sign_of_work_whichever_it_was():
    s, _ = guard.settings({"IMAGEKIT_IDLE_STOP": "30m"})
    g = guard.Guard(s, started=0)
    beat = {**IDLE, "heartbeat_age": 0.0}
    assert g.step(0, {**beat, "gpu_util": [80, 0]}, "") is None  # training, and the loop touches the heartbeat
    assert g.step(600, {**IDLE, "heartbeat_age": 500.0}, "") is None  # GPUs quiet at 600; last touch at 100
    assert g.step(2399, {**IDLE, "heartbeat_age": 2299.0}, "") is None  # 30m after the touch, not after the logout
    trigger, _, message = g.step(2400, {**IDLE, "heartbeat_age": 2300.0}, "")
    assert trigger == "idle" and "idle for 30m " in message
    g = guard.Guard(s, started=0)
    assert g.step(0, {**IDLE, "heartbeat_age": 7200.0}, "") is None  # touched long before the guard looked
    assert g.step(1799, {**IDLE, "heartbeat_age": 8999.0}, "") is None
    assert g.step(1800, {**IDLE, "heartbeat_age": 9000.0}, "")[0] == "idle"
    g = guard.Guard(s, started=0)
    for t in range(0, 3 * 3600, 30):  # a loop that touches it every 25 minutes keeps the pod up
        assert g.step(t, {**IDLE, "heartbeat_age": float(t % 1500)}, "") is None


# ---- a blocker ends the pod as IMAGEKIT_ON_BLOCKER says ----------------------------------------------------------
# Planted: Guard.step returns ("blocker", s["action"], ...) instead of s["on_blocker"].
@pytest.mark.seconds
@pytest.mark.parametrize(
    ("on_blocker", "action", "sent"),
    [("terminate", "stop", '{"action": "terminate"}'), ("stop", "terminate", '{"action": "stop"}')],
)
def test_a_blocker_ends_the_pod_as_on_blocker_says_not_as_the_guard_action(pod, tmp_path, on_blocker, action, sent):
    s, _ = guard.settings({"IMAGEKIT_ON_BLOCKER": on_blocker, "IMAGEKIT_GUARD_ACTION": action})
    g = guard.Guard(s, started=0)
    assert g.step(0, IDLE, "FAIL torch-probe: no GPU") is None
    assert g.step(900, IDLE, "FAIL torch-probe: no GPU")[:2] == ("blocker", on_blocker)
    (tmp_path / "blocked").write_text("==== imagekit: BLOCKED ====\nFAIL torch-probe: torch sees no GPU\n")
    env = _env(tmp_path, IMAGEKIT_ON_BLOCKER=on_blocker, IMAGEKIT_GUARD_ACTION=action, IMAGEKIT_BLOCKER_GRACE="5m")
    code, ended = _drive(env, start=0, until=3600)
    assert code == 0 and ended == 300 and pod.calls == [("runpod", "abc123xyz", on_blocker)]
    assert f"action: {on_blocker}" in _log(tmp_path) and "torch sees no GPU" in _log(tmp_path)
    pod.calls.clear()
    code, _ = _drive({**env, "IMAGEKIT_GUARD_DRY_RUN": "1"}, start=0, until=3600)
    assert pod.calls == [] and "would send POST " in _log(tmp_path) and f"/action {sent}" in _log(tmp_path)


# ---- sessions are connections to the pod's own :22 and :8888 -----------------------------------------------------
# Planted: guard_signs._connections reads the port of the remote address (fields[2]) instead of the local one
# (fields[1]).
TCP = HEADER + "".join(
    f"{n:4d}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 "
    "0000000000000000 100 0 0 10 0\n"
    for n, (local, remote, state, inode) in enumerate([
        ("00000000:0016", "00000000:0000", "0A", 20311),  # sshd listening on 0.0.0.0:22
        ("00000000:22B8", "00000000:0000", "0A", 20419),  # Jupyter listening on 0.0.0.0:8888
        ("020011AC:0016", "097100CB:C93A", "01", 31337),  # a session: 203.0.113.9:51514 -> 172.17.0.2:22
        ("020011AC:0016", "0A7100CB:DD5A", "01", 31338),  # another SSH session (203.0.113.10:56666)
        ("020011AC:22B8", "097100CB:D431", "01", 31400),  # a Jupyter session: 203.0.113.9:54321 -> :8888
        ("020011AC:A112", "0370528C:0016", "01", 31500),  # outgoing: git over SSH from :41234 to 140.82.112.3:22
        ("020011AC:A113", "0370528C:0016", "01", 31501),  # and another
        ("020011AC:A114", "0370528C:22B8", "01", 31502),  # outgoing to someone else's Jupyter
        ("020011AC:0016", "097100CB:C93B", "06", 0),  # a session that ended (TIME_WAIT)
        ("0100007F:1F90", "0100007F:0016", "01", 31600),  # the client end of a loopback connection to :22
    ])
)  # fmt: skip
TCP6 = HEADER6 + "".join(
    f"{n:4d}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 "
    "0000000000000000 100 0 0 10 0\n"
    for n, (local, remote, state, inode) in enumerate([
        ("00000000000000000000000000000000:0016", "00000000000000000000000000000000:0000", "0A", 20312),
        ("0000000000000000FFFF0000020011AC:0016", "B80D0120000000000000000001000000:E1F2", "01", 32000),
        ("0000000000000000FFFF0000020011AC:A115", "B80D0120000000000000000002000000:22B8", "01", 32001),
    ])
)  # fmt: skip


def test_sessions_are_established_connections_to_the_pods_own_ssh_and_jupyter_ports(pod, tmp_path):
    (tmp_path / "tcp").write_text(TCP)
    (tmp_path / "tcp6").write_text(TCP6)
    assert guard_signs._connections((22, 8888)) == {22: 3, 8888: 1}
    (tmp_path / "tcp").write_text(HEADER + "".join(ln + "\n" for ln in TCP.splitlines() if " 0370528C:" in ln))
    (tmp_path / "tcp6").write_text(HEADER6 + TCP6.splitlines()[-1] + "\n")
    assert guard_signs._connections((22, 8888)) == {22: 0, 8888: 0}  # outgoing only: nobody is logged in
    s, _ = guard.settings(_env(tmp_path))
    sample = guard.sample(s, 0.0)
    assert (sample["ssh"], sample["jupyter"]) == (0, 0) and guard.idle_reasons(sample, 5, 0)[0]


# ---- a job works when any GPU does -------------------------------------------------------------------------------
# Planted: Guard.step's GPU-idle watchdog tests min(utils) (the quietest GPU) instead of max(utils).
@pytest.mark.seconds
def test_a_job_whose_gpus_work_but_one_is_not_gpu_idle(pod, tmp_path):
    s, _ = guard.settings({"IMAGEKIT_GPU_IDLE_WARN": "10m", "IMAGEKIT_GPU_IDLE_STOP": "30m"})
    g = guard.Guard(s, started=0)
    working = {**IDLE, "gpu_util": [95, 97, 96, 0], "gpu_procs": 3}
    for t in range(0, 4 * 3600, 30):
        assert g.step(t, working, "", job_running=True) is None and g.warnings == [], t
    assert not guard.idle_reasons(working, 5, 0)[0]
    quiet = guard.Guard(s, started=0)
    assert quiet.step(0, {**working, "gpu_util": [3, 0, 5, 0]}, "", job_running=True) is None
    assert quiet.step(1800, {**working, "gpu_util": [3, 0, 5, 0]}, "", job_running=True)[0] == "gpu-idle"
    pod.gpus = "95\n97\n96\n0\n"
    os.makedirs(tmp_path / "runs")
    (tmp_path / "job").write_text("")
    with pytest.raises(Stopped):  # the loop: hours of a working job on four GPUs, no stop
        _drive(_env(tmp_path, IMAGEKIT_GPU_IDLE_STOP="30m"), start=0, until=3 * 3600)
    assert pod.calls == [] and "warning" not in _log(tmp_path)


# ---- on exit: the pod ends once every run has ended and it stayed quiet, never with a declared output missing ------
def _ended(tmp_path, name, code, when, pid=999999):
    """A run folder as `pod run` leaves it: its pid, and the exit file written at ``when`` with ``code``."""
    run = tmp_path / "runs" / name
    run.mkdir(parents=True, exist_ok=True)
    (run / "pid").write_text(f"{pid}\n")
    (run / "exit").write_text(f"{code}\n")
    os.utime(run / "exit", (when, when))
    return run


# Planted: guard.run acts on the exit trigger without _outputs_ready (the check gone).
@pytest.mark.seconds
def test_the_exit_stop_never_ends_the_pod_while_a_declared_output_is_missing(pod, tmp_path):
    (tmp_path / "model.pt").write_bytes(b"weights")
    missing = tmp_path / "out" / "final.pt"
    env = _env(tmp_path, IMAGEKIT_ON_EXIT="terminate", IMAGEKIT_OUTPUTS=f"{tmp_path / 'model.pt'}:{missing}")
    t0 = time.time()

    def tick(now):
        if now >= t0 + 60 and not (tmp_path / "runs").exists():
            _ended(tmp_path, "20261207T000000Z-1", 0, t0 + 60)

    with pytest.raises(Stopped):
        _drive(env, start=t0, until=t0 + 3600, tick=tick)
    log = _log(tmp_path)
    assert pod.calls == [] and f"declared output {missing} does not exist" in log
    assert "not ending the pod (IMAGEKIT_ON_EXIT=terminate): the outputs are not all there" in log
    missing.parent.mkdir()
    missing.write_bytes(b"final")

    def second(now):  # a second run writes it and ends: the exit stop tries again
        if now >= t0 + 60 and not (tmp_path / "runs" / "20261207T000500Z-2").exists():
            _ended(tmp_path, "20261207T000500Z-2", 0, t0 + 60)

    code, ended = _drive(env, start=t0, until=t0 + 3600, tick=second)
    assert code == 0 and pod.calls == [("runpod", "abc123xyz", "terminate")] and ended == pytest.approx(t0 + 660)
    assert (tmp_path / "model.pt.sha256").is_file() and (tmp_path / "out" / "final.pt.sha256").is_file()


# Planted: guard.worst_exit returns the last exit's code (`exits[-1][1]`): a failure before a success terminated.
@pytest.mark.parametrize(
    "on_exit, codes, sent",
    [("terminate", [0], "terminate"), ("terminate", [3], "stop"), ("terminate-always", [3], "terminate"),
     ("terminate-always", [0], "terminate"), ("stop", [3], "stop"), ("terminate", [3, 0], "stop")],
)  # fmt: skip
def test_a_failed_run_is_never_terminated_unless_terminate_always_asks(pod, tmp_path, on_exit, codes, sent):
    t0 = time.time()
    for i, code in enumerate(codes):
        _ended(tmp_path, f"20261207T00000{i}Z-{i}", code, t0 + 30 + i)
    code, ended = _drive(_env(tmp_path, IMAGEKIT_ON_EXIT=on_exit), start=t0, until=t0 + 3600)
    assert code == 0 and pod.calls == [("runpod", "abc123xyz", sent)] and ended == pytest.approx(t0 + 660)
    if sent != on_exit.split("-")[0]:
        assert "stopping instead of terminating" in _log(tmp_path)


# Planted: guard_files.exits_since keeps every exit file (the `st_mtime >= since` test gone): a run of the last start
# ended the pod again as soon as `pod start` brought it back to fetch the outputs.
@pytest.mark.seconds
def _container_started(tmp_path, monkeypatch, ago: float) -> None:
    """A /proc of the test's own whose PID 1 (the container's init) started ``ago`` seconds before the guard's first
    look: the host's own PID 1 started whenever the machine booted."""
    from tests.in_image.test_guard_activity import _proc_tree, _process

    proc = _proc_tree(tmp_path)
    (proc / "uptime").write_text("100000.00 1.00\n")
    start = int((100000 - ago) * guard_signs.CLK_TCK)
    _process(proc, 1, "/usr/bin/tini -- podstart", "/usr/bin/tini", 0, start=start, comm="tini")
    monkeypatch.setattr(guard_signs, "PROC", str(proc))


def test_a_run_that_ended_before_this_start_is_no_exit(pod, tmp_path, monkeypatch):
    t0 = time.time()
    _container_started(tmp_path, monkeypatch, ago=0)  # this start of the pod: now
    _ended(tmp_path, "20261206T000000Z-1", 0, t0 - 3600)  # the last start's run, ended an hour ago
    env = _env(tmp_path, IMAGEKIT_ON_EXIT="stop")
    with pytest.raises(Stopped):
        _drive(env, start=t0, until=t0 + 3600)  # six grace windows
    assert (
        pod.calls == [] and guard_files.exits_since(env, t0) == [] and len(guard_files.exits_since(env, t0 - 7200)) == 1
    )


# Planted: Guard._exit waits for the quiet window but not for the runs still going (`or job_running` gone).
@pytest.mark.seconds
def test_the_exit_stop_waits_for_every_run_then_a_quiet_grace(pod, tmp_path):
    """Two runs: the short one ends at 60 s while the long one trains until 40m: no stop until both ended and the
    pod stayed quiet for the grace (10m) after the second."""
    t0 = time.time()
    long_run = tmp_path / "runs" / "20261207T000000Z-1"
    long_run.mkdir(parents=True)
    (long_run / "pid").write_text(f"{os.getpid()}\n")  # this process: alive until the tick writes its exit
    (long_run / "identity").write_text(guard_signs.identity(os.getpid()) + "\n")

    def tick(now):
        if now >= t0 + 60 and not (tmp_path / "runs" / "20261207T000001Z-2").exists():
            _ended(tmp_path, "20261207T000001Z-2", 0, t0 + 60)
        if now >= t0 + 2400 and not (long_run / "exit").exists():
            (long_run / "exit").write_text("0\n")
            os.utime(long_run / "exit", (t0 + 2400, t0 + 2400))

    code, ended = _drive(_env(tmp_path, IMAGEKIT_ON_EXIT="stop"), start=t0, until=t0 + 2 * 3600, tick=tick)
    assert code == 0 and pod.calls == [("runpod", "abc123xyz", "stop")]
    assert ended == pytest.approx(t0 + 2400 + 600, abs=30), ended - t0
    log = _log(tmp_path)
    assert "exit: every run and job ended (exit code 0) and the pod was quiet for 10m" in log


def test_an_unknown_on_exit_value_is_refused_and_named():
    s, problems = guard.settings({"IMAGEKIT_ON_EXIT": "terminate-now", "IMAGEKIT_ON_BLOCKER": "terminate-always"})
    assert s["on_exit"] is None and s["on_blocker"] is None
    assert any("stop or terminate or terminate-always" in p for p in problems), problems
    assert any("IMAGEKIT_ON_BLOCKER='terminate-always' is not stop or terminate" in p for p in problems), problems


class StayedUp(Exception):
    """podstart.stay_up: the pod left up (in the image it never returns)."""


@pytest.fixture
def job_mode(monkeypatch, tmp_path):
    """podstart's job mode in this process: its state in the test's folder, stay_up a :class:`StayedUp`, the signal
    handlers it sets put back."""
    monkeypatch.setattr(podstart, "STATE_DIR", str(tmp_path / "state"))

    def stay_up():
        raise StayedUp

    monkeypatch.setattr(podstart, "stay_up", stay_up)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


# Planted: podstart.run_then_end calls guard.act after the job (as it did: the stop raced the `pod cp` of its outputs).
@pytest.mark.seconds
def test_job_mode_on_exit_leaves_the_end_to_the_guard(pod, tmp_path, job_mode, capsys, monkeypatch):
    monkeypatch.setattr(guard_files, "JOB", str(tmp_path / "state" / "job"))
    monkeypatch.setattr(guard_files, "JOB_EXIT", str(tmp_path / "state" / "job-exit"))
    missing = tmp_path / "model.pt"
    env = {**_env(tmp_path), "IMAGEKIT_ON_EXIT": "stop", "IMAGEKIT_OUTPUTS": str(missing)}
    s, _ = guard.settings(env)
    t0 = time.time()
    with pytest.raises(StayedUp):
        podstart.run_then_end(["sh", "-c", "exit 3"], env, guard, s)
    assert pod.calls == [] and not os.path.exists(guard_files.JOB)
    err = capsys.readouterr().err
    assert "exited 3" in err and f"declared output {missing} does not exist" in err and "not ending the pod" in err
    assert guard_files.exits_since(env, t0 - 1) and guard_files.exits_since(env, t0 - 1)[0][1] == 3
    missing.write_bytes(b"weights")
    with pytest.raises(StayedUp):
        podstart.run_then_end(["sh", "-c", "exit 0"], env, guard, s)
    said = capsys.readouterr().err
    assert pod.calls == [] and "the guard will stop this pod once it has stayed quiet for 10m" in said
    code, _ = _drive(env, start=t0 - 1, until=t0 + 3600)  # the guard: quiet for the grace, then the stop
    assert code == 0 and pod.calls == [("runpod", "abc123xyz", "stop")] and (tmp_path / "model.pt.sha256").is_file()


# Planted: guard.run counts exits from its own process's start (`this_start = started`): a job of a moment ended before
# a guard slow to start (a loaded host) read its clock, and the pod was never ended.
@pytest.mark.seconds
def test_a_job_that_ended_before_the_guard_read_its_clock_still_ends_the_pod(pod, tmp_path, job_mode, monkeypatch):
    monkeypatch.setattr(guard_files, "JOB", str(tmp_path / "state" / "job"))
    monkeypatch.setattr(guard_files, "JOB_EXIT", str(tmp_path / "state" / "job-exit"))
    env = {**_env(tmp_path), "IMAGEKIT_ON_EXIT": "stop", "IMAGEKIT_EXIT_GRACE": "1m"}
    t0 = time.time()
    with pytest.raises(StayedUp):
        podstart.run_then_end(["sh", "-c", "exit 0"], env, guard, guard.settings(env)[0])
    _container_started(tmp_path, monkeypatch, ago=60)  # the container's PID 1: 60 s before the guard's first look
    assert guard_signs.started_at(1, now=t0 + 5) == pytest.approx(t0 - 55)
    code, ended = _drive(env, start=t0 + 5, until=t0 + 3600)  # the guard got going 5 s after the job ended
    assert code == 0 and pod.calls == [("runpod", "abc123xyz", "stop")] and ended <= t0 + 5 + 60 + 2 * 30
    monkeypatch.setattr(guard_signs, "PROC", str(tmp_path / "no-proc"))  # PID 1 not readable: from the guard's start
    pod.calls.clear()
    with pytest.raises(Stopped):
        _drive(env, start=t0 + 5, until=t0 + 600)
    assert pod.calls == []


# ---- a run `pod run` started is a job ------------------------------------------------------------------------------
# Planted: guard_files.job_running looks at the job-mode marker only (`return os.path.exists(JOB)`).
@pytest.mark.seconds
def test_a_run_pod_run_started_is_a_job_for_the_gpu_idle_watchdog(pod, tmp_path):
    run = tmp_path / "runs" / "20261202T180000Z-42"
    run.mkdir(parents=True)
    env = _env(tmp_path, IMAGEKIT_GPU_IDLE_STOP="10m")
    assert not guard_files.job_running(env)
    (run / "pid").write_text(f"{os.getpid()}\n")  # this process: alive
    assert guard_files.job_running(env) and not os.path.exists(guard_files.JOB)
    code, ended = _drive(env, start=0, until=3600)  # its GPUs at 0 % all along: a CPU fallback, or a hang
    assert code == 0 and ended == 600 and pod.calls == [("runpod", "abc123xyz", "stop")]
    assert "gpu-idle: a job runs, but the GPUs were at or under 5 % for 10m" in _log(tmp_path)
    (run / "exit").write_text("0\n")
    assert not guard_files.job_running(env)


# ---- a dry run only when asked -------------------------------------------------------------------------------------
# Planted: settings reads `"dry_run": bool(environ.get("IMAGEKIT_GUARD_DRY_RUN"))` (any value, "0" too, is a dry run).
@pytest.mark.parametrize(("value", "dry"), [("1", True), ("0", False), ("", False), (None, False)])
def test_only_dry_run_1_is_a_dry_run(pod, tmp_path, value, dry):
    env = {**RUNPOD, **({} if value is None else {"IMAGEKIT_GUARD_DRY_RUN": value})}
    s, problems = guard.settings(env)
    assert s["dry_run"] is dry and problems == []
    assert guard.act(env, s, "deadline", "stop", "IMAGEKIT_MAX_RUNTIME=6h reached") is True
    assert pod.calls == ([] if dry else [("runpod", "abc123xyz", "stop")])
    assert ("dry run (IMAGEKIT_GUARD_DRY_RUN=1): would send POST" in _log(tmp_path)) is dry


# ---- issue 48's planted bugs ----------------------------------------------------------------------------------------
# Planted: guard_files.resume reads `if prev.get("ended"):` (a state without the field resumed as the live start's).
@pytest.mark.parametrize("ended", ["missing", None, "no", 0])
def test_a_state_without_ended_false_is_a_new_start_never_a_resumed_one(ended):
    """Only a state that says ``"ended": false`` is a start that is still going (a crash loop): anything else, a
    state without the field (an older guard's, or one another user wrote), is a new start, its deadline from now."""
    s, _ = guard.settings({"IMAGEKIT_MAX_RUNTIME": "6h"})
    prev = {"armed": 1000.0, "seen": 1990.0, **({} if ended == "missing" else {"ended": ended})}
    armed, blocked, said = guard_files.resume(prev, 2000.0, s)
    assert (armed, blocked) == (2000.0, None) and said is not None and "a new start" in said
    assert guard_files.resume({**prev, "ended": False}, 2000.0, s)[0] == 1000.0  # the one that resumes


# Planted: guard_files._root_only tests `st.st_mode & 0o002` (writable by others) and lets a group-writable folder by.
@pytest.mark.parametrize(("mode", "refused"), [(0o770, True), (0o707, True), (0o750, False), (0o1777, False),
                                               (0o3775, False)])  # fmt: skip
def test_a_group_writable_state_folder_is_refused_like_a_world_writable_one(tmp_path, mode, refused):
    """A group another user is in could rename the guard's folder away (resetting the deadline), as anyone could a
    world-writable one; a sticky folder (/tmp) lets no one but its owner rename what is in it."""
    folder = tmp_path / "guard"
    folder.mkdir()
    os.chmod(tmp_path, 0o700)
    os.chmod(folder, mode)
    said = guard_files._root_only(str(folder))
    assert bool(said) is refused and (not refused or "writable by other users" in said), said
    assert guard_files.trusted_folder(str(folder)) is not refused


# Planted: Guard.step passes `blocked or ""` to _cpu_fallback whether or not a job runs (the watchdog doubles up).
def test_pod_modes_cpu_fallback_watchdog_stands_aside_while_a_job_runs():
    """A job running on the CPU while the GPUs idle is the job watchdog's to say (GPU idle for a job), once; pod
    mode's CPU-fallback watchdog, for processes outside any job, says nothing and stops nothing meanwhile."""
    s, _ = guard.settings({"IMAGEKIT_REQUIRE_GPU": "1", "IMAGEKIT_GPU_IDLE_WARN": "10m", "IMAGEKIT_GPU_IDLE_STOP": "1h",
                           "IMAGEKIT_MAX_RUNTIME": "1d"})  # fmt: skip
    g = guard.Guard(s, started=0)
    said = []
    for t in range(0, 2 * 3600 + 1, 30):
        ticks = int(t * guard_signs.CLK_TCK)  # one process at 100 % of a core
        sample = {**IDLE, "cpu": {"4242 7": [ticks, "python"]}, "gpu_util": [0]}
        fired = g.step(t, sample, "", job_running=True)
        said += g.warnings
        if fired:
            break
    assert fired is not None and fired[0] == "gpu-idle" and g.banner is None
    assert said and all("training on the CPU at GPU rates?" not in w for w in said)
    assert any("a job runs, but the GPUs were at or under 5 %" in w for w in said)
