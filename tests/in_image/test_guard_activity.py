"""The lifetime guard's signs of work that nobody outside the pod can fake (issue 42): a session is an authenticated
SSH login (OpenSSH's own session process, read from /proc) or a Jupyter kernel or terminal its server reports through
its API with its token, never a TCP connection held open; a process is its (boot id, pid, start time), so a pid reused
after a container restart is not the job; the arm time and the blocker's first sighting outlive a restart; and in pod
mode a process on the CPU while every GPU idles is a warning in the login banner (a stop only when asked).

/proc trees are made in the test's folder where the guard's rule is the point; real sockets, processes and a real
HTTP stand-in of Jupyter's API where they can be had."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from imagekit.in_image import guard, guard_files, guard_signs
from tests import hostile_http

BOOT = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
KEY = "rpa_SECRETKEY0123456789"
RUNPOD = {"RUNPOD_POD_ID": "abc123xyz", "RUNPOD_API_KEY": KEY}
IDLE = {"gpu_util": [0], "gpu_procs": 0, "ssh": 0, "jupyter": 0, "heartbeat_age": None}
PASSWD = "root:x:0:0:root:/root:/bin/bash\nsshd:x:101:65534::/run/sshd:/usr/sbin/nologin\n" \
         "imagekit:x:1000:1000::/home/imagekit:/bin/bash\n"  # fmt: skip


def _process(proc, pid, title, exe, uid, start=5000, comm="sshd", ticks=0, state="S", ppid=1):
    """A process in a /proc tree of the test's own: its cmdline (setproctitle's padding), exe link (None: one root
    may not read, as an undumpable process of another user's), status, stat."""
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(title.encode() + b"\0" * 8)
    if exe is not None:
        (d / "exe").symlink_to(exe)
    (d / "status").write_text(f"Name:\t{comm}\nPPid:\t{ppid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "comm").write_text(comm + "\n")
    rest = [state, "1", str(pid), str(pid), "0", "-1", "0", "0", "0", "0", "0", str(ticks), "0"] + ["0"] * 6
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join([*rest, str(start), "0", "0"]) + "\n")


def _proc_tree(tmp_path):
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT + "\n")
    (proc / "stat").write_text("cpu  1 2 3\nbtime 1700000000\n")
    (tmp_path / "passwd").write_text(PASSWD)
    return proc


# ---- SSH: a logged-in session, not a connection ------------------------------------------------------------------
def test_only_an_authenticated_ssh_session_process_is_a_session(tmp_path, monkeypatch):
    monkeypatch.setattr(guard_signs, "SSHD_EXES", ("/usr/sbin/sshd", "/usr/lib/openssh/sshd-session"))
    proc = _proc_tree(tmp_path)
    sshd = "/usr/sbin/sshd"
    not_sessions = [
        ("sshd: /usr/sbin/sshd -D -f /opt/imagekit/etc/sshd_config [listener] 1 of 10-100 startups", sshd, 0),
        ("sshd: root [priv]", sshd, 0),  # a connection that named root and has not authenticated (or has)
        ("sshd: root [net]", sshd, 101),  # its unprivileged child
        ("sshd: unknown [preauth]", sshd, 101),  # a scanner naming a user that is not one ("root@pts/0" too)
        ("sshd: root@pts/0 [net]", sshd, 101),
        ("sshd: root@pts/0", "/usr/bin/python3.11", 1000),  # a workload that set its own title
        ("sshd: root@pts/0", "/tmp/sshd", 0),  # a copy of sshd elsewhere
        ("sshd: imagekit@notty", sshd, 0),  # the title names a user the process does not run as
        ("sshd: ghost@pts/3", sshd, 0),  # no such user
        ("sshd: root@pts/0; rm -rf /", sshd, 0),
    ]
    sessions = [
        ("sshd: root@pts/0", sshd, 0),  # a root login at a prompt (PermitRootLogin prohibit-password: keys only)
        ("sshd: root@notty" + " " * 60, sshd + " (deleted)", 0),  # `ssh pod cmd`, sshd upgraded since it started
        ("sshd-session: imagekit@pts/1", "/usr/lib/openssh/sshd-session", 1000),  # OpenSSH 9.8+, privsep child
    ]
    for pid, (title, exe, uid) in enumerate(not_sessions + sessions, start=100):
        _process(proc, pid, title, exe, uid)
    assert guard_signs.ssh_sessions(str(proc), str(tmp_path / "passwd")) == len(sessions)
    # as OpenSSH 10 runs them in a container (root without CAP_SYS_PTRACE): a user's session and its monitor are
    # undumpable, their exe unreadable; the listener above them is readable, and is sshd
    _process(proc, 20, "sshd: /usr/sbin/sshd -D -e [listener] 0 of 10-100 startups", sshd, 0)
    _process(proc, 21, "sshd-session: imagekit [priv]", None, 0, ppid=20)
    _process(proc, 22, "sshd-session: imagekit@pts/2", None, 1000, ppid=21)
    _process(proc, 30, "bash", "/usr/bin/bash", 1000)  # a user's shell under tini ...
    _process(proc, 31, "sshd-session: imagekit@pts/3", None, 1000, ppid=30)  # ... runs a process titled as one
    _process(proc, 32, "sshd-session: imagekit@pts/4", None, 1000, ppid=99999)  # whose parent is gone
    assert guard_signs.ssh_sessions(str(proc), str(tmp_path / "passwd")) == len(sessions) + 1


