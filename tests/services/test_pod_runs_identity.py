"""A `pod run` run's process is its boot id, pid and start time (issue 42): the real start script records them
(``identity``, beside ``pid``), and `pod wait` and `pod logs -f`, run by a local shell over run folders in the test's
folder, stop waiting on a run whose pid now names another process (the container restarted: pids start again), where
they waited forever."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from imagekit.errors import EnvironmentFailure
from imagekit.in_image import guard_files, guard_signs
from imagekit.services.pods import pod_runs
from tests.services.test_pod_runs_planted import LIMIT_S, OPTS, TARGET, LocalShell, _nothing


class FollowingShell(LocalShell):
    """LocalShell that also runs a streamed command (`pod logs -f`), with the same time limit."""

    def run(self, command, timeout, out, err):
        code, text = self.capture(command, timeout)
        out(text)
        return code


@pytest.mark.seconds
def test_the_start_script_records_the_runs_identity_as_the_guard_reads_it(tmp_path):
    runs = tmp_path / "runs"
    code, out = LocalShell(runs).capture("umask 022; " + pod_runs.start_script("sleep 2; exit 5"))
    run = runs / out.strip()
    assert code == 0 and (run / "identity").is_file(), out
    pid = int((run / "pid").read_text())
    assert (run / "identity").read_text() == guard_signs.identity(pid) + "\n"
    assert guard_files.a_run_is_alive(str(runs))
    assert pod_runs.wait(TARGET, run.name, OPTS, _nothing, dial=LocalShell(runs).dial) == 5
    assert not guard_files.a_run_is_alive(str(runs))


def _reused(tmp_path):
    """A run whose pid file names a live process (a `sleep` here) that is not the run's: its identity says another
    start time, as after a container restart."""
    holder = subprocess.Popen(["sleep", "60"])
    run = tmp_path / "20261204T210000Z-9"
    run.mkdir()
    (run / "pid").write_text(f"{holder.pid}\n")
    boot, pid, start = guard_signs.identity(holder.pid).split()
    (run / "identity").write_text(f"{boot} {pid} {int(start) - 100}\n")
    (run / "log").write_text("epoch 1\nepoch 2\n")
    return holder, run


def test_pod_wait_on_a_run_whose_pid_was_reused_says_it_was_lost(tmp_path):
    holder, run = _reused(tmp_path)
    try:
        started = time.monotonic()
        with pytest.raises(EnvironmentFailure, match="the run ended without an exit code"):
            pod_runs.wait(TARGET, run.name, OPTS, _nothing, dial=LocalShell(tmp_path).dial)
        assert time.monotonic() - started < LIMIT_S
        assert not guard_files.a_run_is_alive(str(tmp_path))
    finally:
        holder.kill()
        holder.wait()


def test_pod_logs_follow_on_a_run_whose_pid_was_reused_prints_the_log_and_returns(tmp_path):
    holder, run = _reused(tmp_path)
    seen = []
    try:
        code = pod_runs.logs(TARGET, run.name, True, OPTS, seen.append, _nothing, _nothing,
                             dial=FollowingShell(tmp_path).dial)  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    assert code == 0 and "".join(seen) == "epoch 1\nepoch 2\n"
    assert os.path.exists(run / "pid")
