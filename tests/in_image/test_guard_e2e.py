"""The lifetime guard in the real image, started as a pod platform starts it, against a stand-in of RunPod's REST API
(and Vast's) on the host's bridge address (a real HTTP server; the provider is the one fake, at the outer boundary).

Each trigger ends the pod with the request RunPod documents, carrying the pod's key, within seconds of firing; the
key never reaches the container's log. A fake `nvidia-smi` (a script on a mounted folder, first on PATH) answers
the guard's two queries from files the test rewrites, and fails the doctor's queries as a host without a driver
does. Timings and the request log are written to the session's temporary folder (docs/pods.md quotes them).
"""

from __future__ import annotations

import json
import time

import pytest

from tests import containers, guard_pod, hostile_http
from tests.guard_pod import (
    KEY,
    fake_gpu,
    fired_at,
    gateway,
    logs_with,
    scanner,
    ssh,
    start,
    throwaway_key,
    wait_request,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RECORD: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def request_log(tmp_path_factory):
    yield
    (tmp_path_factory.getbasetemp() / "guard-requests.txt").write_text("\n".join(RECORD) + "\n")


def _record(name: str, api, pod, trigger: str, arrived: float) -> None:
    seen = api.seen[-1]
    RECORD.append(
        f"{name}: {seen.method} {seen.path} (Authorization: Bearer <the pod's key>) "
        f"{arrived - fired_at(pod, trigger):.2f} s after the guard logged `{trigger}`"
    )


def test_the_deadline_stops_the_pod_with_its_own_key_never_logged(real_build, engine, api, tmp_path):
    result, _ = real_build
    before = len(api.seen)
    pod, _ = start(engine, result.tag, api, tmp_path, {"IMAGEKIT_MAX_RUNTIME": "5s"})
    try:
        arrived = wait_request(api, before + 1)
        seen = api.seen[-1]
        assert guard_pod.sent(api, -1) == guard_pod.STOP and seen.method == "POST"
        assert seen.headers["Authorization"] == f"Bearer {KEY}"
        _record("deadline", api, pod, "deadline", arrived)
        logs = logs_with(pod, "HTTP 200")
        assert "imagekit-guard: armed: deadline in 5s (action: stop; runpod pod podguard42)" in logs
        assert "IMAGEKIT_MAX_RUNTIME=5s reached" in logs and "HTTP 200" in logs
        assert KEY not in logs
        _code, out = pod.exec("sh", "-c", "ps -eo args; ls -l /var/log/imagekit-guard.log")
        assert KEY not in out and "-rw------- 1 root root" in out  # not on a command line; its log root's only
    finally:
        pod.remove()


def test_idle_stop_waits_while_anything_works_then_stops(real_build, engine, api, tmp_path):
    result, _ = real_build
    before = len(api.seen)
    env = {"IMAGEKIT_IDLE_STOP": "4s", "PUBLIC_KEY": throwaway_key(tmp_path)}
    fake = fake_gpu(tmp_path, procs="4242\n")  # a GPU compute process, from the start
    pod, _ = start(engine, result.tag, api, tmp_path, env, fake=fake)
    try:
        time.sleep(6)
        (fake / "procs").write_text("")
        # `ssh pod cmd` working for 6 s: a session counts by what runs in it (a TCP connection, or a session left
        # open with nothing making progress, counts for nothing)
        ssh(pod, tmp_path, "timeout 6 sh -c 'while :; do :; done' || true")
        pod.exec("sh", "-c", "touch /run/imagekit/heartbeat")  # the training loop's heartbeat
        time.sleep(3)
        assert len(api.seen) == before, pod.logs()
        arrived = wait_request(api, before + 1)
        assert guard_pod.sent(api, -1) == guard_pod.STOP
        _record("idle", api, pod, "idle", arrived)
        logs = pod.logs()
        line = next(x for x in logs.splitlines() if "imagekit-guard: idle:" in x)
        assert "GPU utilisation 0 % (threshold 5 %)" in line and "0 GPU compute process(es)" in line
        assert "0 SSH session(s) logged in" in line and "heartbeat" in line
    finally:
        pod.remove()


def test_an_unauthenticated_connection_held_open_does_not_keep_the_pod_up(real_build, engine, api, tmp_path):
    """A scanner's connection to :22 (its banner sent, no authentication) held open: idle stop fires anyway, and the
    log line shows the connection as evidence, not as a session."""
    result, _ = real_build
    before = len(api.seen)
    env = {"IMAGEKIT_IDLE_STOP": "4s", "PUBLIC_KEY": throwaway_key(tmp_path)}
    pod, _ = start(engine, result.tag, api, tmp_path, env, fake=fake_gpu(tmp_path))
    try:
        logs_with(pod, "SSH: sshd listening on port 22")
        with scanner(pod):
            arrived = wait_request(api, before + 1, timeout=30)  # while it is held open
        assert guard_pod.sent(api, -1) == guard_pod.STOP
        _record("idle, an unauthenticated connection held open", api, pod, "idle", arrived)
        line = next(x for x in pod.logs().splitlines() if "imagekit-guard: idle:" in x)
        assert "0 SSH session(s) logged in" in line and "a connection is not a login" in line
    finally:
        pod.remove()
    guard_pod.ROWS.append(
        (
            "an unauthenticated connection held open to :22 (a scanner: its banner, no login)",
            "idle stop as if it were not there",
            "stopped while it was held open; the log: `0 SSH "
            "session(s) logged in (1 TCP connection(s) to :22 or :8888: a connection is not a login)`",
        )
    )


def test_a_restart_with_a_reused_pid_is_no_job_and_pod_wait_returns(real_build, engine, api, tmp_path):
    """A `pod run` run (the real start script) is running when the container restarts; after it, its pid names
    another process of the restarted container (here made so: the run's pid file is pointed at a live `sleep`, as a
    pid reused by chance would be, without waiting for chance). The guard does not take that for the job (the
    GPU-idle watchdog, armed to stop, stays quiet: it used to stop the pod for a job that was not there), and `pod
    wait`'s script says the run was lost (it used to wait forever); the deadline still counts from the first start."""
    from imagekit.services.pods import pod_runs

    result, _ = real_build
    before = len(api.seen)
    env = {"IMAGEKIT_GPU_IDLE_STOP": "4s", "IMAGEKIT_MAX_RUNTIME": "45s"}
    fake = fake_gpu(tmp_path, util="50\n")  # the run works its GPU until the restart
    pod, vol = start(engine, result.tag, api, tmp_path, env, fake=fake)
    try:
        code, out = pod.exec("bash", "-c", pod_runs.start_script("sleep 600"))
        run_id = out.strip().splitlines()[-1]
        run = vol / ".imagekit" / "runs" / run_id
        assert code == 0 and (run / "identity").is_file() and (run / "pid").is_file(), out
        first = time.time()
        pod.container.restart(timeout=5)
        (fake / "util").write_text("0\n")
        logs_with(pod, "restarted: armed")
        code, out = pod.exec("sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!")
        other = out.strip()
        assert code == 0 and other.isdigit(), out
        (run / "pid").write_text(other + "\n")  # the pid the run recorded now names another live process
        alive = (
            pod_runs._run_dir(run_id) + 'p="$(cat "$r/pid")"; ' + pod_runs.ALIVE + "alive && echo ALIVE || echo LOST"
        )
        assert pod.exec("bash", "-c", alive)[1].strip().endswith("LOST")
        time.sleep(8)  # GPUs at 0 %: a job would be stopped by now
        assert len(api.seen) == before, pod.logs()
        arrived = wait_request(api, before + 1, timeout=60)
        assert "IMAGEKIT_MAX_RUNTIME=45s reached" in pod.logs() and arrived - first < 55
    finally:
        pod.remove()
    guard_pod.ROWS.append(("a restart with a reused pid (a `pod run` job's pid names another live process after "
                           "the restart; GPU-idle stop at 4 s)", "no job: no GPU-idle stop; `pod wait` returns; the "
                           "deadline counts from the first start", "no request in 8 s with the GPUs at 0 %; `pod "
                           f"wait`'s script says the run was lost; deadline stop {arrived - first:.0f} s after the "
                           "first start (deadline 45 s)"))  # fmt: skip


# Vast's SSH launch mode as the image sees it: Vast's init replaces the entrypoint, runs the template's onstart and
# keeps the container up itself (test_pod_e2e.py has the full simulation, with its SSH key).
VAST_INIT = 'sh -c "$ONSTART"; echo "vast-sim: onstart exited $?"; exec sleep infinity'


def test_a_blocked_vast_instance_is_stopped_after_the_grace(real_build, engine, api, tmp_path):
    """Started as Vast's SSH launch mode starts it (the onstart `imagekit vast-template` writes, the instance's id and
    key in the env): IMAGEKIT_REQUIRE_GPU=1 on this GPU-less machine blocks it; after IMAGEKIT_BLOCKER_GRACE, Vast's
    own stop (`PUT /instances/{id}/` state stopped) arrives with the instance's key, after onstart has returned."""
    from imagekit.clouds import vast

    result, _ = real_build
    before = len(api.seen)
    vol = tmp_path / "volume"
    vol.mkdir()
    env = {
        "CONTAINER_ID": "31337", "CONTAINER_API_KEY": KEY, "IMAGEKIT_VAST_API": f"{api.url}/api/v0",
        "IMAGEKIT_REQUIRE_GPU": "1", "IMAGEKIT_ON_BLOCKER": "stop", "IMAGEKIT_BLOCKER_GRACE": "3s",
        "IMAGEKIT_GUARD_INTERVAL": "1s", "ONSTART": vast.ONSTART,
    }  # fmt: skip
    pod = containers.start(
        engine, result.tag, env=env, volumes={str(vol): ("/workspace", "rw")}, entrypoint=["sh", "-c"],
        command=[VAST_INIT], ready=containers.ready_times("vast-sim: onstart exited", 1),
    )  # fmt: skip
    try:
        arrived = wait_request(api, before + 1)
        seen = api.seen[-1]
        assert (seen.method, seen.path) == ("PUT", "/api/v0/instances/31337/")
        assert json.loads(seen.body) == {"state": "stopped"} and seen.headers["Authorization"] == f"Bearer {KEY}"
        _record("blocker (Vast)", api, pod, "blocker", arrived)
        logs = pod.logs()
        assert "BLOCKED" in logs and "imagekit-guard: blocker: blocked for" in logs and "vast pod 31337" in logs
        assert logs.index("vast-sim: onstart exited 1") < logs.index("imagekit-guard: blocker:")  # it outlived it
        assert KEY not in logs
        blocked = arrived - guard_pod.logged_at(pod, "BLOCKED")
    finally:
        pod.remove()
    guard_pod.ROWS.append(
        (
            "a blocked pod left alone (Vast's SSH launch mode, `IMAGEKIT_REQUIRE_GPU=1` on a GPU-less host, grace 3 s)",
            "stopped after the grace, though onstart returned",
            f"`PUT /instances/{{id}}/` state stopped {blocked:.1f} s after the start check said BLOCKED",
        )
    )


def test_a_finished_job_terminates_the_pod_after_its_outputs_are_checksummed(real_build, engine, api, tmp_path):
    result, _ = real_build
    before = len(api.seen)
    env = {"IMAGEKIT_ON_EXIT": "terminate", "IMAGEKIT_OUTPUTS": "/workspace/out", "IMAGEKIT_EXIT_GRACE": "2s"}
    job = ["sh", "-c", "mkdir -p /workspace/out && echo weights > /workspace/out/model.bin && echo trained"]
    pod, vol = start(
        engine, result.tag, api, tmp_path, env, command=job, ready=containers.ready_times("imagekit-guard: exit:", 1)
    )
    try:
        arrived = wait_request(api, before + 1)
        assert guard_pod.sent(api, -1) == guard_pod.TERMINATE
        _record("job exit", api, pod, "exit", arrived)
        assert (vol / "out.sha256").read_text().endswith("  out/model.bin\n")
        logs = pod.logs()
        assert logs.index("outputs: /workspace/out: 1 file(s)") < logs.index("imagekit-guard: exit:")
        pod.container.reload()
        assert pod.container.status == "running"  # waiting for RunPod to end it, not exiting into a restart
    finally:
        pod.remove()


def test_a_job_without_its_outputs_keeps_the_pod_and_an_api_down_is_retried_in_the_log(real_build, engine, tmp_path):
    result, _ = real_build
    with hostile_http.serve(fallback=lambda _seen: (503, {}, b"down"), host=gateway(engine)) as down:
        env = {"IMAGEKIT_ON_EXIT": "stop", "IMAGEKIT_OUTPUTS": "/workspace/missing.pt", "IMAGEKIT_MAX_RUNTIME": "4s"}
        pod, _ = start(
            engine, result.tag, down, tmp_path, env, command=["true"], ready=containers.ready_times("not ending", 1)
        )
        try:
            assert "declared output /workspace/missing.pt does not exist" in pod.logs()
            pod.wait(containers.ready_times("(try 2)", 1), timeout=60)  # the deadline's call, retried
            assert {guard_pod.sent(down, i) for i in range(len(down.seen))} == {guard_pod.STOP}
            pod.container.reload()
            assert pod.container.status == "running" and KEY not in pod.logs()
        finally:
            pod.remove()
    assert json.dumps(RECORD)  # the record is written at the module's end
