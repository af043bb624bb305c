"""The runtime contract has one derivation (`contract.of_cell`) and one written form (`Contract.to_json`): the plan, the
matrix's outputs and a release record from before the contract all get the same answer, and what is written reads
back as it was."""

from __future__ import annotations

from dataclasses import replace

import pytest

from imagekit.compat import contract, rules
from imagekit.matrix import matrix_file as matrix
from imagekit.matrix import outputs
from imagekit.model import AMD64, ARM64, Cell


@pytest.fixture(scope="module")
def evaluated(data):
    return matrix.evaluate(matrix.parse(matrix.default_document(), "<t>", data), data)


def test_the_contract_of_a_cell_is_the_rules_answer(data, evaluated):
    for cell in {e.cell for e in evaluated}:
        got = contract.of_cell(cell, data)
        archs, ptx = rules.supported_archs(data, cell.torch, cell.cuda, cell.platform)
        floor = rules.driver_floor(data, cell.cuda)
        assert (got.sass, got.ptx, got.driver_min, got.driver_full) == (tuple(archs), ptx, floor.minimum, floor.full)
        assert (got.cuda, got.platform, got.glibc_min) == (cell.cuda, cell.platform, data.torch_minor(cell.torch).glibc)


def test_the_matrix_outputs_say_what_the_contract_says(data, evaluated):
    for e in evaluated:
        row, runtime = outputs.cell_row(e, data), contract.of_cell(e.cell, data)
        assert row["min_driver"] == runtime.driver_min
        assert row["archs"] == [*runtime.sass, *([f"{runtime.ptx}+PTX"] if runtime.ptx else [])]


@pytest.mark.parametrize("platform", [AMD64, ARM64])
def test_the_written_contract_reads_back_from_a_record(data, platform):
    cell = Cell("13.2", "2.15.0", "5.9.0", "3.12", platform=platform)
    made = contract.of_cell(cell, data)
    written = made.to_json()
    assert list(written) == ["driver_min", "cuda", "cuda_major", "sass", "ptx", "platform", "glibc_min"]
    assert isinstance(written["sass"], list) and written["cuda_major"] == 13  # as the label and the doctor read it
    assert contract.problems(written, cell.to_json()) == []
    entry = {"tag": "r/x:t", "manifest": {"runtime": written, "cell": cell.to_json()}}
    assert contract.from_record(entry, data) == replace(made, driver_full=None)  # the written form has no full floor


def test_a_record_from_before_the_contract_gets_the_one_its_build_would_have_written(data):
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11")
    entry = {"tag": "r/x:old", "manifest": {"cell": cell.to_json()}}
    assert contract.from_record(entry, data) == contract.of_cell(cell, data)
