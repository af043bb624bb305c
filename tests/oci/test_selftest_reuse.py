"""Which self-test results a build may take from an earlier release (oci/selftest_reuse.py): only a passing run's,
keyed by the layers below the code layer, the runtime config and where it ran (GPU or not), each reused result
naming the record and layers it came from."""

from __future__ import annotations

import pytest

from imagekit.oci import selftest_reuse
from imagekit.oci.selftest_reuse import RunKey

CELL = "cu124-torch2.5.1-py3.11-tf4.48.2"
BELOW = tuple(f"sha256:{c * 64}" for c in "abcd")
CODE_1, CODE_2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
CONFIG = selftest_reuse.config_digest({"Env": ["PATH=/opt/venv/bin:/usr/bin"], "Entrypoint": ["/start"]})
FULL = ["dists-match-lock", "pip-check", "torch-compile", "tiny-model", "gpu-cuda-available", "image-hygiene",
        "smoke-1", "labels-match-contents"]  # fmt: skip


def _key(code: str = CODE_2, below: tuple[str, ...] = BELOW, gpu: bool = False, config: str = CONFIG) -> RunKey:
    return RunKey((*below, code), True, config, gpu, False)


def _release(tag: str, key: RunKey, *, passed: bool = True, when: str = "2026-01-01T00:00:00Z", **ran) -> dict:
    checks = [{"id": c, "status": "pass", "message": f"{c} ok"} for c in FULL]
    if not passed:
        checks[3]["status"] = "fail"
    report = {
        "checks": checks, "failed": [] if passed else ["tiny-model"], "passed": passed,
        "ran": {"gpu": key.gpu, "emulated": key.emulated, "seconds": 40.0, **key.to_json(), **ran},
    }  # fmt: skip
    return {"tag": f"reg/acme:{tag}", "digest": "sha256:" + "e" * 64, "published_at": when,
            "manifest": {"cell": {"id": CELL}}, "selftest": report}  # fmt: skip


def _images(*entries: dict) -> dict:
    return {e["tag"]: e for e in entries}


def test_a_code_change_over_the_same_layers_reuses_a_passing_run_and_names_where_each_result_came_from():
    earlier = _release("one", _key(CODE_1))
    reuse, why = selftest_reuse.find(_key(CODE_2), _images(earlier), CELL)
    assert reuse is not None and why == ""
    assert reuse.record == "reg/acme:one" and reuse.layers == BELOW  # the layers below the code layer
    assert "labels-match-contents" not in [c["id"] for c in reuse.checks]  # the host checks the config every time
    fresh = {"checks": [{"id": "image-hygiene", "status": "pass"}, {"id": "smoke-1", "status": "pass", "message": "2"}],
             "failed": [], "passed": True, "scope": "code-layer"}  # fmt: skip
    report = selftest_reuse.merge(fresh, reuse)
    by_id = {c["id"]: c for c in report["checks"]}
    assert [c["id"] for c in report["checks"]] == FULL[:-1]  # the earlier report's order
    assert by_id["smoke-1"] == {"id": "smoke-1", "status": "pass", "message": "2"}  # run again, not reused
    assert by_id["torch-compile"]["reused"] == {"record": "reg/acme:one", "digest": earlier["digest"],
                                                "layers": list(BELOW)}  # fmt: skip
    assert report["reused"]["checks"] == ["dists-match-lock", "pip-check", "torch-compile", "tiny-model",
                                          "gpu-cuda-available"]  # fmt: skip
    assert report["passed"] is True and report["failed"] == []


def test_a_failing_code_layer_check_fails_the_merged_report():
    reuse, _ = selftest_reuse.find(_key(), _images(_release("one", _key(CODE_1))), CELL)
    assert reuse is not None
    fresh = {"checks": [{"id": "smoke-1", "status": "fail"}], "failed": ["smoke-1"], "passed": False}
    report = selftest_reuse.merge(fresh, reuse)
    assert report["passed"] is False and report["failed"] == ["smoke-1"]


