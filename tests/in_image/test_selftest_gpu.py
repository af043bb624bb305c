"""The self-test's GPU checks (imagekit/in_image/gpu_checks.py, run by selftest.py) in real child processes.

torch and nvidia-smi are the outer boundary here: a fake `nvidia-smi` on PATH and a small pure-Python `torch` on
PYTHONPATH stand in for the driver and the CUDA build, configured per test through environment variables. The
fake torch computes real matrix products (float16 rounding included), so the accuracy check measures something.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT

pytestmark = pytest.mark.programs  # starts Python programs as processes

DOCTOR_DIR = ROOT / "imagekit" / "in_image"
QUOTED = json.loads((FIXTURES / "gpu" / "torch-warnings.json").read_text())

FAKE_TORCH = r'''
"""A stand-in for torch: CUDA state from FAKE_* variables, tensors as lists of float rows."""
import operator
import os
import random
import struct
import types
import warnings

__version__ = os.environ.get("FAKE_TORCH_VERSION", "2.5.1+cu124")
version = types.SimpleNamespace(cuda=os.environ.get("FAKE_TORCH_CUDA", "12.4") or None)


class dtype:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "torch." + self.name


float32, float16, bfloat16 = dtype("float32"), dtype("float16"), dtype("bfloat16")
_seed = [0]


def manual_seed(n):
    _seed[0] = n


def _half(x):
    return struct.unpack("e", struct.pack("e", x))[0]


class Tensor:
    def __init__(self, rows, device="cpu"):
        self.rows, self.device = rows, device

    def to(self, device, dtype=None):
        rows = self.rows
        if dtype is float16:
            rows = [[_half(x) for x in r] for r in rows]
        if str(device).startswith("cuda") and os.environ.get("FAKE_GPU_WRONG") == "1":
            rows = [[x * 1.5 for x in r] for r in rows]  # a GPU that computes wrong results
        return Tensor(rows, str(device))

    def __matmul__(self, other):
        cols = list(zip(*other.rows))
        return Tensor([[sum(map(operator.mul, r, c)) for c in cols] for r in self.rows], self.device)

    def __sub__(self, other):
        return Tensor([[a - b for a, b in zip(r, s)] for r, s in zip(self.rows, other.rows)], self.device)

    def abs(self):
        return Tensor([[abs(x) for x in r] for r in self.rows], self.device)

    def max(self):
        return Tensor([[max(max(r) for r in self.rows)]], self.device)

    def __truediv__(self, other):
        return Tensor([[self.rows[0][0] / other.rows[0][0]]], self.device)

    def __float__(self):
        return float(self.rows[0][0])

    def float(self):
        return Tensor(self.rows, self.device)

    def cpu(self):
        return Tensor(self.rows, "cpu")


def randn(n, m):
    rng = random.Random(_seed[0] * 7919 + n * 31 + m)
    _seed[0] += 1
    return Tensor([[rng.gauss(0.0, 1.0) for _ in range(m)] for _ in range(n)])


class _Cuda(types.ModuleType):
    @staticmethod
    def _count():
        return int(os.environ.get("FAKE_TORCH_GPUS", "0"))

    def is_available(self):
        if os.environ.get("FAKE_TORCH_WARNING"):  # torch warns from cudaGetDeviceCount, then answers False
            warnings.warn(os.environ["FAKE_TORCH_WARNING"], UserWarning)
        if "FAKE_TORCH_AVAILABLE" in os.environ:
            return os.environ["FAKE_TORCH_AVAILABLE"] == "1"
        return self._count() > 0

    def device_count(self):
        return self._count()

    def init(self):
        if os.environ.get("FAKE_TORCH_INIT_ERROR"):
            raise RuntimeError(os.environ["FAKE_TORCH_INIT_ERROR"])

    def get_arch_list(self):
        return os.environ.get("FAKE_TORCH_ARCHS", "sm_80 sm_86 sm_90").split()

    def get_device_capability(self, i):
        major, minor = os.environ.get("FAKE_GPU_CAP", "9.0").split(".")
        return int(major), int(minor)

    def get_device_name(self, i):
        return os.environ.get("FAKE_GPU_NAME", "NVIDIA H100 80GB HBM3")

    def is_bf16_supported(self):
        return False

    def synchronize(self, i=None):
        pass


cuda = _Cuda("torch.cuda")
'''

SMI_LIST = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4f7a1c2e-0000-0000-0000-000000000001)\n"


# The fake image is the test's folder: the self-test's whole-image walk (image-hygiene, from /) walks that folder, not
# the test machine's disk (with the Docker tests' layers beside it, a quarter of a minute per self-test). A walk of
# another folder (the code layer's, --code-to) is the program's own.
IMAGE_IS_THIS_FOLDER = """import importlib.util, sys
spec = importlib.util.spec_from_file_location("hygiene", {hygiene!r})
hygiene = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hygiene)
sys.modules["hygiene"] = hygiene
_walk = hygiene.walk
hygiene.walk = lambda top="/": _walk({top!r} if top == "/" else top)
"""


def _fake_world(tmp: Path, smi_gpus: int) -> tuple[Path, Path]:
    """(bin with nvidia-smi, site with torch). nvidia-smi -L lists ``smi_gpus`` GPUs, or fails as with none."""
    site, bindir = tmp / "site", tmp / "bin"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(FAKE_TORCH)
    (site / "sitecustomize.py").write_text(
        IMAGE_IS_THIS_FOLDER.format(hygiene=str(DOCTOR_DIR / "hygiene.py"), top=str(tmp))
    )
    bindir.mkdir()
    if smi_gpus:
        listing = "".join(SMI_LIST.replace("GPU 0", f"GPU {i}").replace("0001", f"000{i + 1}") for i in range(smi_gpus))
        smi = f"#!/bin/sh\ncat <<'EOF'\n{listing}EOF\n"
    else:
        smi = "#!/bin/sh\necho 'No devices were found'\nexit 6\n"
    (bindir / "nvidia-smi").write_text(smi)
    (bindir / "nvidia-smi").chmod(0o755)
    return bindir, site


def run_gpu_checks(tmp: Path, *args: str, smi_gpus: int = 1, **fake: str) -> tuple[int, dict]:
    bindir, site = _fake_world(tmp, smi_gpus)
    env = {"PATH": f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin", "PYTHONPATH": str(site), "HOME": str(tmp), **fake}
    res = subprocess.run(
        [sys.executable, str(DOCTOR_DIR / "gpu_checks.py"), *args], capture_output=True, text=True, env=env
    )
    assert res.stdout, res.stderr
    return res.returncode, json.loads(res.stdout)


def statuses(report: dict) -> dict[str, str]:
    return {c["id"]: c["status"] for c in report["checks"]}


def test_happy_path_one_gpu_passes_arch_and_matmul(tmp_path):
    code, report = run_gpu_checks(tmp_path, FAKE_TORCH_GPUS="1")
    assert code == 0 and report["passed"], report
    assert statuses(report) == {"gpu-cuda-available": "pass", "gpu-arch": "pass", "gpu-matmul-float16": "pass"}
    (avail, arch, matmul) = report["checks"]
    assert avail["message"] == "torch sees 1 GPU(s)" and avail["evidence"]["visible_gpus"] == [SMI_LIST.strip()]
    assert arch["evidence"]["via"] == "sm_90" and arch["evidence"]["capability"] == "9.0"
    assert 0 < matmul["evidence"]["max_rel_error"] < 0.01  # float16 rounding: measured, not zero


def test_gpu_that_computes_wrong_results_fails(tmp_path):
    code, report = run_gpu_checks(tmp_path, FAKE_TORCH_GPUS="1", FAKE_GPU_WRONG="1")
    assert code == 1 and statuses(report)["gpu-matmul-float16"] == "fail"


def test_gpu_without_kernels_in_this_build_fails_and_skips_the_matmul(tmp_path):
    code, report = run_gpu_checks(tmp_path, FAKE_TORCH_GPUS="1", FAKE_GPU_CAP="12.0", FAKE_GPU_NAME="RTX 5090")
    assert code == 1 and statuses(report) == {"gpu-cuda-available": "pass", "gpu-arch": "fail"}
    assert "sm_120" in report["checks"][1]["message"] and "no kernel image" in report["checks"][1]["message"]


@pytest.mark.parametrize(
    ("fake", "cause"),
    [
        ({"FAKE_TORCH_WARNING": QUOTED["driver-too-old"]}, "driver-too-old"),
        ({"FAKE_TORCH_WARNING": QUOTED["forward-compat-804"]}, "forward-compat-804"),
        ({"FAKE_TORCH_INIT_ERROR": QUOTED["no-driver"]}, "no-driver"),  # is_available() hides it; init() says it
        ({"FAKE_TORCH_CUDA": ""}, "cpu-only-wheel"),
        ({"CUDA_VISIBLE_DEVICES": ""}, "cuda-visible-devices"),
    ],
)
def test_gpus_visible_but_torch_sees_none_fails_naming_the_cause(tmp_path, fake, cause):
    code, report = run_gpu_checks(tmp_path, FAKE_TORCH_GPUS="0", **fake)
    (check,) = report["checks"]  # no arch or matmul check runs on the CPU in place of the GPU
    assert code == 1 and not report["passed"]
    assert check["id"] == "gpu-cuda-available" and check["status"] == "fail"
    assert check["evidence"]["cause"] == cause and "silently run on the CPU" in check["message"]
    assert check["fix"] and "run the doctor" not in check["fix"]


def test_available_but_no_device_is_not_a_pass(tmp_path):
    """is_available() True with device_count() 0 (NVML-based check, CUDA init failing later) is no GPU at all."""
    code, report = run_gpu_checks(tmp_path, FAKE_TORCH_GPUS="0", FAKE_TORCH_AVAILABLE="1")
    assert code == 1 and statuses(report) == {"gpu-cuda-available": "fail"}
    assert "device_count() is 0" in report["checks"][0]["message"]


def test_no_gpu_anywhere_is_a_skip_unless_required(tmp_path):
    code, report = run_gpu_checks(tmp_path / "a", smi_gpus=0)
    assert code == 0 and statuses(report) == {"gpu-cuda-available": "skip"}
    code, report = run_gpu_checks(tmp_path / "b", "--require-gpu", smi_gpus=0)
    assert code == 1 and statuses(report) == {"gpu-cuda-available": "fail"}


def test_selftest_reports_the_cpu_fallback_as_a_failure(tmp_path):
    """The whole self-test, as a build runs it: the GPU failure is in `failed`, with its cause."""
    bindir, site = _fake_world(tmp_path, 2)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        json.dumps(
            {
                "cell": {"id": "cu124-torch2.5.1-tf4.48.2-py3.11"},
                "lock": {"hash": "0" * 64},
                "distributions": {},
                "torch": {"cuda": "12.4"},
                "image": {"compiler": False},
            }
        )
    )
    env = {
        "PATH": f"{bindir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "PYTHONPATH": str(site),
        "HOME": str(tmp_path),
        "IMAGEKIT_MANIFEST": str(manifest),
        "FAKE_TORCH_GPUS": "0",
        "FAKE_TORCH_WARNING": QUOTED["driver-too-old"],
    }
    res = subprocess.run(
        [sys.executable, str(DOCTOR_DIR / "selftest.py")], capture_output=True, text=True, env=env, timeout=300
    )
    report = json.loads(res.stdout)
    check = next(c for c in report["checks"] if c["id"] == "gpu-cuda-available")
    assert res.returncode == 1 and not report["passed"] and "gpu-cuda-available" in report["failed"]
    assert check["status"] == "fail" and check["evidence"]["cause"] == "driver-too-old"
    assert "2 GPU(s) visible" in check["message"] and "driver is older" in check["message"]
    assert report["checks"][3]["id"] == "torch-cuda-version" and report["checks"][3]["status"] == "pass"
