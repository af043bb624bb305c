"""`selftest.py --code-layer` (in_image/selftest.py): the checks the code layer can change and nothing else, run as
the image runs it (a program, with a stand-in torch that records being imported): the host reuses the results of
the layers below it (oci/selftest_reuse.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.in_image.test_selftest_gpu import DOCTOR_DIR, _fake_world

pytestmark = pytest.mark.programs  # starts Python programs as processes


def _run(tmp: Path, *argv: str, project: bool) -> tuple[dict, bool]:
    bindir, site = _fake_world(tmp, 0)
    imported = tmp / "torch-imported"
    (site / "torch" / "__init__.py").write_text(f"open({str(imported)!r}, 'w').close()\n" + (
        site / "torch" / "__init__.py").read_text())  # fmt: skip
    doc = {"cell": {"id": "cu124-torch2.5.1-tf4.48.2-py3.11"}, "lock": {"hash": "0" * 64}, "distributions": {},
           "torch": {"cuda": "12.4"}, "image": {"compiler": True},
           "smoke": {"commands": ["echo smoke ran"], "timeout": 60}}  # fmt: skip
    if project:
        doc["project"] = {"name": "acme", "version": "1.0", "wheel": "acme-1.0-py3-none-any.whl", "source": "."}
    (tmp / "manifest.json").write_text(json.dumps(doc))
    env = {"PATH": f"{bindir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
           "PYTHONPATH": str(site), "HOME": str(tmp), "IMAGEKIT_MANIFEST": str(tmp / "manifest.json")}  # fmt: skip
    res = subprocess.run([sys.executable, str(DOCTOR_DIR / "selftest.py"), *argv], capture_output=True, text=True,
                         env=env, cwd=tmp, timeout=300)  # fmt: skip
    assert res.stdout, res.stderr
    return json.loads(res.stdout), imported.exists()


@pytest.mark.parametrize("project", [False, True], ids=["copy", "copy and install"])
def test_the_code_layer_run_is_hygiene_the_smoke_commands_and_with_install_the_venv(tmp_path, project):
    report, torch_imported = _run(tmp_path, "--code-layer", project=project)
    ids = [c["id"] for c in report["checks"]]
    venv = ["dists-match-lock", "pip-check", "project-imports"] if project else []
    assert ids == [*venv, "image-hygiene", "smoke-1"], ids
    assert report["scope"] == "code-layer" and not torch_imported  # torch, CUDA, the compiler: below the code layer
    smoke = report["checks"][-1]
    assert smoke["status"] == "pass" and "smoke ran" in smoke["evidence"]["output_tail"]


def test_without_the_flag_every_check_runs(tmp_path):
    """The stand-in torch is imported and the image's checks are there: the flag above is what narrows the run."""
    report, torch_imported = _run(tmp_path, project=False)
    ids = [c["id"] for c in report["checks"]]
    assert report["scope"] == "full" and torch_imported
    assert {"torch-cuda-version", "torch-compile", "tiny-model", "image-hygiene", "smoke-1"} <= set(ids), ids


@pytest.mark.parametrize("project", [False, True], ids=["copy", "copy and install"])
def test_the_code_layer_runs_plan_is_what_the_full_run_runs_and_skips(tmp_path, project):
    """The host reuses a recorded result only for a check the plan names, `pass` where the plan runs it, `skip` for
    the plan's reason: the plan must be the full run's own, check for check and reason for reason (issue 49)."""
    (tmp_path / "plan").mkdir()
    (tmp_path / "full").mkdir()
    planned, _ = _run(tmp_path / "plan", "--code-layer", project=project)
    full, _ = _run(tmp_path / "full", project=project)
    plan = {p["id"]: p["skip"] for p in planned["plan"]}
    ran = {c["id"]: c for c in full["checks"]}
    assert list(plan) == [c for c in ran if c in plan], (list(plan), list(ran))  # in the full run's order
    assert set(ran) - set(plan) <= {"gpu-arch", "gpu-matmul-float16", "gpu-matmul-bfloat16"}
    for cid, skip in plan.items():
        if skip is not None:
            assert (ran[cid]["status"], ran[cid]["message"]) == ("skip", skip), cid
        else:
            assert ran[cid]["status"] != "skip", (cid, ran[cid]["message"])


def test_the_code_layers_hygiene_reads_the_code_layers_folder_and_not_the_whole_image(tmp_path):
    """With --code-to (where the code layer lies), image-hygiene judges that folder alone: the layers below were
    judged by the run whose results are reused. What it holds is still judged whole: a .git folder there fails."""
    import shutil
    import tempfile

    # not under /tmp, which hygiene leaves to its leftovers rule
    code = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else Path.home())) / "workspace"
    request_cleanup = code.parent
    (code / "src").mkdir(parents=True)
    (code / "src" / "train.py").write_text("print('hi')\n")
    report, _ = _run(tmp_path, "--code-layer", f"--code-to={code}", project=False)
    hygiene = next(c for c in report["checks"] if c["id"] == "image-hygiene")
    ev = hygiene["evidence"]  # (this host's /tmp may hold leftovers: the status is not this test's)
    assert ev["only"] == [str(code)] and ev["files"] == 3  # the folder, src, train.py: nothing else was read
    assert (ev["git"], ev["credentials"], ev["owners"]) == ([], [], [])

    (code / ".git").mkdir()
    (code / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    report, _ = _run(tmp_path / "again", "--code-layer", f"--code-to={code}", project=False)
    hygiene = next(c for c in report["checks"] if c["id"] == "image-hygiene")
    shutil.rmtree(request_cleanup)
    assert hygiene["status"] == "fail" and hygiene["evidence"]["git"] == [f"{code}/.git"]
