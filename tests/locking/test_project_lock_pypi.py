"""A public project's own dependency list, locked from real PyPI as its users would: karpathy/nanoGPT's README line
(`pip install torch numpy transformers datasets tiktoken wandb tqdm`) as its requirements.txt, `imagekit init
--from requirements.txt`, then `imagekit lock`. Resolver only (seconds): no wheel is downloaded."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from imagekit.services.locks import lock_cells as lock_service
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


def test_init_takes_the_newest_transformers_the_file_resolves_with_and_the_cell_locks_first_time(
    app, runner, in_tmp: Path
) -> None:
    """huggingface/alignment-handbook's setup.py: `transformers>=4.53.3` with `huggingface-hub<1.0`. The newest
    transformers the range allows needs huggingface-hub>=1.0: init resolves the file against the cell, writes the newest
    release that resolves, names the pin that ruled out the newer one, and the lock succeeds first time."""
    (in_tmp / "requirements.txt").write_text("transformers>=4.53.3\nhuggingface-hub>=0.33.4,<1.0\n")
    init = runner.invoke(app, ["init", "--from", "requirements.txt", "--repository", "127.0.0.1:5000/a/b"])
    assert init.exit_code == 0, init.output
    said = " ".join(init.stderr.split())
    assert "(newer) does not:" in said and "requirements.txt:2: huggingface-hub<1.0,>=0.33.4" in said, said
    chosen = tomllib.loads((in_tmp / "imagekit.toml").read_text())["matrix"]["transformers"]
    assert len(chosen) == 1 and chosen[0].startswith("4."), chosen
    res = runner.invoke(app, ["lock"])
    assert res.exit_code == 0, res.output