@pytest.mark.loopback
def test_an_unauthenticated_connection_held_open_is_not_work(tmp_path, monkeypatch):
    """A real TCP connection to :8888 (or :22; here a free port stands for them), ESTABLISHED and held: shown as
    evidence, never counted (it was: a scanner's connection kept an idle pod up)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        monkeypatch.setattr(guard_signs, "SESSION_PORTS", (port, 8888))
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            with accepted:
                smi = lambda args: "0\n" if "--query-gpu=utilization.gpu" in args else ""  # noqa: E731
                monkeypatch.setattr(guard_signs, "_nvidia_smi", smi)
                s, _ = guard.settings({"IMAGEKIT_HEARTBEAT": str(tmp_path / "none"), "IMAGEKIT_IDLE_STOP": "30m"})
                sample = guard.sample(s, time.time())
                assert client.fileno() >= 0 and sample["connections"] >= 1
                idle, evidence = guard.idle_reasons(sample, 5, 0)
    assert idle, evidence
    assert any("0 SSH session(s) logged in" in line and "a connection is not a login" in line for line in evidence)


# ---- Jupyter: its own API, with its token ------------------------------------------------------------------------
def _jupyter(token, kernels, terminals=()):
    def answer(items):
        def route(seen):
            if seen.headers.get("Authorization") != f"token {token}":
                return 403, {}, b'{"message": "Forbidden"}'
            return 200, {"Content-Type": "application/json"}, json.dumps(list(items)).encode()

        return route

    return hostile_http.serve({"/api/kernels": answer(kernels), "/api/terminals": answer(terminals)})


def _iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".123456Z"


@pytest.mark.loopback
def test_jupyter_activity_is_what_its_kernels_and_terminals_report_with_its_token(tmp_path, monkeypatch):
    now = 1_800_000_000.0
    kernels = [{"id": "k1", "execution_state": "idle", "last_activity": _iso(now - 600)},
               {"id": "k2", "execution_state": "busy", "last_activity": _iso(now - 5)}]  # fmt: skip
    with _jupyter("s3cret-token", kernels, [{"name": "1", "last_activity": _iso(now - 120)}]) as server:
        monkeypatch.setattr(guard_signs, "JUPYTER_URL", server.url)
        busy, age, problem = guard_signs.jupyter_activity("s3cret-token", now)
        assert (busy, problem) == (1, None) and 4 < age <= 5
        assert all("no_track_activity=1" in seen.path for seen in server.seen)  # its own looks are not activity
        busy, age, problem = guard_signs.jupyter_activity("guessed", now)  # what anyone reaching :8888 gets
        assert (busy, age) == (0, None) and "HTTP 403" in problem
    assert guard_signs.jupyter_activity("", now) == (0, None, None)  # no Jupyter asked for: nothing to ask


@pytest.mark.loopback
def test_a_jupyter_server_is_found_by_its_runtime_file_never_through_a_link(tmp_path):
    now = 1_800_000_000.0
    with _jupyter("tok-from-file", [{"execution_state": "idle", "last_activity": _iso(now - 60)}]) as server:
        runtime = tmp_path / "runtime"
        runtime.mkdir()
        info = {"port": int(server.url.rsplit(":", 1)[1]), "base_url": "/", "token": "tok-from-file"}
        (tmp_path / "elsewhere.json").write_text(json.dumps(info))
        (runtime / "jpserver-7.json").symlink_to(tmp_path / "elsewhere.json")
        assert guard_signs.jupyter_activity("", now, runtime=[str(runtime)]) == (0, None, None)
        (runtime / "jpserver-7.json").unlink()
        (runtime / "jpserver-7.json").write_text(json.dumps(info))
        busy, age, problem = guard_signs.jupyter_activity("", now, runtime=[str(runtime)])
    assert (busy, problem) == (0, None) and 59 < age <= 60


def test_the_idle_window_counts_from_the_last_jupyter_activity_and_a_running_cell_is_work():
    s, _ = guard.settings({"IMAGEKIT_IDLE_STOP": "30m"})
    g = guard.Guard(s, started=0)
    assert g.step(0, {**IDLE, "jupyter": 1, "jupyter_age": 0.0}, "") is None  # a cell running
    assert g.step(600, {**IDLE, "jupyter_age": 300.0}, "") is None  # it finished at 300, seen at 600
    assert g.step(900, {**IDLE, "jupyter_age": 0.0}, "") is None  # a terminal typed into at 900
    assert g.step(2699, {**IDLE, "jupyter_age": 1799.0}, "") is None
    trigger, _, message = g.step(2700, {**IDLE, "jupyter_age": 1800.0}, "")
    assert trigger == "idle" and "idle for 30m " in message and "last kernel or terminal activity 1800 s ago" in message


@pytest.mark.parametrize("text", ["2026-12-04T21:00:00Z", "2026-12-04T21:00:00.5Z", "2026-12-04T22:00:00+01:00",
                                  "2026-12-04T21:00:00"])  # fmt: skip
def test_jupyter_times_are_read_as_utc(text):
    assert int(guard_signs.iso_time(text)) == 1796418000


@pytest.mark.parametrize("text", [None, 7, "", "yesterday", "2026-13-04T21:00:00Z", "2026-12-04 21:00:00Z"])
def test_a_jupyter_time_that_is_not_one_is_no_activity(text):
    assert guard_signs.iso_time(text) is None


# ---- a process is (boot id, pid, start time) ---------------------------------------------------------------------
def test_a_process_is_its_boot_pid_and_start_time_not_its_pid(tmp_path):
    proc = _proc_tree(tmp_path)
    _process(proc, 42, "python train.py", "/opt/venv/bin/python", 0, start=123456, comm="python")
    me = guard_signs.identity(42, str(proc))
    assert me == f"{BOOT} 42 123456" and guard_signs.same_process(me, str(proc))
    assert not guard_signs.same_process(f"{BOOT} 42 123455", str(proc))  # pid 42 now: another process (a restart)
    assert not guard_signs.same_process(f"{BOOT[:-1]}1 42 123456", str(proc))  # another boot, another host
    assert not guard_signs.same_process(f"{BOOT} 43 123456", str(proc))  # gone
    for garbage in ("", "42", f"{BOOT} 1 1", f"{BOOT} 42 123456 x", f"{BOOT}\n42 123456", f"{BOOT} ٤٢ 123456"):
        assert not guard_signs.same_process(garbage, str(proc)), garbage
    _process(proc, 44, "", "/x", 0, start=9, comm="a) b (c", state="Z")  # a zombie, a name with ) in it
    assert guard_signs.start_time(44, str(proc)) is None


def _stale_run(runs, pid, identity=None, written=None):
    run = runs / "20261204T210000Z-7"
    run.mkdir(parents=True)
    (run / "pid").write_text(f"{pid}\n")
    if identity is not None:
        (run / "identity").write_text(identity + "\n")
    if written is not None:
        os.utime(run / "pid", (written, written))
    return run


@pytest.mark.programs
def test_a_run_whose_pid_now_names_another_process_is_no_job(tmp_path):
    """The container restarted: the run's pid file names a pid that some other process (here: this one) has now."""
    me = guard_signs.identity(os.getpid())
    boot, pid, start = me.split()
    runs = tmp_path / "runs"
    run = _stale_run(runs, pid, identity=f"{boot} {pid} {int(start) + 1}")
    assert not guard_files.a_run_is_alive(str(runs))
    (run / "identity").write_text(me + "\n")
    assert guard_files.a_run_is_alive(str(runs))  # the process it names, still running
    (run / "identity").write_text(f"{boot} {os.getppid()} {start}\n")  # an identity of another pid than the pid file's
    assert not guard_files.a_run_is_alive(str(runs))
    (run / "identity").unlink()  # a run an older `pod run` started: its process started before its pid file
    assert guard_files.a_run_is_alive(str(runs))
    os.utime(run / "pid", (time.time() - 10 * 86400,) * 2)  # written long before this process started: reused
    assert not guard_files.a_run_is_alive(str(runs))


