"""A build's self-test (services/builds/selftest_runner.for_build) against a recording engine: the image is asked for
its
code layer's checks alone (`--code-layer`) only when a passing release of the cell offers results for its layers;
`--full-self-test` and an ENV that puts the code on a path run every check."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from imagekit.model import Cell
from imagekit.oci import selftest_reuse
from imagekit.services.builds import selftest_runner
from imagekit.services.publishing import release_index
from tests.fakes import RecordingEngine

CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11")
LAYERS = [f"sha256:{c * 64}" for c in "abc"]
IMAGE = "reg/acme:x"


@dataclass
class ArgvEngine(RecordingEngine):
    argv: list[list[str]] = field(default_factory=list)

    def run(self, image, argv, **kw):  # type: ignore[override]
        self.argv.append(list(argv))
        code, out, err = super().run(image, argv, **kw)
        if "--code-layer" in argv:  # what the full run would run here: the image's plan
            report = json.loads(out)
            report["plan"] = [{"id": i, "skip": None} for i in ("dists-match-lock", "torch-compile", "tiny-model")]
            out = json.dumps(report)
        return code, out, err


def _engine(env: list[str]) -> ArgvEngine:
    engine = ArgvEngine()
    engine.images[IMAGE] = {"RootFS": {"Layers": [*LAYERS, "sha256:" + "2" * 64]}, "Config": {"Env": env}}
    return engine


def _released(env: list[str]) -> dict:
    key = selftest_reuse.key_of(
        {"RootFS": {"Layers": [*LAYERS, "sha256:" + "1" * 64]}, "Config": {"Env": env}},
        code_layer=True, gpu=False, emulated=False,
    )  # fmt: skip
    checks = [{"id": i, "status": "pass"} for i in ("torch-compile", "tiny-model", "dists-match-lock")]
    report = {"checks": checks, "failed": [], "passed": True, "ran": {"gpu": False, "emulated": False, **key.to_json()}}
    entry = {"tag": "reg/acme:one", "digest": "sha256:" + "e" * 64, "manifest": {"cell": {"id": CELL.id}},
             "selftest": report}  # fmt: skip
    release_index.vouch(entry, "published on this machine")  # as publish notes it
    return {entry["tag"]: entry}


@pytest.mark.parametrize(
    ("env", "full", "says"),
    [
        (["PATH=/opt/venv/bin:/usr/bin"], False, None),
        (["PATH=/opt/venv/bin:/usr/bin"], True, "every check (--full-self-test)"),
        (["PATH=/opt/venv/bin:/usr/bin", "PYTHONPATH=/opt/app"], False, "ENV PYTHONPATH names the code layer's"),
    ],
)
def test_the_code_layer_alone_only_over_a_released_runs_layers(env, full, says):
    engine, said = _engine(env), []
    result = selftest_runner.for_build(
        engine, IMAGE, CELL, _released(env), gpus="auto", emulated=False, code_to="/opt/app", full=full,
        say=said.append, require_gpu=False,
    )  # fmt: skip
    (argv,) = engine.argv
    if says is None:
        assert argv[1:] == ["--code-layer", "--code-to=/opt/app"] and "reg/acme:one's" in said[0], said
        assert result.report["reused"]["checks"] == ["torch-compile", "tiny-model"]  # dists-match-lock: run now
        assert result.report["ran"]["layers"][:-1] == LAYERS
    else:
        assert "--code-layer" not in argv and says in said[0], said
        assert "reused" not in result.report
    assert result.passed
