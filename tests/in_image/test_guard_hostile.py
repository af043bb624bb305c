"""The lifetime guard (and the start logic that calls it) against what another user of the pod, or a bad setting, can
put in its way: links planted where it writes or reads as root, FIFOs and `/dev/zero` among the files it reads,
credentials in the API's URL, values no setting can take. Each read that could block or never end runs in a child
process with a deadline and a memory ceiling, so a hang fails the test in seconds instead of hanging the suite."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from imagekit.in_image import guard, guard_files
from tests import hostile_http
from tests.conftest import ROOT

GUARD = ROOT / "imagekit" / "in_image" / "guard.py"
PODSTART = ROOT / "imagekit" / "in_image" / "podstart.py"
DOCTOR = ROOT / "imagekit" / "in_image" / "imagekit_doctor.py"
KEY = "rpa_SECRETKEY0123456789"
RUNPOD = {"RUNPOD_POD_ID": "abc123xyz", "RUNPOD_API_KEY": KEY}
DEADLINE_S = 10


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch, tmp_path):
    monkeypatch.setattr(guard, "RETRY_PAUSE", 0.01)
    monkeypatch.setattr(guard_files, "LOG", str(tmp_path / "guard.log"))


# A child that imports the guard, sets some of its module constants, evaluates one expression and prints its JSON:
# at most 1 GiB of memory (an unbounded read of /dev/zero is a MemoryError, not a swapped machine) and DEADLINE_S.
# The child sees what conftest.guard_sees_only_the_test lets an in-process test see: no SSH sessions, Jupyter servers,
# terminals or processes of the machine's (another test worker's sshd typed at a terminal 0 s before a sample once)
_CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from imagekit.in_image import guard, guard_files, guard_signs
guard_signs.SSHD_EXES, guard_signs.JUPYTER_RUNTIME, guard_signs.DEV = (), (), "/nonexistent/imagekit-test-dev"
real_usage = guard_signs.process_usage
guard_signs.process_usage = lambda proc=None: {} if proc is None else real_usage(proc)
for name, value in json.loads(sys.argv[1]).items():
    owner = next((m for m in (guard_files, guard_signs, guard) if hasattr(m, name)), None)
    assert owner is not None, f"the guard has no {name} to point elsewhere"
    setattr(owner, name, value)
print(json.dumps(eval(sys.argv[2], {"guard": guard, "guard_files": guard_files, "guard_signs": guard_signs})))
"""


def in_child(expression: str, **constants: object) -> object:
    try:
        res = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(constants), expression],
            cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"{expression} did not return in {DEADLINE_S} s (it blocks, or reads without end)")
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.splitlines()[-1])


def _fifo(path):
    os.mkfifo(path)
    return path


def _zero(path):
    path.symlink_to("/dev/zero")
    return path


def _link_to(target):
    def plant(path):
        path.symlink_to(target)
        return path

    return plant


# ---- 1. what the guard writes as root: never through a planted link ------------------------------------------------
def test_a_link_planted_at_the_temporary_name_is_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    model = tmp_path / "model.pt"
    model.write_bytes(b"weights")
    (tmp_path / f"model.pt.sha256.{os.getpid()}.tmp").symlink_to(victim)  # the name the guard used to write
    (tmp_path / "model.pt.sha256").symlink_to(victim)  # and the manifest's own name
    ok, lines = guard_files.checksum_outputs([str(model)])
    assert victim.read_text() == "precious\n"
    assert ok, lines
    manifest = tmp_path / "model.pt.sha256"
    assert not manifest.is_symlink() and manifest.read_text() == f"{hashlib.sha256(b'weights').hexdigest()}  model.pt\n"
    assert oct(manifest.stat().st_mode & 0o777) == "0o644"  # readable by the user who copies the outputs off
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"model.pt.sha256.{os.getpid()}.tmp", "model.pt", "model.pt.sha256", "victim"]
    )  # no temporary file left


