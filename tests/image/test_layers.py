"""The layer plan: which locked distributions go into which layer, and which cells share CUDA layers."""

from __future__ import annotations

from imagekit.image import layering as layers
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.services.locks.lock_cells import read_lock
from tests.conftest import ROOT


def _lock(cell: str) -> Lock:
    return read_lock(ROOT / "lockfiles" / f"{cell}.txt")


def _names(layer: layers.Layer) -> list[str]:
    return [e.name for e in layer.entries]


def test_the_torch_closure_splits_into_cuda_layers_then_torch():
    plan = layers.split(_lock("cu124-torch2.6.0-py3.11-tf5.9.0"))
    assert [layer.name for layer in plan.layers] == [
        "cuda-toolkit", "cuda-cudnn", "cuda-nccl", "cuda-cusparselt", "torch", "app",
    ]  # fmt: skip
    toolkit = _names(plan.cuda[0])
    assert len(toolkit) == 10 and "nvidia-cublas-cu12" in toolkit and "nvidia-cusparse-cu12" in toolkit
    assert "nvidia-cusparselt-cu12" not in toolkit and "nvidia-cudnn-cu12" not in toolkit
    assert all(layer.target == layers.CUDA_PREFIX and layer.python_independent for layer in plan.cuda)
    assert "torch" in _names(plan.torch) and "triton" in _names(plan.torch)
    assert not any(n.startswith("nvidia-") for n in _names(plan.torch))
    assert plan.torch.target == plan.app.target == layers.VENV and not plan.torch.python_independent
    everything = [e.name for layer in plan.layers for e in layer.entries]
    assert sorted(everything) == sorted(e.name for e in _lock("cu124-torch2.6.0-py3.11-tf5.9.0").entries)


def test_cells_with_the_same_cuda_pins_share_their_cuda_layers_whatever_python_or_torch():
    a = layers.split(_lock("cu124-torch2.5.1-py3.11-tf4.48.2"))
    b = layers.split(_lock("cu124-torch2.6.0-py3.11-tf5.9.0"))  # adds cuSPARSELt to the same 12 pins
    c = layers.split(_lock("cu124-torch2.5.1-py3.12-tf5.9.0"))  # same torch, another Python
    assert [layer.key for layer in a.cuda] == [layer.key for layer in b.cuda[:3]]  # the chain below holds
    assert [layer.key for layer in a.cuda] == [layer.key for layer in c.cuda]
    assert a.torch.key != b.torch.key and b.cuda[3].name == "cuda-cusparselt"


def test_cuda13_names_without_suffix_are_toolkit_components():
    plan = layers.split(_lock("cu130-torch2.14.1-py3.13-tf5.24.0"))
    assert "nvidia-cublas" in _names(plan.cuda[0]) and "nvidia-cuda-runtime" in _names(plan.cuda[0])
    assert [layer.name for layer in plan.cuda] == [
        "cuda-toolkit", "cuda-cudnn", "cuda-nccl", "cuda-cusparselt", "cuda-nvshmem",
    ]  # fmt: skip


def test_a_lock_without_nvidia_wheels_has_no_cuda_layer():
    entry = LockEntry("torch", "2.5.1", ("sha256:" + "a" * 64,))
    plan = layers.split(Lock((entry,), (LockEntry("numpy", "2.0.0", ("sha256:" + "b" * 64,)),)))
    assert plan.cuda == () and _names(plan.torch) == ["torch"] and _names(plan.app) == ["numpy"]


def test_an_unknown_nvidia_library_gets_a_layer_of_its_own_after_the_known_ones():
    h = ("sha256:" + "c" * 64,)
    torch_part = tuple(
        LockEntry(n, "1.0", h) for n in ("nvidia-cublas-cu12", "nvidia-zzz-cu12", "nvidia-cudnn-cu12", "nvidia-aaa")
    )
    plan = layers.split(Lock(torch_part, ()))
    assert [layer.name for layer in plan.cuda] == ["cuda-toolkit", "cuda-cudnn", "cuda-aaa", "cuda-zzz"]
    assert plan.torch.entries == ()


def test_the_manifest_and_the_render_name_every_layer(data):
    from imagekit.image import render
    from imagekit.image.buildplan import BaseRef, BuildPlan, manifest
    from imagekit.model import Cell

    lock = _lock("cu124-torch2.6.0-py3.11-tf5.9.0")
    base = BaseRef("debian", "imagekit/base:x", None, "3.11", "2.36")
    plan = BuildPlan.make(Cell("12.4", "2.6.0", "5.9.0", "3.11"), lock, base, "r/x", data)
    assert plan.layering == layers.split(lock)  # decided once, with the plan
    facts = manifest(plan)
    assert facts["layers"]["cuda_prefix"] == "/opt/cuda-libs"
    assert [layer["name"] for layer in facts["layers"]["layers"]][-2:] == ["torch", "app"]
    assert facts["installer"].startswith("uv ")
    files = render.render_plan(plan)
    for layer in plan.layering.layers:
        assert files[render.layer_file(layer.filename)][0].decode() == layer.requirements
        assert f"/{layer.filename}#sha256={layer.requirements_sha256}" in files["Dockerfile"][0].decode()
