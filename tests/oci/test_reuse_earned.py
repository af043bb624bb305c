"""Self-test reuse is earned (issue 49): a recorded result stands for this image only when its record passed (every
check `pass` or `skip`, at least one), lists every check this image's full self-test would run, `pass` where this
run would run it and `skip` for the very reason this run would skip it, names this image's layers below the code
layer, the same runtime config (USER included) and the same place (GPU or not, emulated or not), and comes from a
record this machine published or verified. `release merge` refuses a record whose self-test did not pass or whose
layers are not its image's.

Tests for bugs planted on purpose name the bug they catch (`# Planted:`); each was run with its bug planted, and
failed, and without it, and passed."""

from __future__ import annotations

import json

import pytest

from imagekit.errors import CheckFailed
from imagekit.model import Cell
from imagekit.oci import selftest_reuse
from imagekit.oci.selftest_reuse import Reuse, RunKey
from imagekit.services.builds import selftest_runner
from imagekit.services.publishing import release_index
from tests.fakes import RecordingEngine

LAYERS = [f"sha256:{c * 64}" for c in "abc"]
CODE_NOW, CODE_THEN = "sha256:" + "2" * 64, "sha256:" + "1" * 64
CONFIG = {"Env": ["PATH=/opt/venv/bin:/usr/bin"], "User": "root"}
CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11")
GPU_SKIP = "no GPU visible: GPU checks skipped"


def _key(config: dict = CONFIG, *, gpu: bool = False, emulated: bool = False, code: str = CODE_NOW) -> RunKey:
    inspect = {"RootFS": {"Layers": [*LAYERS, code]}, "Config": config}
    return selftest_reuse.key_of(inspect, code_layer=True, gpu=gpu, emulated=emulated)


def _report(checks: list[dict] | None = None, **ran: object) -> dict:
    checks = (
        checks
        if checks is not None
        else [
            {"id": "dists-match-lock", "status": "pass", "message": "ok"},
            {"id": "tiny-model", "status": "pass", "message": "ok"},
            {"id": "gpu-cuda-available", "status": "skip", "message": GPU_SKIP},
        ]
    )
    then = _key(code=CODE_THEN, **ran)  # type: ignore[arg-type]
    return {
        "checks": checks,
        "failed": [],
        "passed": True,
        "ran": {"gpu": then.gpu, "emulated": then.emulated, **then.to_json()},
    }


def _entry(report: dict, tag: str = "reg/acme:one") -> dict:
    return {"tag": tag, "digest": "sha256:" + "e" * 64, "manifest": {"cell": {"id": CELL.id}}, "selftest": report}


def _find(key: RunKey, entry: dict) -> tuple[Reuse | None, str]:
    return selftest_reuse.find(key, {entry["tag"]: entry}, CELL.id)


# ---- what a record must be ------------------------------------------------------------------------------------------
# Planted: selftest_reuse._passed `c.get("status") in REUSABLE` -> `c.get("status") != "fail"` (FAIL, error, none).
@pytest.mark.parametrize("status", ["FAIL", "error", None, "Pass", "warn", ""])
def test_a_status_other_than_pass_or_skip_is_never_reused(status):
    # Before: a recorded check whose status was FAIL, error or missing was reused and the build said it passed.
    checks = [{"id": "dists-match-lock", "status": "pass"}, {"id": "tiny-model", "status": status}]
    if status is None:
        del checks[1]["status"]
    reuse, why = _find(_key(), _entry(_report(checks)))
    assert reuse is None and "did not pass" in why


def test_an_empty_check_list_is_never_reused():
    # Before: `"checks": []` with `"passed": true` was reused: no check ran, the build said passed.
    reuse, why = _find(_key(), _entry(_report([])))
    assert reuse is None and "did not pass" in why


# Planted: selftest_reuse.config_digest without "User" in _CONFIG_KEYS.
def test_the_runtime_configs_user_is_part_of_the_reuse_key():
    as_root = _entry(_report())
    assert _find(_key(), as_root)[0] is not None
    reuse, why = _find(_key({**CONFIG, "User": "1000:1000"}), as_root)
    assert reuse is None and "runtime config" in why and "USER" in why


# Planted: selftest_reuse.why_not comparing `theirs.gpu != key.gpu` alone (emulated runs taken for native ones).
@pytest.mark.parametrize(("then", "now"), [(False, True), (True, False)])
def test_emulated_and_native_runs_are_not_interchangeable(then, now):
    reuse, why = _find(_key(emulated=now), _entry(_report(emulated=then)))
    assert reuse is None and "emulated" in why


def test_a_gpu_run_and_a_cpu_run_are_not_interchangeable():
    reuse, why = _find(_key(gpu=True), _entry(_report(gpu=False)))
    assert reuse is None and "without a GPU" in why


