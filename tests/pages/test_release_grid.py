"""The release page's content (pages.release_grid, pages.cell_facts): each cell's state by the one rule, its place on
its Python's torch × CUDA grid, the rules that excluded cells as numbered notes with their sources, the facts a
record holds and the ones it lacks said so, the commands that start it, and failed self-test reports."""

from __future__ import annotations

import pytest

from imagekit.compat import rules
from imagekit.errors import UsageError
from imagekit.matrix import matrix_file as matrix
from imagekit.model import ARM64, Cell, Query
from imagekit.pages import cell_facts, release_grid
from imagekit.pages.cell_facts import EXCLUDED, FAILED, GPU_SKIPPED, PASSED, UNPUBLISHED
from tests.pages import records

GPU_CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11")
CPU_CELL = Cell("11.8", "2.5.1", "4.48.2", "3.11")
MATRIX = {
    "matrix": {
        "cuda": ["11.8", "12.4", "12.6", "12.8"],
        "torch": ["2.5.1", "2.6.0", "2.7.1", "2.8.0"],
        "transformers": ["4.48.2"],
        "python": ["3.11", "3.12"],
        "packages": ["accelerate==1.2.1"],
    },
    "targets": {"gpus": ["V100", "A100", "H100"]},
}


CHECKS = records.report(GPU_CELL)["checks"]


def _evaluated(data, doc: dict = MATRIX) -> list[matrix.EvaluatedCell]:
    return matrix.evaluate(matrix.parse(doc, "imagekit.toml", data), data)


def _page(data, *entries: dict, failed: tuple = (), doc: dict = MATRIX) -> release_grid.Page:
    index = records.index(*entries)
    return release_grid.build(
        index["images"], _evaluated(data, doc), list(failed), data, index_digest="0" * 64, matrix="imagekit.toml"
    )


def _chips(page: release_grid.Page) -> dict[str, release_grid.Chip]:
    found = {}
    for grid in page.grids:
        for row in grid.rows:
            for slot in row.slots:
                for chip in slot:
                    found.update({key: chip for key in chip.cells})
    return found


def _report(**changes: object) -> dict:
    return {**records.report(GPU_CELL), **changes}


@pytest.mark.parametrize(
    ("report", "state"),
    [
        (records.report(GPU_CELL), PASSED),
        (records.report(GPU_CELL, gpu=None), GPU_SKIPPED),  # a CPU-only runner: GPU checks skipped, never passed
        (records.report(GPU_CELL, emulated=True), GPU_SKIPPED),  # emulated: CPU checks only
        (_report(checks=[c for c in CHECKS if not c["id"].startswith("gpu-")]), GPU_SKIPPED),  # no GPU check at all
        (_report(checks=[{**c, "status": "skip"} if c["id"] == "gpu-arch" else c for c in CHECKS]), GPU_SKIPPED),
        (_report(passed=False), FAILED),
        (_report(failed=["pip-check"]), FAILED),  # a report that says both: the failure stands
        (_report(checks=[*records.report(GPU_CELL)["checks"], {"id": "smoke-1", "status": "fail"}]), FAILED),
        (_report(passed="yes"), FAILED),  # only true is true
        ("not a report", FAILED),
        (None, FAILED),
        (_report(ran="odd", checks="odd"), GPU_SKIPPED),  # passed, but nothing says a GPU check ran
    ],
)
def test_a_cells_state_follows_its_self_test_report(report, state):
    assert cell_facts.state_of(report) == state


def test_every_cell_of_the_index_and_the_matrix_is_on_its_pythons_grid_with_its_state(data):
    cpu = records.record(CPU_CELL, data, gpu=None)
    page = _page(data, records.record(GPU_CELL, data), cpu)
    chips = _chips(page)
    assert chips[GPU_CELL.id].state == PASSED and chips[CPU_CELL.id].state == GPU_SKIPPED
    assert chips[GPU_CELL.id].anchor == f"cell-{GPU_CELL.id}" and chips[GPU_CELL.id].label == "tf 4.48.2"
    evaluated = {e.cell.key: e for e in _evaluated(data)}
    assert set(chips) == set(evaluated)  # every matrix cell placed, none twice
    for key, e in evaluated.items():
        if key not in (GPU_CELL.id, CPU_CELL.id):
            assert chips[key].state == (UNPUBLISHED if e.verdict.compatible else EXCLUDED), key
    assert [g.python for g in page.grids] == ["3.11", "3.12"]
    grid = page.grids[0]
    assert grid.variants == ("cu118", "cu124", "cu126", "cu128") and grid.rows[0].torch == "2.5.1"
    assert dict(page.counts) == {PASSED: 1, GPU_SKIPPED: 1, FAILED: 0, EXCLUDED: 14, UNPUBLISHED: 16}
    assert [c.key for c in page.cards] == [CPU_CELL.id, GPU_CELL.id]


