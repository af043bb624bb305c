"""The doctor on real environments: virtual environments, PATHs, config files and mounts built by the tests.

GPU-side parsing is tested on texts quoted from NVIDIA and PyTorch (tests/fixtures/gpu); the GPU path itself
runs on real hardware when a GPU machine is lent (docs/).
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from imagekit.doctor import imagekit_doctor as doc
from tests.conftest import FIXTURES, ROOT
from tests.wheelfactory import build_wheel

DOCTOR = ROOT / "imagekit" / "doctor" / "imagekit_doctor.py"
GPU = FIXTURES / "gpu"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    for name, version in (("alpha", "1.0"), ("alpha", "2.0"), ("beta", "2.0"), ("gamma", "0.1")):
        build_wheel(out, name, version)
    return out


def make_venv(root: Path, wheels: Path, *pins: str) -> Path:
    from imagekit.effects.resolver import uv_binary

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    if pins:
        subprocess.run(
            [
                uv_binary(),
                "pip",
                "install",
                "--quiet",
                "--python",
                str(root / "bin" / "python"),
                "--no-index",
                "--find-links",
                str(wheels),
                *pins,
            ],
            check=True,
        )
    return root


def run_doctor(venv: Path, tmp: Path, *args: str, path_dirs: list[Path] | None = None, env: dict | None = None):
    path = os.pathsep.join(str(p) for p in (path_dirs or [venv / "bin"]))
    full_env = {"PATH": path, "HOME": str(tmp / "home"), "HF_HOME": str(tmp / "hf"), **(env or {})}
    res = subprocess.run(
        [str(venv / "bin" / "python"), str(DOCTOR), "--tier", "quick", "--json", *args],
        capture_output=True,
        text=True,
        env=full_env,
    )
    return res.returncode, json.loads(res.stdout), res


def by_id(report: dict) -> dict:
    return {c["id"]: c for c in report["checks"]}


@pytest.fixture
def lock(tmp_path) -> Path:
    path = tmp_path / "lock.txt"
    path.write_text(
        "# --- layer: torch ---\nalpha==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n# --- layer: app ---\n"
        "beta==2.0 \\\n    --hash=sha256:" + "1" * 64 + "\n"
    )
    return path


def test_identical_environment_exits_0(tmp_path, wheels, lock):
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0", "beta==2.0")
    code, report, res = run_doctor(venv, tmp_path, "--expect", str(lock))
    checks = by_id(report)
    assert code == 0, res.stdout
    assert checks["lock-drift"]["status"] == "pass" and checks["interpreter-identity"]["status"] == "pass"


def test_different_version_is_a_blocker_naming_it(tmp_path, wheels, lock):
    venv = make_venv(tmp_path / "v", wheels, "alpha==2.0", "beta==2.0")
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(lock))
    drift = by_id(report)["lock-drift"]
    assert code == 1 and drift["status"] == "fail"
    assert "alpha 2.0 (pinned 1.0)" in drift["message"]
    assert drift["evidence"]["different"] == {"alpha": {"installed": "2.0", "pinned": "1.0"}}


def test_extra_package_is_reported_and_strict_fails(tmp_path, wheels, lock):
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0", "beta==2.0", "gamma==0.1")
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(lock))
    drift = by_id(report)["lock-drift"]
    assert code == 0 and drift["status"] == "warn" and "gamma 0.1" in drift["message"]
    code, _, _ = run_doctor(venv, tmp_path, "--expect", str(lock), "--strict")
    assert code == 1


def test_torch_family_drift_says_so(tmp_path, wheels):
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"distributions": {"alpha": "1.0", "torch": "2.5.1+cu118"}}))
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(manifest))
    assert code == 1 and by_id(report)["lock-drift"]["message"].startswith("torch-family drift")


def test_python_and_python3_from_different_interpreters(tmp_path, wheels, lock):
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0", "beta==2.0")
    other = make_venv(tmp_path / "other", wheels)
    mixed = tmp_path / "mixed-bin"
    mixed.mkdir()
    for name, target in (("python", venv / "bin" / "python"), ("python3", other / "bin" / "python3")):
        (mixed / name).write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        (mixed / name).chmod(0o755)
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(lock), path_dirs=[mixed])
    ident = by_id(report)["interpreter-identity"]
    assert code == 1 and ident["status"] == "fail"
    assert ident["message"].startswith("`python3`") and str(other) in ident["message"]
    assert ident["evidence"]["python"]["prefix"] == str(venv)


def test_user_site_shadowing_a_pinned_package_is_a_blocker(tmp_path, wheels, lock):
    """`pip install --user` on a pod's system Python: ~/.local comes before site-packages and shadows the pin."""
    system_python = Path(sys.base_prefix) / "bin" / "python3"
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0", "beta==2.0")
    home = tmp_path / "home"
    user_site = subprocess.run(
        [str(system_python), "-c", "import site; print(site.getusersitepackages())"],
        capture_output=True,
        text=True,
        env={"HOME": str(home)},
    ).stdout.strip()
    from imagekit.effects.resolver import uv_binary

    subprocess.run(
        [
            uv_binary(),
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            user_site,
            "--no-index",
            "--find-links",
            str(wheels),
            "alpha==2.0",
        ],
        check=True,
    )
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(lock), "--python", str(system_python))
    shadow = by_id(report)["shadowing"]
    assert code == 1 and shadow["status"] == "fail" and "alpha 2.0" in shadow["message"]
    assert user_site in shadow["message"]


