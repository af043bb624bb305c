"""A public project's own dependency list, locked from real PyPI as its users would: karpathy/nanoGPT's README line
(`pip install torch numpy transformers datasets tiktoken wandb tqdm`) as its requirements.txt, `imagekit init
--from requirements.txt`, then `imagekit lock`. Resolver only (seconds): no wheel is downloaded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from imagekit.services import lock_cells as lock_service
from tests.conftest import FIXTURES

pytestmark = [pytest.mark.network, pytest.mark.resolver]

NANOGPT = FIXTURES / "projects" / "nanogpt" / "requirements.txt"


def test_nanogpt_requirements_init_and_lock(app, runner, in_tmp: Path) -> None:
    shutil.copy(NANOGPT, in_tmp / "requirements.txt")
    init = runner.invoke(app, ["init", "--from", "requirements.txt", "--repository", "127.0.0.1:5000/nanogpt/train"])
    assert init.exit_code == 0, init.output

    res = runner.invoke(app, ["lock"])
    assert res.exit_code == 0, res.output
    locks = sorted((in_tmp / "lockfiles").glob("*.txt"))
    assert [p.stem for p in locks] == ["cu124-torch2.5.1-py3.11-tf4.48.2", "cu128-torch2.8.0-py3.11-tf4.48.2"]
    for path in locks:
        lock = lock_service.read_lock(path)
        assert lock is not None and lock.meta["cell"] == path.stem
        pins = lock.pins()
        assert pins["torch"] == path.stem.split("-")[1].removeprefix("torch")
        assert pins["transformers"] == "4.48.2"  # an axis: the file's unpinned transformers did not move it
        # the rest of the file is each cell's packages, every one locked with its hashes, in the app layer
        app_layer = {e.name for e in lock.app}
        assert {"numpy", "datasets", "tiktoken", "wandb", "tqdm"} <= app_layer, sorted(app_layer)
        assert all(e.hashes for e in lock.entries)

    check = runner.invoke(app, ["lock", "--check"])
    assert check.exit_code == 0, check.output
    # the file is read again: a package added to it makes both locks stale
    with open("requirements.txt", "a") as fh:
        fh.write("einops\n")
    stale = runner.invoke(app, ["lock", "--check"])
    assert stale.exit_code == 1 and all(p.stem in stale.output for p in locks), stale.output


def test_a_transformers_axis_the_file_excludes_is_named_with_the_way_out(app, runner, in_tmp: Path) -> None:
    """huggingface/alignment-handbook's setup.py: `transformers>=4.53.3` lets init take the newest transformers, whose
    huggingface-hub the file's `huggingface-hub<1.0` excludes; the lock says so, and --transformers is the way out."""
    (in_tmp / "requirements.txt").write_text("transformers>=4.53.3\nhuggingface-hub>=0.33.4,<1.0\n")
    init = runner.invoke(app, ["init", "--from", "requirements.txt", "--repository", "127.0.0.1:5000/a/b"])
    assert init.exit_code == 0, init.output
    res = runner.invoke(app, ["lock"])
    assert res.exit_code == 1, res.output
    assert "huggingface-hub" in res.output and "(an axis of the matrix)" in res.output, res.output
    assert "--transformers VERSION" in res.output, res.output
    again = ["init", "--from", "requirements.txt", "--transformers", "4.57.6", "--force", "--repository", "x.io/a/b"]
    assert runner.invoke(app, again).exit_code == 0
    res = runner.invoke(app, ["lock"])
    assert res.exit_code == 0, res.output
