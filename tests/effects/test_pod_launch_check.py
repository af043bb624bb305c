"""`imagekit pod run` checks the launch before it starts it, against real OpenSSH servers on loopback (a full one and
a terminal-only gateway like RunPod's): the pod's `imagekit-doctor` is this tree's doctor, run as the image's wrapper
runs it; the pod has one GPU (an `nvidia-smi` that lists one, which is how the doctor counts them) and an Accelerate
default config asking for two processes; `accelerate` there says it launched and leaves a mark. No mocks of paramiko,
sshd or the doctor."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests import sshd

pytestmark = pytest.mark.sshd
ROOT = Path(__file__).resolve().parents[2]
DOCTOR = ROOT / "imagekit" / "in_image" / "imagekit_doctor.py"
NVIDIA_SMI = """#!/bin/sh
echo "0, NVIDIA GeForce RTX 3090, 550.54.14, 8.6, 24576 MiB, GPU-5f0e4a3c-0000-0000-0000-000000000000"
"""
PYTHON = Path(sys.prefix) / "bin" / "python"  # this environment's, as the image's venv: the doctor's identity check
LAUNCHER = """#!{python}
import pathlib, sys
print("launched:", *sys.argv[1:])
pathlib.Path("{mark}").touch()
"""
TWO_PROCESSES = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 1\nnum_processes: 2\n"


def _pod(root: Path) -> dict[str, str]:
    """The pod's files: its PATH (doctor, nvidia-smi, accelerate), its HF_HOME; the env that points at them."""
    bin_ = root / "bin"
    bin_.mkdir(parents=True)
    files = {
        # as templates/context/bin's; with the pod's PATH (the full server's bash also reads this host's ~/.bashrc,
        # sshd's rule for a remote shell, which may put another Python first: not the pod's environment)
        "imagekit-doctor": f'#!/bin/sh\nPATH={bin_}:{PYTHON.parent}:$PATH exec {PYTHON} -I {DOCTOR} "$@"\n',
        "nvidia-smi": NVIDIA_SMI,
        "accelerate": LAUNCHER.format(python=PYTHON, mark=root / "launched"),
    }
    for name, text in files.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    (root / "hf" / "accelerate").mkdir(parents=True)
    (root / "hf" / "accelerate" / "default_config.yaml").write_text(TWO_PROCESSES)
    return {
        "PATH": f"{bin_}:{PYTHON.parent}:/usr/bin:/bin",  # python, pip and accelerate of one environment
        "HF_HOME": str(root / "hf"),
        "IMAGEKIT_BLOCKED_FILE": str(root / "blocked"),
        "IMAGEKIT_RUNS": str(root / "runs"),
    }