@pytest.mark.parametrize(
    ("earlier", "says"),
    [
        (_release("one", _key(CODE_1), passed=False), "did not pass"),
        (_release("one", _key(CODE_1, below=(*BELOW[:3], "sha256:" + "f" * 64))), "below the code layer differs"),
        (_release("one", _key(CODE_1, below=BELOW[:3])), "below the code layer differs"),  # a layer fewer
        (_release("one", _key(CODE_1, gpu=True)), "it ran on a GPU, this runs without a GPU"),
        (_release("one", _key(CODE_1, config="sha256:" + "0" * 64)), "runtime config"),
        (_release("one", _key(CODE_1), layers="sha256:x"), "names no layers"),  # a record of another shape
        (_release("one", _key(CODE_1), code_layer=False), "it has no code layer"),
    ],
)
def test_no_reuse_from_a_failed_run_other_layers_another_config_or_the_other_side_of_gpu_and_cpu(earlier, says):
    reuse, why = selftest_reuse.find(_key(CODE_2), _images(earlier), CELL)
    assert reuse is None and says in why, why


def test_a_cpu_run_is_not_reused_on_a_gpu_either():
    reuse, why = selftest_reuse.find(_key(gpu=True), _images(_release("one", _key(CODE_1))), CELL)
    assert reuse is None and "without a GPU, this runs on a GPU" in why


def test_an_image_without_a_code_layer_runs_everything_and_other_cells_or_platforms_are_never_asked():
    earlier = _release("one", _key(CODE_1))
    assert selftest_reuse.find(RunKey((*BELOW, CODE_2), False, CONFIG, False, False), _images(earlier), CELL)[0] is None
    assert selftest_reuse.find(_key(), _images(earlier), "cu121-torch2.1.2-py3.11-tf4.48.2")[0] is None
    assert selftest_reuse.find(_key(), _images(earlier), CELL, "linux/arm64")[0] is None


def test_the_newest_release_that_fits_is_taken_and_a_result_reused_before_keeps_its_first_record():
    old = _release("old", _key(CODE_1), when="2026-01-01T00:00:00Z")
    newer_other = _release("other", _key(CODE_1, below=(*BELOW[:3], "sha256:" + "9" * 64)), when="2026-03-01")
    mid = _release("mid", _key(CODE_1), when="2026-02-01T00:00:00Z")
    mid["selftest"]["checks"][2]["reused"] = {"record": "reg/acme:old", "digest": "sha256:" + "e" * 64,
                                              "layers": list(BELOW)}  # fmt: skip
    reuse, _ = selftest_reuse.find(_key(), _images(old, newer_other, mid), CELL)
    assert reuse is not None and reuse.record == "reg/acme:mid"
    merged = selftest_reuse.merge({"checks": [], "failed": [], "passed": True}, reuse)
    by_id = {c["id"]: c for c in merged["checks"]}
    assert by_id["torch-compile"]["reused"]["record"] == "reg/acme:old"
    assert by_id["tiny-model"]["reused"]["record"] == "reg/acme:mid"


def test_the_key_reads_the_engines_layers_and_only_the_config_the_checks_see():
    inspect = {"RootFS": {"Layers": [*BELOW, CODE_1]}, "Config": {"Env": ["A=1"], "Labels": {"rev": "1"}}}
    key = selftest_reuse.key_of(inspect, code_layer=True, gpu=False, emulated=False)
    relabelled = {**inspect, "Config": {"Env": ["A=1"], "Labels": {"rev": "2"}}}
    assert key == selftest_reuse.key_of(relabelled, code_layer=True, gpu=False, emulated=False)
    other_env = {**inspect, "Config": {"Env": ["A=2"]}}
    assert key.config != selftest_reuse.key_of(other_env, code_layer=True, gpu=False, emulated=False).config
    assert key.below_code == BELOW and key.to_json()["layers"] == [*BELOW, CODE_1]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        (["PATH=/opt/venv/bin:/usr/bin", "PYTHONPATH=/opt/app"], "PYTHONPATH"),
        (["LD_LIBRARY_PATH=/usr/lib:/opt/app/lib/"], "LD_LIBRARY_PATH"),
        (["PATH=/opt/venv/bin:/usr/bin", "WANDB_DIR=/opt/application"], None),  # another folder
    ],
)
def test_an_env_that_puts_the_code_layer_on_a_path_is_named(env, named):
    """The code's files could then shadow what lies below it: the build runs every check (selftest_runner)."""
    assert selftest_reuse.on_path({"Env": env}, "/opt/app") == named


def test_the_hosts_own_check_is_never_reused():
    """The host checks the image's config and labels on every build (image.config_truth): never taken from a record."""
    from imagekit.image import config_truth

    assert selftest_reuse.HOST_CHECKS == (config_truth.CHECK,)
