"""`imagekit init --from setup.py`: the build backend's metadata hook runs in a container of the cell's base, with
no network and the project read-only, never on the host; a setup.py that reaches out is contained and fails with its
log. The fixture is huggingface/alignment-handbook's setup.py in its shape (`_deps`, `install_requires`, extras)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from imagekit.services import inputs
from tests.conftest import FIXTURES

pytestmark = [pytest.mark.docker]
PROJECTS = FIXTURES / "projects"
READING = "reading setup.py's metadata in debian-bookworm (no network, the project read-only)"


@pytest.fixture
def kept(tmp_path_factory, monkeypatch) -> Path:
    """Where this test's answers are kept: its own cache."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("IMAGEKIT_CACHE", str(cache))
    return cache / "project-metadata"


@pytest.fixture
def project(in_tmp, kept, engine):
    return in_tmp


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_alignment_handbooks_setup_py_is_read_in_the_base(app, runner, data, project):
    shutil.copytree(PROJECTS / "alignment-handbook", project, dirs_exist_ok=True)
    before = _tree(project)
    res = runner.invoke(app, ["init", "--from", "setup.py", "--extra", "dev", "--repository", "ghcr.io/acme/ah"])
    assert res.exit_code == 0, res.output
    assert READING in res.stderr
    assert {k: v for k, v in _tree(project).items() if k != "imagekit.toml"} == before  # no egg-info, nothing
    config = inputs.load_matrix(None, data)
    packages = config.cells[0].packages
    assert {"accelerate>=1.0.1", "deepspeed>=0.15.4", "trl>=0.14.0", "wandb", "huggingface-hub<1.0,>=0.27.1"} <= set(
        packages
    )
    assert {"pytest", "ruff>=0.9.0", "hf-doc-builder>=0.4.0"} <= set(packages)  # the dev group
    assert not any(p.startswith(("transformers", "torch", "flash-attn")) for p in packages)  # axes; not declared
    assert {c.python for c in config.cells} == {"3.11"}  # python_requires >=3.10.9 allows the default

    again = runner.invoke(app, ["matrix", "--format", "json"])
    assert again.exit_code == 0 and READING not in again.stderr  # the kept answer: no container
    text = (project / "setup.py").read_text().replace('    deps["wandb"],\n', '    deps["wandb"],\n    "tiktoken",\n')
    (project / "setup.py").write_text(text)
    edited = runner.invoke(app, ["matrix", "--format", "json"])
    assert edited.exit_code == 0 and READING in edited.stderr  # setup.py changed: read again
    assert all("tiktoken" in row["packages"] for row in json.loads(edited.stdout))


@pytest.mark.parametrize(
    ("fixture", "needles"),
    [
        ("reaches-network", ("it tried to reach the network", "Temporary failure in name resolution")),
        ("writes-outside", ("it wrote outside /tmp", "Read-only file system: '/etc/imagekit-was-here'")),
    ],
)
def test_a_setup_py_that_reaches_out_is_contained_and_fails_with_its_log(app, runner, project, kept, fixture, needles):
    shutil.copytree(PROJECTS / fixture, project, dirs_exist_ok=True)
    before = _tree(project)
    res = runner.invoke(app, ["init", "--from", "setup.py"])
    assert "Traceback" not in res.stdout
    assert res.exit_code == 1, res.output
    assert res.stderr.count("error: setup.py: ") == 1 and "its log:" in res.stderr and "\nhint: " in res.stderr
    for needle in needles:
        assert needle in res.stderr, res.stderr
    assert _tree(project) == before  # nothing written
    assert not kept.exists() or not any(kept.iterdir())  # a failure is not kept


def test_a_setup_py_that_plants_on_the_host_leaves_nothing_and_stalls_nothing(app, runner, project, kept, tmp_path):
    # Before (issue 49): the hook's /out was a host folder mounted read-write: it was made 0777 and left a setuid copy
    # of `id` (euid 0 for any local user), 300 MB past the 256 MB promised and a 1,200-deep tree that made
    # shutil.rmtree raise RecursionError (a traceback, the folder kept); a FIFO where the driver reads stalled it
    # until the container's 300 s were up, and the message quoted imagekit's own driver.
    import os
    import tempfile
    import time

    shutil.copytree(PROJECTS / "plants-on-host", project, dirs_exist_ok=True)
    before = set(os.listdir(tempfile.gettempdir()))
    began = time.monotonic()
    res = runner.invoke(app, ["init", "--from", "setup.py"])
    took = time.monotonic() - began
    assert "Traceback" not in res.output and res.exit_code == 1, res.output
    assert "is not a regular file" in res.stderr and "\nhint: " in res.stderr
    assert "import glob" not in res.output  # imagekit's driver is not quoted
    assert took < 150, f"{took:.0f} s"
    left = set(os.listdir(tempfile.gettempdir())) - before
    assert not [n for n in left if n.startswith("imagekit-")], left