@pytest.fixture(scope="module")
def launch_full(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch-full")
    env = " ".join(f"{k}={v}" for k, v in _pod(root).items())
    with sshd.serve(root, "full", extra_config=[f"SetEnv {env}"]) as server:
        yield server


@pytest.fixture(scope="module")
def launch_gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch-gateway")
    env = _pod(root)
    rc = "export " + " ".join(f"{k}={v}" for k, v in env.items())
    with sshd.serve(root, "gateway", rc_extra=rc) as server:
        yield server


@pytest.fixture
def pod(request, tmp_path, monkeypatch, launch_full, launch_gateway):
    """The server of the test's ``kind``, known to a HOME's known_hosts; its marks and runs cleared afterwards."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    hosts = launch_full.known_hosts_line() + launch_gateway.known_hosts_line()
    (tmp_path / "home" / ".ssh" / "known_hosts").write_text(hosts)
    server = launch_full if request.param == "full" else launch_gateway
    yield server
    for name in ("launched", "blocked"):
        (server.root / name).unlink(missing_ok=True)


def _run(app, runner, server, *command: str, extra: tuple[str, ...] = ()):
    return runner.invoke(app, ["pod", "run", server.target, "--key", str(server.key), *extra, "--", *command])


def _runs(server) -> list[str]:
    runs = server.root / "runs"
    return sorted(p.name for p in runs.iterdir() if p.name != "latest") if runs.exists() else []


def _wait(app, runner, server, run_id: str):
    return runner.invoke(app, ["pod", "wait", server.target, "--key", str(server.key), "--run", run_id])


@pytest.mark.parametrize("pod", ["full", "gateway"], indirect=True)
def test_a_two_process_accelerate_config_on_a_one_gpu_pod_is_refused_with_nothing_started(app, runner, pod):
    before = _runs(pod)
    res = _run(app, runner, pod, "accelerate", "launch", "train.py")
    assert res.exit_code == 1, res.output
    assert "launch check found 1 blocker" in res.output and "nothing was started" in res.output
    assert "num_processes: 2" in res.output and "1 GPU(s)" in res.output, res.output
    assert "--skip-launch-check" in res.output and res.stdout == ""  # no run id
    assert not (pod.root / "launched").exists() and _runs(pod) == before


@pytest.mark.parametrize("pod", ["full", "gateway"], indirect=True)
def test_skip_launch_check_starts_it(app, runner, pod):
    res = _run(app, runner, pod, "accelerate", "launch", "train.py", extra=("--skip-launch-check",))
    assert res.exit_code == 0, res.output
    run_id = res.stdout.strip()
    assert _wait(app, runner, pod, run_id).exit_code == 0
    assert (pod.root / "launched").exists() and "launch check" not in res.output


@pytest.mark.parametrize("pod", ["full", "gateway"], indirect=True)
def test_a_launch_the_gpus_fit_starts_and_reads_the_commands_own_options(app, runner, pod):
    """`--num_processes 1` in the command wins over the config, as accelerate itself decides; a shell line around
    the launch (a cd, an assignment) is read through."""
    res = _run(app, runner, pod, f"cd {pod.root} && FOO=1 accelerate launch --num_processes 1 train.py")
    assert res.exit_code == 0, res.output
    assert _wait(app, runner, pod, res.stdout.strip()).exit_code == 0
    assert (pod.root / "launched").exists()


@pytest.mark.parametrize("pod", ["full"], indirect=True)
def test_ignore_blockers_starts_it_and_says_what_it_ignored(app, runner, pod):
    res = _run(app, runner, pod, "accelerate", "launch", "train.py", extra=("--ignore-blockers",))
    assert res.exit_code == 0, res.output
    assert "starting anyway (--ignore-blockers)" in res.output and "num_processes: 2" in res.output
    assert _wait(app, runner, pod, res.stdout.strip()).exit_code == 0


@pytest.mark.parametrize("pod", ["full", "gateway"], indirect=True)
def test_a_pod_whose_start_check_found_a_blocker_refuses_the_run_as_exec_does(app, runner, pod):
    (pod.root / "blocked").write_text("FAIL torch-probe: torch sees no GPU (cuda False)\n  fix: use a GPU host\n")
    before = _runs(pod)
    res = _run(app, runner, pod, "accelerate", "launch", "--num_processes", "1", "train.py")
    assert res.exit_code == 1 and "the pod has a blocker" in res.output and "torch sees no GPU" in res.output
    assert not (pod.root / "launched").exists() and _runs(pod) == before


@pytest.mark.parametrize("pod", ["full"], indirect=True)
def test_a_pod_without_imagekit_doctor_is_said_and_the_run_starts(app, runner, pod):
    """Not an imagekit image: nothing pinned to check against; `pod run` says so and starts it (docs/pods.md)."""
    doctor = pod.root / "bin" / "imagekit-doctor"
    doctor.rename(pod.root / "hidden-doctor")
    try:
        res = _run(app, runner, pod, "accelerate", "launch", "train.py")
    finally:
        (pod.root / "hidden-doctor").rename(doctor)
    assert res.exit_code == 0, res.output
    assert "no imagekit-doctor" in res.output and "the launch was not checked" in res.output
    assert _wait(app, runner, pod, res.stdout.strip()).exit_code == 0
