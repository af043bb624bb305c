"""A guard that never ends work or strands results (issue 48), against the real image started as RunPod starts it
(its id and key in the env, a root-owned volume on /workspace, the image's entrypoint and sshd), RunPod's API a
stand-in on the host's bridge address, time compressed through the guard's settings, and `imagekit pod` run as a
renter runs it, over real SSH.

The exit stop waits for every run (two runs, the short one ending first) and for the documented `pod run && pod wait
&& pod cp` chain; a process holding GPU memory while nothing moves is hung, a checkpoint save is not; the launch
check reads the script `pod run` starts; a job training on the CPU is said by `pod logs -f`; `import torch` fails on
a pod whose start check found no GPU; a stopped pod is started again and its output copied. Each adds its row to the
scenario table (docs/pods.md).
"""

from __future__ import annotations

import threading
import time

import pytest

from tests import guard_pod
from tests.guard_pod import (
    POD_ID,
    STOP,
    fake_gpu,
    guard_line,
    imagekit,
    logs_with,
    quiet_for,
    sent,
    ssh,
    ssh_argv,
    start,
    target,
    throwaway_key,
    wait_request,
)
from tests.in_image.test_guard_scenarios import _pod_run, _run_ended

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROWS = guard_pod.ROWS


def _stopped(api, before: int) -> float:  # type: ignore[no-untyped-def]
    arrived = wait_request(api, before + 1, timeout=60)
    assert sent(api, -1) == STOP and len(api.seen) == before + 1
    return arrived


def test_two_runs_no_stop_until_both_ended_and_the_grace_passed(real_build, engine, api, tmp_path):
    """A 12-step training run and, while it is at step 2, a short `pod run -- nvidia-smi`-like one that ends at once:
    the exit stop (grace 3 s) waits for the training run, then for the grace (it stopped the pod 5.5 s after the
    short run ended)."""
    result, _ = real_build
    before = len(api.seen)
    pod, vol = start(engine, result.tag, api, tmp_path, {"IMAGEKIT_ON_EXIT": "stop", "IMAGEKIT_EXIT_GRACE": "3s"})
    try:
        train = _pod_run(pod, "python -c 'import time\nfor i in range(12): print(\"step\", i, flush=True); "
                              "time.sleep(1)'")  # fmt: skip
        time.sleep(2)
        short = _pod_run(pod, "echo 'GPU 0: fake'")
        short_ended = _run_ended(vol, short)
        quiet_for(api, before, 6, pod)  # two graces after the short run: the training goes on
        assert "step 7" in (vol / ".imagekit" / "runs" / train / "log").read_text()
        ended = _run_ended(vol, train, timeout=30)
        arrived = _stopped(api, before)
        line = guard_line(pod, "exit")
        assert "every run and job ended (exit code 0)" in line and 3 <= arrived - ended < 3 + 4, line
    finally:
        pod.remove()
    ROWS.append(("two `pod run` runs, the short one ending first (training 12 s, grace 3 s)", "no stop until both "
                 "ended and the grace passed", f"no request in 6 s after the short run ended (it was stopped 5.5 s "
                 f"after it); stop {arrived - ended:.1f} s after the training run ended ({arrived - short_ended:.1f} "
                 "s after the short one)"))  # fmt: skip