@pytest.mark.programs
def test_the_job_marker_names_the_job_by_its_identity(tmp_path, monkeypatch):
    monkeypatch.setattr(guard_files, "JOB", str(tmp_path / "job"))
    env = {"IMAGEKIT_RUNS": str(tmp_path / "runs")}
    boot, pid, start = guard_signs.identity(os.getpid()).split()
    (tmp_path / "job").write_text(f"{boot} {pid} {int(start) - 1}\n")  # a stale marker: the pid is someone else's
    assert not guard_files.job_running(env)
    (tmp_path / "job").write_text("")  # empty, or garbage
    assert not guard_files.job_running(env)
    (tmp_path / "job").write_text(f"{boot} {pid} {start}\n")
    assert guard_files.job_running(env)


# ---- state that outlives a restart -------------------------------------------------------------------------------
class Crashed(Exception):
    """The container went down (a crash loop), with the guard in it."""


def _live(environ, start, crash_at=None, until=10**6, tick=None):
    """One container start: guard.run on a clock from ``start`` that its sleeps move; at ``crash_at`` it dies."""
    clock = [float(start)]

    def sleep(seconds):
        clock[0] += seconds
        if tick:
            tick(clock[0])
        if (crash_at is not None and clock[0] >= crash_at) or clock[0] > until:
            raise Crashed(clock[0])

    try:
        return guard.run(environ, now=lambda: clock[0], sleep=sleep), clock[0]
    except Crashed:
        return None, clock[0]


