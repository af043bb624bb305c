"""The lifetime guard (imagekit/in_image/guard.py): its settings, its triggers over time, and its calls to a
provider's API, served by a loopback stand-in of RunPod's and Vast's (the real image runs it in test_pod_e2e.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from imagekit.in_image import facts, guard, guard_files
from tests import hostile_http

KEY = "rpa_SECRETKEY0123456789"


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch, tmp_path):
    """Retries a hundredth of a second apart, and the guard's log file in this test's folder."""
    monkeypatch.setattr(guard, "RETRY_PAUSE", 0.01)
    monkeypatch.setattr(guard_files, "LOG", str(tmp_path / "guard.log"))


RUNPOD = {"RUNPOD_POD_ID": "abc123xyz", "RUNPOD_API_KEY": KEY}
VAST_API = facts.provider_named("vast").api


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("6h", 21600), ("1d", 86400), ("45", 45)])
def test_durations_read_as_the_templates_write_them(text, seconds):
    assert guard.parse_duration(text, "X") == seconds
    assert guard.say(seconds) in (text, f"{seconds}s", "1m30s")


@pytest.mark.parametrize("text", ["", "6 hours", "-5m", "1.5h", "10w", "99999999s"])
def test_a_duration_that_is_not_one_is_refused_by_name(text):
    with pytest.raises(guard.GuardError, match=r"IMAGEKIT_IDLE_STOP=.* is not a duration"):
        guard.parse_duration(text, "IMAGEKIT_IDLE_STOP")


@pytest.mark.parametrize("text", ["0", "0s", "00m"])
def test_a_zero_duration_is_named_as_no_time_not_as_garbage(text):
    with pytest.raises(guard.GuardError, match=r"is no time at all.*leave it unset"):
        guard.parse_duration(text, "IMAGEKIT_IDLE_STOP")


def test_the_guard_is_off_unless_asked_and_a_bad_value_disarms_only_its_trigger():
    s, problems = guard.settings({})
    assert not guard.armed(s) and problems == []
    s, problems = guard.settings(
        {"IMAGEKIT_MAX_RUNTIME": "6h", "IMAGEKIT_IDLE_STOP": "soon", "IMAGEKIT_ON_EXIT": "halt",
         "IMAGEKIT_IDLE_GPU_UTIL": "150", "IMAGEKIT_OUTPUTS": "/workspace/out::/workspace/model.pt"}
    )  # fmt: skip
    assert guard.armed(s) and s["max_runtime"] == 21600 and s["idle_stop"] is None and s["on_exit"] is None
    assert s["outputs"] == ["/workspace/out", "/workspace/model.pt"] and s["gpu_util"] == 5
    assert [p.split("=")[0] for p in problems] == ["IMAGEKIT_IDLE_STOP", "IMAGEKIT_ON_EXIT", "IMAGEKIT_IDLE_GPU_UTIL"]
    assert guard.settings({"IMAGEKIT_ON_BLOCKER": "terminate"})[0]["blocker_grace"] == 900  # 15 minutes to look


def test_each_provider_and_action_is_its_documented_request():
    rp = guard.provider({**RUNPOD, "IMAGEKIT_RUNPOD_API": "http://x/v2/"})  # RunPod's REST v2 (v1 retired 2026-11-15)
    assert guard.request(rp, "stop") == ("POST", "http://x/v2/pods/abc123xyz/action", {"action": "stop"})
    assert guard.request(rp, "terminate") == ("POST", "http://x/v2/pods/abc123xyz/action", {"action": "terminate"})
    assert guard.request(rp, "start") == ("POST", "http://x/v2/pods/abc123xyz/action", {"action": "start"})
    vast = guard.provider({"CONTAINER_ID": "4242", "CONTAINER_API_KEY": "k"})
    assert vast[:3] == ("vast", VAST_API, "4242")
    assert guard.request(vast, "stop") == ("PUT", f"{VAST_API}/instances/4242/", {"state": "stopped"})
    assert guard.request(vast, "terminate") == ("DELETE", f"{VAST_API}/instances/4242/", None)
    assert guard.request(vast, "start") == ("PUT", f"{VAST_API}/instances/4242/", {"state": "running"})
    assert guard.provider({"RUNPOD_POD_ID": "abc"}) is None  # no key: nothing can end the pod
    with pytest.raises(guard.GuardError, match="not a pod id"):
        guard.provider({**RUNPOD, "RUNPOD_POD_ID": "../../users"})
    with pytest.raises(guard.GuardError, match="RUNPOD_API_KEY has characters"):
        guard.provider({**RUNPOD, "RUNPOD_API_KEY": "k\r\nX-Evil: 1"})
    with pytest.raises(guard.GuardError, match="RUNPOD_API_KEY is longer than 4096 characters"):
        guard.provider({**RUNPOD, "RUNPOD_API_KEY": "k" * 5000})


IDLE = {"gpu_util": [0, 3], "gpu_procs": 0, "ssh": 0, "jupyter": 0, "heartbeat_age": None}


@pytest.mark.parametrize(
    ("change", "busy"),
    [
        ({}, None),
        ({"gpu_util": [0, 40]}, "GPU utilisation 0/40 %"),
        ({"gpu_procs": 1}, "1 GPU compute process"),
        ({"ssh": 1}, None),  # logged in, at a prompt: a session counts by its input, and what runs in it
        ({"ssh": 1, "ssh_input": [30.0]}, "input at an SSH terminal 30 s ago"),
        ({"progress": ["process 7 (python) used 80 % CPU and wrote 0 B/s since the last look"]}, "process 7 (python)"),
        ({"progress": []}, None),
        ({"jupyter": 2}, "2 Jupyter kernel(s) running a cell"),
        ({"jupyter_age": 30.0}, "Jupyter activity 30 s ago"),
        ({"connections": 3}, None),  # held open, logged in or not: a connection is not a session
        ({"heartbeat_age": 12.0}, "heartbeat 12 s ago"),
    ],
)
def test_idle_means_every_sign_of_work_is_absent(change, busy):
    idle, lines = guard.idle_reasons({**IDLE, **change}, 5, 600)
    assert idle == (busy is None)
    if busy:
        assert any(busy in line for line in lines)
    elif not change:  # the evidence a stop's log line gives: each sign, as read
        assert lines == ["GPU utilisation 0/3 % (threshold 5 %)", "0 GPU compute process(es)",
                         "0 SSH session(s) logged in", "0 Jupyter kernel(s) running a cell",
                         "Jupyter: no kernel or terminal", "heartbeat never touched"]  # fmt: skip


def test_idle_stop_fires_after_a_whole_idle_window_and_any_work_restarts_it():
    s, _ = guard.settings({"IMAGEKIT_IDLE_STOP": "30m", "IMAGEKIT_GUARD_ACTION": "terminate"})
    g = guard.Guard(s, started=0)
    assert g.step(0, IDLE, "") is None and g.step(1700, IDLE, "") is None
    assert g.step(1750, {**IDLE, "ssh": 1, "ssh_input": [0.0]}, "") is None  # someone typed: the window starts again
    assert g.step(1760, IDLE, "") is None and g.step(1750 + 1799, IDLE, "") is None  # logged out: the input counts
    trigger, action, message = g.step(1750 + 1800, IDLE, "")
    assert (trigger, action) == ("idle", "terminate") and "idle for 30m" in message and "0 SSH" in message


def test_the_deadline_fires_first_whatever_else_is_going_on():
    s, _ = guard.settings({"IMAGEKIT_MAX_RUNTIME": "6h", "IMAGEKIT_IDLE_STOP": "30m"})
    g = guard.Guard(s, started=100)
    assert g.step(100 + 21599, {**IDLE, "gpu_procs": 3}, "") is None
    assert g.step(100 + 21600, {**IDLE, "gpu_procs": 3}, "")[:2] == ("deadline", "stop")


def test_a_blocker_ends_the_pod_only_if_it_outlasts_the_grace():
    s, _ = guard.settings({"IMAGEKIT_ON_BLOCKER": "stop", "IMAGEKIT_BLOCKER_GRACE": "15m"})
    g = guard.Guard(s, started=0)
    assert g.step(0, IDLE, "no GPU: torch sees none") is None
    assert g.step(600, IDLE, "") is None  # fixed in the meantime
    assert g.step(700, IDLE, "no GPU: torch sees none") is None and g.step(700 + 899, IDLE, "x") is None
    trigger, action, message = g.step(700 + 900, IDLE, "no GPU: torch sees none")
    assert (trigger, action) == ("blocker", "stop") and "blocked for 15m" in message and "no GPU" in message


def test_a_job_on_a_quiet_gpu_is_a_warning_once_with_the_evidence_and_never_a_stop():
    s, _ = guard.settings({"IMAGEKIT_MAX_RUNTIME": "1d", "IMAGEKIT_GPU_IDLE_WARN": "10m"})
    g = guard.Guard(s, started=0)
    quiet = {**IDLE, "gpu_util": [2], "gpu_procs": 1}
    assert g.step(0, quiet, "", job_running=True) is None and g.warnings == []
    assert g.step(600, quiet, "", job_running=True) is None
    assert g.warnings and "at or under 5 % for 10m" in g.warnings[0] and "(GPU utilisation 2 %)" in g.warnings[0]
    g.step(700, quiet, "", job_running=True)
    assert g.warnings == []  # said once


def test_a_job_on_a_quiet_gpu_ends_the_pod_only_when_asked():
    s, _ = guard.settings({"IMAGEKIT_GPU_IDLE_STOP": "30m"})
    assert guard.armed(s) and not guard.armed(guard.settings({"IMAGEKIT_GPU_IDLE_WARN": "10m"})[0])
    g = guard.Guard(s, started=0)
    quiet = {**IDLE, "gpu_util": [0], "gpu_procs": 1}  # a process holds the GPU, computing nothing
    assert g.step(0, quiet, "", job_running=True) is None and g.step(1799, quiet, "", job_running=True) is None
    trigger, action, message = g.step(1800, quiet, "", job_running=True)
    assert (trigger, action) == ("gpu-idle", "stop") and "IMAGEKIT_GPU_IDLE_STOP=30m" in message
    assert "(GPU utilisation 0 %)" in message
    busy = guard.Guard(s, started=0)
    busy.step(0, quiet, "", job_running=True)
    busy.step(1000, {**quiet, "gpu_util": [80]}, "", job_running=True)  # work restarts the window
    assert busy.step(1800, quiet, "", job_running=True) is None
    assert guard.Guard(s, started=0).step(9999, quiet, "", job_running=False) is None  # no job: not this trigger


@pytest.mark.programs
def test_a_run_imagekit_pod_run_started_counts_as_a_job_while_its_process_lives(tmp_path):
    run = tmp_path / "20261202T180000Z-42"
    run.mkdir()
    assert not guard_files.a_run_is_alive(str(tmp_path)) and not guard_files.a_run_is_alive(str(tmp_path / "none"))
    (run / "pid").write_text(f"{os.getpid()}\n")
    assert guard_files.a_run_is_alive(str(tmp_path))
    (run / "exit").write_text("0\n")
    assert not guard_files.a_run_is_alive(str(tmp_path))  # it ended
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    other = tmp_path / "20261202T180100Z-43"
    other.mkdir()
    (other / "pid").write_text(str(gone.pid))
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "pid").write_text("not a pid")
    assert not guard_files.a_run_is_alive(str(tmp_path))  # killed with the pod's processes, or garbage: not running


def _provider_env(api, **extra):
    return {**RUNPOD, "IMAGEKIT_RUNPOD_API": f"{api.url}/v2", **extra}


@pytest.mark.loopback
def test_the_call_carries_the_key_in_a_header_only_and_retries_until_the_api_answers(capsys, tmp_path, monkeypatch):
    answers = iter([(503, {}, b"busy"), (500, {}, KEY.encode())])

    def route(_seen):
        return next(answers, (200, {}, b"{}"))

    with hostile_http.serve({"/v2/pods/abc123xyz/action": route}) as api:
        env = _provider_env(api)
        s, _ = guard.settings(env)
        assert guard.act(env, s, "deadline", "stop", "IMAGEKIT_MAX_RUNTIME=6h reached", attempts=None) is True
    assert [(x.method, x.path) for x in api.seen] == [("POST", "/v2/pods/abc123xyz/action")] * 3
    assert {json.loads(x.body)["action"] for x in api.seen} == {"stop"}
    assert api.auth_seen() == [f"Bearer {KEY}"] * 3
    err = capsys.readouterr().err + (tmp_path / "guard.log").read_text()
    assert "HTTP 503 (try 1)" in err and "HTTP 500 (try 2)" in err and "HTTP 200" in err
    assert KEY not in err and oct((tmp_path / "guard.log").stat().st_mode & 0o777) == "0o600"


@pytest.mark.loopback
def test_the_guard_never_follows_a_redirect_with_the_key(capsys):
    with hostile_http.serve() as elsewhere:
        redirect = hostile_http.redirect(f"{elsewhere.url}/steal")
        with hostile_http.serve({"/v2/pods/abc123xyz/action": redirect}) as api:
            env = _provider_env(api)
            s, _ = guard.settings(env)
            assert guard.act(env, s, "exit", "terminate", "the job exited 0", attempts=2) is False
    assert elsewhere.seen == [] and "HTTP 302" in capsys.readouterr().err


@pytest.mark.loopback
def test_without_credentials_or_in_a_dry_run_nothing_is_sent_and_the_log_says_so(capsys):
    s, _ = guard.settings({})
    assert guard.act({}, s, "idle", "stop", "idle for 30m") is False
    assert "keeps billing until you stop it" in capsys.readouterr().err
    with hostile_http.serve() as api:
        env = _provider_env(api, IMAGEKIT_GUARD_DRY_RUN="1")
        s, _ = guard.settings(env)
        assert guard.act(env, s, "idle", "terminate", "idle for 30m") is True
    said = capsys.readouterr().err
    assert api.seen == [] and f'would send POST {api.url}/v2/pods/abc123xyz/action {{"action": "terminate"}}' in said


@pytest.mark.loopback
def test_the_loop_arms_samples_and_ends_the_pod_at_the_deadline(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(guard_files, "BLOCKED", str(tmp_path / "absent"))
    clock = [1000.0]

    def sleep(seconds):
        clock[0] += seconds

    with hostile_http.serve({"/v2/pods/abc123xyz/action": (200, {}, b"{}")}) as api:
        env = _provider_env(api, IMAGEKIT_MAX_RUNTIME="2m", IMAGEKIT_GUARD_INTERVAL="30s")
        assert guard.run(env, now=lambda: clock[0], sleep=sleep) == 0
    assert clock[0] == 1120.0 and [x.method for x in api.seen] == ["POST"]
    err = capsys.readouterr().err
    assert "armed: deadline in 2m (action: stop; runpod pod abc123xyz)" in err
    assert "deadline: IMAGEKIT_MAX_RUNTIME=2m reached; action: stop" in err


def test_outputs_are_checksummed_beside_themselves_and_a_missing_one_says_which(tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "a.bin").write_bytes(b"a")
    (out / "sub" / "b.bin").write_bytes(b"b")
    model = tmp_path / "model.pt"
    model.write_bytes(b"weights")
    ok, lines = guard_files.checksum_outputs([str(out), str(model)])
    assert ok and "2 file(s)" in lines[0]
    check = subprocess.run(["sha256sum", "-c", "out.sha256", "model.pt.sha256"], cwd=tmp_path, capture_output=True)
    assert check.returncode == 0 and check.stdout.count(b": OK") == 3
    ok, lines = guard_files.checksum_outputs([str(out), str(tmp_path / "missing.pt")])
    assert not ok and lines == [f"declared output {tmp_path / 'missing.pt'} does not exist"]


@pytest.mark.programs
def test_the_program_runs_by_itself_under_python_3_8_rules(tmp_path):
    """As the image runs it: a file of its own, standard library only, off when nothing is asked."""
    res = subprocess.run(
        [sys.executable, "-I", guard.__file__], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True
    )
    assert res.returncode == 0 and res.stderr == ""
    assert json.loads(json.dumps(guard.settings({})[0]))["action"] == "stop"
