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
from pathlib import Path

import pytest

from imagekit.in_image import imagekit_doctor as doc
from tests import loopback
from tests.conftest import FIXTURES, ROOT
from tests.wheelfactory import build_wheel

DOCTOR = ROOT / "imagekit" / "in_image" / "imagekit_doctor.py"
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


@pytest.mark.programs
def test_identical_environment_exits_0(tmp_path, wheels, lock):
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0", "beta==2.0")
    code, report, res = run_doctor(venv, tmp_path, "--expect", str(lock))
    checks = by_id(report)
    assert code == 0, res.stdout
    assert checks["lock-drift"]["status"] == "pass" and checks["interpreter-identity"]["status"] == "pass"


@pytest.mark.programs
def test_different_version_is_a_blocker_naming_it(tmp_path, wheels, lock):
    venv = make_venv(tmp_path / "v", wheels, "alpha==2.0", "beta==2.0")
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(lock))
    drift = by_id(report)["lock-drift"]
    assert code == 1 and drift["status"] == "fail"
    assert "alpha 2.0 (pinned 1.0)" in drift["message"]
    assert drift["evidence"]["different"] == {"alpha": {"installed": "2.0", "pinned": "1.0"}}


@pytest.mark.programs
def test_extra_package_is_reported_and_strict_fails(tmp_path, wheels, lock):
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0", "beta==2.0", "gamma==0.1")
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(lock))
    drift = by_id(report)["lock-drift"]
    assert code == 0 and drift["status"] == "warn" and "gamma 0.1" in drift["message"]
    code, _, _ = run_doctor(venv, tmp_path, "--expect", str(lock), "--strict")
    assert code == 1


@pytest.mark.programs
def test_torch_family_drift_says_so(tmp_path, wheels):
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"distributions": {"alpha": "1.0", "torch": "2.5.1+cu118"}}))
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(manifest))
    assert code == 1 and by_id(report)["lock-drift"]["message"].startswith("torch-family drift")


@pytest.mark.programs
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


@pytest.mark.programs
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


@pytest.mark.programs
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


@pytest.mark.programs
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


def test_the_runtime_contract_wins_over_the_older_sections():
    """A manifest's `runtime` is what the image says a host needs; the older sections count only without it."""
    h100 = doc.parse_smi_query((GPU / "nvidia-smi-query-h100x2.csv").read_text())
    manifest = _manifest(["sm_80", "sm_90"]) | {
        "runtime": {"driver_min": "999.1", "cuda": "12.4", "sass": ["sm_80"], "ptx": None, "platform": "linux/amd64"}
    }
    status = {c["id"]: c for c in doc.check_gpus((h100, None, True), manifest, False)}
    assert status["driver-floor"]["status"] == "fail" and "below 999.1" in status["driver-floor"]["message"]
    assert status["gpu-arch"]["status"] == "fail" and "kernels for sm_80" in status["gpu-arch"]["message"]


@pytest.mark.parametrize(
    ("machine", "glibc", "status", "says"),
    [
        ("x86_64", "2.36", "pass", "amd64 host, glibc 2.36"),
        ("aarch64", "2.36", "fail", "this host is aarch64 (arm64) but the image is built for linux/amd64"),
        ("x86_64", "2.27", "fail", "glibc 2.27 is older than 2.28"),
        ("riscv64", None, "fail", "this host is riscv64 (riscv64)"),
    ],
)
def test_a_host_outside_the_contract_is_a_blocker_naming_why(machine, glibc, status, says):
    manifest = {"runtime": {"platform": "linux/amd64", "glibc_min": "2.28", "driver_min": "525.60.13"}}
    (check,) = doc.check_host_contract(manifest, machine=machine, glibc=glibc)
    assert check["status"] == status and says in check["message"], check
    assert doc.check_host_contract({}, machine="aarch64")[0]["status"] == "skip"  # an older manifest says nothing


def test_no_gpu_is_a_skip_unless_required():
    assert doc.check_gpus(([], None, False), None, False)[0]["status"] == "skip"
    assert doc.check_gpus(([], None, False), None, True)[0]["status"] == "fail"
    mismatch = (GPU / "nvidia-smi-mismatch.txt").read_text()
    assert doc.check_gpus(([], mismatch, True), None, False)[0]["status"] == "fail"


def test_provider_detection():
    assert doc.detect_provider({"RUNPOD_POD_ID": "abc"})[0] == "runpod"
    assert doc.detect_provider({"VAST_CONTAINERLABEL": "C.1"})[0] == "vast"
    assert doc.detect_provider({})[0] is None


