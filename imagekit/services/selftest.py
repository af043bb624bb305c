"""Run the self-test inside a built image and read its JSON report."""

from __future__ import annotations

import json
from dataclasses import dataclass

from imagekit.effects.docker import Engine
from imagekit.errors import CheckFailed


@dataclass(frozen=True)
class SelfTestReport:
    image: str
    passed: bool
    report: dict

    @property
    def failed(self) -> list[str]:
        return list(self.report.get("failed", []))


def run(engine: Engine, image: str, *, gpus: bool, require_gpu: bool) -> SelfTestReport:
    argv = ["/opt/imagekit/doctor/selftest.py"] + (["--require-gpu"] if require_gpu else [])
    code, out, err = engine.run(image, argv, entrypoint=["/opt/venv/bin/python"], gpus=gpus)
    try:
        report = json.loads(out)
    except json.JSONDecodeError:
        raise CheckFailed(
            f"the self-test in {image} crashed (exit {code}):\n{(err or out)[-2000:]}",
            "the image cannot run its own checks; see the output above",
        ) from None
    return SelfTestReport(image, code == 0 and bool(report.get("passed")), report)
