"""The lifetime guard's adversarial suite: the real image started as RunPod starts it (its id and key in the env, a
root-owned volume on /workspace, the image's own entrypoint, sshd and JupyterLab), the provider's API a stand-in on
the host's bridge address, time compressed through the guard's settings (a look a second, windows of seconds).

No false stop: a logged-in SSH user idle at a prompt, a dataset download, a checkpoint save with the GPUs at 0 %, a
data-loading dip, a Jupyter cell running. No missed stop: a stalled process, a crash loop, a non-root workload
deleting the guard's state, the control plane down then back, CPU-speed training over SSH on a GPU-less pod, a failed
job with `on-exit` armed (test_guard_e2e.py has the unauthenticated connection, the reused pid and the blocked pod).
Each test adds its row (scenario, expected, observed) to ``guard-scenarios.md`` in pytest's temporary folder, the
table docs/pods.md shows.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests import containers, guard_pod, loopback
from tests.guard_pod import (
    KEY,
    fake_gpu,
    fired_at,
    guard_line,
    logged_at,
    logs_with,
    quiet_for,
    ssh,
    ssh_argv,
    start,
    throwaway_key,
    wait_request,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROWS = guard_pod.ROWS
STOP = guard_pod.STOP


def _sent(api, index: int) -> tuple[str, str, str]:
    return guard_pod.sent(api, index)


def _stopped(api, before: int, pod, trigger: str) -> tuple[float, str]:  # type: ignore[no-untyped-def]
    """When RunPod's stop arrived (the one request since ``before``), and the guard's line for ``trigger``."""
    arrived = wait_request(api, before + 1, timeout=30)
    assert _sent(api, -1) == STOP
    return arrived, guard_line(pod, trigger)


def _pod_run(pod, command: str) -> str:
    """Start ``command`` as `imagekit pod run` starts it (its real start script, in the pod's login shell); its id."""
    from imagekit.services.pods import pod_runs

    code, out = pod.exec("bash", "-lc", pod_runs.start_script(command))
    assert code == 0, out
    return out.strip().splitlines()[-1]


def _run_ended(vol, run_id: str, timeout: float = 60) -> float:
    """The time the run's exit file appeared (polled from the host, through the volume)."""
    exit_file = vol / ".imagekit" / "runs" / run_id / "exit"
    begin = time.time()
    while not exit_file.exists():
        assert time.time() - begin < timeout, f"the run {run_id} never ended"
        time.sleep(0.05)
    return time.time()


# ---- no false stop --------------------------------------------------------------------------------------------------
def _login(pod, tmp_path):  # type: ignore[no-untyped-def]
    """An interactive login over real SSH (`ssh -tt`: a shell at its prompt on a terminal); once its session shows."""
    user = subprocess.Popen(
        ssh_argv(pod, tmp_path, "-tt"), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    begin = time.time()
    while "sshd: root@pts/" not in pod.exec("ps", "-eo", "args")[1]:
        assert time.time() - begin < 20 and user.poll() is None, "no interactive login"
        time.sleep(0.2)
    return user


def _logout(user) -> None:  # type: ignore[no-untyped-def]
    user.stdin.write(b"exit\n")
    user.stdin.close()
    user.wait(timeout=30)


WINDOW = 16  # s: the idle window of the session scenarios (the kernel dates a terminal's input to 8 s at best)


def test_a_session_typing_now_and_then_keeps_the_pod_and_left_at_its_prompt_is_stopped(real_build, engine, api,
                                                                                        tmp_path):  # fmt: skip
    """One interactive SSH login (`ssh -tt`), nothing else working: typing every 3 s for a window and a half keeps
    the pod; then it is left open at its prompt, typing nothing, and the pod is stopped a window (less up to the 8 s
    the kernel rounds a terminal's input time to) after the last keystroke, the session still open: a session counts
    by the input at its terminal (the TTY's access time, as `w` reads it), not by being there."""
    result, _ = real_build
    before = len(api.seen)
    fake = fake_gpu(tmp_path, util="50\n")  # busy until the user is logged in: the window starts at the prompt
    env = {"IMAGEKIT_IDLE_STOP": f"{WINDOW}s", "PUBLIC_KEY": throwaway_key(tmp_path)}
    pod, _ = start(engine, result.tag, api, tmp_path, env, fake=fake)
    try:
        ssh(pod, tmp_path, "true")
        user = _login(pod, tmp_path)
        try:
            (fake / "util").write_text("0\n")
            end = time.time() + 1.5 * WINDOW
            while time.time() < end:  # typing now and then
                user.stdin.write(b"echo typed\n")
                user.stdin.flush()
                quiet_for(api, before, 3, pod)
            typed = time.time()
            arrived = wait_request(api, before + 1, timeout=WINDOW + 20)  # left at the prompt
            assert user.poll() is None  # the session is still open
        finally:
            _logout(user)
        assert _sent(api, -1) == STOP
        line = guard_line(pod, "idle")
        assert "1 SSH session(s) logged in, the last input at a terminal" in line, line
        # the last keystroke was at most 3 s before `typed`; the kernel dated it up to 7 s earlier than it was
        assert WINDOW - 3 - 7 - 1 <= arrived - typed < WINDOW + 4, line
    finally:
        pod.remove()
    ROWS.append((f"an SSH login typing every 3 s for {1.5 * WINDOW:.0f} s (idle window {WINDOW} s)", "no stop while "
                 "typing", f"no request in {1.5 * WINDOW:.0f} s"))  # fmt: skip
    ROWS.append((f"the same login left open at its prompt, typing nothing (window {WINDOW} s)", "idle stop a window "
                 "after the last keystroke, the session still open", f"stop {arrived - typed:.1f} s after the last "
                 "keystroke; the log: `1 SSH session(s) logged in, the last input at a terminal ...`"))  # fmt: skip


class _Trickle(http.server.BaseHTTPRequestHandler):
    """A slow download: CHUNK bytes every EVERY seconds, for SECONDS."""

    CHUNK, EVERY, SECONDS = 16384, 0.5, 10.0

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        n = int(self.SECONDS / self.EVERY)
        self.send_response(200)
        self.send_header("Content-Length", str(n * self.CHUNK))
        self.end_headers()
        for _ in range(n):
            self.wfile.write(b"\0" * self.CHUNK)
            self.wfile.flush()
            time.sleep(self.EVERY)


@contextmanager
def _slow_download(engine) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer((guard_pod.gateway(engine), 0), _Trickle)
    loopback.start(server)
    try:
        yield f"http://{server.server_address[0]}:{server.server_address[1]}/dataset.bin"
    finally:
        loopback.stop(server)


def test_a_dataset_download_started_with_pod_run_keeps_the_pod(real_build, engine, api, tmp_path):
    """32 kB/s for 10 s (two and a half idle windows) with no GPU, no login, no heartbeat: the run's processes move
    data, so the pod is working; a window after the run ends, it is idle."""
    result, _ = real_build
    before = len(api.seen)
    fake = fake_gpu(tmp_path, util="50\n")
    pod, vol = start(engine, result.tag, api, tmp_path, {"IMAGEKIT_IDLE_STOP": "4s"}, fake=fake)
    try:
        with _slow_download(engine) as url:
            fetch = (f"python -c 'import shutil, urllib.request; shutil.copyfileobj(urllib.request.urlopen("
                     f'"{url}"), open("/workspace/dataset.bin", "wb"), 16384)\'')  # fmt: skip
            run_id = _pod_run(pod, fetch)
            (fake / "util").write_text("0\n")
            quiet_for(api, before, 7, pod)
            ended = _run_ended(vol, run_id)
        arrived = wait_request(api, before + 1, timeout=30)
        assert _sent(api, -1) == STOP
        assert (vol / "dataset.bin").stat().st_size == 20 * 16384
        line = guard_line(pod, "idle")
        assert 3 <= arrived - ended < 4 + 6, line
    finally:
        pod.remove()
    ROWS.append(("a dataset download started with `pod run` (32 kB/s for 10 s, GPUs at 0 %, nobody logged in)",
                 "no stop while it downloads; idle stop a window after it ends", f"no request in 7 s; the run "
                 f"ended, stop {arrived - ended:.1f} s later"))  # fmt: skip


def test_a_checkpoint_save_with_the_gpus_at_0_percent_keeps_the_pod(real_build, engine, api, tmp_path):
    """Training at 95 %, then 6 s (one and a half windows) writing a checkpoint: the GPUs at 0 %, the training
    process still holding its GPU context (a compute process in nvidia-smi), as torch.save does; GPU-idle stop armed
    at 15 s."""
    result, _ = real_build
    before = len(api.seen)
    fake = fake_gpu(tmp_path, util="95\n", procs="4242\n")
    env = {"IMAGEKIT_IDLE_STOP": "4s", "IMAGEKIT_GPU_IDLE_STOP": "15s"}
    pod, vol = start(engine, result.tag, api, tmp_path, env, fake=fake)
    try:
        save = ("python -c 'import time\nf = open(\"/workspace/ckpt.pt\", \"wb\")\nfor _ in range(60):\n"
                "    f.write(bytes(1 << 20)); f.flush(); time.sleep(0.1)'")  # fmt: skip
        run_id = _pod_run(pod, save)
        (fake / "util").write_text("0\n")
        quiet_for(api, before, 6, pod)
        (fake / "util").write_text("95\n")
        _run_ended(vol, run_id)
        quiet_for(api, before, 2, pod)
        (fake / "procs").write_text("")  # training done: the process let go of the GPU
        (fake / "util").write_text("0\n")
        done = time.time()
        arrived = wait_request(api, before + 1, timeout=30)
        logs = pod.logs()
        assert _sent(api, -1) == STOP and "imagekit-guard: idle:" in logs and "imagekit-guard: gpu-idle:" not in logs
        assert (vol / "ckpt.pt").stat().st_size == 60 << 20
    finally:
        pod.remove()
    ROWS.append(("a checkpoint save with the GPUs at 0 % (6 s of writes, the process holding its GPU context)",
                 "no stop; GPU-idle stop (15 s) not reached", f"no request during the save; idle stop "
                 f"{arrived - done:.1f} s after the process let go of the GPU"))  # fmt: skip


def test_a_data_loading_dip_is_no_gpu_idle_stop_but_a_quiet_job_is(real_build, engine, api, tmp_path):
    """Four GPUs, one of them idle (95/97/96/0: a working job), then every GPU at 0 for 2 s (the loader refilling),
    with the GPU-idle stop armed at 4 s; then the GPUs stay quiet and it fires."""
    result, _ = real_build
    before = len(api.seen)
    fake = fake_gpu(tmp_path, util="95\n97\n96\n0\n", procs="4242\n")
    pod, _ = start(engine, result.tag, api, tmp_path, {"IMAGEKIT_GPU_IDLE_STOP": "4s"}, fake=fake)
    try:
        _pod_run(pod, "sleep 600")
        quiet_for(api, before, 5, pod)  # the quietest GPU at 0 for longer than the window
        (fake / "util").write_text("0\n0\n0\n0\n")
        quiet_for(api, before, 2, pod)  # the dip
        (fake / "util").write_text("95\n97\n96\n0\n")
        quiet_for(api, before, 2, pod)
        (fake / "util").write_text("0\n0\n0\n0\n")
        quiet = time.time()
        arrived, line = _stopped(api, before, pod, "gpu-idle")
        assert "GPU utilisation 0/0/0/0 %" in line
        assert 4 <= arrived - quiet < 4 + 6, line
    finally:
        pod.remove()
    ROWS.append(("a data-loading dip (4 GPUs at 95/97/96/0 %, then all at 0 % for 2 s; GPU-idle stop at 4 s)",
                 "no stop; a job quiet longer than the window is stopped", f"no request in 9 s; all GPUs quiet "
                 f"for good: stop {arrived - quiet:.1f} s later"))  # fmt: skip


CELL = """import json, time, urllib.request
from jupyter_client import BlockingKernelClient
from jupyter_core.paths import jupyter_runtime_dir
ask = urllib.request.Request("http://127.0.0.1:8888/api/kernels", data=b"{}", method="POST",
                             headers={"Authorization": "token s3cret", "Content-Type": "application/json"})
for _ in range(120):
    try:
        kernel = json.load(urllib.request.urlopen(ask, timeout=5))["id"]
        break
    except OSError:
        time.sleep(0.5)
client = BlockingKernelClient(connection_file=f"{jupyter_runtime_dir()}/kernel-{kernel}.json")
client.load_connection_file()
client.start_channels()
client.wait_for_ready(timeout=120)
print("running", flush=True)
client.execute("import time; time.sleep(10)")
print("done", client.get_shell_msg(timeout=120)["content"]["status"], flush=True)
time.sleep(600)
"""


def test_a_jupyter_kernel_running_a_cell_keeps_the_pod(user_project, engine, api, tmp_path):
    """The image's own JupyterLab (`[image] jupyter = true`, the user project's image), a kernel started through its
    API, a 10 s cell running (two and a half idle windows, no other sign of work): the server reports the kernel busy; a
    window after the cell ends, the pod is idle."""
    before = len(api.seen)
    fake = fake_gpu(tmp_path, util="50\n")
    env = {"IMAGEKIT_IDLE_STOP": "4s", "JUPYTER_PASSWORD": "s3cret"}
    pod, vol = start(engine, user_project["result"]["tag"], api, tmp_path, env, fake=fake)
    try:
        (vol / "cell.py").write_text(CELL)
        pod.exec("sh", "-c", "cd /workspace && nohup /opt/venv/bin/python cell.py >cell.log 2>&1 &")
        out, begin = vol / "cell.log", time.time()
        while "running" not in (out.read_text() if out.exists() else ""):
            assert time.time() - begin < 120, (out.read_text() if out.exists() else "") + pod.logs()[-2000:]
            time.sleep(0.2)
        (fake / "util").write_text("0\n")
        quiet_for(api, before, 8, pod)
        while "done ok" not in out.read_text():
            assert time.time() - begin < 120, out.read_text()
            time.sleep(0.05)
        done = time.time()
        arrived, line = _stopped(api, before, pod, "idle")
        assert "0 Jupyter kernel(s) running a cell" in line and 3 <= arrived - done < 4 + 6, line
        assert "s3cret" not in pod.logs()
    finally:
        pod.remove()
    ROWS.append(("an open Jupyter kernel running a cell (10 s, the image's JupyterLab, nothing else working)",
                 "no stop while the cell runs; idle stop a window after it ends", f"no request in 8 s of the cell; "
                 f"stop {arrived - done:.1f} s after it ended"))  # fmt: skip


# ---- no missed stop ------------------------------------------------------------------------------------------------
def test_a_stalled_process_holding_no_gpu_does_not_keep_the_pod(real_build, engine, api, tmp_path):
    """A `pod run` job blocked for good (waiting on an event nobody sets: a dead peer, a lock) and holding no GPU: a
    job that makes no progress is no work (skypilot#10628: a stalled process kept a cluster up for ever)."""
    result, _ = real_build
    before = len(api.seen)
    fake = fake_gpu(tmp_path, util="50\n")
    pod, vol = start(engine, result.tag, api, tmp_path, {"IMAGEKIT_IDLE_STOP": "4s"}, fake=fake)
    try:
        run_id = _pod_run(pod, "python -c 'import threading; threading.Event().wait()'")
        (fake / "util").write_text("0\n")
        quiet = time.time()
        arrived, line = _stopped(api, before, pod, "idle")
        assert "no progress (stalled?)" in line and 3.5 <= arrived - quiet < 4 + 6, line
        assert not (vol / ".imagekit" / "runs" / run_id / "exit").exists()  # it was still there, stalled
    finally:
        pod.remove()
    ROWS.append(("a stalled process holding no GPU (a `pod run` job blocked for good)", "idle stop a window after "
                 "its last progress", f"stop {arrived - quiet:.1f} s after the GPUs went quiet, the job still "
                 "there; the log: `no progress (stalled?)`"))  # fmt: skip


def test_a_crash_loop_reaches_its_deadline(real_build, engine, api, tmp_path):
    """A job that fails 2 s after each start, Docker restarting it (as RunPod restarts a pod's container): the
    deadline counts from the first start, kept on the volume."""
    result, _ = real_build
    before = len(api.seen)
    env = {"IMAGEKIT_MAX_RUNTIME": "10s"}
    pod, _ = start(
        engine, result.tag, api, tmp_path, env, command=["sh", "-c", "sleep 2; exit 1"],
        ready=containers.ready_times("imagekit-guard: armed", 1), restart_policy={"Name": "always"},
    )  # fmt: skip
    try:
        first = logged_at(pod, "imagekit-guard: armed")
        arrived = wait_request(api, before + 1, timeout=40)
        assert _sent(api, -1) == STOP
        pod.container.reload()
        restarts = pod.container.attrs["RestartCount"]
        logs = pod.logs()
        assert restarts >= 2 and "restarted: armed" in logs and "IMAGEKIT_MAX_RUNTIME=10s reached" in logs
        assert 10 <= arrived - first < 10 + 8, logs[-2000:]
    finally:
        pod.remove()
    ROWS.append(("a crash loop (the job exits 1 two seconds after each start; restart policy always; deadline 10 s)",
                 "stop at the deadline counted from the first start", f"stop {arrived - first:.1f} s after the first "
                 f"start, after {restarts} restarts (`restarted: armed ... ago, that time already used`)"))  # fmt: skip


def test_a_non_root_workload_cannot_delete_the_guards_state(real_build, engine, api, tmp_path):
    """The workload, as a user other than root, tries to delete, move and replace the guard's state; the container
    restarts; the deadline still counts from the first start."""
    result, _ = real_build
    before = len(api.seen)
    pod, vol = start(engine, result.tag, api, tmp_path, {"IMAGEKIT_MAX_RUNTIME": "14s"})
    try:
        first = logged_at(pod, "imagekit-guard: armed")
        attack = ("rm -rf /workspace/.imagekit/guard; mv /workspace/.imagekit /workspace/gone; "
                  "echo '{}' > /workspace/.imagekit/guard/state.json; ls /workspace/.imagekit/guard")  # fmt: skip
        code, out = pod.container.exec_run(["sh", "-c", attack], user="nobody")
        out = out.decode()
        assert out.count("Permission denied") >= 3 and code != 0, out
        assert json.loads((vol / ".imagekit" / "guard" / "state.json").read_text())["armed"] <= first + 1
        pod.container.restart(timeout=5)
        logs_with(pod, "restarted: armed")
        arrived = wait_request(api, before + 1, timeout=40)
        assert _sent(api, -1) == STOP and 14 <= arrived - first < 14 + 6
    finally:
        pod.remove()
    ROWS.append(
        (
            "a workload that deletes the guard's state files as a non-root user, then a restart",
            "state untouched; the deadline counts from the first start",
            "`rm`, `mv` and overwrite refused "
            f"(Permission denied); stop {arrived - first:.1f} s after the first start (deadline 14 s)",
        )
    )


def test_the_control_plane_down_then_back_gets_the_stop(real_build, engine, tmp_path):
    """RunPod's API answers 503, then comes back: the guard retries (after 5 s; the pause doubles each time, up to
    five minutes) until it takes the stop, then sends nothing more; the pod stays up meanwhile."""
    result, _ = real_build

    def answer(seen):
        return (503, {}, b"upstream down") if len(down.seen) <= 1 else (200, {}, b"{}")

    with guard_pod.stand_in(engine, answer) as down:
        pod, _ = start(engine, result.tag, down, tmp_path, {"IMAGEKIT_MAX_RUNTIME": "3s"})
        try:
            arrived = wait_request(down, 2, timeout=40)
            quiet_for(down, 2, 3, pod)
            logs = logs_with(pod, "HTTP 200")
            assert [guard_pod.sent(down, i) for i in range(len(down.seen))] == [STOP] * 2
            assert "HTTP 503 (try 1); retrying in 5 s" in logs and KEY not in logs
            pod.container.reload()
            assert pod.container.status == "running"
            took = arrived - fired_at(pod, "deadline")
        finally:
            pod.remove()
    ROWS.append(
        (
            "the control plane down then back (503, then 200)",
            "retried until it takes the stop; nothing after",
            f"2 requests, the stop taken {took:.1f} s after the deadline fired; none after",
        )
    )


def test_cpu_speed_training_over_ssh_on_a_gpu_less_pod_is_stopped(real_build, engine, api, tmp_path):
    """A GPU-less pod (no driver, no nvidia-smi) that requires a GPU: the start check finds none; a user logs in over
    SSH and trains anyway, on the CPU, at GPU rates. The login banner warns, then the pod stops (GPU-idle stop asked
    for), the SSH session notwithstanding."""
    result, _ = real_build
    before = len(api.seen)
    env = {"IMAGEKIT_REQUIRE_GPU": "1", "IMAGEKIT_GPU_IDLE_WARN": "3s", "IMAGEKIT_GPU_IDLE_STOP": "8s",
           "PUBLIC_KEY": throwaway_key(tmp_path)}  # fmt: skip
    pod, _ = start(engine, result.tag, api, tmp_path, env)
    try:
        ssh(pod, tmp_path, "true")
        train = subprocess.Popen(
            [*ssh_argv(pod, tmp_path), "exec /opt/venv/bin/python -c 'while True: pass'"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            began = time.time()
            logs_with(pod, "training on the CPU at GPU rates?", timeout=120)  # a loaded CI host: SSH and looks slow
            banner = subprocess.run(
                [*ssh_argv(pod, tmp_path), "bash -lic true"], capture_output=True, text=True, timeout=60
            ).stderr
            assert "training on the CPU at GPU rates?" in banner and "(python) used" in banner, banner
            arrived = wait_request(api, before + 1, timeout=90)
        finally:
            train.kill()
            train.wait()
        assert _sent(api, -1) == STOP
        line = guard_line(pod, "cpu-fallback")
        # the stop not before GPU_IDLE_STOP (8 s) of CPU-speed training; its upper bound loose for a loaded host
        assert "no GPU answers nvidia-smi" in line and 7 <= arrived - began < 8 + 60, line
    finally:
        pod.remove()
    ROWS.append(("CPU-speed training over SSH on a GPU-less pod (`IMAGEKIT_REQUIRE_GPU=1`, GPU-idle warn 3 s, stop "
                 "8 s)", "a warning in the log and the login banner, then a stop, the SSH session notwithstanding",
                 f"banner shown at the next login; stop {arrived - began:.1f} s after training began"))  # fmt: skip


def test_a_failed_job_with_on_exit_terminate_is_stopped_not_terminated(real_build, engine, api, tmp_path):
    result, _ = real_build
    before = len(api.seen)
    env = {"IMAGEKIT_ON_EXIT": "terminate", "IMAGEKIT_OUTPUTS": "/workspace/out", "IMAGEKIT_EXIT_GRACE": "2s"}
    job = ["sh", "-c", "mkdir -p /workspace/out && echo partial > /workspace/out/ckpt.pt && echo 'loss: nan' && exit 3"]
    pod, vol = start(
        engine, result.tag, api, tmp_path, env, command=job, ready=containers.ready_times("imagekit-guard: exit:", 1)
    )
    try:
        wait_request(api, before + 1)
        assert _sent(api, -1) == STOP and len(api.seen) == before + 1  # no terminate: the volume and the log stay
        logs = pod.logs()
        assert "the exit code is 3: stopping instead of terminating" in logs and "loss: nan" in logs
        assert (vol / "out" / "ckpt.pt").read_text() == "partial\n" and (vol / "out.sha256").is_file()
    finally:
        pod.remove()
    ROWS.append(("a failed job (exit 3) with `IMAGEKIT_ON_EXIT=terminate`", "stopped, not terminated: the volume, "
                 "its outputs and the log kept", "`POST /pods/{id}/action` stop, no terminate; outputs checksummed, "
                 "the log says `the exit code is 3: stopping instead of terminating`"))  # fmt: skip
