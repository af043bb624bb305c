"""The issue's torch 2.1.2 cell asking only for tensorboard, built into an image and self-tested (Docker, PyPI): locked
to numpy 1 and a setuptools that still ships pkg_resources by the companion table, its image passes numpy-interop,
torch-compile (Inductor imports pkg_resources through torch.utils.cpp_extension) and torch-companions. It starts from
the session's real build (tests/conftest.py `real_build`): the same torch build, its lock the preference, so the base
and the torch layer are the real cell's and only the app layer and the steps after it are built."""

from __future__ import annotations

import shutil
import time

import pytest

from imagekit.locking import lockfile
from imagekit.model import Cell
from imagekit.services import inputs
from imagekit.services.builds.build import BuildOptions, build_cell
from tests.conftest import REAL_CELL

pytestmark = [pytest.mark.images, pytest.mark.docker, pytest.mark.slow, pytest.mark.network]

TENSORBOARD = Cell("12.1", "2.1.2", "4.48.2", "3.11", ("tensorboard",))


def test_the_torch_2_1_2_cell_with_only_tensorboard_is_held_to_numpy_1_and_pkg_resources_and_passes(
    real_build, engine, tmp_path
):
    _, real_opts = real_build
    locks = tmp_path / "lockfiles"
    locks.mkdir()
    # the real cell's lock (the same id: another cell's packages) is what the resolver keeps where it may
    shutil.copy(real_opts.lock_dir / f"{REAL_CELL.id}.txt", locks / f"{TENSORBOARD.id}.txt")
    opts = BuildOptions(
        repository="imagekit-test/companions",
        lock_dir=locks,
        state_dir=tmp_path / "state",
        release_index=tmp_path / "releases.json",
        release_records=tmp_path / "records",
    )
    began = time.monotonic()
    result = build_cell(TENSORBOARD, opts, engine, inputs.compat_data(), lambda cid, msg: print(cid, msg, flush=True))
    print(f"tensorboard cell: {time.monotonic() - began:.0f} s ({result.step_summary()})", flush=True)
    try:
        assert result.status == "passed", result.error and result.error.render()
        lock = lockfile.parse((locks / f"{TENSORBOARD.id}.txt").read_text())
        pins = lock.pins()
        assert "tensorboard" in pins and "accelerate" not in pins
        assert pins["numpy"].startswith("1.") and int(pins["setuptools"].split(".")[0]) < 82, pins
        committed = lockfile.parse((real_opts.lock_dir / f"{REAL_CELL.id}.txt").read_text())
        assert [e.spec for e in lock.torch] == [e.spec for e in committed.torch]  # the real cell's torch layer
        checks = {c["id"]: c for c in result.report["checks"]}
        for cid in ("numpy-interop", "torch-compile", "torch-companions", "dists-match-lock"):
            assert checks[cid]["status"] == "pass", checks[cid]
        assert "pkg_resources" in checks["torch-companions"]["evidence"]["modules"]
        assert "triton" in checks["torch-companions"]["evidence"]["modules"]
        assert f"numpy {pins['numpy']}" in checks["numpy-interop"]["message"]
    finally:
        for image in engine.client.images.list():
            for tag in image.tags:
                if tag.startswith("imagekit-test/companions:"):
                    engine.remove(tag)