def test_a_record_this_machine_does_not_vouch_for_is_not_reused(monkeypatch, tmp_path):
    # Before: whatever the release index said was taken; a cloned repository's releases/index.json could lend "pass"
    # to any image whose layers it named.
    monkeypatch.setenv("IMAGEKIT_STATE", str(tmp_path))
    entry = _entry(_report(), tag="reg/acme:planted")
    found = selftest_reuse.find(_key(), {entry["tag"]: entry}, CELL.id, origin=release_index.unvouched)
    assert found[0] is None and "neither published on this machine nor merged with its signature verified" in found[1]
    release_index.vouch(entry, "published on this machine")
    assert release_index.vouched(entry) == "published on this machine"
    assert selftest_reuse.find(_key(), {entry["tag"]: entry}, CELL.id, origin=release_index.unvouched)[0] is not None
    edited = _entry({**_report(), "checks": [{"id": "tiny-model", "status": "pass"}]}, tag="reg/acme:planted")
    assert release_index.vouched(edited) is None  # the report changed since it was vouched for


# ---- what the record must cover: the full run's plan ----------------------------------------------------------------
def _plan(*steps: tuple[str, str | None]) -> list[dict]:
    return [{"id": cid, "skip": skip} for cid, skip in steps]


FULL = (("dists-match-lock", None), ("tiny-model", None), ("gpu-cuda-available", GPU_SKIP))


def _reuse(report: dict) -> Reuse:
    reuse, why = _find(_key(), _entry(report))
    assert reuse is not None, why
    return reuse


def test_every_check_the_full_run_would_run_must_be_in_the_record():
    reuse = _reuse(_report())
    fresh = {"checks": [{"id": "dists-match-lock", "status": "pass"}], "passed": True, "failed": []}
    assert selftest_reuse.shortfall({**fresh, "plan": _plan(*FULL)}, reuse) is None
    more = _plan(*FULL, ("torch-compile", None))
    assert "has no result for torch-compile" in str(selftest_reuse.shortfall({**fresh, "plan": more}, reuse))
    assert "no plan" in str(selftest_reuse.shortfall(fresh, reuse))


# Planted: selftest_reuse.shortfall comparing the status alone (`old.get("status") != "skip"`), not the reason.
def test_a_skip_is_reused_only_for_the_reason_this_run_would_give():
    reuse = _reuse(_report())
    fresh = {"checks": [{"id": "dists-match-lock", "status": "pass"}], "passed": True, "failed": []}
    other = _plan(("dists-match-lock", None), ("tiny-model", None), ("gpu-cuda-available", "another reason"))
    assert "not skipped for the reason this run would skip it" in str(
        selftest_reuse.shortfall({**fresh, "plan": other}, reuse)
    )
    runs_now = _plan(("dists-match-lock", None), ("tiny-model", None), ("gpu-cuda-available", None))
    assert "this run would run it" in str(selftest_reuse.shortfall({**fresh, "plan": runs_now}, reuse))


# Planted: selftest_reuse.merge taking a reused result as passed (`{**old, "status": "pass", "reused": ...}`).
def test_a_check_the_record_skipped_for_a_stated_reason_stays_a_skip():
    reuse = _reuse(_report())
    fresh = {"checks": [{"id": "dists-match-lock", "status": "pass"}], "passed": True, "failed": [], "plan": []}
    merged = selftest_reuse.merge(fresh, reuse)
    gpu = next(c for c in merged["checks"] if c["id"] == "gpu-cuda-available")
    assert (gpu["status"], gpu["message"]) == ("skip", GPU_SKIP) and gpu["reused"]["record"] == "reg/acme:one"
    assert merged["passed"] is True and "plan" not in merged


# Planted: selftest_reuse.merge `"passed": not failed and fresh.get("passed") is True` -> `"passed": not failed`.
@pytest.mark.parametrize("fresh_passed", [False, None, "yes"])
def test_a_merged_report_passes_only_when_the_fresh_run_passed_too(fresh_passed):
    reuse = _reuse(_report())
    fresh = {"checks": [{"id": "dists-match-lock", "status": "pass"}], "passed": fresh_passed, "failed": []}
    assert selftest_reuse.merge(fresh, reuse)["passed"] is False


def test_a_fresh_check_of_another_status_fails_the_merged_report():
    reuse = _reuse(_report())
    fresh = {"checks": [{"id": "dists-match-lock", "status": "error"}], "passed": True, "failed": []}
    merged = selftest_reuse.merge(fresh, reuse)
    assert merged["passed"] is False and merged["failed"] == ["dists-match-lock"]


