"""What a torch extension wheel's local version says it was built against, in the spellings real wheels use, checked
against the cell: PyG's ``+pt25cu124`` (data.pyg.org: ``torch_scatter-2.1.2+pt25cu124``, ``+pt113cpu``,
``+pt20cpu``), flash-attn's ``+cu12torch2.5cxx11abiFALSE``, and ``+torch2.5cu118``; the torch minor, the CUDA
version, and the C++ ABI of the cell's torch build."""

from __future__ import annotations

import pytest

from imagekit.errors import CheckFailed
from imagekit.locking import direct_wheels, resolution
from imagekit.locking import wheel_choice as wheels
from imagekit.model import Cell

SHA = "a" * 64
SUPPORTED = wheels.supported_tags("3.11", "2.28")


def _wheel(local: str, name: str = "torch_scatter") -> direct_wheels.DirectWheel:
    return direct_wheels.parse(name, f"https://h/{name}-2.1.2+{local}-cp311-cp311-linux_x86_64.whl#sha256={SHA}")


def _problems(local: str, torch: str, cuda: str, abi: tuple[bool, str] | None = None) -> list[str]:
    if abi is None:  # the cell's ABI is not known: the call as it was before the ABI check
        return direct_wheels.cell_problems(_wheel(local), SUPPORTED, torch, cuda)
    return direct_wheels.cell_problems(_wheel(local), SUPPORTED, torch, cuda, abi)


@pytest.mark.parametrize(
    "local", ["pt25cu124", "pt2.5cu124", "torch2.5cu124", "cu124torch2.5", "cu12torch2.5cxx11abiFALSE", "PT25CU124"]
)
def test_every_spelling_of_the_torch_a_wheel_was_built_for_is_checked(local):
    assert _problems(local, "2.5.1", "12.4") == []
    (torch,) = _problems(local, "2.4.1", "12.4")
    assert "built for torch 2.5, the cell has torch 2.4.1" in torch


@pytest.mark.parametrize(
    ("local", "built", "cell", "other"),
    [
        ("pt113cu117", "1.13", "1.13.1", "2.0.1"),  # PyG: three digits for 1.1x
        ("pt20cu118", "2.0", "2.0.1", "2.1.2"),
        ("pt21cu121", "2.1", "2.1.2", "2.10.0"),
        ("pt210cu126", "2.10", "2.10.0", "2.1.2"),  # not torch 21.0
        ("torch2.10cu126", "2.10", "2.10.0", "2.1.2"),
    ],
)
def test_pyg_digits_are_torchs_major_and_minor(local, built, cell, other):
    cuda = {"117": "11.7", "118": "11.8", "121": "12.1", "126": "12.6"}[local[-3:]]
    assert _problems(local, cell, cuda) == []
    (torch,) = _problems(local, other, cuda)
    assert f"built for torch {built}, the cell has torch {other}" in torch


@pytest.mark.parametrize("local", ["cu124opt25", "cu124script21", "cu124cpt25"])
def test_pt_inside_another_word_names_no_torch(local):
    assert _problems(local, "2.4.1", "12.4") == []


@pytest.mark.parametrize(
    ("local", "cell_cuda"), [("torch2.5cu118", "12.4"), ("pt25cu124", "11.8"), ("pt2.5cu124", "12.1")]
)
def test_a_cuda_tag_after_the_torch_tag_is_checked(local, cell_cuda):
    (cuda,) = _problems(local, "2.5.1", cell_cuda)
    assert f"the cell has CUDA {cell_cuda}" in cuda


FACT = "[PYPI (compat-facts table 1)] the source"


@pytest.mark.parametrize(
    ("local", "cell_abi", "refused"),
    [
        ("cu12torch2.5cxx11abiFALSE", (True, FACT), True),
        ("cu12torch2.5cxx11abiTRUE", (False, FACT), True),
        ("cu12torch2.5cxx11abiFALSE", (False, FACT), False),
        ("cu12torch2.5cxx11abiTRUE", (True, FACT), False),
        ("cu12torch2.5cxx11abiTRUE", None, False),  # the cell's ABI is not sourced: not checked, not guessed
    ],
)
def test_the_cxx11_abi_tag_is_checked_against_the_cells_torch(local, cell_abi, refused):
    problems = _problems(local, "2.5.1", "12.4", cell_abi)
    if not refused:
        assert problems == []
        return
    (abi,) = problems
    tag = local.rpartition("torch2.5")[2]
    assert f"built with {tag}" in abi and FACT in abi  # which fact said the cell's ABI


