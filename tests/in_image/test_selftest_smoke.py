"""The self-test's `smoke-N` checks (in_image/selftest.py: `[image] smoke`, read from the image's manifest), run as
the image runs it: the whole self-test as a program on this host, with the stand-in torch and nvidia-smi of
test_selftest_gpu.py and a manifest of our own. Each command runs in a shell with the image's environment; its exit
code and the tail of its output are the evidence; one that fails, hangs or is never reached fails the self-test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imagekit.in_image import selftest
from tests.in_image.test_selftest_gpu import DOCTOR_DIR, _fake_world

pytestmark = pytest.mark.programs  # starts Python programs as processes


def _selftest(
    tmp: Path, smoke: dict | None, before_torch: str = "", compiler: bool = False, **env: str
) -> tuple[int, dict, float]:
    bindir, site = _fake_world(tmp, 0)
    if before_torch:  # code the stand-in torch runs first, in every process that imports it
        init = site / "torch" / "__init__.py"
        init.write_text(before_torch + init.read_text())
    manifest = tmp / "manifest.json"
    doc = {"cell": {"id": "cu124-torch2.5.1-tf4.48.2-py3.11"}, "lock": {"hash": "0" * 64}, "distributions": {},
           "torch": {"cuda": "12.4"}, "image": {"compiler": compiler}}  # fmt: skip
    if smoke is not None:
        doc["smoke"] = smoke
    manifest.write_text(json.dumps(doc))
    environ = {
        "PATH": f"{bindir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "PYTHONPATH": str(site),
        "HOME": str(tmp),
        "IMAGEKIT_MANIFEST": str(manifest),
        **env,
    }
    began = time.monotonic()
    res = subprocess.run([sys.executable, str(DOCTOR_DIR / "selftest.py")], capture_output=True, text=True,
                         env=environ, cwd=tmp, timeout=300)  # fmt: skip
    return res.returncode, json.loads(res.stdout), time.monotonic() - began


def _smoke(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["checks"] if c["id"].startswith("smoke-")}


def test_each_command_is_a_check_with_its_exit_code_and_output_and_a_failing_one_fails_the_self_test(tmp_path):
    commands = [
        "python -c 'import sys; print(sys.prefix)'; echo \"project=$WANDB_PROJECT\"",
        "for i in $(seq 1 2000); do echo line $i; done; echo 'Traceback: No module named trl' >&2; exit 3",
        "true",
    ]
    code, report, _ = _selftest(tmp_path, {"commands": commands, "timeout": 60}, WANDB_PROJECT="sft")
    smoke = _smoke(report)
    assert list(smoke) == ["smoke-1", "smoke-2", "smoke-3"]  # in order, last in the report
    assert [c["id"] for c in report["checks"]][-3:] == list(smoke)
    first, second, third = smoke.values()
    assert first["status"] == "pass" and first["evidence"]["exit"] == 0
    assert "project=sft" in first["evidence"]["output_tail"]  # the image's environment
    assert second["status"] == "fail" and second["evidence"]["exit"] == 3
    assert second["message"] == f"`{commands[1]}` exited 3: Traceback: No module named trl"
    tail = second["evidence"]["output_tail"]
    assert len(tail) <= 2000 and "line 2000" in tail and "line 1\n" not in tail  # the tail, bounded
    assert "fails in this image" in second["fix"]
    assert third["status"] == "pass"  # a failure does not stop the commands after it
    assert code == 1 and not report["passed"] and "smoke-2" in report["failed"] and "smoke-1" not in report["failed"]


def test_a_command_that_hangs_is_stopped_at_its_time_limit_with_what_it_started(tmp_path):
    marker = tmp_path / "child-survived"
    hang = f"(sleep 5; touch {marker}) & echo started; sleep 600"
    code, report, seconds = _selftest(tmp_path, {"commands": [hang, "true"], "timeout": 2, "budget": 60})
    hung, after = _smoke(report).values()
    assert hung["status"] == "fail" and hung["message"] == f"`{hang}` did not finish within 2 s"
    assert hung["evidence"]["exit"] is None and "started" in hung["evidence"]["output_tail"]
    assert after["status"] == "pass" and code == 1 and seconds < 300  # not the 600 s the command would take
    time.sleep(4)
    assert not marker.exists()  # its process group was killed, the background child too


def test_the_commands_share_one_budget_and_one_never_reached_fails():
    """In this process (the functions the program runs): the budget is the manifest's, and no smoke key, no check."""
    first, second = selftest.run_smoke({"smoke": {"commands": ["sleep 3", "true"], "timeout": 60, "budget": 2}})
    assert first["status"] == "fail" and "did not finish within 2 s" in first["message"]
    assert second["status"] == "fail" and "was not run: the smoke commands' time is spent" in second["message"]
    assert second["evidence"]["timeout"] <= 0
    assert selftest.run_smoke({}) == [] and selftest.run_smoke({"smoke": {"commands": []}}) == []


def test_a_smoke_commands_output_never_reaches_a_disk(tmp_path, monkeypatch):
    # Before: the output went to a temporary file, whole (in the image's writable layer: the host's disk under it),
    # and only its tail was read back; a command printing without end filled the disk until its time was up.
    def no_disk(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the smoke output was written to a file")

    monkeypatch.setattr(selftest.tempfile, "TemporaryFile", no_disk)
    result = selftest.check_smoke(1, "head -c 20000000 /dev/zero | tr '\\0' x; echo; echo the end", 60)
    assert result["status"] == "pass", result
    ev = result["evidence"]
    assert ev["output_bytes"] == 20_000_000 + len("\nthe end\n")
    assert ev["output_tail"].endswith("x\nthe end\n") and len(ev["output_tail"]) == selftest.SMOKE_TAIL


def test_the_commands_run_while_torch_compile_does_and_keep_their_place_in_the_report(tmp_path):
    """The smoke commands start once every check in the self-test's own process is done (what the image holds was
    read, the project imported, the GPU checked), and run while torch.compile's process still works: here that
    process (its `import torch`, a stand-in) waits for the first command to have started, which it never would if the
    commands ran after it. The report keeps its order: the project's commands last."""
    wait = (
        "import os, sys, time\n"
        "if '--only-torch-compile' in sys.argv:\n"
        "    flag = os.path.join(os.environ['HOME'], 'smoke-started')\n"
        "    deadline = time.time() + 300\n"  # a loaded machine's checks may take a minute before the commands
        "    while not os.path.exists(flag) and time.time() < deadline:\n"
        "        time.sleep(0.05)\n"
        "    open(os.path.join(os.environ['HOME'], 'seen'), 'w').write(str(os.path.exists(flag)))\n"
    )
    commands = ['touch "$HOME/smoke-started"; sleep 1', "true"]
    _, report, _ = _selftest(tmp_path, {"commands": commands, "timeout": 60}, before_torch=wait, compiler=True)
    assert (tmp_path / "seen").read_text() == "True"  # the command ran while torch.compile's process was under way
    ids = [c["id"] for c in report["checks"]]
    assert ids[-2:] == ["smoke-1", "smoke-2"] and ids.index("dists-match-lock") == 0
    assert ids.index("tiny-model") < ids.index("image-hygiene") < ids.index("torch-compile")
    assert _smoke(report)["smoke-1"]["status"] == "pass"