def test_accelerate_config_more_processes_than_gpus(tmp_path, wheels, lock):
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0", "beta==2.0")
    cfg = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 1\n"
        "num_processes: 2\nuse_cpu: false\n"
    )
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(lock))
    acc = by_id(report)["accelerate-config"]
    assert code == 1 and acc["status"] == "fail" and "num_processes: 2" in acc["message"]
    assert acc["evidence"]["path"] == str(cfg)


@pytest.mark.parametrize(
    ("text", "gpus", "status"),
    [
        ("num_processes: 8\nnum_machines: 1\n", 8, "pass"),
        ("num_processes: 2\nnum_machines: 1\n", 8, "warn"),
        ("num_processes: 4\nnum_machines: 1\n", 2, "fail"),
        ("use_cpu: true\nnum_processes: 1\n", 1, "warn"),
        ('{"num_processes": 3, "num_machines": 1}', 2, "fail"),
    ],
)
def test_accelerate_rules(tmp_path, text, gpus, status):
    path = tmp_path / "cfg"
    path.write_text(text)
    assert doc.check_accelerate(str(path), gpus)["status"] == status


def test_hf_home_on_tmpfs_warns_and_on_a_disk_passes(tmp_path, wheels, lock):
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0", "beta==2.0")
    _, report, _ = run_doctor(venv, tmp_path, "--expect", str(lock), env={"HF_HOME": "/dev/shm/imagekit-test-hf"})
    check = by_id(report)["persistent-hf-home"]
    assert check["status"] == "warn" and check["evidence"]["fstype"] == "tmpfs"
    _, report, _ = run_doctor(venv, tmp_path, "--expect", str(lock))
    check = by_id(report)["persistent-hf-home"]
    assert check["evidence"]["fstype"] not in doc.EPHEMERAL_FS and check["status"] == "pass"


def test_mountinfo_parsing_on_a_real_table():
    text = Path("/proc/self/mountinfo").read_text()
    mounts = doc.parse_mountinfo(text)
    assert any(point == "/" for point, _, _ in mounts)
    assert doc.mount_of("/dev/shm", mounts)[1] == "tmpfs"


@pytest.mark.parametrize(
    "cause", ["driver-too-old", "forward-compat-804", "driver-combination-803", "no-driver", "no-kernel-image"]
)
def test_cuda_failure_classification_on_real_texts(cause):
    text = json.loads((GPU / "torch-warnings.json").read_text())[cause]
    assert doc.classify_cuda_failure(text, "12.8")[0] == cause
    assert doc.classify_cuda_failure(text, None)[0] == "cpu-only-wheel"


@pytest.mark.parametrize(
    ("fixture", "needle"),
    [
        ("nvidia-smi-mismatch.txt", "kernel module and user libraries"),
        ("nvidia-smi-no-driver.txt", "cannot talk to the driver"),
    ],
)
def test_nvidia_smi_failures(fixture, needle):
    what, fix = doc.classify_smi_failure((GPU / fixture).read_text())
    assert needle in what and fix


def _manifest(archs, ptx=None, minimum="525.60.13"):
    return {
        "distributions": {},
        "driver": {"minimum": minimum},
        "torch": {"archs": archs, "ptx": ptx, "variant": "cu124"},
    }


