"""`import torch` refused on a pod whose start check found torch without the GPU the pod expects (in_image/
cuda_guard.py): a fresh interpreter with the module on its path and a stand-in `torch` package, as the image's venv
runs the `.pth` line at every start. The real image: test_guard_scenarios.py (`ssh pod python -c 'import torch'`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imagekit.in_image import cuda_guard, podstart

pytestmark = pytest.mark.programs
GUARD = Path(cuda_guard.__file__)


def _python(tmp_path: Path, marker: Path, code: str = "import torch; print('torch', torch.ok)", **env: str):
    """A Python whose startup installs the guard (as the image's .pth line does), with a stand-in torch beside it."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True, exist_ok=True)
    (site / "torch" / "__init__.py").write_text("ok = True\n")
    source = GUARD.read_text().replace('MARKER = "/run/imagekit/no-cuda"', f"MARKER = {str(marker)!r}")
    (site / "_imagekit_cuda_guard.py").write_text(source)
    (site / "_imagekit_cuda_guard.pth").write_text("import _imagekit_cuda_guard; _imagekit_cuda_guard.install()\n")
    prelude = f"import site; site.addsitedir({str(site)!r})\n"
    clean = {k: v for k, v in os.environ.items() if k != "IMAGEKIT_ALLOW_CPU"}
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True,
                          env={**clean, **env}, timeout=60)  # fmt: skip


def test_without_the_start_checks_marker_torch_imports(tmp_path):
    done = _python(tmp_path, tmp_path / "no-cuda")
    assert done.returncode == 0 and done.stdout.strip() == "torch True", done.stderr


def test_with_it_every_import_of_torch_fails_naming_the_cause(tmp_path):
    marker = tmp_path / "no-cuda"
    marker.write_text("cpu-fallback: 1 GPU(s) visible to the driver but torch sees none: no driver (fix: restart)\n")
    done = _python(tmp_path, marker)
    assert done.returncode == 1 and "CpuFallbackRefused" in done.stderr
    assert "torch sees none: no driver (fix: restart)" in done.stderr and "IMAGEKIT_ALLOW_CPU=1" in done.stderr
    caught = _python(tmp_path, marker, "try:\n    import torch\nexcept ImportError:\n    print('cpu')\n")
    assert caught.returncode == 1 and "cpu" not in caught.stdout  # not an ImportError: no quiet CPU fallback
    allowed = _python(tmp_path, marker, IMAGEKIT_ALLOW_CPU="1")
    assert allowed.returncode == 0 and allowed.stdout.strip() == "torch True"


def test_a_marker_that_is_not_roots_regular_file_is_not_believed(tmp_path):
    marker = tmp_path / "no-cuda"
    marker.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text("forged\n")
    assert _python(tmp_path, marker).returncode == 0  # a link: never followed
    marker.unlink()
    marker.write_text("forged by another user\n")
    os.chown(marker, 65534, 65534)
    assert _python(tmp_path, marker).returncode == 0
    marker.unlink()
    os.mkfifo(marker)  # a FIFO: never waited on
    assert _python(tmp_path, marker).returncode == 0


def test_the_start_check_writes_the_cause_only_when_torch_lacks_the_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(podstart, "NO_CUDA", str(tmp_path / "no-cuda"))
    ok = [{"id": "torch-probe", "status": "pass", "message": "torch sees 1 GPU"}]
    assert podstart.mark_no_cuda(ok) is False and not (tmp_path / "no-cuda").exists()
    drift = [{"id": "lock-drift", "status": "fail", "message": "numpy 2.0 drifted"}]
    assert podstart.mark_no_cuda(drift) is False and not (tmp_path / "no-cuda").exists()
    fallback = [{"id": "cpu-fallback", "status": "fail", "message": "a GPU is required but torch sees none",
                 "fix": "use a pod with a GPU, token=hf_SECRET123456789012345"}]  # fmt: skip
    assert podstart.mark_no_cuda(fallback) is True
    text = (tmp_path / "no-cuda").read_text()
    assert text.startswith("cpu-fallback: a GPU is required but torch sees none (fix: use a pod with a GPU")
    assert cuda_guard.cause(str(tmp_path / "no-cuda")).startswith("cpu-fallback: a GPU is required")