# The Hub's answers, as huggingface_hub users meet them: repo info from /api/{models,datasets}/ID (public for gated
# repos, 401 for private ones without access), files from /ID/resolve/main/FILE (LFS files redirect to a CDN), and
# a gated file refused with 401 (no token) or 403 with the reason in X-Error-Message.
LICENCE_403 = (
    "Access to model org/gated is restricted and you are not in the authorized list. "
    "Visit https://huggingface.co/org/gated to ask for access."
)
FINE_GRAINED_403 = (
    "Access to model org/gated is restricted. Please enable access to public gated repositories in your "
    "fine-grained token settings to view this repository."
)
TOKENS = {"Bearer accepted": "ok", "Bearer not-accepted": "licence", "Bearer fine-grained": "scope"}
REPOS = {
    "models/org/public": {"gated": False, "siblings": ["config.json", "model.safetensors"]},
    "models/org/adapter": {"gated": False, "siblings": ["adapter_config.json", "adapter_model.safetensors"]},
    "models/org/gguf": {"gated": "manual", "siblings": ["model-q4.gguf"]},
    "models/org/gated": {"gated": "manual", "siblings": [".gitattributes", "config.json"]},
    "models/org/private": {"gated": False, "private": True, "siblings": ["config.json"]},
    "datasets/org/data": {"gated": False, "siblings": ["train.parquet"]},
}