def test_gpu_checks_from_nvidia_smi_query():
    gpus = doc.parse_smi_query((GPU / "nvidia-smi-query-h100x2.csv").read_text())
    assert [g["compute_cap"] for g in gpus] == ["9.0", "9.0"]
    ok = doc.check_gpus((gpus, None, True), _manifest(["sm_80", "sm_86", "sm_90"]), False)
    assert {c["id"]: c["status"] for c in ok} == {"nvidia-driver": "pass", "driver-floor": "pass", "gpu-arch": "pass"}
    blackwell = doc.parse_smi_query((GPU / "nvidia-smi-query-rtx5090.csv").read_text())
    bad = doc.check_gpus((blackwell, None, True), _manifest(["sm_80", "sm_90"], minimum="580.65.06"), False)
    status = {c["id"]: c["status"] for c in bad}
    assert status["gpu-arch"] == "fail" and status["driver-floor"] == "fail"
    ptx = doc.check_gpus((blackwell, None, True), _manifest(["sm_90", "sm_100"], ptx="sm_100"), False)
    assert next(c for c in ptx if c["id"] == "gpu-arch")["status"] == "pass"


def test_no_gpu_is_a_skip_unless_required():
    assert doc.check_gpus(([], None, False), None, False)[0]["status"] == "skip"
    assert doc.check_gpus(([], None, False), None, True)[0]["status"] == "fail"
    mismatch = (GPU / "nvidia-smi-mismatch.txt").read_text()
    assert doc.check_gpus(([], mismatch, True), None, False)[0]["status"] == "fail"


def test_provider_detection():
    assert doc.detect_provider({"RUNPOD_POD_ID": "abc"})[0] == "runpod"
    assert doc.detect_provider({"VAST_CONTAINERLABEL": "C.1"})[0] == "vast"
    assert doc.detect_provider({})[0] is None


class _Hub(http.server.BaseHTTPRequestHandler):
    """Answers like the Hub's resolve endpoint: public 200, gated 403 with a token, 401 without, unknown 404."""

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        token = self.headers.get("Authorization", "")
        if self.path.startswith("/org/public/"):
            code = 200
        elif self.path.startswith("/org/gated/"):
            code = 401 if not token else (200 if token == "Bearer accepted" else 403)
        elif self.path.startswith("/org/private/"):
            code = 401 if token in ("", "Bearer revoked") else 200
        else:
            code = 404
        self.send_response(code)
        self.end_headers()


@pytest.fixture
def hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize(
    ("repo", "token", "status", "needle"),
    [
        ("org/public", None, "pass", "readable"),
        ("org/gated", None, "fail", "no token was sent"),
        ("org/gated", "not-accepted", "fail", "licence is not accepted"),
        ("org/gated", "accepted", "pass", "readable"),
        ("org/private", "revoked", "fail", "rejected"),
        ("org/missing", "x", "fail", "404"),
    ],
)
def test_deep_hf_access(hub, repo, token, status, needle):
    result = doc.check_hf_repo(repo, hub, token)
    assert result["status"] == status and needle in result["message"]


def test_deep_tier_end_to_end(tmp_path, wheels, lock, hub):
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0", "beta==2.0")
    code, report, _ = run_doctor(
        venv,
        tmp_path,
        "--expect",
        str(lock),
        "--tier",
        "deep",
        "--hf-repo",
        "org/gated",
        env={"HF_ENDPOINT": hub, "HF_TOKEN": "not-accepted"},
    )
    assert code == 1 and by_id(report)["hf-access:org/gated"]["status"] == "fail"
    assert by_id(report)["torch-probe"]["status"] == "fail"  # this venv has no torch: the probe says so


def test_unreadable_expectation_is_exit_3(tmp_path, wheels):
    venv = make_venv(tmp_path / "v", wheels)
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(tmp_path / "nope.json"))
    assert code == 3 and by_id(report)["manifest"]["status"] == "error"


def test_cli_doctor_passes_through(app, runner, tmp_path, lock):
    res = runner.invoke(app, ["doctor", "--tier", "quick", "--expect", str(lock), "--json"])
    report = json.loads(res.stdout)
    assert res.exit_code == report["exit_code"] and by_id(report)["lock-drift"]["status"] == "fail"


def test_container_overlay_rootfs_is_ephemeral():
    mountinfo = "1 0 0:1 / / rw - fuse.fuse-overlayfs fuse-overlayfs rw\n2 1 0:2 / /workspace rw - ext4 /dev/vda rw\n"
    checks = doc.check_paths(
        [("hf-home", "/root/.cache/huggingface"), ("workspace", "/workspace/out")],
        mountinfo,
        "on RunPod, only the volume at /workspace survives",
    )
    assert [c["status"] for c in checks] == ["warn", "pass"]
    assert "RunPod" in checks[0]["fix"]