@pytest.fixture
def quiet_pod(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(guard_files, "LOG", str(tmp_path / "guard.log"))
    monkeypatch.setattr(guard_files, "BLOCKED", str(tmp_path / "blocked"))
    monkeypatch.setattr(guard_files, "JOB", str(tmp_path / "job"))
    monkeypatch.setattr(guard_signs, "_nvidia_smi", lambda args: "0\n" if "--query-gpu=utilization.gpu" in args else "")
    monkeypatch.setattr(guard, "call", lambda found, action, attempts=None: calls.append(action) or True)
    return calls


def _env(tmp_path, **extra):
    return {**RUNPOD, "IMAGEKIT_HEARTBEAT": str(tmp_path / "heartbeat"), "IMAGEKIT_RUNS": str(tmp_path / "runs"),
            "IMAGEKIT_GUARD_INTERVAL": "30s", **extra}  # fmt: skip


@pytest.mark.seconds
def test_a_crash_looping_container_reaches_its_deadline(quiet_pod, tmp_path):
    env = _env(tmp_path, IMAGEKIT_MAX_RUNTIME="1h")
    t = 0.0
    for _ in range(5):  # each start lives 10 minutes, then the container restarts a minute later
        code, t = _live(env, t, crash_at=t + 600)
        assert code is None and quiet_pod == []
        t += 60
    code, ended = _live(env, t, until=t + 3600)
    assert code == 0 and quiet_pod == ["stop"] and ended == 3600  # an hour after the first start, not the last
    log = (tmp_path / "guard.log").read_text()
    assert "restarted: armed 11m ago, that time already used" in log and "the deadline in 49m" in log
    assert stat.S_IMODE(os.stat(guard_files.STATE_DIR).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(guard_files.STATE_DIR, guard_files.STATE)).st_mode) == 0o600


@pytest.mark.seconds
def test_a_pod_started_again_long_after_or_after_the_guard_ended_it_starts_afresh(quiet_pod, tmp_path):
    env = _env(tmp_path, IMAGEKIT_MAX_RUNTIME="1h")
    assert _live(env, 0, crash_at=1800)[0] is None
    code, ended = _live(env, 1800 + guard_files.RESUME_GAP + 60, until=10**5)  # stopped by hand, started the next day
    assert code == 0 and ended == 1800 + guard_files.RESUME_GAP + 60 + 3600
    code, ended = _live(env, ended + 5, until=10**5)  # the guard stopped it; started again at once
    assert code == 0 and quiet_pod == ["stop", "stop"]
    assert "a new start: the last start's guard ended the pod" in (tmp_path / "guard.log").read_text()


