"""`[image] cuda_toolkit = true`: parsed, locked as requirements, laid in a layer of its own, rendered with CUDA_HOME,
and checked by the self-test's cuda-extension. The lock fixture is a real `imagekit lock` of a CUDA 13 cell with it."""

from __future__ import annotations

import pytest

from imagekit.errors import ConfigError, UsageError
from imagekit.image import cuda_toolkit, imageconfig, render
from imagekit.image import layering as layers
from imagekit.image.buildplan import BaseRef, BuildPlan, manifest
from imagekit.image.image_options import ImageOptions
from imagekit.in_image import selftest
from imagekit.matrix import matrix_file as matrix
from imagekit.model import Cell
from imagekit.services.locks.lock_cells import read_lock
from tests.conftest import ROOT

CELL_ID = "cu130-torch2.14.1-py3.13-tf5.24.0"
AXES13 = {"cuda": ["13.0"], "torch": ["2.14.1"], "transformers": ["5.24.0"], "python": ["3.13"]}
COMPILER = ["nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-cuda-nvcc", "nvidia-nvvm"]


def _lock():
    return read_lock(ROOT / "tests" / "fixtures" / "lockfiles-cuda-toolkit" / f"{CELL_ID}.txt")


def _plan(data, **options):
    cell = Cell("13.0", "2.14.1", "5.24.0", "3.13", cuda_toolkit.requirements("13.0"))
    base = BaseRef("debian-trixie", "imagekit/base:x", None, "3.13", "2.41", compiler=True)
    options = ImageOptions(cuda_toolkit=True, builder="buildkit", **options)  # what `imagekit render` renders
    return BuildPlan.make(cell, _lock(), base, "r/x", data, options=options)


def test_the_option_adds_the_compiler_and_ninja_to_each_cells_requirements(data):
    config = matrix.parse({"matrix": AXES13, "image": {"cuda_toolkit": True}}, "m.toml", data)
    (cell,) = config.cells
    assert config.options.cuda_toolkit is True
    assert cell.packages == ("cuda-toolkit[cccl,crt,nvcc,nvvm]==13.0.*", "ninja")
    plain = matrix.parse({"matrix": AXES13}, "m.toml", data)
    assert plain.options.cuda_toolkit is False and plain.cells[0].packages == ()
    pinned = matrix.parse(
        {"matrix": {**AXES13, "packages": ["ninja==1.11.1.4"]}, "image": {"cuda_toolkit": True}}, "m.toml", data
    )
    assert pinned.cells[0].packages == ("cuda-toolkit[cccl,crt,nvcc,nvvm]==13.0.*", "ninja==1.11.1.4")


def test_cuda_11_and_12_cells_without_debians_toolkit_are_refused_naming_the_cells_that_have_one(data):
    axes = {"cuda": ["12.8", "13.0"], "torch": ["2.14.1"], "transformers": ["5.24.0"], "python": ["3.13"]}
    with pytest.raises(ConfigError) as exc:
        matrix.parse({"matrix": axes, "image": {"cuda_toolkit": True}}, "m.toml", data)
    (problem,) = exc.value.problems
    assert "image.cuda_toolkit" in problem and "cu128-" in problem and "CUDA 12.8 on debian-trixie" in problem
    assert "nvidia-cuda-toolkit for CUDA 11.8 on debian-bookworm" in problem and "dists/trixie/non-free" in problem
    hint = exc.value.hint or ""
    assert "CUDA 11.8 cells on debian-bookworm" in hint and "CUDA 12.4 cells on debian-trixie" in hint
    assert "CUDA 13 cells" in hint


def test_the_option_needs_the_host_compiler_and_a_boolean(data):
    with pytest.raises(ConfigError) as exc:
        matrix.parse({"matrix": AXES13, "image": {"cuda_toolkit": True, "compiler": False}}, "m.toml", data)
    assert any("image.cuda_toolkit: needs the host compiler" in p for p in exc.value.problems)
    with pytest.raises(ConfigError) as exc:
        matrix.parse({"matrix": AXES13, "image": {"cuda_toolkit": "yes"}}, "m.toml", data)
    assert any("image.cuda_toolkit: expected true or false" in p for p in exc.value.problems)


def test_the_real_lock_holds_nvcc_of_the_cells_cuda_minor_and_ninja():
    pins = _lock().pins()
    assert pins["nvidia-cuda-nvcc"].startswith("13.0.") and pins["cuda-toolkit"].startswith("13.0.")
    assert all(name in pins for name in COMPILER) and "ninja" in pins
    assert all(e.hashes for e in _lock().entries)