def _cell(torch: str, cuda: str, wheel: str) -> Cell:
    return Cell(cuda, torch, "4.48.2", "3.11", packages=(f"flash-attn @ https://h/{wheel}#sha256={SHA}",))


def _flash(local: str) -> str:
    return f"flash_attn-2.7.4.post1+{local}-cp311-cp311-linux_x86_64.whl"


@pytest.mark.parametrize(
    ("torch", "cuda", "wrong", "right", "says"),
    [
        ("2.7.1", "12.6", "cu12torch2.7cxx11abiFALSE", "cu12torch2.7cxx11abiTRUE", "the C++11 ABI"),
        ("2.5.1", "12.4", "cu12torch2.5cxx11abiTRUE", "cu12torch2.5cxx11abiFALSE", "the pre-C++11 ABI"),
    ],
)
def test_a_pypi_cells_torch_abi_comes_from_the_curated_facts_with_their_source(data, torch, cuda, wrong, right, says):
    """The ABI of PyPI's torch build per minor (compat-facts table 1 and fact 5: <= 2.6 pre-C++11, 2.7+ C++11) is
    checked before anything is resolved, and the message names the fact it used."""
    cell = _cell(torch, cuda, _flash(wrong))
    req = resolution.request(cell, resolution.LockSettings(), data)
    assert not req.routed
    with pytest.raises(CheckFailed) as exc:
        resolution.check_direct_wheels(req, list(cell.packages), data)
    assert says in exc.value.message and "compat-facts" in exc.value.message
    assert "cxx11abi" in exc.value.hint
    good = _cell(torch, cuda, _flash(right))
    resolution.check_direct_wheels(resolution.request(good, resolution.LockSettings(), data), list(good.packages), data)


def test_a_pytorch_index_build_has_no_sourced_abi_and_is_not_refused_on_it(data):
    cell = _cell("2.5.1", "11.8", _flash("cu11torch2.5cxx11abiTRUE"))
    req = resolution.request(cell, resolution.LockSettings(), data)
    assert req.routed
    resolution.check_direct_wheels(req, list(cell.packages), data)
    assert data.torch_cxx11_abi("2.5.1", "cu118") is None
    assert data.torch_cxx11_abi("2.5.1", "cu124") == (False, data.source(data.torch_minor("2.5.1").cxx11_abi_source))


def test_a_lock_whose_wheel_has_the_other_abi_is_refused_when_verified(data):
    """The same check on what the resolver returned, and on a lock read back (`resolution.verify`)."""
    url = f"https://h/{_flash('cu12torch2.7cxx11abiFALSE')}#sha256={SHA}"
    cell = Cell("12.6", "2.7.1", "4.48.2", "3.11", packages=(f"flash-attn @ {url}",))
    output = "".join(
        f"{pin} \\\n    --hash=sha256:{digest}\n    # via imagekit-cell (pyproject.toml)\n"
        for pin, digest in [
            (f"flash-attn @ {url}", SHA),
            ("nvidia-cuda-runtime-cu12==12.6.77", "b" * 64),
            ("torch==2.7.1", "c" * 64),
            ("transformers==4.48.2", "d" * 64),
        ]
    )
    req = resolution.request(cell, resolution.LockSettings(), data)
    with pytest.raises(CheckFailed) as exc:
        resolution.build_lock(req, output, None, data, "uv 0.5.3")
    assert "built with cxx11abiFALSE, the cell's torch 2.7.1 uses the C++11 ABI" in exc.value.message
    right = output.replace("cxx11abiFALSE", "cxx11abiTRUE")
    good = Cell("12.6", "2.7.1", "4.48.2", "3.11", packages=(f"flash-attn @ {url.replace('FALSE', 'TRUE')}",))
    resolution.build_lock(resolution.request(good, resolution.LockSettings(), data), right, None, data, "uv 0.5.3")