def test_a_declared_output_that_is_a_link_is_refused_and_the_log_says_why(tmp_path, capsys):
    secret = tmp_path / "secret"
    secret.write_text("root's own\n")
    (tmp_path / "model.pt").symlink_to(secret)
    ok, lines = guard_files.checksum_outputs([str(tmp_path / "model.pt")])
    assert not ok and len(lines) == 1
    assert "symbolic link" in lines[0] and "not followed" in lines[0], lines
    assert not (tmp_path / "model.pt.sha256").exists()
    code = guard.after_run({"IMAGEKIT_ON_EXIT": "stop", "IMAGEKIT_OUTPUTS": str(tmp_path / "model.pt")}, 0)
    err = capsys.readouterr().err
    assert code == 1 and "symbolic link" in err and "will not end the pod on this run" in err


@pytest.mark.programs
@pytest.mark.parametrize("kind", ["fifo", "zero", "link", "dir-link"])
def test_what_is_not_a_file_inside_an_output_folder_is_refused_without_blocking(tmp_path, kind):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.bin").write_bytes(b"a")
    planted = out / "z"
    {"fifo": _fifo, "zero": _zero, "link": _link_to(out / "a.bin"), "dir-link": _link_to(tmp_path)}[kind](planted)
    ok, lines = in_child(f"guard_files.checksum_outputs([{str(out)!r}])")
    assert not ok and str(planted) in lines[0], lines
    assert not (tmp_path / "out.sha256").exists()


@pytest.mark.programs
@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_declared_output_that_is_a_fifo_or_a_device_is_refused(tmp_path, kind):
    out = {"fifo": _fifo, "zero": _zero}[kind](tmp_path / "out")
    ok, lines = in_child(f"guard_files.checksum_outputs([{str(out)!r}])")
    assert not ok and str(out) in lines[0] and "0 file(s)" not in lines[0], lines


def test_a_manifest_name_taken_by_a_folder_is_a_failure_not_a_traceback(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"w")
    (tmp_path / "model.pt.sha256").mkdir()
    ok, lines = guard_files.checksum_outputs([str(tmp_path / "model.pt")])
    assert not ok and "model.pt.sha256" in lines[0]


# ---- 2. credentials never reach a log line -------------------------------------------------------------------------
@pytest.mark.loopback
@pytest.mark.parametrize("base", ["http://apiuser:PASSW0RD-42@{host}/v1", "http://{host}/v1?api_key=PASSW0RD-42"])
def test_credentials_in_the_api_url_appear_in_no_log_line_and_no_log_file(tmp_path, capsys, base):
    with hostile_http.serve(fallback=lambda _seen: (503, {}, b"busy")) as api:
        env = {**RUNPOD, "IMAGEKIT_RUNPOD_API": base.format(host=api.address)}
        s, _ = guard.settings(env)
        assert guard.act(env, s, "deadline", "stop", "IMAGEKIT_MAX_RUNTIME=6h reached", attempts=2) is False
        s, _ = guard.settings({**env, "IMAGEKIT_GUARD_DRY_RUN": "1"})
        guard.act({**env, "IMAGEKIT_GUARD_DRY_RUN": "1"}, s, "idle", "stop", "idle for 30m")
    seen = capsys.readouterr().err + (tmp_path / "guard.log").read_text()
    assert "PASSW0RD-42" not in seen and KEY not in seen, seen
    assert "IMAGEKIT_RUNPOD_API" in seen  # the log names what to fix


def test_every_line_the_guard_logs_is_redacted(tmp_path, capsys):
    guard.log("PUT https://bob:hunter2@api.example/v1?token=t0k3n&x=1 failed; see http://u@h/ and \x1b[2Jdone")
    seen = capsys.readouterr().err + (tmp_path / "guard.log").read_text()
    assert "hunter2" not in seen and "t0k3n" not in seen and "bob" not in seen and "\x1b" not in seen
    assert "api.example/v1" in seen and "x=1" in seen


def _podstart_env(tmp_path, **extra):
    return {"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin", "HOME": str(tmp_path),
            "HF_HOME": str(tmp_path / "hf"), **extra}  # fmt: skip


@pytest.mark.programs
def test_the_start_logic_never_logs_the_password_of_a_url_in_the_command(tmp_path):
    cmd = "git clone https://alice:GHP-PASSW0RD@github.com/acme/x.git"
    res = subprocess.run(
        [sys.executable, str(PODSTART), "sh", "-c", cmd], capture_output=True, text=True, timeout=120,
        env=_podstart_env(tmp_path, IMAGEKIT_REQUIRE_GPU="1"),
    )  # fmt: skip
    assert res.returncode == 1 and "not starting" in res.stderr, res.stderr[-2000:]
    assert "GHP-PASSW0RD" not in res.stderr and "github.com/acme/x.git" in res.stderr