def test_pod_run_then_wait_then_cp_of_200_mb_completes_before_the_stop(real_build, engine, api, tmp_path):
    """The documented chain, as a renter types it, with the default exit stop and a grace shorter than the copy (1
    s): `pod cp` holds its lease while it copies, so the stop comes after the copy, and only one."""
    result, _ = real_build
    before = len(api.seen)
    env = {"IMAGEKIT_ON_EXIT": "stop", "IMAGEKIT_EXIT_GRACE": "1s", "PUBLIC_KEY": throwaway_key(tmp_path)}
    pod, _ = start(engine, result.tag, api, tmp_path, env)
    try:
        ssh(pod, tmp_path, "true")
        to = target(pod, tmp_path)
        ran = imagekit("pod", "run", *to, "--", "sleep 2; head -c 200000000 /dev/urandom > /workspace/model.bin")
        assert ran.returncode == 0, ran.stderr
        waited = imagekit("pod", "wait", *to)
        assert waited.returncode == 0, waited.stderr
        began = time.time()
        copied = imagekit("pod", "cp", f"{to[0]}:/workspace/model.bin", str(tmp_path / "model.bin"), *to[1:])
        done = time.time()
        assert copied.returncode == 0, copied.stderr
        assert (tmp_path / "model.bin").stat().st_size == 200_000_000 and len(api.seen) == before, pod.logs()[-2000:]
        arrived = _stopped(api, before)
        quiet_for(api, before + 1, 3, pod)  # one stop, nothing after
        assert 1 <= arrived - done < 1 + 5 and done - began > 1, (done - began, arrived - done)
    finally:
        pod.remove()
    ROWS.append(("`pod run ... && pod wait && pod cp` of 200 MB with the default exit stop (grace 1 s, shorter than "
                 "the copy)", "the copy completes, then one stop", f"copied in {done - began:.1f} s, no request "
                 f"meanwhile; one stop {arrived - done:.1f} s after the copy"))  # fmt: skip


def test_a_hung_gpu_holder_is_stopped_and_a_checkpoint_save_at_0_percent_is_not(real_build, engine, api, tmp_path):
    """A process holds GPU memory (nvidia-smi lists it) with every GPU at 0 %: while a checkpoint is written (10 s
    of writes, longer than the 6 s hung window) nothing stops; once nothing moves, the hung stop fires after its
    window, with a warning first (the login banner's too)."""
    result, _ = real_build
    before = len(api.seen)
    fake = fake_gpu(tmp_path, util="0\n", procs="4242\n")
    env = {"IMAGEKIT_IDLE_STOP": "4s", "IMAGEKIT_HUNG_STOP": "6s", "IMAGEKIT_GPU_IDLE_WARN": "2s"}
    pod, vol = start(engine, result.tag, api, tmp_path, env, fake=fake)
    try:
        save = ("python -c 'import time\nf = open(\"/workspace/ckpt.pt\", \"wb\")\nfor _ in range(100):\n"
                "    f.write(bytes(1 << 20)); f.flush(); time.sleep(0.1)'")  # fmt: skip
        run_id = _pod_run(pod, save)
        saved = _run_ended(vol, run_id, timeout=60)
        assert len(api.seen) == before and (vol / "ckpt.pt").stat().st_size == 100 << 20, pod.logs()[-2000:]
        arrived = _stopped(api, before)
        line = guard_line(pod, "hung")
        assert "1 process(es) held GPU memory" in line and "IMAGEKIT_HUNG_STOP=6s" in line
        assert 6 <= arrived - saved < 6 + 5, line
        assert "hung?" in logs_with(pod, "warning:")
    finally:
        pod.remove()
    ROWS.append(("a checkpoint save at 0 % GPU (100 MB over 10 s) beside a process holding GPU memory; hung window 6 s",
                 "no stop while it writes", "no request during the save"))  # fmt: skip
    ROWS.append(("then the process holds GPU memory at 0 % and nothing moves", "hung stop after its window",
                 f"stop {arrived - saved:.1f} s after the save ended; a `hung?` warning first"))  # fmt: skip


