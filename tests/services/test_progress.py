"""Progress: what long steps print while they run (a terminal, a CI log, --quiet), and what services report."""

from __future__ import annotations

import hashlib
import io
import time

import pytest
from rich.console import Console

from imagekit.cli.progress_display import ConsoleProgress
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.services.builds.build import _StepTimer
from imagekit.services.builds.selftest_runner import _relay
from imagekit.services.progress import NullProgress, activity, human_bytes
from imagekit.services.wheels import fetch
from tests.recording import RecordingProgress
from tests.wheelfactory import build_wheel, serve, write_simple_index


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=200, color_system=None), buf


def _wait_for(predicate, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_ci_log_gets_a_line_every_interval_while_an_activity_runs(monkeypatch):
    monkeypatch.setenv("IMAGEKIT_PROGRESS_INTERVAL", "0.05")
    console, buf = _console(terminal=False)
    progress = ConsoleProgress(console)
    assert not progress.live
    act = progress.begin("cell-a", "download torch.whl", total=4_000_000, unit="B")
    act.update(1_000_000)
    assert _wait_for(lambda: "download torch.whl:" in buf.getvalue() and "1.0 MB of 4.0 MB" in buf.getvalue())
    act.update(4_000_000)
    act.finish("download torch.whl: 4.0 MB")
    text = buf.getvalue()
    assert text.splitlines()[0].startswith("cell-a download torch.whl: ")
    assert text.rstrip().endswith("cell-a download torch.whl: 4.0 MB")
    lines = len(text.splitlines())
    time.sleep(0.2)
    assert len(buf.getvalue().splitlines()) == lines  # the ticker stopped with the activity


def test_quiet_prints_nothing(monkeypatch):
    monkeypatch.setenv("IMAGEKIT_PROGRESS_INTERVAL", "0.05")
    console, buf = _console(terminal=True)
    progress = ConsoleProgress(console, quiet=True)
    progress.line("c", "hello")
    with activity(progress, "c", "step", total=3) as act:
        act.advance(3)
        time.sleep(0.15)
    assert buf.getvalue() == ""


def test_a_terminal_gets_bars_and_a_line_per_long_activity(monkeypatch):
    monkeypatch.setattr("imagekit.cli.progress_display.QUIET_BELOW_S", 0.0)
    console, buf = _console(terminal=True)
    progress = ConsoleProgress(console)
    assert progress.live
    with activity(progress, "c", "self-test"):
        assert progress.bars is not None
        progress.line("c", "self-test pass tiny-model 4.2s")
    assert progress.bars is None  # stopped when the last activity ended
    text = buf.getvalue()
    assert "c self-test pass tiny-model 4.2s" in text and "c self-test: " in text


def test_an_activity_that_raises_says_it_stopped():
    rec = RecordingProgress()
    with pytest.raises(RuntimeError), activity(rec, "c", "fetching wheels"):
        raise RuntimeError("boom")
    assert rec.activities[0].finished and rec.activities[0].summary == "fetching wheels: stopped"


def test_short_activities_end_without_a_line():
    console, buf = _console(terminal=False)
    with activity(ConsoleProgress(console), "c", "lock"):
        pass
    assert buf.getvalue() == ""


def test_cell_names_and_messages_are_not_markup():
    console, buf = _console(terminal=False)
    ConsoleProgress(console).line("[bold]x", "[red]literal[/]")
    assert buf.getvalue().strip() == "[bold]x [red]literal[/]"


def test_docker_build_steps_become_timed_activities():
    rec = RecordingProgress()
    steps = _StepTimer(rec, "c")
    for line in ["Step 1/3 : FROM base", " ---> abc", "Step 2/3 : RUN pip install x", "Step 3/3 : LABEL a=b"]:
        steps(line)
    steps.close()
    assert [a.label for a in rec.activities] == ["step 1/3 FROM", "step 2/3 RUN", "step 3/3 LABEL"]
    assert all(a.finished for a in rec.activities)
    assert [m for _, m in rec.lines] == ["Step 1/3 : FROM base", "Step 2/3 : RUN pip install x", "Step 3/3 : LABEL a=b"]


def test_a_layers_own_timings_are_relayed_and_its_other_output_is_not():
    rec = RecordingProgress()
    steps = _StepTimer(rec, "c")
    for line in ["Step 2/3 : RUN install-layer", "Installed 12 packages in 3.1s",
                 "install-layer: installed in 20.4 s (uv), bytecode 11.2 s\n",
                 "finalize-layer: 20511 paths: found in 2100 ms, clamped to SOURCE_DATE_EPOCH in 3400 ms"]:  # fmt: skip
        steps(line)
    assert [m for _, m in rec.lines] == [
        "Step 2/3 : RUN install-layer",
        "install-layer: installed in 20.4 s (uv), bytecode 11.2 s",
        "finalize-layer: 20511 paths: found in 2100 ms, clamped to SOURCE_DATE_EPOCH in 3400 ms",
    ]


def test_self_test_lines_are_relayed_one_per_check():
    rec = RecordingProgress()
    relay = _relay(rec, "c")
    for line in [
        "imagekit-selftest: pass dists-match-lock 0.4s",
        "some warning",
        "imagekit-selftest: fail tiny-model 3.1s",
    ]:
        relay(line)
    assert rec.lines == [("c", "self-test pass dists-match-lock 0.4s"), ("c", "self-test fail tiny-model 3.1s")]


@pytest.mark.loopback
def test_downloads_report_their_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    noise = "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(40_000))  # ~1.3 MB compressed
    wheel = build_wheel(tmp_path / "w", "bigpkg", "1.0", payload=f"# {noise}\n")
    write_simple_index(tmp_path / "idx", [wheel])
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    rec = RecordingProgress()
    with serve(tmp_path / "idx") as url:
        lock = Lock((), (LockEntry("bigpkg", "1.0", (f"sha256:{sha}",)),), {"index": f"{url}/simple"})
        (got,) = fetch.fetch_lock(lock, "3.11", "2.36", progress=rec, cell="c")
    assert got.downloaded
    (act,) = rec.activities
    assert act.label == f"download {wheel.name}" and act.unit == "B" and act.finished
    assert act.done == wheel.stat().st_size and act.updates >= 1
    assert fetch.fetch_lock(lock, "3.11", "2.36", progress=rec, cell="c")[0].downloaded is False
    assert len(rec.activities) == 1  # a cache hit downloads nothing


def test_null_progress_and_sizes():
    act = NullProgress().begin("c", "x")
    act.update(1)
    act.finish()
    assert [human_bytes(n) for n in (5, 1_500, 2_500_000, 5_300_000_000)] == ["5 B", "1.5 kB", "2.5 MB", "5.30 GB"]
