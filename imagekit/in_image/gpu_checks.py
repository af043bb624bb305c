"""GPU checks that need torch: run by the image self-test, the doctor's standard-tier probe and on GPU hosts.

Standard library only, with its siblings (facts.py; the doctor for a CUDA failure's cause): this file runs as a plain
script inside any image (``python gpu_checks.py --json``).
A CPU fallback is never a warning here: GPUs visible to the driver while torch sees none is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings

if __package__:  # imported from the host's package, imagekit.in_image
    from . import facts
else:  # a program in the image: its siblings lie beside it
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import facts


def check(cid, status, message, fix="", evidence=None):
    return {"id": cid, "status": status, "message": message, "fix": fix, "evidence": evidence or {}}


GPU_SKIP = "no GPU visible: GPU checks skipped"  # the self-test's plan says it beforehand (selftest.SKIPS)


def visible_gpus():
    """GPUs the driver exposes to this process, without torch: nvidia-smi, else /proc/driver/nvidia."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
            gpus = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
            return gpus, (out.stdout + out.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [], str(exc)
    proc = "/proc/driver/nvidia/gpus"
    if os.path.isdir(proc):
        return sorted(os.listdir(proc)), "from /proc/driver/nvidia/gpus"
    return [], "no nvidia-smi and no /proc/driver/nvidia"


def arch_supported(cap, arch_list):
    """(ok, how) for a GPU of capability ``cap`` and torch's ``arch_list`` (sm_XY cubins, compute_XY PTX), by the
    one rule (facts.best_kernel): the highest cubin that runs on it, else PTX the driver can JIT for it."""
    cubins = [a for a in arch_list if a.startswith("sm_")]
    ptx = [a for a in arch_list if a.startswith("compute_")]
    how = facts.best_kernel(tuple(cap), cubins, ptx)
    if how is None:
        return False, None
    pool = cubins if how[0] == "cubin" else ptx
    text = next(a for a in pool if facts.arch_key(a) == how[1] and facts.runs_on(a, tuple(cap), pool is ptx))
    return True, text if how[0] == "cubin" else text + " (PTX JIT)"


def classify(text, torch_cuda):
    """(cause id, what, fix) from torch's own text, by the doctor's table (a sibling file in every image)."""
    try:
        if __package__:
            from .imagekit_doctor import classify_cuda_failure
        else:
            from imagekit_doctor import classify_cuda_failure
    except ImportError:
        return ("unknown", "CUDA could not be initialised", "run imagekit-doctor for the cause")
    return classify_cuda_failure(text, torch_cuda, os.environ.get("CUDA_VISIBLE_DEVICES"))


def run_gpu_checks(require_gpu=False):
    """The GPU part of the self-test. Returns a list of checks (status pass/fail/skip)."""
    import torch

    out = []
    gpus, smi_text = visible_gpus()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    warning_text = " | ".join(str(w.message) for w in caught)
    evidence = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "visible_gpus": gpus,
                "nvidia_smi": smi_text[-500:], "warnings": warning_text[-1000:]}
    if not count:
        if gpus:
            init_error = ""
            if torch.version.cuda:
                try:
                    torch.cuda.init()  # is_available() hides why; init() raises torch's own text
                except Exception as exc:  # its text is the finding
                    init_error = repr(exc)
            cause, what, fix = classify(warning_text + " " + init_error, torch.version.cuda)
            evidence.update(cause=cause, init_error=init_error[-1000:],
                            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
            seen = "torch.cuda.is_available() is False" if not available else "torch.cuda.device_count() is 0"
            out.append(check("gpu-cuda-available", "fail",
                             f"{len(gpus)} GPU(s) visible to the driver but {seen}: {what}; training would "
                             "silently run on the CPU", fix, evidence))
        elif require_gpu:
            out.append(check("gpu-cuda-available", "fail", "no GPU visible and --require-gpu was given",
                             "run on a GPU host with the NVIDIA runtime (docker run --gpus all)", evidence))
        else:
            out.append(check("gpu-cuda-available", "skip", GPU_SKIP, "", evidence))
        return out
    out.append(check("gpu-cuda-available", "pass", f"torch sees {count} GPU(s)", "", evidence))
    arch_list = torch.cuda.get_arch_list()
    for i in range(count):
        cap = torch.cuda.get_device_capability(i)
        name = torch.cuda.get_device_name(i)
        ok, how = arch_supported(cap, arch_list)
        ev = {"device": i, "name": name, "capability": f"{cap[0]}.{cap[1]}", "arch_list": arch_list, "via": how}
        if not ok:
            out.append(check("gpu-arch", "fail", f"{name} is sm_{cap[0]}{cap[1]}; this torch has kernels for "
                             f"{' '.join(arch_list)}: 'no kernel image is available for execution on the device'",
                             "use a torch CUDA variant built for this GPU (imagekit explain --arch)", ev))
            continue
        out.append(check("gpu-arch", "pass", f"{name} (sm_{cap[0]}{cap[1]}) runs via {how}", "", ev))
        torch.manual_seed(0)
        a = torch.randn(256, 256)
        b = torch.randn(256, 256)
        ref = a @ b
        dtypes = [torch.float16]
        if torch.cuda.is_bf16_supported():
            dtypes.insert(0, torch.bfloat16)
        for dtype in dtypes:
            got = (a.to(f"cuda:{i}", dtype) @ b.to(f"cuda:{i}", dtype)).float().cpu()
            torch.cuda.synchronize(i)
            rel = float((got - ref).abs().max() / ref.abs().max())
            tol = 0.05 if dtype == torch.bfloat16 else 0.01
            status = "pass" if rel < tol else "fail"
            out.append(check(f"gpu-matmul-{str(dtype).split('.')[-1]}", status,
                             f"{name}: {str(dtype).split('.')[-1]} matmul vs CPU float32, max relative error {rel:.2e} "
                             f"(tolerance {tol})", "" if status == "pass" else "the GPU computes wrong results: "
                             "check the driver and the hardware", {"device": i, "max_rel_error": rel}))
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    checks = run_gpu_checks(require_gpu="--require-gpu" in argv)
    failed = any(c["status"] == "fail" for c in checks)
    print(json.dumps({"checks": checks, "passed": not failed}, indent=2, sort_keys=True))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