@pytest.mark.seconds
def test_a_restarted_blocked_pod_keeps_the_blockers_first_sighting(quiet_pod, tmp_path, monkeypatch):
    (tmp_path / "blocked").write_text("==== imagekit ====\nFAIL cpu-fallback: torch sees no GPU\n")
    open(guard_files.CHECKED, "w").close()
    env = _env(tmp_path, IMAGEKIT_ON_BLOCKER="stop", IMAGEKIT_BLOCKER_GRACE="20m")
    assert _live(env, 0, crash_at=900)[0] is None  # blocked from 0, the container dies at 15m
    os.unlink(guard_files.CHECKED)
    os.unlink(tmp_path / "blocked")  # the new start's check is running: no banner yet

    def check_done(now):
        if now >= 1000:
            (tmp_path / "blocked").write_text("==== imagekit ====\nFAIL cpu-fallback: torch sees no GPU\n")
            open(guard_files.CHECKED, "w").close()

    code, ended = _live(env, 960, until=10**5, tick=check_done)
    assert code == 0 and quiet_pod == ["stop"] and ended == 1200  # 20m after it was first seen blocked


@pytest.mark.seconds
def test_a_stop_the_api_never_took_is_not_an_end_a_restart_keeps_the_deadline(quiet_pod, tmp_path, monkeypatch):
    """The control plane down when the deadline fires, and the container restarts meanwhile: the next start is a
    restart (the deadline long past, it fires again at once), not a new start with a new deadline."""
    monkeypatch.setattr(guard, "call", lambda found, action, attempts=None: quiet_pod.append("refused") and False)
    env = _env(tmp_path, IMAGEKIT_MAX_RUNTIME="10m")
    assert _live(env, 0, until=10**5) == (1, 600)
    monkeypatch.setattr(guard, "call", lambda found, action, attempts=None: quiet_pod.append(action) or True)
    assert _live(env, 700, until=10**5) == (0, 700) and quiet_pod == ["refused", "stop"]


@pytest.mark.programs
def test_a_non_root_workload_cannot_delete_the_guards_state(quiet_pod, tmp_path, guard_sees_only_the_test):
    if os.geteuid() != 0:
        pytest.skip("needs root, as the guard runs")
    env = _env(tmp_path, IMAGEKIT_MAX_RUNTIME="1h")
    assert _live(env, 0, crash_at=600)[0] is None
    folder, workspace = guard_sees_only_the_test, guard_sees_only_the_test / "workspace"
    for above in (folder.parent.parent, folder.parent, folder, workspace):
        os.chmod(above, 0o755)  # the path down to the state can be walked by anyone, as /workspace can
    state = os.path.join(guard_files.STATE_DIR, guard_files.STATE)
    attack = (f"import os, shutil; os.setgid(65534); os.setuid(65534)\n"
              f"for f in (lambda: os.unlink({state!r}), lambda: shutil.rmtree({guard_files.STATE_DIR!r}),\n"
              f"          lambda: os.rename({guard_files.STATE_DIR!r}, {guard_files.STATE_DIR + '.old'!r})):\n"
              f"    try: f(); print('done')\n"
              f"    except OSError as exc: print(type(exc).__name__)\n")  # fmt: skip
    res = subprocess.run([sys.executable, "-I", "-c", attack], capture_output=True, text=True)
    assert res.stdout.split() == ["PermissionError"] * 3, res.stdout + res.stderr
    code, ended = _live(env, 660, until=10**5)
    assert code == 0 and ended == 3600


@pytest.mark.seconds
def test_state_under_a_folder_other_users_can_change_is_kept_on_the_containers_disk(quiet_pod, tmp_path):
    imagekit = os.path.dirname(guard_files.STATE_DIR)
    os.makedirs(imagekit)
    os.chown(imagekit, 1000, 1000)  # /workspace/.imagekit made by a non-root user: they could rename guard/ away
    env = _env(tmp_path, IMAGEKIT_MAX_RUNTIME="1h")
    assert _live(env, 0, crash_at=600)[0] is None
    assert not os.path.exists(guard_files.STATE_DIR) or not os.listdir(guard_files.STATE_DIR)
    assert os.path.isfile(os.path.join(guard_files.STATE_FALLBACK, guard_files.STATE))
    assert _live(env, 660, until=10**5) == (0, 3600)


# ---- the CPU-fallback watchdog in pod mode -----------------------------------------------------------------------
def _burning(t, percent=380.0, comm="python"):
    """A sample at ``t``: one process that used ``percent`` % of a core since t=0, GPUs idle."""
    return {**IDLE, "cpu": {"4242 777": [int(t * percent / 100 * guard_signs.CLK_TCK), comm], "99 5": [0, "bash"]}}


