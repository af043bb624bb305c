"""The checks that decide what a tag means, exercised through the paths real data takes.

tests/test_truth.py holds one direct test per check; these go through what feeds the check in production: uv's
output (``build_lock``), a lock read back from disk (``verify_lock``), a rendered build context
(``context_digest``) and a matrix file (``matrix.parse``). Each names the hand-planted bug it catches.
"""

from __future__ import annotations

import hashlib
import re

import pytest

from imagekit.errors import CheckFailed, ConfigError, UsageError
from imagekit.image import render
from imagekit.image.buildplan import BuildPlan, bootstrap_base
from imagekit.locking import lockfile, resolution
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.matrix import matrix_file as matrix
from imagekit.model import Cell

PYPI = "https://pypi.org/simple"
TORCH_118 = "https://download.pytorch.org/whl/cu118"
CU118 = Cell("11.8", "2.5.1", "4.48.2", "3.11")  # not PyPI's default variant of torch 2.5: routed
CU121 = Cell("12.1", "2.1.2", "4.48.2", "3.11")  # PyPI's default variant of torch 2.1: not routed


def _hash(name: str) -> str:
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


def uv_output(*pins: tuple[str, str, tuple[str, ...], str | None], unhashed: tuple[str, ...] = ()) -> str:
    """What ``uv pip compile --generate-hashes --emit-index-annotation`` prints: pin, hashes, ``# via``, ``# from``.
    Each pin is (name, version, via, index URL or None for no annotation)."""
    out = []
    for name, version, via, src in pins:
        hashed = name not in unhashed
        out.append(f"{name}=={version}" + (" \\" if hashed else ""))
        if hashed:
            out.append(f"    --hash={_hash(name + version)}")
        if len(via) == 1:
            out.append(f"    # via {via[0]}")
        elif via:
            out.append("    # via")
            out.extend(f"    #   {v}" for v in via)
        if src:
            out.append(f"    # from {src}")
    return "\n".join(out) + "\n"


ROOT_VIA = ("imagekit-cell (pyproject.toml)",)


def _routed_output(torch_version: str = "2.5.1+cu118", **override: str | None) -> str:
    """A cu118 resolution: torch and its CUDA libraries from the cu118 index, the rest from PyPI."""
    sources = {"torch": TORCH_118, "nvidia-cudnn-cu11": TORCH_118, "nvidia-cublas-cu11": TORCH_118, **override}
    return uv_output(
        ("filelock", "3.16.1", ("torch", "transformers"), PYPI),
        ("nvidia-cublas-cu11", "11.11.3.6", ("nvidia-cudnn-cu11",), sources["nvidia-cublas-cu11"]),
        ("nvidia-cudnn-cu11", "9.1.0.70", ("torch",), sources["nvidia-cudnn-cu11"]),
        ("torch", torch_version, ROOT_VIA, sources["torch"]),
        ("transformers", "4.48.2", ROOT_VIA, PYPI),
    )


def _build(cell: Cell, output: str, data) -> Lock:
    req = resolution.request(cell, resolution.LockSettings(), data)
    return resolution.build_lock(req, output, None, data, "uv 0.5.3")


def _written(lock: Lock) -> str:
    """The lock as `imagekit lock` writes it: intact, with its own body digest."""
    return lock.render()


# ---- bug 1: verify accepting torch 2.5.1+cu121 for a cu118 cell ------------------------------------------------
@pytest.mark.parametrize("wrong", ["2.5.1+cu121", "2.5.1", "2.5.1+cu118.post1", "2.5.10+cu118", "2.5.1+cpu"])
def test_a_resolution_with_another_torch_build_is_refused(data, wrong):
    with pytest.raises(CheckFailed, match=re.escape(f"resolved torch {wrong}, expected 2.5.1+cu118")) as exc:
        _build(CU118, _routed_output(wrong), data)
    assert exc.value.hint == f"the index {TORCH_118} does not serve 2.5.1+cu118"


def test_the_right_torch_build_from_the_right_index_locks(data):
    lock = _build(CU118, _routed_output(), data)
    assert lock.pins()["torch"] == "2.5.1+cu118"
    assert lock.meta["torch-index"] == TORCH_118 and lock.meta["cell"] == CU118.id


def test_a_lock_on_disk_pinning_another_variant_is_refused_before_use(data):
    good = _build(CU118, _routed_output(), data)
    torch = next(e for e in good.torch if e.name == "torch")
    swapped = Lock(
        tuple(LockEntry("torch", "2.5.1+cu121", torch.hashes, torch.via) if e is torch else e for e in good.torch),
        good.app,
        good.meta,
        good.header,
    )
    text = _written(swapped)  # internally consistent: only the variant check can tell
    assert lockfile.integrity_problems(lockfile.parse(text), text) == []
    with pytest.raises(CheckFailed, match=re.escape("resolved torch 2.5.1+cu121, expected 2.5.1+cu118")):
        resolution.verify_lock(lockfile.parse(text), text, CU118, data, "lockfiles/x.txt")
    text = _written(good)
    resolution.verify_lock(lockfile.parse(text), text, CU118, data, "lockfiles/x.txt")  # the genuine one passes