def test_versions_sort_as_versions_not_as_text():
    assert sorted(["2.10.0", "2.9.1", "2.14.1"], key=release_grid.natural) == ["2.9.1", "2.10.0", "2.14.1"]
    assert sorted(["cu130", "cu118", "cu128"], key=release_grid.natural) == ["cu118", "cu128", "cu130"]
    assert sorted(["x<1>", "2.5.1", ""], key=release_grid.natural) == ["", "2.5.1", "x<1>"]  # any text sorts


def test_an_exclusion_carries_its_rules_message_and_source_and_cites_a_numbered_note(data):
    page = _page(data)
    chips = _chips(page)
    key = "cu128-torch2.7.1-py3.11-tf4.48.2"  # torch 2.7.1+cu128 has no sm_70 kernels: V100 is in the fleet
    verdict = rules.evaluate(Query(cuda="12.8", torch="2.7.1", archs=("sm_70", "sm_80", "sm_90")), data)
    [violation] = verdict.violations
    chip = chips[key]
    assert chip.state == EXCLUDED and chip.label == "no sm_70 kernels"
    assert violation.message in chip.title and violation.source in chip.title and "gpu-arch" in chip.title
    notes = {n.number: n for n in page.notes}
    assert [notes[n].rule for n in chip.notes] == ["gpu-arch"]
    assert notes[chip.notes[0]].source == violation.source
    # the notes are numbered as the grids meet them, each (rule, source) once, and every one is cited
    assert sorted(notes) == list(range(1, len(notes) + 1))
    cited = {n for c in chips.values() for n in c.notes}
    assert cited == set(notes)
    wheels = chips["cu118-torch2.8.0-py3.11-tf4.48.2"]
    assert wheels.label == "no such wheels" and notes[wheels.notes[0]].rule == "cuda-variant"
    assert "[TI release/2.8]" in notes[wheels.notes[0]].source


def test_the_excluded_cells_of_a_slot_share_one_chip(data):
    doc = {**MATRIX, "matrix": {**MATRIX["matrix"], "transformers": ["4.48.2", "4.57.6"], "torch": ["2.1.2"]}}
    doc["matrix"]["cuda"] = ["12.1"]
    page = _page(data, doc=doc)
    [[slot]] = [row.slots for row in page.grids[0].rows]
    assert [c.state for c in slot] == [UNPUBLISHED, EXCLUDED]  # 4.48.2 builds; 4.57.6 needs torch >= 2.2
    assert slot[1].cells == ("cu121-torch2.1.2-py3.11-tf4.57.6",) and slot[1].label == "transformers-torch"


def test_a_published_cell_the_matrix_now_excludes_is_shown_published_saying_so(data):
    cell = Cell("12.8", "2.7.1", "4.48.2", "3.11")  # the fleet's V100 excludes it now
    page = _page(data, records.record(cell, data))
    assert _chips(page)[cell.id].state == PASSED
    [made] = page.cards
    [note] = [f for f in made.facts if f.label == "The matrix now excludes it"]
    assert "gpu-arch" in note.value and "sm_70" in note.value


def test_the_newest_release_of_a_cell_is_its_card_and_the_older_ones_are_listed(data):
    old = records.record(GPU_CELL, data, build="aaaaaaaaaaaa", published_at="2026-01-01T00:00:00Z", gpu=None)
    new = records.record(GPU_CELL, data, build="bbbbbbbbbbbb", published_at="2026-02-01T00:00:00Z")
    page = _page(data, old, new)
    [made] = page.cards
    assert made.state == PASSED and made.facts[0].value == new["tag"]
    assert [f.value for f in made.earlier] == [f"{old['tag']} ({old['digest']})"]


def test_the_commands_start_the_image_by_digest_and_on_the_gpu_it_was_tested_on(data):
    entry = records.record(GPU_CELL, data)
    repo = records.REPO
    assert [c.text for c in cell_facts.commands(entry, data)] == [
        f"docker pull {repo}@{entry['digest']}",
        f"imagekit runpod-template {entry['tag']} --digest --create",
        f"imagekit pod create {entry['tag']} --gpu 'NVIDIA H100 80GB HBM3' --deadline 6h",
    ]
    untested = cell_facts.commands(records.record(CPU_CELL, data, gpu=None), data)
    assert untested[2].text.endswith("--gpu GPU_TYPE_ID --deadline 6h") and "name the GPU" in untested[2].label
    odd = records.record(GPU_CELL, data, gpu="NVIDIA H100'; rm -rf / #")  # not of RunPod's ids: never quoted in
    assert "rm -rf" not in cell_facts.commands(odd, data)[2].text


