"""The torch 2.15 cell for linux/arm64, built on this amd64 host as a user builds it: an arm64 Debian base
bootstrapped under qemu-user-static, PyPI's aarch64 torch and CUDA 13.2 runtime wheels, the self-test's CPU checks
emulated (and said to be), published with the cell's amd64 image under one tag.

Emulated from the base up, this takes tens of minutes on two cores (docs/builds.md has the times): `make
test-arm64` runs it; `make test` runs the same path on busybox images (services/test_multiplatform.py) and the pure
parts (tests/image/test_arm64_paths.py).
"""

from __future__ import annotations

import json
import shutil

import pytest

from imagekit.clouds import runpod
from imagekit.effects.registry import RegistryClient, Remote
from imagekit.model import ARM64, Cell
from imagekit.oci import image_index, media_types
from imagekit.services import inputs
from imagekit.services.builds import selftest_runner
from imagekit.services.builds.build import BuildOptions, build_cell
from imagekit.services.publishing import release_index
from tests.conftest import ROOT, _log

pytestmark = [pytest.mark.docker, pytest.mark.emulated, pytest.mark.slow]
CELL = Cell("13.2", "2.15.0", "5.24.0", "3.13", ("accelerate==1.12.0",))


def test_the_torch_2_15_cell_on_arm64_and_amd64_under_one_tag(engine, registry, tmp_path):
    locks = tmp_path / "lockfiles"
    shutil.copytree(ROOT / "tests" / "fixtures" / "lockfiles-arm64", locks)  # real locks, resolved from PyPI
    opts = BuildOptions(
        repository=f"{registry.address}/imagekit-test/arm",
        lock_dir=locks,
        state_dir=tmp_path / "state",
        release_index=tmp_path / "index.json",
        release_records=tmp_path / "records",
        push=True,
    )
    data = inputs.compat_data()
    arm = build_cell(Cell(**{**CELL.__dict__, "platform": ARM64}), opts, engine, data, _log)
    assert arm.status == "published", arm.error and arm.error.render()
    amd = build_cell(CELL, opts, engine, data, _log)
    assert amd.status == "published", amd.error and amd.error.render()

    # the arm64 image is arm64 through and through, and its torch runs (emulated) as aarch64
    assert engine.image(arm.tag)["Architecture"] == "arm64" and arm.tag.split(":")[-1].startswith(f"{CELL.id}-arm64-")
    with selftest_runner.emulated_cpus(True) as cpus:  # what torch reads of its CPU (imagekit/image/emulation.py)
        code, out, err = engine.run(
            arm.tag,
            ["-c", "import platform, torch; print(platform.machine(), torch.__version__, torch.version.cuda)"],
            entrypoint=["/opt/venv/bin/python"],
            volumes=cpus,
            timeout=1800,
        )
    assert (code, out.split()) == (0, ["aarch64", "2.15.0+cu132", "13.2"]), err  # PyPI's aarch64 wheel names its CUDA
    # its self-test ran the CPU checks emulated, and says so; no GPU check passed
    checks = {c["id"]: c["status"] for c in arm.report["checks"]}
    assert arm.report["ran"]["emulated"] is True and arm.report["ran"]["gpu"] is False
    assert checks["tiny-model"] == "pass" and checks["torch-cuda-version"] == "pass"
    assert checks["gpu-cuda-available"] == "skip"
    # one tag, both platforms: what each host pulls
    remote = Remote.parse(f"{registry.address}/imagekit-test/arm")
    media, body, _ = RegistryClient().manifest_raw(remote, CELL.id)
    assert media == media_types.DOCKER_MANIFEST_LIST
    listed = {e.platform: e.digest for e in image_index.entries_of(json.loads(body))}
    assert listed == {"linux/amd64": amd.digest, "linux/arm64": arm.digest}
    # a record per platform; the arm64 one's template says it was only emulated
    records = sorted(p.name for p in (tmp_path / "records").iterdir())
    assert records == sorted(f"{r.tag.rsplit(':', 1)[1]}.json" for r in (amd, arm))
    entry = release_index.read_index(opts.release_index)["images"][arm.tag]
    assert entry["manifest"]["cell"]["platform"] == ARM64 and entry["manifest"]["runtime"]["platform"] == ARM64
    readme = runpod.readme(entry, False)
    assert "Tested: emulated only" in readme and "passed on a GPU" not in readme
    print(
        f"arm64: {arm.seconds:.0f} s, {arm.size / 1e9:.2f} GB, emulated self-test {arm.report['ran']['seconds']} s; "
        f"amd64: {amd.seconds:.0f} s, {amd.size / 1e9:.2f} GB, self-test {amd.report['ran']['seconds']} s"
    )