# ---- a build: a record that does not cover the run gets every check run again, said why -----------------------------
class _Image(RecordingEngine):
    """The engine at its outer boundary: the image answers `--code-layer` with its plan of the full run."""

    def __init__(self, plan: list[dict]) -> None:
        super().__init__()
        self.plan, self.argv = plan, []
        self.images["reg/acme:x"] = {"RootFS": {"Layers": [*LAYERS, CODE_NOW]}, "Config": CONFIG}

    def run(self, image, argv, **kw):  # type: ignore[no-untyped-def,override]
        self.argv.append(list(argv))
        code, out, err = super().run(image, argv, **kw)
        if "--code-layer" in argv:
            out = json.dumps({**json.loads(out), "plan": self.plan})
        return code, out, err


def test_a_build_runs_every_check_when_the_record_does_not_cover_its_plan(monkeypatch, tmp_path):
    monkeypatch.setenv("IMAGEKIT_STATE", str(tmp_path))
    entry = _entry(_report())
    release_index.vouch(entry, "published on this machine")
    engine, said = _Image(_plan(*FULL, ("smoke-1", None))), []
    result = selftest_runner.for_build(
        engine, "reg/acme:x", CELL, {entry["tag"]: entry}, gpus="off", emulated=False, code_to="/opt/app",
        full=False, say=said.append, require_gpu=False,
    )  # fmt: skip
    code_layer = ["--code-layer", "--code-to=/opt/app"]
    assert [a[1:] for a in engine.argv] == [code_layer, []]  # the code layer's checks, then all of them
    assert said[-1] == "self-test: every check (reg/acme:one has no result for smoke-1, which this self-test runs)"
    assert "reused" not in result.report

    engine, said = _Image(_plan(*FULL)), []
    result = selftest_runner.for_build(
        engine, "reg/acme:x", CELL, {entry["tag"]: entry}, gpus="off", emulated=False, code_to="/opt/app",
        full=False, say=said.append, require_gpu=False,
    )  # fmt: skip
    code_layer = ["--code-layer", "--code-to=/opt/app"]
    assert [a[1:] for a in engine.argv] == [code_layer] and result.report["reused"]["checks"]


# ---- release merge checks the same ----------------------------------------------------------------------------------
# Planted: selftest_reuse.record_problem without its comparison of the named layers with the image's diff ids.
def test_a_record_whose_layers_are_not_its_images_is_refused():
    report = _report()
    assert selftest_reuse.record_problem(report, [*LAYERS, CODE_THEN]) is None
    assert "not the image's" in str(selftest_reuse.record_problem(report, [*LAYERS, CODE_NOW]))
    assert "did not pass" in str(selftest_reuse.record_problem({**report, "checks": []}, None))


def test_release_merge_refuses_a_record_claiming_another_images_layers(tmp_path, monkeypatch):
    # Before: `release merge` "verified" a record whose self-test named layers that are not its image's; its results
    # then stood for any build of those layers.
    from imagekit.effects.registry import Remote
    from imagekit.oci import release_record
    from imagekit.services.publishing import release
    from tests.fakes import RecordingRegistry

    monkeypatch.setenv("IMAGEKIT_STATE", str(tmp_path / "state"))
    registry, repo = RecordingRegistry(calls=[]), "r.example.com/acme/train"
    tag = f"{CELL.id}-0123456789ab"
    inspect = {"Id": "sha256:" + "c" * 64, "RootFS": {"Layers": [*LAYERS, CODE_THEN]}, "Config": {}}
    digest = registry.receive(Remote.parse(repo), tag, inspect)
    published = release_record.Published(f"{repo}:{tag}", f"{repo}:{CELL.id}", digest, False, inspect["Id"])

    def merged(report: dict) -> release.Merged:
        folder = tmp_path / f"records-{len(list(tmp_path.iterdir()))}"
        entry = release_index.release_entry(
            published, lock_hash="l" * 64, manifest={"cell": {"id": CELL.id}}, report=report, size=1
        )
        release_index.write_record(folder, entry)
        return release.merge(
            [folder], tmp_path / "index.json", registry, allowed=([release.Named("r.example.com")], "--registry")
        )

    claims_other = _report()
    claims_other["ran"]["layers"] = [*LAYERS, CODE_NOW]  # not the image's own code layer
    with pytest.raises(CheckFailed, match="layers its self-test names are not the image's"):
        merged(claims_other)
    with pytest.raises(CheckFailed, match="its self-test did not pass"):
        merged({**_report(), "checks": [{"id": "tiny-model", "status": "FAIL"}]})
    assert not (tmp_path / "index.json").exists()  # nothing written
    assert merged(_report()).added == [f"{repo}:{tag}"]
