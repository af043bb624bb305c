"""The self-test's `torch-companions` check (in_image/selftest.py): each of torch's companion libraries the lock holds,
and what torch imports undeclared, imported beside the image's torch in a process of its own; run as the image runs
it, the whole self-test as a program, with the stand-in torch of test_selftest_gpu.py and companions of our own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.in_image.test_selftest_gpu import DOCTOR_DIR, _fake_world

pytestmark = pytest.mark.programs  # starts Python programs as processes

GOOD = "VERSION = '2.7.1'\n"
# what torchaudio 2.11.0 (a CUDA 13 build) does beside torch 2.7.1+cu126
MISSING_LIB = "raise OSError('libcudart.so.13: cannot open shared object file: No such file or directory')\n"
ABORTS = "import os\nos.abort()\n"  # torchao's .so files built for another torch: 'Aborted (core dumped)'


def _companions(tmp: Path, modules: dict[str, str], held: list[dict] | None) -> tuple[int, dict]:
    bindir, site = _fake_world(tmp, 0)
    for name, body in modules.items():
        (site / f"{name}.py").write_text(body)
    manifest = tmp / "manifest.json"
    doc = {"cell": {"id": "cu126-torch2.7.1-py3.11-tf4.48.2"}, "lock": {"hash": "0" * 64}, "distributions": {},
           "torch": {"cuda": "12.6"}, "image": {"compiler": False}}  # fmt: skip
    if held is not None:
        doc["companions"] = held
    manifest.write_text(json.dumps(doc))
    env = {
        "PATH": f"{bindir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "PYTHONPATH": str(site),
        "HOME": str(tmp),
        "IMAGEKIT_MANIFEST": str(manifest),
    }
    res = subprocess.run([sys.executable, str(DOCTOR_DIR / "selftest.py")], capture_output=True, text=True, env=env,
                         cwd=tmp, timeout=300)  # fmt: skip
    report = json.loads(res.stdout)
    return res.returncode, {c["id"]: c for c in report["checks"]}


def _held(name: str, module: str, version: str = "2.7.1", requires: str = "==2.7.1") -> dict:
    return {"name": name, "version": version, "requires": requires, "why": f"torch 2.7.1 goes with {name} {version}",
            "source": f"PYPI ({name} {version} METADATA)", "import": [module]}  # fmt: skip


def test_every_companion_the_lock_holds_imports_and_the_check_passes(tmp_path):
    held = [_held("torchaudio", "fake_torchaudio"), _held("setuptools", "fake_pkg_resources", "81.0.0", "<82")]
    _, checks = _companions(tmp_path, {"fake_torchaudio": GOOD, "fake_pkg_resources": GOOD}, held)
    check = checks["torch-companions"]
    assert check["status"] == "pass", check
    assert "torchaudio 2.7.1, setuptools 81.0.0 import beside torch" in check["message"]
    assert check["evidence"]["modules"] == ["fake_torchaudio", "fake_pkg_resources"]


def test_a_companion_built_for_another_torch_fails_the_check_naming_it_and_the_table(tmp_path):
    held = [_held("triton", "fake_triton", "2.1.0", "==2.1.0"),
            _held("torchaudio", "fake_torchaudio", "2.11.0", "==2.7.1")]  # fmt: skip
    code, checks = _companions(tmp_path, {"fake_triton": GOOD, "fake_torchaudio": MISSING_LIB}, held)
    check = checks["torch-companions"]
    assert code == 1 and check["status"] == "fail"
    assert check["message"].startswith("import fake_torchaudio (torchaudio 2.11.0) beside torch")
    assert "libcudart.so.13: cannot open shared object file" in check["message"]
    assert "torchaudio==2.7.1" in check["message"] and "PYPI (torchaudio 2.11.0 METADATA)" in check["message"]
    assert "re-lock" in check["fix"]


def test_a_companion_that_aborts_the_process_fails_the_check_and_not_the_self_test(tmp_path):
    held = [_held("torchao", "fake_torchao", "0.16.0", "<0.13.0")]
    code, checks = _companions(tmp_path, {"fake_torchao": ABORTS}, held)
    check = checks["torch-companions"]
    assert code == 1 and check["status"] == "fail"
    assert "import fake_torchao (torchao 0.16.0)" in check["message"] and "exit -6" in check["message"]
    assert "tiny-model" in checks  # the other checks ran and reported


def test_an_image_without_companions_has_no_such_check(tmp_path):
    _, checks = _companions(tmp_path, {}, None)
    assert "torch-companions" not in checks