# ---- bug 2: the "torch-family package from another index" guard --------------------------------------------
@pytest.mark.parametrize(
    ("override", "named", "came_from"),
    [
        ({"nvidia-cudnn-cu11": PYPI}, "nvidia-cudnn-cu11", PYPI),
        ({"nvidia-cudnn-cu11": None}, "nvidia-cudnn-cu11", "an unknown index"),
        ({"torch": "https://download.pytorch.org/whl/cu121"}, "torch", "https://download.pytorch.org/whl/cu121"),
    ],
)
def test_torch_family_packages_from_another_index_are_refused(data, override, named, came_from):
    with pytest.raises(CheckFailed, match=re.escape(f"{named} came from {came_from}, not the PyTorch index")) as exc:
        _build(CU118, _routed_output(**override), data)
    assert exc.value.hint == "torch-family packages must come from the variant's index"


def test_a_trailing_slash_on_the_index_is_the_same_index(data):
    lock = _build(CU118, _routed_output(**{"nvidia-cudnn-cu11": TORCH_118 + "/"}), data)
    assert "nvidia-cudnn-cu11" in lock.pins()


# ---- bug 3: the "no hashes for X" check ------------------------------------------------------------------
@pytest.mark.parametrize("cell", [CU118, CU121], ids=["routed", "pypi-default"])
def test_a_resolution_with_an_unhashed_pin_is_refused(data, cell):
    if cell is CU118:
        text = _routed_output()
    else:
        text = uv_output(
            ("nvidia-cuda-runtime-cu12", "12.1.105", ("torch",), PYPI),
            ("torch", "2.1.2", ROOT_VIA, PYPI),
            ("transformers", "4.48.2", ROOT_VIA, PYPI),
        )
        _build(cell, text, data)  # hashed: fine
    unhashed = text.replace(
        re.search(r"transformers==4\.48\.2 \\\n    --hash=\S+\n", text).group(0), "transformers==4.48.2\n"
    )
    with pytest.raises(CheckFailed, match=re.escape(f"{cell.id}: no hashes for transformers")) as exc:
        _build(cell, unhashed, data)
    assert exc.value.hint == "the index must publish sha256 hashes"


# ---- bug 4: torch_closure no longer transitive ------------------------------------------------------------
def test_a_package_torch_needs_only_indirectly_goes_to_the_torch_layer(data):
    lock = _build(CU118, _routed_output(), data)
    assert {e.name for e in lock.torch} == {"torch", "nvidia-cudnn-cu11", "nvidia-cublas-cu11", "filelock"}
    assert {e.name for e in lock.app} == {"transformers"}


def test_an_indirect_torch_family_package_from_pypi_is_refused(data):
    """nvidia-cublas is needed by torch only through nvidia-cudnn: the index check must still reach it."""
    with pytest.raises(CheckFailed, match=re.escape("nvidia-cublas-cu11 came from https://pypi.org/simple")):
        _build(CU118, _routed_output(**{"nvidia-cublas-cu11": PYPI}), data)
    req = resolution.request(CU118, resolution.LockSettings(), data)
    assert resolution.misrouted(req, _routed_output(**{"nvidia-cublas-cu11": PYPI})) == {"nvidia-cublas-cu11"}


# ---- bug 5: render.context_digest (the immutable tag) ignoring file modes ----------------------------------
def test_the_immutable_tag_changes_when_any_files_mode_changes(data):
    spec = data.bases["3.11"]
    lock = Lock((LockEntry("torch", "2.5.1", (_hash("t"),)),), (LockEntry("transformers", "4.48.2", (_hash("x"),)),))
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11")
    files = render.render_plan(BuildPlan.make(cell, lock, bootstrap_base(spec), "r/x", data))
    assert files[f"{render.APP_FILES}/bin/entrypoint"][1] == 0o755 and files["Dockerfile"][1] == 0o644
    tag = render.context_digest(files)
    for rel, (content, mode) in files.items():
        flipped = {**files, rel: (content, 0o644 if mode == 0o755 else 0o755)}
        assert render.context_digest(flipped) != tag, rel


# ---- bug 6: validate.python accepting a trailing newline ---------------------------------------------------
@pytest.mark.parametrize("bad", ["3.11\n", "3.11\r", "\n3.11", "3.11\n\n"])
def test_a_python_version_with_a_line_break_is_refused_by_validation(data, bad):
    """Refused where it is read, naming the field: not later by the Dockerfile quoting filter."""
    doc = {"matrix": {"include": [{"cuda": "12.4", "torch": "2.5.1", "transformers": "4.48.2", "python": bad}]}}
    with pytest.raises((ConfigError, UsageError), match=re.escape("invalid Python version")) as exc:
        matrix.parse(doc, "m.toml", data)
    assert "python" in exc.value.message and "refusing to render" not in exc.value.message


def test_a_python_version_with_a_line_break_is_exit_2_on_the_command_line(app, runner):
    res = runner.invoke(app, ["explain", "--python", "3.11\n"])
    assert res.exit_code == 2 and res.output.startswith("error: invalid Python version")
