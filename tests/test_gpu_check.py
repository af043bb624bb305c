"""tools/gpu-check, the one script that runs imagekit's GPU half on a lent GPU machine, kept runnable here: on this
GPU-less machine it checks that every program, function and doctor flag it calls exists, and writes every report
with the GPU steps as `skip`, never `pass`. A tree where a program it calls moved fails its `paths` step."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.programs  # starts Python programs as processes

SCRIPT = ROOT / "tools" / "gpu-check"
REPORTS = {"report.json", "report.txt", "nvidia-smi.txt", "outputs.txt"}


def _run(script: Path, out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    res = subprocess.run([sys.executable, str(script), "--out", str(out), *args], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    return res, json.loads((out / "report.json").read_text())


def test_on_a_machine_without_a_gpu_every_path_is_checked_and_every_gpu_step_is_a_skip(tmp_path):
    for args in ((), ("--no-gpu",)):
        out = tmp_path / ("auto" if not args else "forced")
        res, report = _run(SCRIPT, out, *args)
        assert res.returncode == 0, res.stdout + res.stderr
        assert {p.name for p in out.iterdir()} == REPORTS and len(REPORTS) <= 8
        by_id = {s["id"]: s for s in report["steps"]}
        assert by_id["paths"]["status"] == "pass", by_id["paths"]
        gpu = [s for s in report["steps"] if s["id"] != "paths"]
        assert [s["id"] for s in gpu] == ["nvidia-smi", "gpu-checks", "doctor-standard", "doctor-start",
                                          "doctor-hidden", "torch-compile", "guard-sampling"]  # fmt: skip
        assert all(s["status"] == "skip" for s in gpu), gpu  # never a pass without a GPU
        assert report["gpu"]["present"] is False and report["result"] == "skipped: no GPU"
        assert "[skip] guard-sampling" in (out / "report.txt").read_text()


def test_a_tree_where_a_program_it_calls_moved_fails_its_paths_step(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "imagekit" / "in_image", tree / "imagekit" / "in_image",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    (tree / "tools").mkdir()
    shutil.copy(SCRIPT, tree / "tools" / "gpu-check")
    (tree / "imagekit" / "in_image" / "gpu_checks.py").rename(tree / "imagekit" / "gpu_checks.py")
    doctor = tree / "imagekit" / "in_image" / "imagekit_doctor.py"
    doctor.write_text(doctor.read_text().replace('"--tier"', '"--level"'))
    res, report = _run(tree / "tools" / "gpu-check", tmp_path / "out")
    assert res.returncode == 1
    paths = report["steps"][0]
    assert paths["status"] == "fail" and "imagekit/in_image/gpu_checks.py" in paths["summary"]
    assert "imagekit_doctor --tier" in paths["summary"]