def test_what_a_record_lacks_is_said_to_be_not_recorded(data):
    bare = records.record(GPU_CELL, data, sbom=False, signed=False, layers=False, revision=None)
    page = _page(data, bare)
    facts = {f.label: f for f in page.cards[0].facts}
    for label in ("SBOM", "Signed by key", "Built from commit", "Compressed (what a pull downloads)",
                  "Vulnerability gate"):  # fmt: skip
        assert facts[label].missing and "not" in facts[label].value, label
    full = {f.label: f for f in _page(data, records.record(GPU_CELL, data)).cards[0].facts}
    assert not full["SBOM"].missing and "39 Python distributions, 131 Debian packages" in full["SBOM"].value
    assert full["Signed by key"].value.startswith(records.digest("cosign.pub"))
    assert full["Built from commit"].value == "4f2a9c1d3e5b" and full["Size"].value.startswith("5.32 GB")
    assert full["Compressed (what a pull downloads)"].value == "2.91 GB (2,912,345,678 bytes)"
    assert full["Vulnerability gate"].missing  # no record holds the audit's verdict
    unknown = records.record(GPU_CELL, data, revision="unknown")
    assert (
        "outside a git checkout" in {f.label: f for f in _page(data, unknown).cards[0].facts}["Built from commit"].value
    )


def test_where_the_self_test_ran_is_read_from_its_report(data):
    gpu = cell_facts.selftest(records.report(GPU_CELL), "linux/amd64")
    assert gpu.where.startswith("on a GPU: NVIDIA H100 80GB HBM3 (linux/amd64 host; CPU model not recorded)")
    assert gpu.verdict == "passed: 7 passed, 0 failed, 0 skipped of 7 checks"
    cpu = cell_facts.selftest(records.report(GPU_CELL, gpu=None), "linux/amd64")
    assert "on a CPU without a GPU" in cpu.where and "GPU checks skipped" in cpu.where
    emulated = cell_facts.selftest(records.report(GPU_CELL, emulated=True), ARM64)
    assert emulated.where.startswith("emulated under qemu") and "CPU checks only" in emulated.where
    old = cell_facts.selftest({**records.report(GPU_CELL, gpu=None), "ran": None}, "linux/amd64")
    assert old.where.startswith("not recorded")
    assert cell_facts.selftest(None, "linux/amd64").verdict.startswith("no self-test report recorded")


def test_a_failed_build_marks_its_cell_failed_with_its_report(data):
    report = records.report(CPU_CELL, passed=False)
    run = release_grid.failed_run(report, f"{CPU_CELL.id}.json")
    assert run is not None and run.platform == "linux/amd64"
    published = records.record(GPU_CELL, data)
    failed_too = release_grid.failed_run(records.report(GPU_CELL, passed=False), f"{GPU_CELL.id}.json")
    page = _page(data, published, failed=(run, failed_too))
    chips = _chips(page)
    assert chips[CPU_CELL.id].state == FAILED and chips[GPU_CELL.id].state == FAILED
    cards = {c.key: c for c in page.cards}
    assert cards[CPU_CELL.id].failed_run.verdict.startswith("failed (dists-match-lock)")
    assert cards[CPU_CELL.id].commands == () and cards[CPU_CELL.id].facts[0].missing  # nothing to start
    assert cards[GPU_CELL.id].failed_run and cards[GPU_CELL.id].commands  # the older build is still there to start
    arm = release_grid.failed_run(records.report(CPU_CELL, passed=False), f"{CPU_CELL.id}-arm64.json")
    assert arm.platform == ARM64
    assert release_grid.failed_run(records.report(CPU_CELL), f"{CPU_CELL.id}.json") is None  # passed: its record says


@pytest.mark.parametrize(
    ("doc", "name", "says"),
    [
        ([], "x.json", "expected an object"),
        ({"cell": "../../etc", "passed": False, "checks": []}, "x.json", "cell: expected a cell id"),
        ({"cell": CPU_CELL.id, "passed": "no", "checks": []}, f"{CPU_CELL.id}.json", "expected 'passed'"),
        ({"cell": CPU_CELL.id, "passed": False, "checks": []}, "other.json", "its name is not its cell's"),
    ],
)
def test_a_report_of_another_shape_is_refused_naming_what_is_wrong(doc, name, says):
    with pytest.raises(UsageError, match=says):
        release_grid.failed_run(doc, name)


def test_a_record_whose_cell_names_no_place_is_listed_apart(data):
    odd = records.record(GPU_CELL, data)
    cell = {"id": "custom-build"}
    odd = {**odd, "tag": f"{records.REPO}:custom-build-1", "alias": f"{records.REPO}:custom-build",
           "manifest": {**odd["manifest"], "cell": cell, "runtime": None}}  # fmt: skip
    page = _page(data, odd)
    assert [c.cells for c in page.unplaced] == [("custom-build",)] and page.unplaced[0].anchor
    assert "custom-build" not in _chips(page)


def test_values_are_made_printable_and_bounded():
    assert cell_facts.shown("a\x1b[31mb\x07c\nd") == "abc d"
    long = cell_facts.shown("n" * 10_000)
    assert long.endswith("… (10,000 characters)") and len(long) < 230
    assert cell_facts.shown(["a", 1]) == "['a', 1]"