@pytest.mark.programs
def test_the_doctor_never_prints_the_password_of_a_url(tmp_path):
    env = {**_podstart_env(tmp_path), "PYTHONPATH": "https://carol:D0C-PASSW0RD@pypi.example/simple"}
    launch = ["--", "sh", "-c", "curl https://carol:D0C-PASSW0RD@files.example/x"]
    for args in (["--json", "--require-gpu"], ["--require-gpu"], ["--require-gpu", *launch]):
        res = subprocess.run(
            [sys.executable, str(DOCTOR), "--tier", "quick", *args], capture_output=True, text=True, env=env,
            timeout=120,
        )  # fmt: skip
        assert res.returncode == 1, res.stderr[-2000:]
        assert "D0C-PASSW0RD" not in res.stdout + res.stderr and "pypi.example" in res.stdout + res.stderr
        if "--json" in args:
            json.loads(res.stdout)  # still JSON


# ---- 3. what the guard reads: bounded, never blocking, never through a link ----------------------------------------
@pytest.mark.programs
@pytest.mark.parametrize("kind", ["fifo", "zero", "link"])
def test_a_blocked_marker_that_is_not_a_file_is_read_without_blocking(tmp_path, kind):
    target = tmp_path / "report"
    target.write_text("[FAIL] gpu: none\n")
    marker = {"fifo": _fifo, "zero": _zero, "link": _link_to(target)}[kind](tmp_path / "blocked")
    said = in_child("guard_files.blocker()", BLOCKED=str(marker))
    assert isinstance(said, str) and "cannot be read" in said and len(said) <= 300, said


@pytest.mark.programs
def test_a_huge_blocked_marker_is_read_within_a_bound(tmp_path):
    marker = tmp_path / "blocked"
    with open(marker, "wb") as fh:
        fh.truncate(8 << 30)  # 8 GiB of holes: a read of all of it is a MemoryError under the child's ceiling
    said = in_child("guard_files.blocker()", BLOCKED=str(marker))
    assert isinstance(said, str) and said, said


@pytest.mark.programs
@pytest.mark.parametrize("pid", ["fifo", "zero", "link", "-1", "0", "1", "²", "٣٤", "99999999999999"])
def test_a_run_folder_whose_pid_is_not_a_running_process_is_not_a_job(tmp_path, pid):
    live = tmp_path / "elsewhere"
    live.write_text(f"{os.getpid()}\n")
    run = tmp_path / "runs" / "20261202T180000Z-42"
    run.mkdir(parents=True)
    planted = {"fifo": _fifo, "zero": _zero, "link": _link_to(live)}.get(pid)
    if planted:
        planted(run / "pid")
    else:
        (run / "pid").write_text(pid + "\n")
    assert in_child(f"guard_files.a_run_is_alive({str(tmp_path / 'runs')!r})") is False


def test_a_run_folder_that_is_a_link_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "pid").write_text(f"{os.getpid()}\n")
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "20261202T180000Z-42").symlink_to(elsewhere)
    assert guard_files.a_run_is_alive(str(runs)) is False
    (runs / "20261202T180100Z-43").mkdir()
    (runs / "20261202T180100Z-43" / "pid").write_text(f"{os.getpid()}\n")
    assert guard_files.a_run_is_alive(str(runs)) is True  # a real run still counts


@pytest.mark.programs
@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_heartbeat_that_is_not_a_regular_file_is_no_heartbeat(tmp_path, kind):
    touched = tmp_path / "touched"
    touched.write_text("")
    beat = {"fifo": _fifo, "link": _link_to(touched)}[kind](tmp_path / "heartbeat")
    sample = in_child(f"guard.sample(guard.settings({{'IMAGEKIT_HEARTBEAT': {str(beat)!r}}})[0], {time.time()})")
    assert sample["heartbeat_age"] is None, sample
    idle, evidence = guard.idle_reasons(sample, 5, 1800)
    assert idle and any("not a regular file" in line for line in evidence), evidence