class _Hub(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        token = self.headers.get("Authorization", "")
        self.server.seen.append((self.path, token))
        if self.path.startswith("/api/"):
            kind, _, repo = self.path[len("/api/") :].partition("/")
            info = REPOS.get(f"{kind}/{repo}")
            if info is None or (info.get("private") and token != "Bearer accepted"):
                return self._send(401 if info or not token else 404, b'{"error": "Repository not found"}')
            doc = {**info, "siblings": [{"rfilename": f} for f in info["siblings"]]}
            return self._send(200, json.dumps(doc).encode(), [("Content-Type", "application/json")])
        path = self.path.lstrip("/")
        repo_key = (
            "models/" + path.split("/resolve/")[0] if not path.startswith("datasets/") else path.split("/resolve/")[0]
        )
        info = REPOS.get(repo_key)
        if info is None:
            return self._send(404)
        if info.get("gated"):
            who = TOKENS.get(token)
            if not token:
                return self._send(401, b"", [("X-Error-Code", "GatedRepo"), ("X-Error-Message", "Access restricted")])
            if who == "licence":
                return self._send(403, b"", [("X-Error-Code", "GatedRepo"), ("X-Error-Message", LICENCE_403)])
            if who == "scope":
                return self._send(403, b"", [("X-Error-Code", "GatedRepo"), ("X-Error-Message", FINE_GRAINED_403)])
        if path.endswith((".safetensors", ".gguf")):  # LFS: a redirect to another origin, never followed
            return self._send(302, b"", [("Location", "http://127.0.0.2:9/cdn")])
        return self._send(206, b"{")


@pytest.fixture
def hub_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    server.seen = []
    loopback.start(server)
    yield server
    loopback.stop(server)


@pytest.fixture
def hub(hub_server):
    return f"http://127.0.0.1:{hub_server.server_address[1]}"


@pytest.mark.parametrize(
    ("repo", "token", "status", "needle"),
    [
        ("org/public", None, "pass", "readable"),
        ("org/adapter", None, "pass", "readable"),  # no config.json: still a repo
        ("datasets/org/data", None, "pass", "readable"),
        ("org/gated", None, "fail", "no token was sent"),
        ("org/gated", "not-accepted", "fail", "licence is not accepted"),
        ("org/gated", "fine-grained", "fail", "fine-grained and lacks access to public gated repos"),
        ("org/gated", "accepted", "pass", "this token has access"),
        ("org/gguf", "accepted", "pass", "this token has access"),  # a redirect means access; never followed
        ("org/private", "revoked", "fail", "rejected"),
        ("org/private", "accepted", "pass", "private"),
        ("org/missing", "x", "fail", "404"),
    ],
)
def test_deep_hf_access(hub, hub_server, repo, token, status, needle):
    result = doc.check_hf_repo(repo, hub, token)
    assert result["status"] == status and needle in result["message"], result
    assert all(path.startswith(("/api/", f"/{repo}", "/org/")) for path, _ in hub_server.seen)


def test_hf_403_causes_from_the_hubs_messages():
    assert doc.classify_hf_403(LICENCE_403)[0] == "licence"
    assert doc.classify_hf_403(FINE_GRAINED_403)[0] == "token-scope"
    assert doc.classify_hf_403("")[0] == "unknown"


def test_hf_token_from_the_login_file(tmp_path, hub, hub_server):
    """`hf auth login` saves $HF_HOME/token: a logged-in user is not told 'no token was sent'."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "token").write_text("accepted\n")
    token, source = doc.hf_token({"HF_HOME": str(tmp_path / "hf")})
    assert token == "accepted" and source == str(tmp_path / "hf" / "token")
    assert doc.hf_token({"HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "env"}) == ("env", "HF_TOKEN")
    (tmp_path / "elsewhere").write_text("not-accepted")
    assert doc.hf_token({"HF_TOKEN_PATH": str(tmp_path / "elsewhere")})[0] == "not-accepted"
    assert doc.hf_token({"HF_HOME": str(tmp_path / "empty")}) == (None, None)
    venv = Path(sys.prefix)
    res = subprocess.run(
        [sys.executable, str(DOCTOR), "--tier", "deep", "--json", "--hf-repo", "org/gated"],
        capture_output=True,
        text=True,
        env={"PATH": str(venv / "bin"), "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub},
    )
    check = by_id(json.loads(res.stdout))["hf-access:org/gated"]
    assert check["status"] == "pass" and check["evidence"]["token"] == str(tmp_path / "hf" / "token")
    assert ("/org/gated/resolve/main/config.json", "Bearer accepted") in hub_server.seen


@pytest.mark.loopback
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


@pytest.mark.programs
def test_an_unreadable_expectation_is_bad_usage(tmp_path, wheels):
    """A file named on the command line that cannot be read is a usage error (exit 2), before any check runs; a
    file that reads but is not a manifest is a check that could not run (below)."""
    venv = make_venv(tmp_path / "v", wheels)
    nope = tmp_path / "nope.json"
    res = subprocess.run(
        [str(venv / "bin" / "python"), str(DOCTOR), "--tier", "quick", "--json", "--expect", str(nope)],
        capture_output=True, text=True,
        env={"PATH": str(venv / "bin"), "HOME": str(tmp_path), "HF_HOME": str(tmp_path)},
    )  # fmt: skip
    assert res.returncode == 2 and res.stdout == "" and f"--expect {nope}: cannot read" in res.stderr


def _special(path: Path, kind: str) -> Path:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "dir":
        path.mkdir()
    elif kind == "dangling":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "huge":
        with open(path, "wb") as fh:
            fh.truncate(8 << 30)  # holes: nothing on disk, 8 GiB to a reader
    return path


@pytest.mark.programs
@pytest.mark.parametrize("kind", ["missing", "fifo", "zero", "dir", "dangling", "huge"])
def test_an_unreadable_expectation_is_exit_2_even_when_a_check_fails(tmp_path, kind):
    """Bad usage wins: `--require-gpu` on a host without one is a blocker (exit 1), an `--expect` that cannot be
    read is exit 2 all the same, and nothing blocks on a FIFO or reads /dev/zero without end."""
    expect = _special(tmp_path / "manifest.json", kind)
    try:
        res = subprocess.run(
            [sys.executable, str(DOCTOR), "--tier", "quick", "--require-gpu", "--expect", str(expect)],
            capture_output=True, text=True, timeout=30,
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf")},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"the doctor blocked on an --expect that is {kind}")
    assert res.returncode == 2, (res.returncode, res.stdout[-1500:], res.stderr[-1500:])
    assert "cannot read" in res.stderr and "Traceback" not in res.stderr and "hint:" in res.stderr


@pytest.mark.programs
def test_cli_doctor_passes_through(app, runner, tmp_path, lock):
    res = runner.invoke(app, ["doctor", "--tier", "quick", "--expect", str(lock), "--json"])
    report = json.loads(res.stdout)
    assert res.exit_code == report["exit_code"] and by_id(report)["lock-drift"]["status"] == "fail"


def test_container_overlay_rootfs_is_ephemeral():
    mountinfo = "1 0 0:1 / / rw - fuse.fuse-overlayfs fuse-overlayfs rw\n2 1 0:2 / /workspace rw - ext4 /dev/vda rw\n"
    checks = doc.check_paths(
        [("hf-home", "/root/.cache/huggingface"), ("workspace", "/workspace/out")],
        mountinfo,
        doc.detect_provider({"RUNPOD_POD_ID": "abc"})[1],
    )
    assert [c["status"] for c in checks] == ["warn", "pass"]
    assert (
        "RunPod" in checks[0]["fix"] and "survives a stop" in checks[0]["fix"] and "not a terminate" in checks[0]["fix"]
    )


# ---- requirements with ranges ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("have", "spec", "ok"),
    [
        ("4.48.2", ">=4.48.0", True),
        ("4.47.1", ">=4.48.0", False),
        ("2.1.2+cu121", "==2.1.2", True),  # a local label satisfies the public version
        ("2.1.2+cu121", "==2.1.2+cu118", False),
        ("2.5.1", "~=2.5.0", True),
        ("2.6.0", "~=2.5.0", False),
        ("1.26.4", "<2", True),
        ("2.0.0rc1", "<2", False),  # PEP 440: <V excludes V's pre-releases
        ("2.6.0.dev20241001+cu124", "<2.6", False),
        ("2.5.1", "<2.6", True),
        ("2.0.0", "<2", False),
        ("2.5.1", "==2.5.*", True),
        ("2.50.1", "==2.5.*", False),
        ("1.0.post1", ">1.0", False),  # ... and >V its post-releases
        ("1.1", ">1.0", True),
        ("2.4.1+cu121", "==2.4.1", True),
        ("1.0.dev1", ">=1.0", False),
        ("1.0", "!=1.0.0", False),
    ],
)
def test_version_specifiers_with_the_standard_library(have, spec, ok):
    (clauses,) = [c for _, _, c, _ in doc.parse_requirements(f"pkg{spec}\n")]
    assert all(doc.version_satisfies(have, op, want) for op, want in clauses) is ok


@pytest.mark.programs
def test_expect_a_requirements_file_with_ranges(tmp_path, wheels):
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0", "beta==2.0", "gamma==0.1")
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("# what the training code needs\nalpha>=1.0,<2\nbeta>=2.0  # ModernBERT-style floor\n")
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(reqs))
    check = by_id(report)["requirements"]
    assert code == 0 and check["status"] == "pass" and "lock-drift" not in by_id(report)  # extras are not drift
    reqs.write_text("alpha>=2.0\nbeta>=2.0\ndelta==1.0\nepsilon>=1; python_version < '3'\n")
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(reqs))
    check = by_id(report)["requirements"]
    assert code == 1 and check["status"] == "fail"
    assert "alpha>=2.0: 1.0 is installed" in check["message"] and "delta==1.0: not installed" in check["message"]
    assert check["evidence"]["not_checked"] == ["epsilon>=1; python_version < '3'"]
    reqs.write_text("alpha>=>1\n")
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(reqs))
    assert code == 3 and "line 1" in by_id(report)["manifest"]["message"]


# ---- writability -----------------------------------------------------------------------------------------
@pytest.mark.programs
def test_writability_is_a_blocker_with_a_fix(tmp_path):
    ok = tmp_path / "vol"
    ok.mkdir()
    assert doc.check_writable([("workspace", str(ok / "not-yet" / "hf"))])[0]["status"] == "pass"
    if os.geteuid() == 0:  # root ignores modes: drop to nobody in a child, as a non-root pod user would be
        locked = tmp_path / "root-owned"
        locked.mkdir(mode=0o755)
        code = (
            f"import json, os, sys; sys.path.insert(0, {str(DOCTOR.parent)!r}); import imagekit_doctor as d; "
            f"os.setgid(65534); os.setuid(65534); "
            f"print(json.dumps(d.check_writable([('workspace', {str(locked / 'hf')!r})])))"
        )
        tmp_path.chmod(0o755)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        (check,) = json.loads(res.stdout)
        assert check["status"] == "fail" and "uid 65534" in check["message"]
        assert "chown -R 65534" in check["fix"] and check["evidence"]["owner_uid"] == 0


# ---- GPUs the process can use, launch commands --------------------------------------------------------------
def test_usable_gpus_follow_cuda_visible_devices():
    gpus = doc.parse_smi_query((GPU / "nvidia-smi-query-h100x2.csv").read_text())
    gpus[0]["uuid"], gpus[1]["uuid"] = "GPU-aaaa-1111", "GPU-bbbb-2222"
    assert doc.usable_gpu_count(gpus, None) == 2
    assert doc.usable_gpu_count(gpus, "1") == 1
    assert doc.usable_gpu_count(gpus, "") == 0 and doc.usable_gpu_count(gpus, "-1") == 0
    assert doc.usable_gpu_count(gpus, "0,7,1") == 1  # CUDA stops at the first entry naming no GPU
    assert doc.usable_gpu_count(gpus, "GPU-bbbb") == 1


def test_launch_command_options_override_the_config(tmp_path):
    cfg = tmp_path / "two.yaml"
    cfg.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nuse_cpu: false\n")
    launch = doc.launch_options(["accelerate", "launch", "--config_file", str(cfg), "train.py"])
    assert launch["config_file"] == str(cfg)
    assert doc.check_accelerate(None, 1, launch)["status"] == "fail"  # a 2-GPU config on 1 GPU hangs
    launch = doc.launch_options(["accelerate", "launch", f"--config_file={cfg}", "--num_processes", "1", "t.py"])
    assert doc.check_accelerate(None, 1, launch)["status"] == "pass"
    launch = doc.launch_options(["torchrun", "--nproc_per_node=4", "train.py"])
    assert launch["num_processes"] == 4 and doc.check_accelerate(None, 2, launch)["status"] == "fail"
    assert doc.launch_options(["python", "train.py"]) == {}


def test_a_shell_script_is_read_for_the_launch_it_runs(tmp_path, monkeypatch):
    """`pod run -- bash train.sh`: the script's `accelerate launch` line, continued over lines, after a `cd` and with
    a variable of its own, is the launch checked (a 2-GPU config on a 1-GPU pod hangs)."""
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "two.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    (tmp_path / "train.sh").write_text(
        "#!/bin/bash\nset -e\nCFG=two.yaml\n# accelerate launch --num_processes 8 (a comment, not a launch)\n"
        'cd cfg\nNCCL_DEBUG=INFO exec accelerate launch \\\n  --config_file "$CFG" \\\n  ../train.py --lr 1e-4\n'
    )
    monkeypatch.chdir(tmp_path)
    whole = str(tmp_path / "train.sh")
    for argv in (["bash", "train.sh"], ["sh", "-x", "./train.sh"], ["./train.sh"], ["bash", whole]):
        launch = doc.launch_options(argv)
        assert launch["config_file"] == str(tmp_path / "cfg" / "two.yaml") and launch["script"].endswith("train.sh")
        check = doc.check_accelerate(None, 1, launch)
        assert check["status"] == "fail" and "the launch in " in check["message"] and "train.sh" in check["message"]
    (tmp_path / "torch.sh").write_text("torchrun --nproc_per_node=$NPROC train.py\n")
    monkeypatch.setenv("NPROC", "4")
    assert doc.launch_options(["bash", "torch.sh"])["num_processes"] == 4  # the env the pod's run has
    monkeypatch.delenv("NPROC")
    unknown = doc.launch_options(["bash", "torch.sh"])
    assert unknown["unresolved"] == ["--nproc_per_node"] and doc.check_accelerate(None, 1, unknown)["status"] == "warn"
    (tmp_path / "plain.sh").write_text("python train.py\n")
    assert doc.launch_options(["bash", "plain.sh"]) == {} and doc.launch_options(["bash", "missing.sh"]) == {}
    os.mkfifo(tmp_path / "fifo.sh")  # never waited on
    assert doc.launch_options(["bash", "fifo.sh"]) == {} and doc.launch_options(["bash", "-c", "x"]) == {}


@pytest.mark.programs
def test_doctor_guards_a_launch_command(tmp_path, wheels, lock):
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0", "beta==2.0")
    cfg = tmp_path / "two.yaml"
    cfg.write_text("num_processes: 2\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    accelerate = fake / "accelerate"
    accelerate.write_text(  # a console script of the checked environment, as pip would write it
        f"#!{venv}/bin/python\nimport sys\nopen({str(tmp_path / 'ran')!r}, 'w').write(' '.join(sys.argv[1:]))\n"
    )
    accelerate.chmod(0o755)
    path = [venv / "bin", fake]
    args = ["--expect", str(lock), "--", "accelerate", "launch", "--config_file", str(cfg), "train.py"]
    res = subprocess.run(
        [str(venv / "bin" / "python"), str(DOCTOR), "--tier", "quick", *args],
        capture_output=True,
        text=True,
        env={"PATH": os.pathsep.join(map(str, path)), "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")},
    )
    assert res.returncode == 1 and "num_processes: 2" in res.stderr and "not launching" in res.stderr
    assert not (tmp_path / "ran").exists()
    args[args.index(str(cfg))] = str(tmp_path / "none.yaml")
    cfg.rename(tmp_path / "none.yaml")
    (tmp_path / "none.yaml").write_text("num_processes: 1\n")
    res = subprocess.run(
        [str(venv / "bin" / "python"), str(DOCTOR), "--tier", "quick", *args],
        capture_output=True,
        text=True,
        env={"PATH": os.pathsep.join(map(str, path)), "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")},
    )
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "ran").read_text().startswith("launch --config_file")


# ---- the start check's CUDA probe ---------------------------------------------------------------------------
def test_cuda_visible_devices_empty_is_classified():
    quoted = json.loads((GPU / "torch-warnings.json").read_text())
    assert doc.classify_cuda_failure("", "12.1", "")[0] == "cuda-visible-devices"
    assert doc.classify_cuda_failure("", "12.1", "-1")[0] == "cuda-visible-devices"
    assert doc.classify_cuda_failure(quoted["forward-compat-804"], "12.1", "0")[0] == "forward-compat-804"
    assert doc.classify_cuda_failure(quoted["driver-combination-803"], "12.1", None)[0] == "driver-combination-803"


def _fake_torch(root: Path, init_error: str) -> Path:
    """A `torch` module whose CUDA is as broken as the quoted text says (the probe runs it in a child process)."""
    pkg = root / "torch"
    (pkg / "cuda").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import types\n__version__ = '2.1.2+cu121'\nversion = types.SimpleNamespace(cuda='12.1')\nfrom . import cuda\n"
    )
    (pkg / "cuda" / "__init__.py").write_text(
        f"def is_available():\n    return False\ndef init():\n    raise RuntimeError({init_error!r})\n"
    )
    return root


@pytest.mark.programs
@pytest.mark.parametrize(
    ("env", "cause"),
    [
        ({"CUDA_VISIBLE_DEVICES": ""}, "cuda-visible-devices"),
        ({"IMAGEKIT_QUOTE": "forward-compat-804"}, "forward-compat-804"),
        ({"IMAGEKIT_QUOTE": "no-driver"}, "no-driver"),
    ],
)
def test_start_tier_probes_torch_when_a_gpu_is_required(tmp_path, wheels, env, cause):
    quoted = json.loads((GPU / "torch-warnings.json").read_text())
    site = _fake_torch(tmp_path / "site", quoted.get(env.get("IMAGEKIT_QUOTE", ""), "CUDA unavailable"))
    venv = make_venv(tmp_path / "v", wheels)
    base = {"PYTHONPATH": str(site)}
    code, report, _ = run_doctor(venv, tmp_path, "--tier", "start", env={**base, **env})
    assert "cpu-fallback" not in by_id(report) and "torch-probe" not in by_id(report)  # no GPU expected: no probe
    code, report, _ = run_doctor(venv, tmp_path, "--tier", "start", env={**base, **env, "IMAGEKIT_REQUIRE_GPU": "1"})
    check = by_id(report)["cpu-fallback"]
    assert code == 1 and check["status"] == "fail" and check["evidence"]["cause"] == cause
    assert "silently run on the CPU" in check["message"] and check["fix"]


@pytest.mark.programs
def test_missing_python_is_a_usage_error(tmp_path):
    res = subprocess.run(
        [sys.executable, str(DOCTOR), "--python", str(tmp_path / "nope" / "python")], capture_output=True, text=True
    )
    assert res.returncode == 2 and "no such executable" in res.stderr


def test_a_missing_relative_expect_is_cannot_read(app, runner, in_tmp, monkeypatch):
    """Bad usage (README, exit codes: a path of the wrong kind is 2), through `imagekit doctor` as well."""
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:/usr/bin:/bin")
    monkeypatch.setenv("HF_HOME", str(in_tmp / "hf"))
    res = runner.invoke(app, ["doctor", "--tier", "quick", "--expect", "manifest.json", "--json"])
    assert res.exit_code == 2 and "--expect manifest.json: cannot read" in res.output


def test_printed_reports_escape_control_characters():
    forged = doc.result("lock-drift", "fail", "evil 1.0\n[ok  ] lock-drift: all good\x1b[2K", "fix\rit")
    text = doc.render_text([forged])
    assert text.count("\n") == 1 and "\\n[ok  ]" in text and "\\x1b" in text and "\\r" in text


@pytest.mark.programs
def test_isolated_doctor_still_sees_pythonpath_shadowing(tmp_path, wheels, lock):
    """Images run the doctor with `python -I` (a json.py on PYTHONPATH cannot defeat it); what PYTHONPATH puts in
    front of the pinned packages must still be found: a plain child of the interpreter describes the environment."""
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0", "beta==2.0")
    shadow = tmp_path / "shadow"
    from imagekit.effects.resolver import uv_binary

    subprocess.run(
        [
            uv_binary(),
            "pip",
            "install",
            "-q",
            "--python",
            str(venv / "bin" / "python"),
            "--no-index",
            "--find-links",
            str(wheels),
            "--target",
            str(shadow),
            "alpha==2.0",
        ],
        check=True,
        capture_output=True,
    )
    (shadow / "json.py").write_text("raise SystemExit('a hostile json module')\n")
    env = {"PATH": str(venv / "bin"), "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(shadow)}
    res = subprocess.run(
        [str(venv / "bin" / "python"), "-I", str(DOCTOR), "--tier", "quick", "--json", "--expect", str(lock)],
        capture_output=True,
        text=True,
        env=env,
    )
    checks = by_id(json.loads(res.stdout))  # the doctor itself was not defeated: its report is valid JSON
    assert res.returncode == 3 and "a hostile json module" in checks["interpreter"]["message"]
    (shadow / "json.py").unlink()
    res = subprocess.run(
        [str(venv / "bin" / "python"), "-I", str(DOCTOR), "--tier", "quick", "--json", "--expect", str(lock)],
        capture_output=True,
        text=True,
        env=env,
    )
    checks = by_id(json.loads(res.stdout))
    assert res.returncode == 1 and checks["shadowing"]["status"] == "fail"
    assert "alpha 2.0 (pinned 1.0)" in checks["lock-drift"]["message"]


@pytest.mark.programs
@pytest.mark.parametrize("args", [["--timeout", "nan"], ["--timeout", "-1"], ["--path", ""], ["--path", __file__]])
def test_hostile_doctor_options_are_usage_errors(args):
    res = subprocess.run([sys.executable, str(DOCTOR), "--tier", "quick", *args], capture_output=True, text=True)
    assert res.returncode == 2 and "error:" in res.stderr and "hint:" in res.stderr and "Traceback" not in res.stderr


# ---- what the doctor reads is bounded and checked: a manifest file, and what an interpreter says of itself ------
def _doctor(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp / "home"), "HF_HOME": str(tmp / "hf")}
    return subprocess.run([sys.executable, str(DOCTOR), "--json", *args], capture_output=True, text=True, env=env)


@pytest.mark.programs
@pytest.mark.parametrize(
    "text",
    [
        '{"distributions": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"distributions": {"alpha": "1.0"}, "cell": {"n": ' + "9" * 5000 + "}}",
        '{"distributions": {"alpha": "1.0"}, "cell": {"n": NaN}}',
    ],
)
def test_a_hostile_manifest_is_a_check_that_could_not_run(tmp_path, text):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(text)
    res = _doctor("--tier", "quick", "--expect", str(manifest), tmp=tmp_path)
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    check = by_id(json.loads(res.stdout))["manifest"]
    assert res.returncode in (1, 3) and check["status"] == "error" and f"cannot read {manifest}" in check["message"]
    assert len(check["message"]) < 400 and check["fix"]


INTERPRETER_SAYS = {
    "a list": "[]",
    "no dists": '{"prefix": "/x", "executable": "/x/bin/python", "version": "3.11.7"}',
    "a path of numbers": '{"prefix": "/x", "executable": "/x/bin/python", "version": "3.11.7", '
    '"user_site": "", "enable_user_site": false, "path": [1, 2]}',
    "a number prefix": '{"prefix": 5, "executable": "/x/bin/python", "version": "3.11.7", "dists": {}, '
    '"user_site": "", "enable_user_site": false, "path": []}',
    "nested": "[" * 100_000 + "]" * 100_000,
    "no JSON": "hello",
}


@pytest.mark.programs
@pytest.mark.parametrize("kind", sorted(INTERPRETER_SAYS))
@pytest.mark.parametrize("tier", ["quick", "standard"])
def test_an_interpreter_answering_the_wrong_shape_is_a_check_that_could_not_run(tmp_path, kind, tier, lock):
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    (tmp_path / "says.json").write_text(INTERPRETER_SAYS[kind])
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'says.json'}\n")  # what it prints, whatever it is asked
    fake.chmod(0o755)
    res = _doctor("--tier", tier, "--python", str(fake), "--expect", str(lock), "--timeout", "30", tmp=tmp_path)
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    checks = by_id(json.loads(res.stdout))
    assert res.returncode in (1, 3) and checks["interpreter"]["status"] == "error", checks
    assert f"cannot inspect {fake}" in checks["interpreter"]["message"] and checks["interpreter"]["fix"]
    if tier == "standard":  # the same program answers the torch probe: a shape that is not the probe's is said so
        probe = checks["torch-probe"]
        assert probe["status"] in ("error", "skip") and (kind != "a list" or "wrong shape" in probe["message"])


@pytest.mark.programs
def test_off_an_image_the_doctor_checks_the_python_on_path_not_its_own(tmp_path, wheels, lock):
    """`imagekit doctor` on a host runs in imagekit's own venv: it checks the `python` a training command would
    run (the first on PATH), says which it checked, never blames an image, and ends with a summary line."""
    venv = make_venv(tmp_path / "v", wheels, "alpha==2.0", "beta==2.0")
    env = {"PATH": str(venv / "bin"), "HOME": str(tmp_path / "home"),
           "HF_HOME": str(tmp_path / "hf")}  # fmt: skip
    res = subprocess.run(
        [sys.executable, str(DOCTOR), "--tier", "quick", "--json", "--expect", str(lock)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    checks = by_id(json.loads(res.stdout))
    assert checks["python"]["message"] == f"checking {venv / 'bin' / 'python'} (the python on PATH)"
    drift = checks["lock-drift"]
    assert drift["status"] == "fail" and "alpha 2.0 (pinned 1.0)" in drift["message"]  # the venv's, not imagekit's
    assert "image" not in drift["fix"] and "--require-hashes" in drift["fix"]
    text = subprocess.run(
        [sys.executable, str(DOCTOR), "--tier", "quick", "--expect", str(lock)], capture_output=True, text=True, env=env
    ).stdout.splitlines()
    assert text[-1] == "1 blocker, no warnings", text
    given = subprocess.run(
        [sys.executable, str(DOCTOR), "--tier", "quick", "--json", "--python", sys.executable],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert by_id(json.loads(given.stdout))["python"]["message"] == f"checking {sys.executable} (--python)"


def test_the_summary_counts_blockers_warnings_and_checks_that_could_not_run():
    def c(status: str) -> dict:
        return {"id": "x", "status": status, "message": "", "fix": ""}

    assert doc.summary([c("pass")]) == "no blockers, no warnings"
    assert doc.summary([c("fail"), c("fail"), c("warn")]) == "2 blockers, 1 warning"
    assert doc.summary([c("warn"), c("warn"), c("error")]) == "no blockers, 2 warnings, 1 check could not run"


@pytest.mark.programs
@pytest.mark.parametrize("where", ["pip on PATH", "HF_TOKEN_PATH", "--accelerate-config", "default accelerate config"])
def test_the_doctor_never_blocks_on_a_fifo_where_it_reads_a_file(tmp_path, where):
    """A FIFO (or a link to one) where the doctor reads: a console script's shebang, the saved Hub token, an
    accelerate config. Each is opened without blocking and refused, in seconds."""
    bin_dir, hf = tmp_path / "bin", tmp_path / "hf"
    (hf / "accelerate").mkdir(parents=True)
    bin_dir.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    env = {"PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin", "HOME": str(tmp_path),
           "HF_HOME": str(hf)}  # fmt: skip
    args = ["--tier", "quick"]
    if where == "pip on PATH":
        os.mkfifo(bin_dir / "pip")
        (bin_dir / "pip").chmod(0o755)  # `which` finds it: executable, not a folder
    elif where == "HF_TOKEN_PATH":
        env["HF_TOKEN_PATH"] = str(fifo)
        args = ["--tier", "deep", "--timeout", "30"]
    elif where == "--accelerate-config":
        args += ["--accelerate-config", str(fifo)]
    else:
        (hf / "accelerate" / "default_config.yaml").symlink_to(fifo)
    try:
        res = subprocess.run([sys.executable, str(DOCTOR), "--json", *args], capture_output=True, text=True, env=env,
                             timeout=60)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"the doctor blocked on a FIFO ({where})")
    assert "Traceback" not in res.stderr and res.returncode in (0, 1, 3), res.stderr[-2000:]
    json.loads(res.stdout)