def test_a_process_on_the_cpu_while_every_gpu_idles_is_a_warning_then_a_stop_only_when_asked():
    s, _ = guard.settings({"IMAGEKIT_REQUIRE_GPU": "1", "IMAGEKIT_MAX_RUNTIME": "1d"})
    g = guard.Guard(s, started=0)
    for t in range(0, 4 * 3600, 30):
        assert g.step(t, _burning(t), "") is None
        if t == 600:  # seen burning at t=30, since the look before
            assert len(g.warnings) == 1 and "process 4242 (python) used 380 % CPU for 10m " in g.warnings[0]
            assert "GPU utilisation 0 %" in g.banner and "training on the CPU at GPU rates?" in g.banner
        else:
            assert g.warnings == [], t
    s, _ = guard.settings({"IMAGEKIT_REQUIRE_GPU": "1", "IMAGEKIT_GPU_IDLE_STOP": "30m"})
    g = guard.Guard(s, started=0)
    fired = next(f for t in range(0, 7200, 30) if (f := g.step(t, _burning(t), "")))
    assert fired[:2] == ("cpu-fallback", "stop") and "for 30m" in fired[2]


@pytest.mark.parametrize(
    ("env", "sample", "blocked"),
    [
        ({}, {"gpu_util": None}, ""),  # a CPU pod: no GPU expected, none there
        ({"IMAGEKIT_REQUIRE_GPU": "1"}, {"gpu_util": [0, 97]}, ""),  # one GPU works
        ({"IMAGEKIT_REQUIRE_GPU": "1"}, {"comm": "cc1plus"}, ""),  # a build (flash-attn from source)
        ({"IMAGEKIT_REQUIRE_GPU": "1"}, {"percent": 40.0}, ""),  # a download, an unzip: not a core's worth
    ],
)
def test_no_cpu_fallback_warning_where_nothing_is_wrong(env, sample, blocked):
    s, _ = guard.settings({**env, "IMAGEKIT_GPU_IDLE_STOP": "30m"})
    g = guard.Guard(s, started=0)
    for t in range(0, 2 * 3600, 30):
        look = _burning(t, sample.get("percent", 380.0), sample.get("comm", "python"))
        look["gpu_util"] = sample.get("gpu_util", look["gpu_util"])
        assert g.step(t, look, blocked) is None and g.warnings == [], t


def test_a_gpu_less_pod_whose_start_check_found_no_gpu_is_watched():
    s, _ = guard.settings({"IMAGEKIT_GPU_IDLE_STOP": "30m"})
    g = guard.Guard(s, started=0)
    blocked = "FAIL cpu-fallback: a GPU is required but torch sees none"
    t, fired = next((t, f) for t in range(0, 7200, 30) if (f := g.step(t, {**_burning(t), "gpu_util": None}, blocked)))
    assert t == 1800 and fired[0] == "cpu-fallback" and "no GPU answers nvidia-smi" in fired[2]
    g = guard.Guard(s, started=0)  # the same pod, the start check content: nothing expects a GPU
    assert all(g.step(t, {**_burning(t), "gpu_util": None}, "") is None for t in range(0, 7200, 30))