def test_pod_run_of_a_script_with_a_2_gpu_config_on_a_1_gpu_pod_is_refused_before_it_starts(real_build, engine, api,
                                                                                            tmp_path):  # fmt: skip
    """`pod run -- bash train.sh`, whose `accelerate launch` (after a `cd`, continued over lines) names a 2-process
    config, on a pod with one GPU: the launch check reads the script, refuses, nothing starts."""
    result, _ = real_build
    fake = fake_gpu(tmp_path, util="0\n")
    (fake / "gpus").write_text("0, NVIDIA H100 80GB HBM3, 550.54.15, 9.0, 81559 MiB, GPU-0a1b2c3d\n")
    env = {"PUBLIC_KEY": throwaway_key(tmp_path), "IMAGEKIT_SKIP_DOCTOR": "1"}  # the start check's torch probe: none
    pod, vol = start(engine, result.tag, api, tmp_path, env, fake=fake)
    try:
        (vol / "cfg").mkdir()
        (vol / "cfg" / "two.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
        (vol / "train.sh").write_text("#!/bin/bash\nset -e\ncd /workspace/cfg\nCONFIG=two.yaml\naccelerate launch \\\n"
                                      "  --config_file $CONFIG ../train.py\n")  # fmt: skip
        ssh(pod, tmp_path, "true")
        refused = imagekit("pod", "run", *target(pod, tmp_path), "--", "bash /workspace/train.sh")
        assert refused.returncode == 1, refused.stderr
        said = refused.stderr
        assert "the launch check found 1 blocker(s); nothing was started on the pod" in said
        assert "num_processes: 2 but this machine has 1 GPU(s)" in said and "/workspace/train.sh" in said
        assert not (vol / ".imagekit" / "runs").exists()
    finally:
        pod.remove()
    ROWS.append(("`pod run -- bash train.sh`, whose `accelerate launch` names a 2-GPU config, on a 1-GPU pod",
                 "refused before it starts", "exit 1, `num_processes: 2 but this machine has 1 GPU(s)` (the launch in "
                 "/workspace/train.sh); no run folder made"))  # fmt: skip


def test_a_script_training_on_the_cpu_on_a_gpu_pod_is_warned_of_by_pod_logs_follow(real_build, engine, api, tmp_path):
    """A script that sets `device = "cpu"` itself passes the start check (the GPU is fine); while it runs, the GPU
    stays at 0 %: the guard's warning reaches the renter in `pod logs -f`, where they look."""
    result, _ = real_build
    fake = fake_gpu(tmp_path, util="0\n")
    (fake / "gpus").write_text("0, NVIDIA H100 80GB HBM3, 550.54.15, 9.0, 81559 MiB, GPU-0a1b2c3d\n")
    # a GPU pod whose GPU works: the start check passes (its torch probe, which would find no GPU here, skipped)
    env = {"PUBLIC_KEY": throwaway_key(tmp_path), "IMAGEKIT_GPU_IDLE_WARN": "3s", "IMAGEKIT_MAX_RUNTIME": "10m",
           "IMAGEKIT_SKIP_DOCTOR": "1"}  # fmt: skip
    pod, _ = start(engine, result.tag, api, tmp_path, env, fake=fake)
    try:
        ssh(pod, tmp_path, "true")
        to = target(pod, tmp_path)
        train = ("python -c 'import time\ndevice = \"cpu\"\nend = time.time() + 10\nwhile time.time() < end: pass\n"
                 "print(\"trained on\", device)'")  # fmt: skip
        ran = imagekit("pod", "run", *to, "--", train)
        assert ran.returncode == 0, ran.stderr
        followed = imagekit("pod", "logs", *to, "-f", timeout=120)
        assert followed.returncode == 0 and "trained on cpu" in followed.stdout, followed.stderr
        warned = [ln for ln in followed.stderr.splitlines() if "warning from the pod's lifetime guard" in ln]
        assert warned and "a job runs, but the GPUs were at or under 5 %" in warned[0], followed.stderr
        assert "training on the CPU at GPU rates" in warned[0]
    finally:
        pod.remove()
    ROWS.append(("a script forcing `device = \"cpu\"` on a GPU pod (GPU at 0 %, warn after 3 s)", "the warning "
                 "printed by `pod logs -f`", "`warning from the pod's lifetime guard: ... a job runs, but the GPUs "
                 "were at or under 5 % ... training on the CPU at GPU rates ...` in `pod logs -f`"))  # fmt: skip


def test_import_torch_fails_naming_the_cause_on_a_pod_whose_start_check_found_no_gpu(real_build, engine, api,
                                                                                      tmp_path):  # fmt: skip
    """`ssh pod python -c 'import torch'` on a pod that requires a GPU and has none (this host): the start check found
    torch without one; the import fails at once, naming it, instead of training at CPU speed."""
    result, _ = real_build
    env = {"PUBLIC_KEY": throwaway_key(tmp_path), "IMAGEKIT_REQUIRE_GPU": "1"}
    pod, _ = start(engine, result.tag, api, tmp_path, env)
    try:
        logs_with(pod, "every `import torch` in this image now fails", timeout=120)
        ssh(pod, tmp_path, "true")
        import subprocess

        refused = subprocess.run([*ssh_argv(pod, tmp_path), "python -c 'import torch'"], capture_output=True,
                                 text=True, timeout=120)  # fmt: skip
        assert refused.returncode == 1 and "CpuFallbackRefused" in refused.stderr, refused.stderr
        assert "this pod's start check found that torch cannot use its GPU: cpu-fallback:" in refused.stderr
        anyway = "IMAGEKIT_ALLOW_CPU=1 python -c 'import torch; print(torch.__version__)'"
        allowed = subprocess.run([*ssh_argv(pod, tmp_path), anyway], capture_output=True, text=True, timeout=120)
        assert allowed.returncode == 0 and allowed.stdout.startswith("2.1.2"), allowed.stderr
    finally:
        pod.remove()
    ROWS.append(
        (
            "`ssh pod python -c 'import torch'` on a pod whose start check found no GPU (`IMAGEKIT_REQUIRE_GPU=1`"
            ", no GPU)",
            "fails at import, naming the cause",
            "exit 1: `CpuFallbackRefused: ... this pod's start "
            "check found that torch cannot use its GPU: cpu-fallback: ...`; `IMAGEKIT_ALLOW_CPU=1` imports",
        )
    )


def test_pod_start_on_a_stopped_pod_then_pod_cp_of_its_output(real_build, engine, tmp_path):
    """The guard stops the pod after its run (the stand-in stops the container, as RunPod does); `pod cp` then says
    the pod may be stopped and names `pod start`; `imagekit pod start POD_ID` (the stand-in starts the container
    again: a new SSH port, as RunPod may give) and the output is copied; the run of the last start is no exit now."""
    result, _ = real_build
    holder: dict = {}

    def answer(seen):  # RunPod: the action answered, then carried out
        import json

        action = json.loads(seen.body or b"{}").get("action")
        box = holder["pod"].container
        threading.Thread(target=box.stop if action == "stop" else box.start, daemon=True).start()
        return 200, {}, json.dumps({"id": POD_ID, "status": "EXITED" if action == "stop" else "RUNNING"}).encode()

    with guard_pod.stand_in(engine, answer) as api:
        env = {"IMAGEKIT_ON_EXIT": "stop", "IMAGEKIT_EXIT_GRACE": "1s", "PUBLIC_KEY": throwaway_key(tmp_path)}
        pod, _ = start(engine, result.tag, api, tmp_path, env)
        holder["pod"] = pod
        try:
            ssh(pod, tmp_path, "true")
            to = target(pod, tmp_path)
            assert imagekit("pod", "run", *to, "--", "echo 'final loss 0.12' > /workspace/out.txt").returncode == 0
            wait_request(api, 1, timeout=60)
            begin = time.time()
            while pod.container.status != "exited":
                assert time.time() - begin < 60
                time.sleep(0.2)
                pod.container.reload()
            lost = imagekit("pod", "cp", f"{to[0]}:/workspace/out.txt", str(tmp_path / "out.txt"), *to[1:])
            assert lost.returncode == 3 and "imagekit pod start POD_ID" in lost.stderr, lost.stderr
            started = imagekit("pod", "start", POD_ID, "--api-url", f"{api.url}/v2")
            assert started.returncode == 0 and "is starting" in started.stderr, started.stderr
            assert sent(api, -1) == ("POST", f"/v2/pods/{POD_ID}/action", "start")
            pod.wait(guard_pod.containers.ready_times("imagekit: ready", 2))
            ssh(pod, tmp_path, "true")
            to = target(pod, tmp_path)  # its SSH port after the start
            copied = imagekit("pod", "cp", f"{to[0]}:/workspace/out.txt", str(tmp_path / "out.txt"), *to[1:])
            assert copied.returncode == 0 and (tmp_path / "out.txt").read_text() == "final loss 0.12\n"
            quiet_for(api, 2, 4, pod)  # the run ended before this start: no exit, no stop
        finally:
            pod.remove()
    ROWS.append(("`pod start` on a pod the exit stop stopped, then `pod cp` of its output", "the copy names `pod "
                 "start` while stopped; after it, the output copies and nothing stops the pod again", "`pod cp` exit 3 "
                 "naming `imagekit pod start POD_ID`; `POST /v2/pods/{id}/action` start; the output copied; no "
                 "request in 4 s after"))  # fmt: skip
