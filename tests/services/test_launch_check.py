"""`pod run`'s launch check (services/pods/launch_check.py) in this process: which words of a shell line the doctor
reads
as the launch, and what the doctor's exit code and report mean for the run. The real doctor on a real sshd:
tests/effects/test_pod_launch_check.py."""

from __future__ import annotations

import json

import pytest

from imagekit.errors import CheckFailed
from imagekit.services.pods import launch_check
from tests.fakes import FakeTransport


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("accelerate launch train.py", ["accelerate", "launch", "train.py"]),
        ("cd /workspace && HF_HOME=/w/hf accelerate launch --num_processes 1 t.py --lr 3",
         ["accelerate", "launch", "--num_processes", "1", "t.py", "--lr", "3"]),
        ("pip install -q x; /opt/venv/bin/torchrun --nproc_per_node=2 t.py | tee log",
         ["/opt/venv/bin/torchrun", "--nproc_per_node=2", "t.py"]),
        ("python -m torch.distributed.run --nproc_per_node 2 t.py", ["python", "-m", "torch.distributed.run",
                                                                     "--nproc_per_node", "2", "t.py"]),
        ("python train.py", []),  # the doctor then checks the default config, as `imagekit-doctor -- python ...`
        ("echo 'unbalanced", []),
        ("bash train.sh", ["bash", "train.sh"]),  # the doctor reads the script for the launch it runs
        ("X=1 sh -x ./run.sh --epochs 3", ["sh", "-x", "./run.sh", "--epochs", "3"]),
        ("cd /w && bash -c 'accelerate launch t.py'", ["accelerate", "launch", "t.py"]),
    ],
)  # fmt: skip
def test_the_launch_is_found_in_a_shell_line(command, words):
    assert launch_check.launch_words(command) == words


def test_the_pods_script_quotes_the_launch_and_never_launches_it():
    script = launch_check.script(["accelerate", "launch", "t.py; rm -rf /", "$(reboot)"])
    assert "--no-launch -- accelerate launch 't.py; rm -rf /' '$(reboot)'" in script
    assert "--no-launch --" not in launch_check.script([])


def _report(*checks: tuple[str, str, str, str]) -> str:
    doc = {"exit_code": 1, "checks": [dict(zip(("id", "status", "message", "fix"), c, strict=True)) for c in checks]}
    return "stray login noise\n" + json.dumps(doc, indent=2)


def test_a_blocker_refuses_naming_it_and_the_override_and_nothing_after_it():
    out = _report(
        ("manifest", "pass", "expecting /etc/imagekit/manifest.json", ""),
        ("accelerate-config", "fail", "cfg asks for num_processes: 2 but this machine has 1 GPU(s)\x1b[2J", "set 1"),
        ("disk-workspace", "warn", "9 GB free", "free some"),
    )
    t = FakeTransport(answers={"if command -v imagekit-doctor": (1, out)})
    said: list[str] = []
    with pytest.raises(CheckFailed) as err:
        launch_check.enforce(t, "accelerate launch t.py", said.append)
    assert "found 1 blocker(s); nothing was started" in err.value.message
    assert "num_processes: 2" in err.value.message and "(fix: set 1)" in err.value.message
    assert "\x1b" not in err.value.message and "--skip-launch-check" in err.value.hint
    assert said == ["warning: launch check: disk-workspace: 9 GB free (fix: free some)"]
    assert [c[0] for c in t.calls] == ["capture"]


def test_ignore_blockers_says_them_and_goes_on():
    out = _report(("lock-drift", "fail", "torch 2.5.0 (pinned 2.5.1)", "rebuild"))
    said: list[str] = []
    t = FakeTransport(answers={"if command -v imagekit-doctor": (1, out)})
    verdict = launch_check.enforce(t, "python t.py", said.append, ignore_blockers=True)
    assert verdict.blockers and said == [
        "warning: launch check: starting anyway (--ignore-blockers): lock-drift: torch 2.5.0 (pinned 2.5.1) "
        "(fix: rebuild)"
    ]


@pytest.mark.parametrize(
    ("code", "out", "said"),
    [
        (0, launch_check.NO_DOCTOR + "\n", "no imagekit-doctor (not an imagekit image?)"),
        (2, "", "predates --no-launch"),
        (124, "", f"did not finish in {launch_check.CHECK_SECONDS} s"),
        (3, _report(("interpreter", "error", "cannot inspect /opt/venv/bin/python", "")), "could not run every check"),
    ],
)
def test_what_cannot_be_checked_is_said_and_the_run_starts(code, out, said):
    verdict = launch_check.judge(code, out)
    assert not verdict.blockers and not verdict.checked
    [warning] = verdict.warnings
    assert said in warning and "the launch was not checked" in warning


def test_an_unreadable_report_with_a_blocker_exit_still_refuses():
    assert launch_check.judge(1, "garbage {").blockers == ["a blocker (its report could not be read)"]
    assert launch_check.judge(0, "garbage {") == launch_check.Verdict()


# Planted: launch_check.judge reads `if NO_DOCTOR in out:` (the exit code that goes with the marker not checked): a
# command's output naming the marker made a refused launch look unchecked, and the run started.
@pytest.mark.parametrize("code", [0, 1, 3, 124])
def test_the_no_doctor_marker_counts_only_with_its_exit_code(code):
    out = f"{launch_check.NO_DOCTOR}\n" + json.dumps({"checks": [{"id": "accelerate-config", "status": "fail",
                                                                  "message": "2 processes on 1 GPU"}]})  # fmt: skip
    verdict = launch_check.judge(code, out)
    no_doctor = any("has no imagekit-doctor" in w for w in verdict.warnings)
    assert no_doctor is (code == 0) and verdict.checked is (code == 1)
    if code == 1:  # the doctor ran and refused: a blocker, whatever else the output held
        assert verdict.blockers and "2 processes on 1 GPU" in verdict.blockers[0]


# Planted: launch_check.launch_words pops one leading VAR=value (`if` for `while`): five settings hid the launcher.
def test_every_leading_assignment_is_stripped_before_the_launcher_is_read():
    command = "A=1 B=2 NCCL_DEBUG=INFO CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4 accelerate launch --num_processes 2 x"
    assert launch_check.launch_words(command)[:4] == ["accelerate", "launch", "--num_processes", "2"]
    assert launch_check.launch_words("X=1 Y=2 Z=3 W=4 V=5 bash train.sh") == ["bash", "train.sh"]
