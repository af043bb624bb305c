"""torch's companion libraries (compat/companions.py): the table as the facts say, each row with its source; what a
lock is asked and held to; a user's pin that contradicts it refused naming both and the source; what `explain` says.
The locks from real PyPI are tests/locking/test_companions_pypi.py."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from imagekit.compat import companions, rules
from imagekit.errors import CheckFailed
from imagekit.locking import lockfile, resolution
from imagekit.model import Cell, Query
from imagekit.services.locks import lock_cells as lock_service
from tests.conftest import ROOT

CURATED = tomllib.loads((ROOT / "imagekit" / "data" / "compat.toml").read_text())


def held(data, torch: str) -> dict[str, str]:
    return {c.name: c.spec for c in companions.constraints(data, torch)}


# (torch, companion, what the lock holds it to): one row of each source, read where the table comes from
TABLE = [
    ("2.7.1", "torchvision", "==0.22.1"),  # torchvision 0.22.1's METADATA: torch==2.7.1
    ("2.14.1", "torchvision", ">=0.29.0,<=0.29.2"),  # 0.29.* with 2.14.* (curated: 0.29.1/0.29.2 say only >=2.14.0)
    ("2.7.1", "torchaudio", "==2.7.1"),  # METADATA
    ("2.11.0", "torchaudio", "==2.11.0"),  # test-infra: its METADATA names no torch
    ("2.8.0", "torchao", ">=0.13.0,<=0.14.0"),  # torchao's own table: built against torch 2.8.0
    ("2.9.0", "torchao", "==0.14.1"),
    ("2.9.1", "torchao", "==0.15.0"),
    ("2.10.0", "torchao", "==0.16.0"),
    ("2.12.1", "torchao", ">=0.17.0,<=0.18.0"),  # min_torch_version 2.11.0
    ("2.7.1", "torchao", "<0.13.0"),  # none in the table: the releases built for newer torch are kept out
    ("2.1.2", "torchtext", "==0.16.2"),  # METADATA
    ("2.3.1", "torchtext", "==0.18.0"),  # the PyTorch wiki's row, read as the 2.3 series
    ("2.1.2", "torchdata", "==0.7.1"),  # torchtext 0.16.x's METADATA pins it beside torch 2.1.x
    ("2.5.1", "torchdata", ">=0.9.0,<=0.10.0"),  # pytorch/data's README
    ("2.7.1", "xformers", ">=0.0.31,<=0.0.31.post1"),  # METADATA (two releases for one torch)
    ("2.7.1", "fbgemm-gpu", "==1.2.0"),  # FBGEMM's compatibility table: 1.2.0 with 2.7.x
    ("2.11.0", "fbgemm-gpu", "==1.6.0"),
    ("2.1.2", "triton", "==2.1.0"),  # torch 2.1.2's own METADATA
    ("2.14.1", "triton", "~=3.8.0"),
    ("2.1.2", "numpy", "<2"),  # built against NumPy 1
    ("2.2.2", "numpy", "<2"),
    ("2.1.2", "setuptools", "<82"),  # cpp_extension imports pkg_resources up to 2.1.x
]


@pytest.mark.parametrize(("torch", "name", "spec"), TABLE, ids=[f"{n}-torch{t}" for t, n, _ in TABLE])
def test_the_table_holds_each_companion_to_the_release_built_for_the_cells_torch(data, torch, name, spec):
    assert held(data, torch)[name] == spec


def test_what_the_table_does_not_know_is_left_to_the_companions_own_metadata(data):
    """Newer torch than every row of a companion: no guess. The companion is named (explain says so), asks nothing."""
    free = {c.name: c for c in companions.constraints(data, "2.14.1")}
    for name in ("torchtext", "fbgemm-gpu"):
        assert not free[name].binding and "its own metadata decides" in free[name].why
    assert "torchaudio" not in held(data, "2.12.1") or held(data, "2.12.1")["torchaudio"] == ""
    # numpy and setuptools are held only where torch needs it
    assert "numpy" not in held(data, "2.3.0") and "setuptools" not in held(data, "2.2.0")
    assert {"numpy", "setuptools"} <= set(held(data, "1.13.1"))


def test_every_row_names_a_source_the_data_cites():
    keys = set(CURATED["sources"])
    rows = [*CURATED["companion"], *CURATED["undeclared"]]
    assert len(rows) >= 25
    for row in rows:
        head = row["source"].split(" ")[0].rstrip(",;:")
        assert head in keys, row
        assert row["confidence"] in ("V", "V2", "I")
        companions.interval(row["torch"])  # valid specifiers
        companions.interval(row.get("releases") or row["requires"])
    names = {r["name"] for r in CURATED["companion"]}
    assert names == {"torchvision", "torchaudio", "torchao", "torchtext", "torchdata", "fbgemm-gpu"}
    assert {r["name"] for r in CURATED["undeclared"]} == {"numpy", "setuptools"}


def test_a_constraint_cites_its_source_in_full(data):
    for torch in ("2.1.2", "2.7.1", "2.8.0", "2.11.0"):
        for c in companions.constraints(data, torch):
            assert c.source and data.source(c.source).startswith("["), (torch, c)


def test_metadata_rows_are_only_exact_torch_pins(data):
    """A floor (torchaudio 2.11.1: torch>=2.11) says what a release needs, not what it was built for: no row."""
    derived = {(r.name, r.releases): r.torch for r in data.companions_derived}
    assert derived[("torchaudio", "==2.7.1")] == "==2.7.1"
    assert ("torchaudio", "==2.11.1") not in derived and ("xformers", "==0.0.35") not in derived


def test_intervals():
    assert companions.disjoint(">=2", "<2") and companions.disjoint("==2.11.0", "==2.7.1")
    assert not companions.disjoint(">=1.20", "<2") and not companions.disjoint("~=1.26", "<2")
    assert companions.disjoint(">2", "<=2") and not companions.disjoint(">=2", "<=2")
    assert companions.disjoint("==0.29.*", ">=0.30") and not companions.disjoint("==0.29.*", "<0.29.1")
    assert companions.side_of("==2.8.0", "2.7.1") == "below" and companions.side_of("==2.8.*", "2.9.0") == "above"
    assert companions.side_of(">=2.11.0", "2.12.1") == "in" and companions.side_of("==2.8.0", "2.8.0+cu126") == "in"
    assert companions.allows("==2.7.1", "2.7.1+cu118")  # a PyTorch index build's local label is not compared


# ---- a user's pin that contradicts the table -------------------------------------------------------------------
CONFLICTS = [
    ("2.7.1", "torchvision==0.24.0", "torchvision==0.22.1"),
    ("2.7.1", "torchaudio==2.11.0", "torchaudio==2.7.1"),
    ("2.8.0", "torchao==0.17.0", "torchao>=0.13.0,<=0.14.0"),
    ("2.1.2", "torchtext==0.18.0", "torchtext==0.16.2"),
    ("2.1.2", "torchdata==0.11.0", "torchdata==0.7.1"),
    ("2.7.1", "xformers==0.0.32.post2", "xformers>=0.0.31,<=0.0.31.post1"),
    ("2.7.1", "fbgemm-gpu==1.3.0", "fbgemm-gpu==1.2.0"),
    ("2.1.2", "triton==3.1.0", "triton==2.1.0"),
    ("2.1.2", "numpy>=2", "numpy<2"),
    ("2.1.2", "setuptools==84.2.1", "setuptools<82"),
]


@pytest.mark.parametrize(("torch", "pin", "table"), CONFLICTS, ids=[p for _, p, _ in CONFLICTS])
def test_a_pin_that_contradicts_the_table_is_a_violation_naming_both_and_the_source(data, torch, pin, table):
    verdict = rules.evaluate(Query(torch=torch, packages=(pin,)), data)
    (v,) = [v for v in verdict.violations if v.rule == "torch-companion"]  # a METADATA pin may say so too
    assert pin in v.message and table in v.message
    assert v.source.startswith("[")


@pytest.mark.parametrize("pin", ["torchaudio==2.7.1", "torchaudio", "numpy>=1.20", "numpy==1.26.4", "triton>=2"])
def test_a_pin_the_table_allows_is_no_violation(data, pin):
    assert rules.evaluate(Query(torch="2.7.1" if "audio" in pin else "2.1.2", packages=(pin,)), data).compatible


def test_lock_refuses_a_contradicting_pin_before_the_resolver_runs(data, tmp_path):
    class NoResolver:
        name = "uv"

        def version(self) -> str:
            return "uv 0"

        def compile(self, *args, **kwargs) -> str:
            raise AssertionError("the resolver was asked")

    cell = Cell("12.6", "2.7.1", "4.48.2", "3.11", ("torchaudio==2.11.0",))
    res = lock_service.lock_one(cell, tmp_path, resolution.LockSettings(), data, using=NoResolver())
    assert res.status == "failed" and not (tmp_path / f"{cell.id}.txt").exists()
    text = res.error.render()
    assert text.startswith("error: ") and "\nhint: " in text
    assert "torchaudio==2.11.0" in text and "torchaudio==2.7.1" in text and "[PYPI (torchaudio 2.7.1 METADATA)]" in text
    assert res.error.exit_code == 1


def test_the_lock_command_says_so_with_error_and_hint(app, runner, in_tmp: Path):
    (in_tmp / "imagekit.toml").write_text(
        '[image]\nrepository = "127.0.0.1:5000/a/b"\n[matrix]\ncuda = ["12.6"]\ntorch = ["2.7.1"]\n'
        'transformers = ["4.48.2"]\npython = ["3.11"]\npackages = ["torchaudio==2.11.0"]\n'
    )
    res = runner.invoke(app, ["lock"])
    assert res.exit_code != 0
    assert "error:" in res.output and "hint:" in res.output
    assert "torchaudio==2.11.0" in res.output and "torchaudio==2.7.1" in res.output, res.output


# ---- what the resolver is asked, and what a lock read back is held to -------------------------------------------
def test_the_request_hands_the_table_to_the_resolver_as_constraints(data):
    req = resolution.request(Cell("12.1", "2.1.2", "4.48.2", "3.11"), resolution.LockSettings(), data)
    text = resolution.constraints_text(req)
    for line in ("torchaudio==2.1.2", "triton==2.1.0", "numpy<2", "setuptools<82", "torchao<0.13.0"):
        assert f"{line}\n" in text
    assert req.uv_args()[-2:] == ["--constraint", resolution.CONSTRAINTS_FILE]
    # a constraint binds only a name the resolution holds: the request's direct requirements are the cell's alone
    assert req.requirements == ("torch==2.1.2", "transformers==4.48.2")
    # and it is no input of the hash (a lock is held to the table when read back instead)
    assert req.input_hash == replace(req, constraints=()).input_hash


def _lock_pinning(cell: Cell, data, extra: dict[str, str]) -> lockfile.Lock:
    committed = (ROOT / "lockfiles" / f"{Cell('12.1', '2.1.2', '4.48.2', '3.11').id}.txt").read_text()
    lock = lockfile.parse(committed)
    entries = [e for e in lock.app if e.name not in extra]
    entries += [lockfile.LockEntry(n, v, (f"sha256:{'0' * 64}",)) for n, v in extra.items()]
    return replace(lock, app=tuple(sorted(entries, key=lambda e: e.name)))


def test_a_lock_the_table_contradicts_is_stale_and_says_why(data):
    cell = Cell("12.1", "2.1.2", "4.48.2", "3.11")
    fine = _lock_pinning(cell, data, {"numpy": "1.26.4"})
    assert resolution.companion_drift(fine, cell, data) == []
    bad = _lock_pinning(cell, data, {"numpy": "2.4.6", "setuptools": "84.2.1"})
    drift = resolution.companion_drift(bad, cell, data)
    assert [d.split(" (")[0] for d in drift] == ["numpy 2.4.6", "setuptools 84.2.1"]
    reason = resolution.stale_reason(bad, cell, data)
    assert reason and "companion table" in reason and "numpy 2.4.6" in reason and "NP2" in reason


def test_the_committed_locks_agree_with_the_table(data):
    for path in sorted((ROOT / "lockfiles").glob("*.txt")):
        lock = lockfile.parse(path.read_text())
        cell_torch = lock.pins()["torch"].split("+")[0]
        assert companions.drift(lock.pins(), companions.constraints(data, cell_torch)) == [], path.name


def test_a_resolution_outside_the_table_is_refused(data):
    """The resolver was given the constraints; an answer that broke one is not written (a resolver's bug)."""
    cell = Cell("12.1", "2.1.2", "4.48.2", "3.11")
    req = resolution.request(cell, resolution.LockSettings(), data)
    text = (ROOT / "lockfiles" / f"{cell.id}.txt").read_text()
    body = text.split("# --- layer: torch ---", 1)[1].replace("numpy==1.26.4", "numpy==2.4.6")
    body = "\n".join(line for line in body.splitlines() if not line.startswith("# --- layer"))
    with pytest.raises(CheckFailed, match=r"numpy 2\.4\.6, which the companion table does not allow"):
        resolution.build_lock(req, body, None, data, "uv 0")


# ---- explain -------------------------------------------------------------------------------------------------------
def test_explain_names_the_companions_of_a_torch(app, runner):
    res = runner.invoke(app, ["explain", "--cuda", "12.6", "--torch", "2.7.1"])
    assert res.exit_code == 0
    assert "torchaudio==2.7.1" in res.output and "fbgemm-gpu==1.2.0" in res.output and "FBGEMM" in res.output
    assert "torchtext (free)" in res.output


def test_explain_json_names_a_companion_the_query_asks_for(app, runner):
    plain = runner.invoke(app, ["explain", "--torch", "2.7.1", "--json"])
    assert json.loads(plain.stdout) == {"compatible": True, "violations": []}  # the contract, as before
    res = runner.invoke(app, ["explain", "--torch", "2.7.1", "--package", "torchaudio==2.11.0", "--json"])
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["companions"]["torchaudio"]["requires"] == "==2.7.1"
    assert [v["rule"] for v in doc["violations"]] == ["torch-companion"]


# ---- what the image is told to check -----------------------------------------------------------------------------
def test_the_manifest_names_each_companion_the_lock_holds_and_the_self_test_plans_its_check(data):
    from imagekit.image.buildplan import held_companions
    from imagekit.in_image import selftest

    cell = Cell("12.1", "2.1.2", "4.48.2", "3.11")
    lock = _lock_pinning(cell, data, {"numpy": "1.26.4", "setuptools": "81.0.0", "torchaudio": "2.1.2"})
    found = {c["name"]: c for c in held_companions(cell, lock, data)}
    assert set(found) == {"torchaudio", "triton", "setuptools"}  # numpy: numpy-interop checks it
    assert found["setuptools"]["import"] == ["pkg_resources"] and found["setuptools"]["requires"] == "<82"
    assert found["torchaudio"] == {
        "name": "torchaudio", "version": "2.1.2", "requires": "==2.1.2",
        "why": "torch 2.1.2 goes with torchaudio 2.1.2", "source": "PYPI (torchaudio 2.1.2 METADATA)",
        "import": ["torchaudio"],
    }  # fmt: skip
    planned = [p["id"] for p in selftest.plan({"companions": list(found.values())})]
    assert "torch-companions" in planned and "torch-companions" not in [p["id"] for p in selftest.plan({})]


def test_a_pin_whose_marker_the_image_does_not_meet_is_not_the_images(data):
    query = Query(torch="2.1.2", python="3.11", packages=("numpy>=2; python_version >= '3.13'",))
    assert rules.evaluate(query, data).compatible
    assert not rules.evaluate(replace(query, packages=("numpy>=2; python_version >= '3.11'",)), data).compatible
