"""`pod run`, `pod wait` and `pod logs` trust only a runs folder no other user of the pod can change (issue 49's
finding, the guard's own state rule): the real scripts, run by bash here over folders of the test's own, owned and
moded as a pod's users would leave them. And what the lifetime guard warns of reaches the renter through them."""

from __future__ import annotations

import os

import pytest

from imagekit.errors import CheckFailed
from imagekit.services.pods import pod_runs
from tests.services.test_pod_runs_planted import OPTS, TARGET, LocalShell, _nothing


class Shell(LocalShell):
    """LocalShell with the guard's warning file where the test says."""

    def __init__(self, runs, warning=None):
        super().__init__(runs)
        self.warning = warning

    def capture(self, command: str, timeout: float = 300.0) -> tuple[int, str]:
        extra = f'IMAGEKIT_WARNING_FILE="{self.warning}"; export IMAGEKIT_WARNING_FILE; ' if self.warning else ""
        return super().capture(extra + command, timeout)


def _volume(tmp_path, runs_owner=0, runs_mode=0o700, parent_mode=0o755):
    """A volume as a pod's users leave it: ``.imagekit`` (mode ``parent_mode``), its ``runs`` (owner and mode)."""
    os.chmod(tmp_path, 0o755)
    parent = tmp_path / "workspace" / ".imagekit"
    runs = parent / "runs"
    runs.mkdir(parents=True)
    os.chmod(tmp_path / "workspace", 0o755)
    os.chmod(parent, parent_mode)
    os.chmod(runs, runs_mode)
    os.chown(runs, runs_owner, runs_owner)
    return runs


def test_a_private_runs_folder_runs_and_the_guards_warning_is_said(tmp_path):
    runs = _volume(tmp_path)
    warning = tmp_path / "guard-warning"
    warning.write_text("imagekit-guard, 2026-12-07 10:00:00Z: a job runs, but the GPUs were at or under 5 % for 10m\n"
                       "\x1b[2Jsecond line\n")  # fmt: skip
    said: list[str] = []
    started = pod_runs.start(TARGET, "exit 3", OPTS, said.append, dial=Shell(runs, warning).dial, check_launch=False,
                             ignore_blockers=True)  # fmt: skip
    assert pod_runs.RUN_ID.fullmatch(started.run_id)
    assert said == [
        "warning from the pod's lifetime guard: imagekit-guard, 2026-12-07 10:00:00Z: a job runs, but the "
        "GPUs were at or under 5 % for 10m",
        "warning from the pod's lifetime guard: second line",
    ]
    said.clear()
    assert pod_runs.wait(TARGET, started.run_id, OPTS, said.append, dial=Shell(runs, warning).dial) == 3
    assert len(said) == 2 and "GPUs were at or under 5 %" in said[0]


@pytest.mark.parametrize(
    ("runs_owner", "runs_mode", "parent_mode", "unsafe"),
    [
        (65534, 0o700, 0o755, "runs (owner uid 65534, mode 700)"),  # made first by another user
        (0, 0o777, 0o755, "runs (owner uid 0, mode 777)"),
        (0, 0o700, 0o775, ".imagekit (owner uid 0, mode 775)"),  # a group could rename runs away
        (0, 0o700, 0o1777, None),  # sticky, as /tmp: no one renames another's folder
    ],
)
def test_a_runs_folder_another_user_can_change_is_refused_before_anything_runs(
    tmp_path, runs_owner, runs_mode, parent_mode, unsafe
):
    runs = _volume(tmp_path, runs_owner, runs_mode, parent_mode)
    ran = tmp_path / "ran"
    start = lambda: pod_runs.start(TARGET, f"touch {ran}", OPTS, _nothing, dial=Shell(runs).dial,  # noqa: E731
                                   check_launch=False, ignore_blockers=True)  # fmt: skip
    if unsafe is None:
        assert pod_runs.RUN_ID.fullmatch(start().run_id)
        return
    with pytest.raises(CheckFailed) as err:
        start()
    assert "the pod's runs folder is not private" in err.value.message and unsafe in err.value.message
    assert "chmod 700" in err.value.hint and not ran.exists() and os.listdir(runs) == []
    (runs / "20261207T000000Z-1").mkdir()
    (runs / "20261207T000000Z-1" / "pid").write_text("1\n")
    with pytest.raises(CheckFailed, match="not private"):  # nor is a run in it waited on or its log shown
        pod_runs.wait(TARGET, "20261207T000000Z-1", OPTS, _nothing, dial=Shell(runs).dial)
