"""`imagekit pod run` and `pod wait` (services/pods/pod_runs.py) against bugs planted on purpose that every tier without
Docker let through: the run id a pod prints taken as it is, and `pod wait` on a run whose process died without an
exit code waiting forever. The wait script is the real one, run by a local shell (bash, as a pod's login shell
runs it) over run folders in the test's own folder; each test was run with its bug planted (and failed) and without
it (and passed)."""

from __future__ import annotations

import subprocess
import time
from contextlib import contextmanager

import pytest

from imagekit.clouds.podwire import parse_target
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.services.pods import pod, pod_runs
from tests.fakes import FakeTransport

TARGET = parse_target("root@pod.test:2222")
OPTS = pod.PodOptions()
LIMIT_S = 15  # a wait script that has not answered by then never will: the test fails instead of hanging the suite


def _nothing(*_: object) -> None:
    pass


# ---- the run id a pod prints is checked before it is shown or used -------------------------------------------------
# Planted: pod_runs.start takes the last line the pod printed as the run id (`not RUN_ID.fullmatch(said)` gone).
@pytest.mark.parametrize(
    "said",
    [
        "\x1b]0;pwned\x07\n",  # retitles the user's terminal
        "20261202T130501Z-42\x1b[2J\n",  # a real id, then clears the screen
        "../../../root/.ssh\n",  # `pod wait --run` and `pod logs` would look there
        "20261202T130501Z-42/../../x\n",
        "20261202T130501Z-42 ; rm -rf /\n",
        "started\n",
        "\n",
    ],
)
def test_a_run_id_the_pod_prints_that_is_not_one_is_refused(said):
    t = FakeTransport(answers={"set -e;": (0, said)})
    with pytest.raises(EnvironmentFailure, match="the run did not start on the pod") as err:
        pod_runs.start(TARGET, "python train.py", OPTS, _nothing, dial=t.dial)
    assert "\x1b" not in err.value.message and "\x07" not in err.value.message
    # the blocked probe, the launch check, the start; nothing after
    assert [c[0] for c in t.calls] == ["connect", "capture", "capture", "capture"]


def test_a_run_id_the_pod_prints_is_the_runs_id():
    t = FakeTransport(answers={"set -e;": (0, "mkdir: warning\n20261202T130501Z-42\n")})
    started = pod_runs.start(TARGET, "python train.py", OPTS, _nothing, dial=t.dial)
    assert started == pod_runs.Started("20261202T130501Z-42", "exec")


# ---- `pod wait` through a real shell ---------------------------------------------------------------------------------
class LocalShell:
    """A pod whose commands bash runs here, with ``$IMAGEKIT_RUNS`` in the test's folder."""

    mode = "exec"

    def __init__(self, runs):
        self.runs = runs

    @contextmanager
    def dial(self, target, opts, warn):
        yield self

    def capture(self, command: str, timeout: float = 300.0) -> tuple[int, str]:
        env = {"PATH": "/usr/bin:/bin", "IMAGEKIT_RUNS": str(self.runs), "SHELL": "/bin/sh", "HOME": "/"}
        try:
            res = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True,
                                 timeout=min(timeout, LIMIT_S))  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.fail(f"the pod's wait script had not answered after {LIMIT_S} s: it waits forever")
        return res.returncode, res.stdout

    def run(self, command: str, timeout: float, out, err) -> int:
        code, text = self.capture(command, timeout)
        out(text)
        return code


def _dead_pid() -> int:
    """The pid of a process that ran and was reaped (the run's process, gone with the pod's restart)."""
    res = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    return int(res.stdout)


# Planted: pod_runs.wait's script loops on `[ ! -e "$r/exit" ]` alone (its `kill -0 "$p" || break` gone).
def test_pod_wait_on_a_run_whose_process_died_without_an_exit_code_says_so(tmp_path):
    run = tmp_path / "20261202T130501Z-42"
    run.mkdir()
    (run / "pid").write_text(f"{_dead_pid()}\n")
    (tmp_path / "latest").symlink_to(run.name)
    shell = LocalShell(tmp_path)
    started = time.monotonic()
    for run_id in (None, run.name):
        with pytest.raises(EnvironmentFailure, match="the run ended without an exit code"):
            pod_runs.wait(TARGET, run_id, OPTS, _nothing, dial=shell.dial)
    assert time.monotonic() - started < LIMIT_S
    (run / "exit").write_text("3\n")  # it did end, and said how
    assert pod_runs.wait(TARGET, None, OPTS, _nothing, dial=shell.dial) == 3
    with pytest.raises(UsageError, match="no such run"):
        pod_runs.wait(TARGET, "20261202T130501Z-43", OPTS, _nothing, dial=shell.dial)


@pytest.mark.seconds
def test_pod_wait_follows_a_run_the_real_start_script_started_to_its_exit_code(tmp_path):
    runs = tmp_path / "runs"
    shell = LocalShell(runs)
    code, out = shell.capture("umask 022; " + pod_runs.start_script("sleep 1; exit 7"))
    run_id = out.strip()
    assert code == 0 and pod_runs.RUN_ID.fullmatch(run_id), out
    assert not (runs / run_id / "exit").exists()  # still running when the wait begins
    assert pod_runs.wait(TARGET, run_id, OPTS, _nothing, dial=shell.dial) == 7