def test_the_compiler_is_a_cuda_layer_of_its_own_and_only_when_asked():
    lock = _lock()
    split = layers.split(lock, cuda_toolkit=True)
    assert [layer.name for layer in split.cuda][-1] == "cuda-compiler"
    compiler = split.cuda[-1]
    assert [e.name for e in compiler.entries] == COMPILER and compiler.target == layers.CUDA_PREFIX
    everything = sorted(e.name for layer in split.layers for e in layer.entries)
    assert everything == sorted(e.name for e in lock.entries)  # each distribution once
    assert "ninja" in [e.name for e in split.app.entries]  # a venv package: its command lands in /opt/venv/bin
    below = layers.split(lock)  # without the option, the same lock lays out as before it existed
    assert "cuda-compiler" not in [layer.name for layer in below.layers]
    # the libraries' own layers are the same as without it (there, nvvm would be a layer of its own)
    assert [layer.key for layer in split.cuda[1:-1]] == [
        layer.key for layer in below.cuda[1:] if layer.name != "cuda-nvvm"
    ]
    toolkit = [e.name for e in split.cuda[0].entries]  # the CUDA libraries' layer keeps the libraries alone
    assert toolkit == [e.name for e in below.cuda[0].entries if e.name not in COMPILER]


def test_render_golden_with_cuda_home_the_cudart_script_and_the_manifest(data, update_golden):
    plan = _plan(data)
    files = render.render_plan(plan)
    dockerfile = files["Dockerfile"][0].decode()
    golden = ROOT / "tests" / "golden" / f"{CELL_ID}.cuda-toolkit.Dockerfile"
    if update_golden:
        golden.write_text(dockerfile)
    assert dockerfile == golden.read_text(), "golden differs: review, then `pytest --update-golden`"
    assert "--requirements /mnt/requirements-cuda-compiler.txt#sha256=" in dockerfile
    assert 'CUDA_HOME="/opt/cuda-libs/nvidia/cu13"' in dockerfile
    assert 'PATH="/opt/venv/bin:/opt/cuda-libs/nvidia/cu13/bin:' in dockerfile
    script, mode = files["rootfs/app/opt/cuda-libs/nvidia/cu13/lib/libcudart.so"]
    assert script.endswith(b"INPUT(libcudart.so.13)\n") and mode == 0o644
    facts = manifest(plan)
    assert facts["cuda_toolkit"] == {"home": "/opt/cuda-libs/nvidia/cu13", "nvcc": _lock().pins()["nvidia-cuda-nvcc"]}
    assert "requirements-cuda-compiler.txt" in plan.layering.requirement_files


def test_a_plan_refuses_a_cuda_12_cell_or_a_lock_without_nvcc(data):
    base = BaseRef("debian", "imagekit/base:x", None, "3.11", "2.36")
    lock12 = read_lock(ROOT / "lockfiles" / "cu128-torch2.8.0-py3.11-tf4.48.2.txt")
    with pytest.raises(UsageError, match=r"no CUDA compiler for CUDA 12\.8 on debian"):
        BuildPlan.make(Cell("12.8", "2.8.0", "4.48.2", "3.11"), lock12, base, "r/x", data,
                       options=ImageOptions(cuda_toolkit=True))  # fmt: skip
    lock13 = read_lock(ROOT / "lockfiles" / f"{CELL_ID}.txt")
    with pytest.raises(UsageError, match="has no nvidia-cuda-nvcc"):
        BuildPlan.make(Cell("13.0", "2.14.1", "5.24.0", "3.13"), lock13, base, "r/x", data,
                       options=ImageOptions(cuda_toolkit=True))  # fmt: skip


def test_runtime_env_sets_cuda_home_and_keeps_the_venv_first_on_path():
    plain = dict(imageconfig.runtime({}).env)
    assert "CUDA_HOME" not in plain
    env = dict(imageconfig.runtime({}, cuda_home="/opt/cuda-libs/nvidia/cu13").env)
    assert env["CUDA_HOME"] == "/opt/cuda-libs/nvidia/cu13"
    assert env["PATH"].startswith("/opt/venv/bin:/opt/cuda-libs/nvidia/cu13/bin:")
    with pytest.raises(UsageError, match="CUDA_HOME"):
        imageconfig.runtime({}, env=(("CUDA_HOME", "/usr/local/cuda"),), cuda_home="/opt/x")
    assert imageconfig.cuda_home({"cuda_toolkit": {"home": "/opt/x"}}) == "/opt/x"
    assert imageconfig.cuda_home({}) is None


def test_the_selftest_check_skips_without_a_toolkit_and_fails_without_nvcc(tmp_path, monkeypatch):
    skipped = selftest.check_cuda_extension({"image": {}})
    assert skipped["status"] == "skip" and "cuda_toolkit = false" in skipped["message"]
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    failed = selftest.check_cuda_extension({"cuda_toolkit": {"home": str(tmp_path), "nvcc": "13.0.88"}})
    assert failed["status"] == "fail" and f"no nvcc at {tmp_path}/bin/nvcc" in failed["message"]