@pytest.mark.programs
def test_a_real_busy_process_is_seen_with_its_cpu_share(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:  # read until it has used 0.2 s more (a second on a quiet core; longer where the machine is busy)
        time.sleep(0.3)
        before = guard_signs.cpu_times("/proc")
        key = next(k for k in before if k.split()[0] == str(busy.pid))  # "PID START_TIME"
        deadline, used = time.monotonic() + 30, 0.0
        while used <= 0.2 and time.monotonic() < deadline:
            time.sleep(0.5)
            after = guard_signs.cpu_times("/proc")
            used = (after[key][0] - before[key][0]) / guard_signs.CLK_TCK
    finally:
        busy.kill()
        busy.wait()
    assert used > 0.2 and after[key][1].startswith("python") and str(os.getpid()) not in [k.split()[0] for k in after]


@pytest.mark.seconds
def test_the_warning_reaches_the_login_banner_and_leaves_it_when_the_process_stops(quiet_pod, tmp_path, monkeypatch):
    ticks = {"n": 0}

    def process_usage():
        return {"4242 777": [ticks["n"], 0, "python", ticks["n"]]}

    monkeypatch.setattr(guard_signs, "process_usage", process_usage)

    def burn(now):
        ticks["n"] = int(now * 2 * guard_signs.CLK_TCK) if now < 1800 else ticks["n"]  # 200 % until 30m, then done

    env = _env(tmp_path, IMAGEKIT_REQUIRE_GPU="1", IMAGEKIT_MAX_RUNTIME="1h")
    shown = []
    _live(env, 0, until=10**5, tick=lambda now: (burn(now), shown.append(os.path.exists(guard_files.WARNING))))
    assert shown.index(True) in range(20, 23) and not shown[-1]
    log = (tmp_path / "guard.log").read_text()
    assert "warning: process 4242 (python) used 200 % CPU for 10m" in log and quiet_pod == ["stop"]  # the deadline


@pytest.mark.programs
def test_job_mode_marks_its_job_by_the_jobs_identity(tmp_path, monkeypatch):
    """podstart's on-exit job mode writes the job's (boot id, pid, start time), not an empty marker a restart
    leaves behind (/run is the container's own disk: it survives a restart)."""
    from imagekit.in_image import podstart

    monkeypatch.setattr(podstart, "STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(guard_files, "JOB", str(tmp_path / "state" / "job"))
    monkeypatch.setattr(guard_files, "LOG", str(tmp_path / "guard.log"))
    monkeypatch.setattr(podstart, "stay_up", lambda: None)  # in the image it never returns: the guard ends the pod
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    seen = tmp_path / "seen"
    script = f"sleep 0.5; cat {guard_files.JOB} >{seen}; echo $$ >>{seen}"
    try:
        code = podstart.run_then_end(["sh", "-c", script], {}, guard, guard.settings({"IMAGEKIT_ON_EXIT": "stop"})[0])
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    marker, pid = seen.read_text().splitlines()
    assert code == 0 and marker.split()[0] == guard_signs.boot_id() and marker.split()[1] == pid
    assert not os.path.exists(guard_files.JOB)


# ---- a job counts while it makes progress: a download, a pip install, a checkpoint written; a stalled one does not


def _job_usage(ticks=0, moved=0):
    return {**IDLE, "job_usage": {"4242 777": [ticks, moved]}}


@pytest.mark.parametrize(
    ("per_look", "counts"),
    [
        ((0, 0), False),  # asleep, blocked on a dead peer: stalled
        ((30, 0), False),  # 300 ms of CPU in 30 s (1 %): a loop polling a dead peer, starting a program each time
        ((0, 30 * 1024), False),  # 1 kB/s written: a log line now and then
        ((150, 0), True),  # 5 % of a core: unpacking, hashing
        ((0, 30 * 8192), True),  # 8 kB/s written: a download on a slow link
    ],
)
def test_a_job_counts_as_work_while_it_makes_progress(per_look, counts):
    s, _ = guard.settings({"IMAGEKIT_IDLE_STOP": "30m"})
    g = guard.Guard(s, started=0)
    ticks, moved = per_look
    scale = guard_signs.CLK_TCK / 100  # the ticks above are at 100 a second
    looks = range(0, 7200, 30)
    fired = [g.step(t, _job_usage(int(t // 30 * ticks * scale), t // 30 * moved), "") for t in looks]
    stop = next((t for t, f in zip(looks, fired, strict=True) if f), None)
    assert (stop is None) == counts, stop
    if not counts:
        assert stop == 1830 and "no progress (stalled?)" in next(f for f in fired if f)[2]


def test_a_job_that_stalls_is_idle_a_window_after_its_last_progress():
    s, _ = guard.settings({"IMAGEKIT_IDLE_STOP": "30m"})
    g = guard.Guard(s, started=0)
    work = lambda t: min(t, 3600) * guard_signs.CLK_TCK  # noqa: E731 -- 100 % of a core for an hour, then nothing
    stop = next(t for t in range(0, 10800, 30) if g.step(t, _job_usage(work(t)), ""))
    assert 3600 + 1800 <= stop <= 3600 + 1800 + 60


def test_no_job_and_a_new_job_are_told_apart():
    s, _ = guard.settings({"IMAGEKIT_IDLE_STOP": "30m"})
    g = guard.Guard(s, started=0)
    assert g._job(0, None) is None
    assert g._job(30, {"1 2": [0, 0]}) == (True, "a job started since the last look")
    assert g._job(60, {"1 2": [0, 0]})[0] is False
    assert (
        g._job(90, {"1 2": [0, 0], "3 4": [50 * guard_signs.CLK_TCK, 0]})[0] is True
    )  # a new child: all its time counts


@pytest.mark.programs
def test_the_usage_of_a_job_is_its_whole_process_tree_read_from_proc(tmp_path):
    """A real tree: a shell whose child burns CPU and whose other child writes a file; the shell's own line, its
    children's, and a finished child's time kept in its parent's (cutime)."""
    out = tmp_path / "data"
    script = (
        f"{sys.executable} -c 'import time; t=time.process_time()\nwhile time.process_time()-t<0.6: pass'; "
        f'{sys.executable} -c \'import time\nf=open("{out}","wb")\nfor _ in range(50): f.write(bytes(65536)); '
        "f.flush(); time.sleep(0.01)\ntime.sleep(60)' & sleep 60"
    )
    job = subprocess.Popen(["sh", "-c", script], start_new_session=True)  # its tree ends with it, below
    try:  # read once the burner has ended (0.6 s of CPU, however long a busy machine takes) and the writer wrote
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (out.exists() and out.stat().st_size >= 50 * 65536):
            time.sleep(0.05)
        usage = guard_signs.tree_usage([job.pid])
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    assert str(job.pid) in [k.split()[0] for k in usage]
    assert len(usage) >= 3  # the shell, the writer, sleep
    ticks = sum(v[0] for v in usage.values())
    moved = sum(v[1] for v in usage.values())
    assert ticks >= 0.4 * guard_signs.CLK_TCK  # the finished burner's 0.6 s, kept in the shell's cutime
    assert 50 * 65536 <= moved < 60 * 65536  # the writer's wchar; no reads (every new program reads its libraries)
    assert guard_signs.tree_usage([]) == {} and guard_signs.tree_usage([2**22 + 17]) == {}


@pytest.mark.programs
def test_a_pod_run_and_a_job_mode_command_are_the_jobs_whose_trees_are_read(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    run = runs / "20261204T000000Z-1"
    run.mkdir(parents=True)
    child = subprocess.Popen(["sleep", "30"])
    try:
        (run / "pid").write_text(f"{child.pid}\n")
        (run / "identity").write_text(guard_signs.identity(child.pid) + "\n")
        monkeypatch.setattr(guard_files, "JOB", str(tmp_path / "job"))
        (tmp_path / "job").write_text(guard_signs.identity(os.getpid()) + "\n")
        assert guard_files.job_pids({"IMAGEKIT_RUNS": str(runs)}) == [os.getpid(), child.pid]
        (run / "exit").write_text("0\n")
        assert guard_files.job_pids({"IMAGEKIT_RUNS": str(runs)}) == [os.getpid()]
    finally:
        child.kill()
        child.wait()


@pytest.mark.programs
def test_a_job_mode_command_without_on_exit_is_the_job_too(tmp_path):
    """Without IMAGEKIT_ON_EXIT the command replaces the entrypoint's process (exec): the marker written just before
    names it, since exec keeps the pid and the start time; the guard counts it as the job."""
    seen = tmp_path / "seen"
    child = (
        "import sys; from imagekit.in_image import guard, guard_files, podstart; sys.modules['guard'] = guard; "
        f"podstart.STATE_DIR = {str(tmp_path)!r}; guard_files.JOB = {str(tmp_path / 'job')!r}; "
        f"podstart.job(['sh', '-c', 'cat {tmp_path / 'job'} >{seen}; echo $$ >>{seen}'], "
        "{'IMAGEKIT_SKIP_DOCTOR': '1'})"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    marker, pid = seen.read_text().splitlines()
    assert marker.split()[:2] == [guard_signs.boot_id(), pid]


@pytest.mark.programs
@pytest.mark.parametrize(
    "loop",
    [
        "while true; do sleep 1; done",  # a shell waiting for ever
        "until false; do sleep 0.5; done",
        f"while ! {sys.executable} -c 'import sys; sys.exit(1)'; do sleep 3; done",  # polling a dead peer with python
    ],
)
def test_a_job_polling_for_ever_is_stalled_not_progress(loop):
    """Every program a polling loop starts reads its libraries (rchar) and uses a little CPU: not progress."""
    s, _ = guard.settings({"IMAGEKIT_IDLE_STOP": "30m"})
    g = guard.Guard(s, started=0)
    job = subprocess.Popen(["sh", "-c", loop])
    try:
        time.sleep(0.5)
        g._job(0, guard_signs.tree_usage([job.pid]))
        time.sleep(6)
        progress, text = g._job(6, guard_signs.tree_usage([job.pid]))
    finally:
        job.kill()
        job.wait()
    assert progress is False and "no progress (stalled?)" in text, text
