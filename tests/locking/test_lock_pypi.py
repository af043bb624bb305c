"""A real lock from real PyPI (network), and the committed lockfiles."""

from __future__ import annotations

import pytest

from imagekit.locking import resolution
from imagekit.model import Cell
from imagekit.services.locks import lock_cells as lock_service
from tests.conftest import ROOT


@pytest.mark.network
@pytest.mark.resolver
def test_real_pypi_lock_of_a_real_cell(data, tmp_path):
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11", ("accelerate==1.2.1",))
    res = lock_service.lock_one(cell, tmp_path, resolution.LockSettings(), data)
    assert res.status == "locked", res.error and res.error.render()
    lock = res.lock
    pins = lock.pins()
    assert pins["torch"] == "2.5.1" and pins["transformers"] == "4.48.2" and pins["accelerate"] == "1.2.1"
    assert pins["nvidia-cuda-runtime-cu12"].startswith("12.4.")
    torch_layer = {e.name for e in lock.torch}
    assert {"torch", "triton", "nvidia-cudnn-cu12", "filelock"} <= torch_layer
    assert {"transformers", "tokenizers", "huggingface-hub", "accelerate"} <= {e.name for e in lock.app}
    assert not torch_layer & {e.name for e in lock.app}
    assert all(e.hashes for e in lock.entries)
    # re-running with the same inputs is a no-op
    assert lock_service.lock_one(cell, tmp_path, resolution.LockSettings(), data).status == "up-to-date"


@pytest.mark.seconds
def test_committed_lockfiles_are_current(app, runner, in_tmp):
    """What CI runs: every PyPI-default cell of the default matrix has a fresh lock committed."""
    res = runner.invoke(app, ["lock", "--check", "--source", "pypi", "--dir", str(ROOT / "lockfiles")])
    assert res.exit_code == 0, res.output


def test_pytorch_index_cells_are_reported_missing_here(app, runner, in_tmp):
    res = runner.invoke(app, ["lock", "--check", "--source", "pytorch", "--dir", str(ROOT / "lockfiles")])
    assert res.exit_code == 1 and "missing" in res.output and "cu118-torch2.5.1-py3.11-tf4.48.2.txt" in res.output


def test_committed_locks_split_and_verify(data):
    for path in sorted((ROOT / "lockfiles").glob("*.txt")):
        lock = lock_service.read_lock(path)
        assert lock is not None, path
        assert lock.torch[0].name and "torch" in {e.name for e in lock.torch}, path
        assert "transformers" in {e.name for e in lock.app}, path
        assert lock.meta["cell"] == path.stem