@pytest.mark.programs
@pytest.mark.parametrize("kind", ["fifo", "zero", "garbage"])
def test_the_connection_tables_are_read_without_blocking_or_crashing(tmp_path, kind):
    table = tmp_path / "tcp"
    if kind == "garbage":
        table.write_text("header\n0: 0100007F:ZZZZ 00000000:0000 01\n1: x\n2: 0100007F:0016 00000000:0000 01\n")
    else:
        {"fifo": _fifo, "zero": _zero}[kind](table)
    counts = in_child("guard_signs._connections((22, 8888))", PROC_TCP=[str(table)])
    assert counts == ({"22": 1, "8888": 0} if kind == "garbage" else {"22": 0, "8888": 0})


# ---- 4. settings no guard can use: said by name, never a traceback -------------------------------------------------
@pytest.mark.parametrize("value", ["²", "5²", "١", "٥٠", "1e2", "-1", "101", " 5", "5\n", "0x10", "+5", "5.0"])
def test_a_gpu_threshold_that_is_not_an_ascii_percentage_is_refused_by_name(value):
    s, problems = guard.settings({"IMAGEKIT_IDLE_GPU_UTIL": value, "IMAGEKIT_IDLE_STOP": "30m"})
    assert s["gpu_util"] == 5 and s["idle_stop"] == 1800
    assert [p.split("=")[0] for p in problems] == ["IMAGEKIT_IDLE_GPU_UTIL"], problems


@pytest.mark.parametrize("value", ["9999999d", "1" + "0" * 30, "1e309", "106752d", "2h", "inf", "nan"])
def test_a_check_interval_no_clock_can_sleep_is_refused_by_name(value):
    s, problems = guard.settings({"IMAGEKIT_GUARD_INTERVAL": value, "IMAGEKIT_MAX_RUNTIME": "6h"})
    assert s["interval"] == 30 and s["max_runtime"] == 21600
    assert [p.split("=")[0] for p in problems] == ["IMAGEKIT_GUARD_INTERVAL"], problems


BAD_IDS = ["abc\n", "abc\r", "abc/def", "..", "a/../b", "a?b", "a#b", "a b", "a\x00b", "a\tb", "ab\x1b", "é", "٣"]


@pytest.mark.loopback
@pytest.mark.parametrize("pod_id", BAD_IDS)
@pytest.mark.parametrize(("id_var", "key_var", "api_var"),
                         [("RUNPOD_POD_ID", "RUNPOD_API_KEY", "IMAGEKIT_RUNPOD_API"),
                          ("CONTAINER_ID", "CONTAINER_API_KEY", "IMAGEKIT_VAST_API")])  # fmt: skip
def test_a_pod_id_that_is_not_one_is_refused_by_name_and_no_request_is_sent(capsys, pod_id, id_var, key_var, api_var):
    with hostile_http.serve(fallback=lambda _seen: (200, {}, b"{}")) as api:
        env = {id_var: pod_id, key_var: KEY, api_var: f"{api.url}/v1"}
        with pytest.raises(guard.GuardError, match=f"^{id_var} is not a pod id"):
            guard.provider(env)
        s, _ = guard.settings(env)
        assert guard.act(env, s, "deadline", "stop", "reached", attempts=1) is False
    assert api.seen == []
    err = capsys.readouterr().err
    assert f"{id_var} is not a pod id" in err and "Traceback" not in err


@pytest.mark.parametrize("key", ["kéy", "k\u0101y", "k y", "k\x7f", "k\u2028"])
def test_a_key_no_header_can_carry_is_refused_by_name(key):
    with pytest.raises(guard.GuardError, match=r"^RUNPOD_API_KEY has characters"):
        guard.provider({**RUNPOD, "RUNPOD_API_KEY": key})


@pytest.mark.parametrize(
    "base",
    ["ftp://api.example/v1", "file:///etc/passwd", "http://", "api.example/v1", "http://api.example:99999/v1",
     "http://api.example/v1?token=Q-SECRET", "http://api.example/v1#frag", "http://api example/v1",
     "http://bob:Q-SECRET@api.example/v1", "https://api.example/v1\n"],
)  # fmt: skip
def test_an_api_base_that_is_not_one_is_refused_by_name_without_its_secrets(base):
    with pytest.raises(guard.GuardError, match=r"^IMAGEKIT_RUNPOD_API") as err:
        guard.provider({**RUNPOD, "IMAGEKIT_RUNPOD_API": base})
    assert "Q-SECRET" not in str(err.value)


