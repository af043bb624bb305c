"""Checks that decide what a tag means, each with a test that fails when the check is weakened."""

from __future__ import annotations

import re

import pytest

from imagekit.errors import CheckFailed, UsageError
from imagekit.image import render
from imagekit.locking import resolution
from imagekit.locking.lockfile import LockEntry, torch_closure
from imagekit.model import Cell
from imagekit.trust import validate

H = ("sha256:" + "a" * 64,)
CU118 = Cell("11.8", "2.5.1", "4.48.2", "3.11")
CU121_DEFAULT = Cell("12.1", "2.1.2", "4.48.2", "3.11")
TORCH_INDEX = "https://download.pytorch.org/whl/cu118"
TF = LockEntry("transformers", "4.48.2", H)


def _routed(entries, sources, data):
    req = resolution.request(CU118, resolution.LockSettings(), data)
    assert req.routed
    resolution.verify(req, [*entries, TF], sources, data)


def test_verify_refuses_another_variants_torch(data):
    with pytest.raises(CheckFailed, match=r"resolved torch 2\.5\.1\+cu121, expected 2\.5\.1\+cu118"):
        _routed([LockEntry("torch", "2.5.1+cu121", H)], {"torch": TORCH_INDEX}, data)
    _routed([LockEntry("torch", "2.5.1+cu118", H)], {"torch": TORCH_INDEX}, data)  # the right one passes


def test_verify_refuses_torch_family_from_another_index(data):
    entries = [LockEntry("torch", "2.5.1+cu118", H), LockEntry("nvidia-cudnn-cu11", "9.1.0.70", H, ("torch",))]
    with pytest.raises(CheckFailed, match=re.escape("nvidia-cudnn-cu11 came from https://pypi.org/simple")):
        _routed(entries, {"torch": TORCH_INDEX, "nvidia-cudnn-cu11": "https://pypi.org/simple"}, data)


def test_verify_refuses_pins_without_hashes(data):
    entries = [LockEntry("torch", "2.5.1+cu118", H), LockEntry("filelock", "3.16.1", (), ("torch",))]
    with pytest.raises(CheckFailed, match="no hashes for filelock"):
        _routed(entries, {"torch": TORCH_INDEX}, data)


def test_verify_checks_the_cuda_runtime_of_a_pypi_default_build(data):
    req = resolution.request(CU121_DEFAULT, resolution.LockSettings(), data)
    assert not req.routed
    ok = [LockEntry("torch", "2.1.2", H), LockEntry("nvidia-cuda-runtime-cu12", "12.1.105", H, ("torch",)), TF]
    resolution.verify(req, ok, {}, data)
    wrong = [ok[0], LockEntry("nvidia-cuda-runtime-cu12", "12.4.127", H, ("torch",))]
    with pytest.raises(CheckFailed, match=re.escape("brings CUDA runtime 12.4.127, not 12.1")):
        resolution.verify(req, wrong, {}, data)
    with pytest.raises(CheckFailed, match="pulled no CUDA runtime"):
        resolution.verify(req, [ok[0], TF], {}, data)


def test_torch_closure_is_transitive():
    entries = [
        LockEntry("torch", "2.5.1", H),
        LockEntry("sympy", "1.13.1", H, ("torch",)),
        LockEntry("mpmath", "1.3.0", H, ("sympy",)),  # needed by torch only through sympy
        LockEntry("tokenizers", "0.21.0", H, ("transformers",)),
    ]
    assert torch_closure(entries) == {"torch", "sympy", "mpmath"}


def test_context_digest_covers_paths_modes_and_bytes():
    base = {"Dockerfile": (b"FROM x\n", 0o644), "imagekit/bin/entrypoint": (b"#!/bin/sh\n", 0o755)}
    digest = render.context_digest(base)
    assert render.context_digest({**base, "imagekit/bin/entrypoint": (b"#!/bin/sh\n", 0o644)}) != digest  # mode
    assert render.context_digest({**base, "Dockerfile": (b"FROM y\n", 0o644)}) != digest  # bytes
    assert (
        render.context_digest(
            {"Dockerfile2": base["Dockerfile"], "imagekit/bin/entrypoint": base["imagekit/bin/entrypoint"]}
        )
        != digest
    )  # path


