"""The worked example under examples/fine-tune: its matrix is valid as shipped; locked against PyPI with the real
resolver, it renders with its code as the last layer and its dry run plans a build."""

from __future__ import annotations

import shutil

import pytest

from imagekit.services import inputs
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "fine-tune"
CELL = "cu121-torch2.1.2-py3.11-tf4.48.2"


def test_the_example_matrix_is_valid_and_names_one_compatible_cell(app, runner, monkeypatch):
    monkeypatch.chdir(EXAMPLE)
    res = runner.invoke(app, ["matrix"])
    assert res.exit_code == 0, res.output
    assert CELL in res.output
    config = inputs.load_matrix(EXAMPLE / "imagekit.toml", inputs.compat_data())
    assert config.options.copy is not None and config.options.copy.source == str(EXAMPLE)
    assert config.options.jupyter and "peft==0.14.0" in config.cells[0].packages


@pytest.mark.network
@pytest.mark.resolver
def test_the_example_locks_renders_and_plans(app, runner, tmp_path, monkeypatch):
    project = tmp_path / "fine-tune"
    shutil.copytree(EXAMPLE, project)
    monkeypatch.chdir(project)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    res = runner.invoke(app, ["lock"])
    assert res.exit_code == 0, res.output
    lock = (project / "lockfiles" / f"{CELL}.txt").read_text()
    assert "peft==0.14.0" in lock and "jupyterlab==" in lock and "torch==2.1.2" in lock
    res = runner.invoke(app, ["render", "--out", "build"])
    assert res.exit_code == 0, res.output
    dockerfile = (project / "build" / CELL / "Dockerfile").read_text()
    assert dockerfile.index("COPY rootfs/code/ /") > dockerfile.rindex("install-layer")  # the code, last
    code = project / "build" / CELL / "rootfs" / "code" / "opt" / "app"
    assert (code / "train.py").read_bytes() == (EXAMPLE / "train.py").read_bytes()
    res = runner.invoke(app, ["render", "--out", "build"])  # again: the first render's output is not copied in
    assert res.exit_code == 0, res.output
    assert not (code / "build").exists() and (code / "train.py").is_file()
    res = runner.invoke(app, ["build", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert f"{CELL}: lock up to date" in res.output and "BLOCKED" not in res.output