HOSTILE_ENVS = {
    "threshold ²": {"IMAGEKIT_IDLE_GPU_UTIL": "²"},
    "threshold 5²": {"IMAGEKIT_IDLE_GPU_UTIL": "5²"},
    "threshold ١": {"IMAGEKIT_IDLE_GPU_UTIL": "١"},
    "interval 9999999d": {"IMAGEKIT_GUARD_INTERVAL": "9999999d"},
    "interval 10**30": {"IMAGEKIT_GUARD_INTERVAL": "1" + "0" * 30},
    "interval 1e309": {"IMAGEKIT_GUARD_INTERVAL": "1e309"},
    "pod id with a newline": {"RUNPOD_POD_ID": "abc\n"},
    "pod id with ..": {"RUNPOD_POD_ID": "../x"},
    "key with a newline": {"RUNPOD_API_KEY": "k\nX-Evil: 1"},
    "api base with a password": {"IMAGEKIT_RUNPOD_API": "http://u:PASSW0RD@127.0.0.1:9/v1"},
    "api base file://": {"IMAGEKIT_RUNPOD_API": "file:///etc/passwd"},
}


@pytest.mark.programs
def test_the_program_under_hostile_settings_logs_by_name_and_never_tracebacks(tmp_path):
    """The guard as the image runs it, one process per hostile env, all at once: a deadline a second away in a dry
    run. Each ends (or is still sleeping its interval after 4 s) without a traceback, naming what it ignored."""
    procs = {}
    for name, extra in HOSTILE_ENVS.items():
        env = {"PATH": os.environ["PATH"], **RUNPOD, "IMAGEKIT_MAX_RUNTIME": "1s", "IMAGEKIT_GUARD_INTERVAL": "1s",
               "IMAGEKIT_GUARD_DRY_RUN": "1", **extra}  # fmt: skip
        procs[name] = subprocess.Popen([sys.executable, "-I", str(GUARD)], env=env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True)  # fmt: skip
    # a guard whose interval fell back to 30 s is still asleep when the others are done: each is given until it has
    # named what it ignored (at start) and a second past its deadline, then stopped
    said: dict[str, list[str]] = {name: [] for name in procs}
    readers = [threading.Thread(target=lambda p=p, out=said[n]: out.extend(p.stderr), daemon=True)
               for n, p in procs.items()]  # fmt: skip
    for reader in readers:
        reader.start()
    began, end = time.monotonic(), time.monotonic() + 15
    for name, proc in procs.items():
        var = next(iter(HOSTILE_ENVS[name]))
        while time.monotonic() < end and proc.poll() is None:
            if var in "".join(said[name]) and time.monotonic() > began + 2.5:
                break
            time.sleep(0.05)
        proc.kill()
        proc.wait()
    for reader in readers:
        reader.join(5)
    for proc in procs.values():
        proc.stderr.close()
    for name in procs:
        err = "".join(said[name])
        assert "Traceback" not in err, (name, err)
        var = next(iter(HOSTILE_ENVS[name]))
        assert var in err and "PASSW0RD" not in err, (name, err)
    bad = subprocess.run([sys.executable, "-I", str(GUARD), "--after-run", "²"], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "IMAGEKIT_ON_EXIT": "stop"}, timeout=30)  # fmt: skip
    assert "Traceback" not in bad.stderr and bad.returncode == 2, bad.stderr


@pytest.mark.programs
def test_a_job_starts_whatever_the_guard_settings_say(tmp_path):
    marker = tmp_path / "ran"
    res = subprocess.run(
        [sys.executable, str(PODSTART), "sh", "-c", f"touch {marker}"], capture_output=True, text=True, timeout=60,
        env=_podstart_env(tmp_path, IMAGEKIT_SKIP_DOCTOR="1", IMAGEKIT_IDLE_GPU_UTIL="²", IMAGEKIT_GPU_IDLE_WARN="x"),
    )  # fmt: skip
    assert res.returncode == 0 and marker.exists(), res.stderr[-2000:]
    assert "Traceback" not in res.stderr
