"""The built image says what it holds: its config against the runtime config imagekit set, its labels' claims
against the self-test's readings (imagekit/image/config_truth.py)."""

from __future__ import annotations

from imagekit.image import config_truth, imageconfig

LABELS = {
    "imagekit.cell": "cu121-torch2.1.2-py3.11-tf4.48.2",
    "imagekit.lock.hash": "ab" * 32,
    "imagekit.python": "3.11",
    "imagekit.torch.version": "2.1.2",
    "imagekit.torch.cuda": "12.1",
    "org.opencontainers.image.vendor": "imagekit",
}
RUNTIME = imageconfig.runtime(LABELS)


def _config(**over) -> dict:
    config = {
        "Labels": dict(LABELS),
        "Env": ["HOME=/root", *(f"{k}={v}" for k, v in imageconfig.ENV)],  # inherited keys may come first
        "WorkingDir": imageconfig.WORKDIR,
        "Entrypoint": list(imageconfig.ENTRYPOINT),
        "Cmd": None,
    }
    return {**config, **over}


def _report(torch="2.1.2", cuda="12.1", python="3.11.2", cell=LABELS["imagekit.cell"]) -> dict:
    evidence = {"torch": torch, "torch.version.cuda": cuda}
    return {"cell": cell, "lock_hash": LABELS["imagekit.lock.hash"], "python": python,
            "checks": [{"id": "torch-cuda-version", "status": "pass", "evidence": evidence}]}  # fmt: skip


def test_an_image_that_tells_the_truth_passes():
    result = config_truth.check(_config(), RUNTIME, _report())
    assert result["status"] == "pass" and result["id"] == "labels-match-contents", result


def test_a_label_changed_added_or_dropped_is_named():
    labels = {**LABELS, "imagekit.torch.version": "2.8.0", "extra": "x"}
    del labels["org.opencontainers.image.vendor"]
    found = config_truth.findings(_config(Labels=labels), RUNTIME, _report())
    assert "label imagekit.torch.version: the image says '2.8.0', imagekit set '2.1.2'" in found
    assert "label extra: the image says 'x', imagekit set None" in found
    assert "label org.opencontainers.image.vendor: the image says None, imagekit set 'imagekit'" in found


def test_env_workdir_entrypoint_and_cmd_must_be_what_was_set():
    env = [e for e in _config()["Env"] if not e.startswith("PIP_CONSTRAINT=")]
    found = config_truth.findings(
        _config(Env=env, WorkingDir="/", Entrypoint=["bash"], Cmd=["sleep", "1"]), RUNTIME, _report()
    )
    assert "ENV PIP_CONSTRAINT: the image says None, imagekit set '/opt/imagekit/constraints.txt'" in found
    assert "WORKDIR: the image says '/', imagekit set '/workspace'" in found
    assert any(f.startswith("ENTRYPOINT: the image says ['bash']") for f in found)
    assert "CMD: the image says ['sleep', '1'], imagekit set []" in found


def test_the_labels_claims_meet_what_the_self_test_found_inside():
    report = _report(torch="2.4.0", cuda="11.8", python="3.10.12", cell="another")
    found = config_truth.findings(_config(), RUNTIME, report)
    assert found == [
        "label imagekit.cell='cu121-torch2.1.2-py3.11-tf4.48.2', but the image's manifest names cell 'another'",
        "label imagekit.python='3.11', but its Python is '3.10'",
        "label imagekit.torch.version='2.1.2', but its torch is '2.4.0'",
        "label imagekit.torch.cuda='12.1', but its torch is built for CUDA '11.8'",
    ]
    result = config_truth.check(_config(), RUNTIME, report)
    assert result["status"] == "fail" and "nothing was published" in result["fix"]


def test_pypis_torch_names_its_cuda_build_in_its_version_and_that_is_no_lie():
    """torch 2.1.2 from PyPI says 2.1.2+cu121 in ``__version__``; its distribution (the lock, the label) says 2.1.2."""
    assert config_truth.findings(_config(), RUNTIME, _report(torch="2.1.2+cu121")) == []
    assert config_truth.findings(_config(), RUNTIME, _report(torch="2.1.1+cu121")) != []
    labels = {**LABELS, "imagekit.torch.version": "2.5.1+cu124"}
    runtime = imageconfig.runtime(labels)
    assert config_truth.findings(_config(Labels=labels), runtime, _report(torch="2.5.1+cu124")) == []
    assert config_truth.findings(_config(Labels=labels), runtime, _report(torch="2.5.1+cu118")) != []


def test_a_reading_the_self_test_could_not_make_is_not_a_lie():
    """A CPU-only or failed torch check gives no reading: the other checks say so; this one claims nothing."""
    report = {**_report(), "checks": []}
    assert config_truth.findings(_config(), RUNTIME, report) == []