@pytest.mark.parametrize("bad", ["3.11\n", "3.11 ", " 3.11", "3", "3.11.1", "3.x", "", None, 3.11])
def test_python_versions_are_exact(bad):
    with pytest.raises(UsageError):
        validate.python(bad)


@pytest.mark.parametrize("bad", ["12.4\n", "12.4 ", "12", ""])
def test_cuda_versions_are_exact(bad):
    with pytest.raises(UsageError):
        validate.cuda(bad)


# ---- one implementation: the doctor in the image and the core on the build host judge alike ------------------
def test_doctor_and_rules_agree_on_every_arch_entry_and_gpu(data):
    from imagekit.compat import rules
    from imagekit.in_image import imagekit_doctor as doctor

    gpus = sorted({*data.gpus.values(), "7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "12.1"})
    judged = 0
    for entry in data.archs:
        archs = [f"sm_{a.replace('.', '')}" for a in entry.archs]
        ptx = f"sm_{entry.ptx.replace('.', '')}" if entry.ptx else None
        for cc in gpus:
            core = rules.how_arch_runs(entry, f"sm_{cc.replace('.', '')}")
            ok, how = doctor.arch_runs(cc, archs, ptx)
            assert ok == (core is not None), (entry, cc, core, how)
            if core and core.startswith("cubin"):
                assert how == core, (entry, cc)  # the highest same-major cubin, in both
            judged += 1
    assert judged > 50


def test_the_highest_cubin_and_three_digit_archs():
    from imagekit.in_image import facts
    from imagekit.in_image import imagekit_doctor as doctor

    assert doctor.arch_runs("8.9", ["sm_86", "sm_80", "sm_89"], None) == (True, "cubin sm_89")  # not the last listed
    assert doctor.arch_runs("8.6", ["sm_80", "sm_90"], None) == (True, "cubin sm_80")
    assert doctor.arch_runs("10.0", ["sm_90"], "sm_100") == (True, "PTX JIT from sm_100")  # sm_100 is 10.0, not 1.0
    assert doctor.arch_runs("9.0", ["sm_80"], "sm_100") == (False, None)
    assert doctor.arch_runs("12.0", ["sm_90", "sm_100", "sm_120"], None) == (True, "cubin sm_120")
    assert [facts.arch_key(t) for t in ("sm_90a", "9.0", "90", "sm_100", "x", "", None)] == [
        (9, 0),
        (9, 0),
        (9, 0),
        (10, 0),
        None,
        None,
        None,
    ]


def test_torch_family_is_one_definition():
    from imagekit.in_image import facts
    from imagekit.locking import lockfile, resolution

    assert lockfile.TORCH_FAMILY is facts.TORCH_FAMILY and resolution.is_torch_family is facts.is_torch_family
    assert [facts.is_torch_family(n) for n in ("torch", "nvidia-cudnn-cu12", "cuda-toolkit", "transformers")] == [
        True,
        True,
        True,
        False,
    ]


@pytest.mark.parametrize("url", ["https://[::1", "https://host:port/simple", "https://u:p@[::1/simple"])
def test_an_unparseable_url_is_never_shown(url):
    assert resolution.redact(url) == "<unparseable URL>"


def test_torch_closure_goes_on_past_a_package_reached_twice():
    """Ten packages under torch share one dependency: meeting it again must not end the walk, in any order."""
    entries = [LockEntry("torch", "2.5.1", H), LockEntry("shared", "1", H, tuple(f"c{i}" for i in range(10)))]
    entries += [LockEntry(f"c{i}", "1", H, ("torch",)) for i in range(10)]
    entries += [LockEntry(f"d{i}", "1", H, (f"c{i}",)) for i in range(10)]
    want = {"torch", "shared"} | {f"c{i}" for i in range(10)} | {f"d{i}" for i in range(10)}
    assert torch_closure(entries) == want
