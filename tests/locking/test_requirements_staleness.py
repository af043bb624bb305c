"""The project's dependency file is an input of every cell's lock: a lock made for it is current, and an edit to its
requirements (not to its comments) makes the lock stale, for `lock --check`, render and fetch alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagekit.locking import resolution
from imagekit.services import inputs
from imagekit.services.locks.lock_cells import lock_path, status_of
from tests.conftest import ROOT

CELL_ID = "cu121-torch2.1.2-py3.11-tf4.48.2"  # its committed lock pins accelerate==1.2.1 and numpy<2 over torch
MATRIX = (
    '[matrix]\ncuda = ["12.1"]\ntorch = ["2.1.2"]\ntransformers = ["4.48.2"]\npython = ["3.11"]\n'
    'requirements = "requirements.txt"\n'
)


def _project(in_tmp: Path, requirements: str) -> None:
    (in_tmp / "imagekit.toml").write_text(MATRIX)
    (in_tmp / "requirements.txt").write_text(requirements)
    (in_tmp / "lockfiles").mkdir()
    (in_tmp / "lockfiles" / f"{CELL_ID}.txt").write_text((ROOT / "lockfiles" / f"{CELL_ID}.txt").read_text())


@pytest.mark.seconds
def test_a_lock_made_for_the_files_requirements_is_current_and_an_edit_makes_it_stale(app, runner, data, in_tmp):
    # the same requirements the committed lock was made for, stated by the project's file (torch's axis pin too)
    _project(in_tmp, "# training\ntorch==2.1.2\ntransformers\n-r base.txt\n")
    (in_tmp / "base.txt").write_text("accelerate==1.2.1\nnumpy<2\n")
    (cell,) = inputs.load_matrix(None, data).cells
    assert status_of(Path("lockfiles"), cell, resolution.LockSettings(), data).status == "up-to-date"
    ok = runner.invoke(app, ["lock", "--check"])
    assert ok.exit_code == 0, ok.output
    (in_tmp / "base.txt").write_text("accelerate==1.2.1\nnumpy<2\n# a comment changes nothing\n")
    assert runner.invoke(app, ["lock", "--check"]).exit_code == 0

    (in_tmp / "base.txt").write_text("accelerate==1.2.1\nnumpy<2\npeft==0.14.0\n")  # an included file, edited
    (cell,) = inputs.load_matrix(None, data).cells
    result = status_of(Path("lockfiles"), cell, resolution.LockSettings(), data)
    assert result.status == "stale"
    assert resolution.stale_reason(result.lock, cell, data).startswith(
        "was locked for other inputs (the cell's requirements or packages changed)"
    )
    stale = runner.invoke(app, ["lock", "--check"])
    assert stale.exit_code == 1 and "stale" in stale.output and str(lock_path(Path("lockfiles"), cell)) in stale.output
    assert "hint: `imagekit lock` locks them again" in stale.output
    for argv in (["render", "--out", "out"], ["fetch"]):
        refused = runner.invoke(app, argv)
        assert refused.exit_code == 1 and "peft is not pinned" in refused.output, (argv, refused.output)
    assert not (in_tmp / "out").exists()


def test_a_constraint_that_narrows_a_requirement_is_an_input_too(data, in_tmp):
    _project(in_tmp, "accelerate==1.2.1\nnumpy\n-c constraints.txt\n")
    (in_tmp / "constraints.txt").write_text("numpy<2\n")
    (cell,) = inputs.load_matrix(None, data).cells
    assert cell.packages == ("accelerate==1.2.1", "numpy<2")  # what the committed lock was made for
    assert status_of(Path("lockfiles"), cell, resolution.LockSettings(), data).status == "up-to-date"
    (in_tmp / "constraints.txt").write_text("numpy<1.27\n")
    (cell,) = inputs.load_matrix(None, data).cells
    assert status_of(Path("lockfiles"), cell, resolution.LockSettings(), data).status == "stale"
