"""The lifetime guard ends a pod only when it is done (issue 48): the exit stop waits for every run and job to end and
the pod to stay quiet for its grace (imagekit clients connected count); idle means idle (a session counts by the input
at its terminal, read from the TTY's access time as `w` reads it, and any process by its progress); a process holding
GPU memory while nothing moves is hung. In this process, over real processes, a real terminal and real folders; the
real image runs the same in test_guard_scenarios.py."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time

import pytest

from imagekit.in_image import guard, guard_files, guard_signs
from tests.in_image.test_guard_activity import BOOT, PASSWD, _proc_tree, _process

IDLE = {"gpu_util": [0], "gpu_procs": 0, "ssh": 0, "jupyter": 0, "heartbeat_age": None}


# ---- a session counts by the input at its terminal -------------------------------------------------------------------
def test_a_terminals_idle_time_is_its_devices_access_time_as_w_reads_it():
    """A real terminal: the shell reading what was typed sets the device's access time (the kernel does it at most
    every 8 seconds); nothing typed, it stays where it was, however long the session is open."""
    master, slave = pty.openpty()
    try:
        name = os.ttyname(slave)
        tty = name.removeprefix("/dev/")
        old = time.time() - 600
        os.utime(name, (old, os.stat(name).st_mtime))  # the last input ten minutes ago
        assert 595 <= guard_signs.input_age(tty, time.time(), "/dev") <= 605
        os.write(master, b"ls\n")  # typed
        assert os.read(slave, 64) == b"ls\n"  # and read by the shell at its prompt
        assert guard_signs.input_age(tty, time.time(), "/dev") < 10
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize("tty", ["pts/../../etc/passwd", "tty1", "", "pts/9999999999", None])
def test_only_a_pts_name_is_read_as_a_terminal(tty):
    assert guard_signs.input_age(tty, time.time(), "/dev") is None


def test_a_file_or_a_link_where_the_terminal_should_be_is_no_input(tmp_path):
    (tmp_path / "pts").mkdir()
    (tmp_path / "pts" / "3").write_text("")  # a file someone made: not the terminal
    (tmp_path / "pts" / "4").symlink_to("/dev/null")  # a link: never followed
    assert guard_signs.input_age("pts/3", time.time(), str(tmp_path)) is None
    assert guard_signs.input_age("pts/4", time.time(), str(tmp_path)) is None


def test_a_sessions_terminal_is_read_from_its_title(tmp_path, monkeypatch):
    monkeypatch.setattr(guard_signs, "SSHD_EXES", ("/usr/sbin/sshd",))
    proc = _proc_tree(tmp_path)
    _process(proc, 100, "sshd: root@pts/0", "/usr/sbin/sshd", 0)
    _process(proc, 101, "sshd: root@notty", "/usr/sbin/sshd", 0)
    found = guard_signs.ssh_session_list(str(proc), str(tmp_path / "passwd"))
    assert sorted(found) == [(100, "pts/0"), (101, None)] and BOOT and PASSWD


def test_a_session_left_at_a_prompt_is_idle_after_the_window_and_one_typing_now_and_then_is_not():
    s, _ = guard.settings({"IMAGEKIT_IDLE_STOP": "45m"})
    left = guard.Guard(s, started=0)
    fired = None
    for t in range(0, 12 * 3600, 30):  # logged in at t=0, typed once, then nothing: a night at the prompt
        fired = left.step(t, {**IDLE, "ssh": 1, "ssh_input": [float(t)]}, "")
        if fired:
            break
    assert fired is not None and fired[0] == "idle" and t == 45 * 60
    assert "1 SSH session(s) logged in, the last input at a terminal 45m ago" in fired[2]
    typing = guard.Guard(s, started=0)
    for t in range(0, 12 * 3600, 30):  # a keystroke every 20 minutes
        assert typing.step(t, {**IDLE, "ssh": 1, "ssh_input": [float(t % 1200)]}, "") is None


# ---- any process that makes progress is work; one that does not is not ---------------------------------------------
@pytest.mark.programs
def test_a_writer_makes_progress_and_a_sleeper_or_a_poller_does_not(tmp_path):
    out = tmp_path / "ckpt.pt"
    writer = subprocess.Popen([sys.executable, "-c", f"import time\nf = open({str(out)!r}, 'wb')\nwhile True:\n"
                               "    f.write(bytes(1 << 18)); f.flush(); time.sleep(0.05)"])  # fmt: skip
    sleeper = subprocess.Popen(["sleep", "30"])
    poller = subprocess.Popen(["sh", "-c", "while :; do test -e /nonexistent; sleep 0.5; done"])
    try:
        time.sleep(0.5)
        g = guard.Guard(guard.settings({"IMAGEKIT_IDLE_STOP": "1h"})[0], started=0)
        t0 = time.time()
        assert g._progress(t0, guard_signs.process_usage("/proc")) is None  # the first look: nothing to compare with
        time.sleep(2.0)
        lines = g._progress(time.time(), guard_signs.process_usage("/proc"))
    finally:
        for p in (writer, sleeper, poller):
            p.kill()
            p.wait()
    moving = " ".join(lines)
    assert f"process {writer.pid} (python" in moving and "MB/s" in moving
    assert f"process {sleeper.pid} " not in moving and f"process {poller.pid} " not in moving
    assert f"process {os.getpid()} " not in moving  # the guard's own process is never its own work


def test_a_process_making_progress_keeps_the_pod_and_idle_counts_from_when_it_stopped():
    s, _ = guard.settings({"IMAGEKIT_IDLE_STOP": "30m"})
    g = guard.Guard(s, started=0)
    ticks = 0
    for t in range(0, 3600, 30):  # preprocessing on the CPU for an hour: no GPU, no session, no heartbeat
        ticks += 30 * guard_signs.CLK_TCK
        assert g.step(t, {**IDLE, "usage": {"77 5": [ticks, 0, "python", ticks]}}, "") is None
    for t in range(3600, 3600 + 1800, 30):  # it finished at 3600 (its process stays, asleep)
        assert g.step(t, {**IDLE, "usage": {"77 5": [ticks, 0, "python", ticks]}}, "") is None
    fired = g.step(3600 + 1800, {**IDLE, "usage": {"77 5": [ticks, 0, "python", ticks]}}, "")
    assert fired is not None and fired[0] == "idle" and "no process made progress" in fired[2]


# ---- hung: a process holds GPU memory while nothing moves --------------------------------------------------------
def test_a_process_holding_gpu_memory_while_nothing_moves_is_hung_and_a_saving_one_is_not():
    s, _ = guard.settings({"IMAGEKIT_IDLE_STOP": "45m", "IMAGEKIT_HUNG_STOP": "60m", "IMAGEKIT_GPU_IDLE_WARN": "10m"})
    hung, saving = guard.Guard(s, started=0), guard.Guard(s, started=0)
    warned, fired, written = [], None, 0
    for t in range(0, 3 * 3600, 30):
        held = {**IDLE, "gpu_procs": 1, "usage": {"88 9": [500, 1 << 20, "python", 500]}}
        fired = fired or hung.step(t, held, "")
        warned += hung.warnings
        written += 30 * 1 << 20  # a checkpoint written at 1 MB/s, the GPUs at 0 %
        assert saving.step(t, {**held, "usage": {"88 9": [500, written, "python", 500]}}, "") is None
    assert fired is not None and fired[:2] == ("hung", "stop") and "IMAGEKIT_HUNG_STOP=1h" in fired[2]
    assert "held GPU memory for 1h while every GPU idled and nothing made progress" in fired[2]
    assert len(warned) == 1 and "hung?" in warned[0] and hung.hung_banner and "IMAGEKIT_HUNG_STOP=1h" in (
        hung.banner_text() or "")  # fmt: skip


def test_without_the_hung_stop_a_gpu_holder_keeps_the_pod_as_before():
    s, _ = guard.settings({"IMAGEKIT_IDLE_STOP": "45m"})
    g = guard.Guard(s, started=0)
    for t in range(0, 6 * 3600, 30):
        assert g.step(t, {**IDLE, "gpu_procs": 1}, "") is None


# ---- the exit stop: every run ended, then the grace with no client ------------------------------------------------
def test_the_exit_stop_waits_while_an_imagekit_client_is_connected():
    """`pod run && pod wait && pod cp`: the run ended at 100; `pod wait` returned at 101 and `pod cp` copied until
    2000 (its lease held): the stop comes a grace after the copy, not after the run."""
    s, _ = guard.settings({"IMAGEKIT_ON_EXIT": "stop", "IMAGEKIT_EXIT_GRACE": "10m"})
    g = guard.Guard(s, started=0)
    exits, notes = [(100.0, 0)], []
    for t in range(0, 2000, 30):
        sample = {**IDLE, "exits": exits if t >= 100 else [], "clients": 1 if 90 <= t < 2000 else 0}
        assert g.step(t, sample, "", job_running=t < 100) is None, t
        notes += g.notes
    for t in range(2000, 2000 + 600, 30):
        assert g.step(t, {**IDLE, "exits": exits, "clients": 0}, "") is None
    fired = g.step(2600, {**IDLE, "exits": exits, "clients": 0}, "")
    assert fired is not None and fired[:2] == ("exit", "stop") and "0 imagekit client(s) connected" in fired[2]
    assert len(notes) == 1 and "1 run(s) or job(s) ended since this start, none runs now" in notes[0]


def test_no_exit_stop_without_an_exit_and_none_while_a_job_runs():
    s, _ = guard.settings({"IMAGEKIT_ON_EXIT": "terminate"})
    g = guard.Guard(s, started=0)
    for t in range(0, 6 * 3600, 30):  # a pod someone works on by hand: no run ever ended
        assert g.step(t, IDLE, "") is None
    for t in range(0, 6 * 3600, 30):  # a run ended, another still runs (a stalled one, even)
        assert g.step(t, {**IDLE, "exits": [(10.0, 0)]}, "", job_running=True) is None


# ---- what the guard reads for it: leases and exits, in folders root's alone ----------------------------------------
def _lease(folder, pid):
    folder.mkdir(mode=0o700, exist_ok=True)
    (folder / str(pid)).write_text((guard_signs.identity(pid) or "x") + "\n")


def test_a_lease_counts_while_its_process_runs_and_a_stale_one_is_removed(tmp_path):
    os.chmod(tmp_path, 0o700)
    clients = tmp_path / "clients"
    holder = subprocess.Popen(["sleep", "30"])
    try:
        _lease(clients, holder.pid)
        (clients / "12").write_text(
            f"{guard_signs.boot_id()} 12 1\n"
        )  # a process long gone (its start time is not this)
        (clients / ".99.tmp").write_text("being written")  # a lease half there: not read, never removed
        assert guard_files.client_leases(str(clients)) == 1
        assert sorted(os.listdir(clients)) == [".99.tmp", str(holder.pid)]
    finally:
        holder.kill()
        holder.wait()
    assert guard_files.client_leases(str(clients)) == 0 and not (clients / str(holder.pid)).exists()


def test_leases_in_a_folder_another_user_can_write_count_for_nothing(tmp_path):
    os.chmod(tmp_path, 0o700)
    clients = tmp_path / "clients"
    _lease(clients, os.getpid())
    assert guard_files.client_leases(str(clients)) == 1
    os.chmod(clients, 0o733)  # anyone may drop a lease there: it would keep the pod up on their word
    assert guard_files.client_leases(str(clients)) == 0
    os.chmod(clients, 0o700)
    os.chown(clients, 65534, 65534)  # another user's folder
    assert guard_files.client_leases(str(clients)) == 0


def test_exits_are_read_from_runs_and_the_job_ending_since_this_start(tmp_path, monkeypatch):
    os.chmod(tmp_path, 0o700)
    runs = tmp_path / "runs"
    for name, code, when in [("20261207T000000Z-1", 0, 1000), ("20261207T000100Z-2", 3, 2000), ("bad", "x", 2000),
                             ("20261207T000200Z-3", 999, 2000)]:  # fmt: skip
        (runs / name).mkdir(parents=True)
        (runs / name / "exit").write_text(f"{code}\n")
        os.utime(runs / name / "exit", (when, when))
    (runs / "20261207T000300Z-4").mkdir()
    (runs / "20261207T000300Z-4" / "exit").symlink_to("/etc/passwd")  # a link: not an exit
    (tmp_path / "job-exit").write_text("0 2500.000\n")
    os.utime(tmp_path / "job-exit", (2500, 2500))
    env = {"IMAGEKIT_RUNS": str(runs)}
    monkeypatch.setattr(guard_files, "JOB_EXIT", str(tmp_path / "job-exit"))
    assert guard_files.exits_since(env, 1500) == [(2000.0, 3), (2500.0, 0)]
    assert guard_files.exits_since(env, 0) == [(1000.0, 0), (2000.0, 3), (2500.0, 0)]
    os.chmod(runs, 0o777)  # anyone could write an exit code there: the runs are not read
    assert guard_files.exits_since(env, 0) == [(2500.0, 0)]
