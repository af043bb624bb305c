"""The image self-test: run inside a built image before anything is published.

Checks: installed distributions equal the lock exactly (local labels included, nothing extra), `pip check`,
the `[image] apt` packages at their locked versions, torch's CUDA version,
the GPU architectures compiled into it (the runtime contract's), `python`/`python3` identity, numpy interop,
a tiny transformers model's forward and
backward pass, the image's hygiene (no credentials, .git, build leftovers or owners above 65534: hygiene.py),
(gpu_checks) the GPU when there is one, with `[image] install` the project's wheel shadowing nothing and its
top-level modules importing (project-imports, less `[image] skip_imports`), and last the project's own commands
(`[image] smoke`, one `smoke-N` check each, from the manifest). Prints a JSON report; exit 1 on any failure.
`--code-layer`: the code layer's checks alone (code_layer_checks), when the host reuses the others' results
(imagekit/oci/selftest_reuse.py).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

if __package__:  # imported from the host's package, imagekit.in_image
    from . import facts, hygiene
    from .gpu_checks import GPU_SKIP, check, run_gpu_checks, visible_gpus
else:  # the program in the image: its siblings lie beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import facts
    import hygiene
    from gpu_checks import GPU_SKIP, check, run_gpu_checks, visible_gpus


# Why the full self-test skips a check before running it: one text per check, decided by what the manifest says
# (for numpy and the GPU: what the image holds, what the host shows). The checks skip with these words and `plan`
# says them beforehand, so the host reuses an earlier release's skip only where this run would skip for the same
# reason (imagekit/oci/selftest_reuse.py).
SKIPS = {
    "apt-packages": "no [image] apt packages",
    "torch-archs": "the manifest promises no GPU architectures",
    "cuda-libraries": "no CUDA runtime wheels in this image (torch bundles its libraries)",
    "numpy-interop": "numpy is not installed",
    "torch-compile": "built without a compiler ([image] compiler = false): torch.compile is not available in this "
                     "image",
    "cuda-extension": "no CUDA compiler in this image ([image] cuda_toolkit = false)",
    "torch-companions": "the lock holds none of torch's companion libraries",
    "gpu-cuda-available": GPU_SKIP,
}


def _cuda_wheels(manifest):
    layers = manifest.get("layers") or {}
    prefix = layers.get("cuda_prefix")
    return prefix, [d for layer in layers.get("layers", []) if layer.get("target") == prefix
                    for d in layer["distributions"]]


def skipped(cid, manifest, require_gpu=False):
    """The reason the full self-test skips ``cid`` here without running it (SKIPS), or None when it runs it."""
    import importlib.util

    skips = {
        "apt-packages": lambda: not (manifest.get("apt") or {}).get("packages"),
        "torch-archs": lambda: not (manifest.get("runtime") or {}).get("sass"),
        "cuda-libraries": lambda: not all(_cuda_wheels(manifest)),
        "numpy-interop": lambda: importlib.util.find_spec("numpy") is None,
        "torch-compile": lambda: (manifest.get("image") or {}).get("compiler") is False,
        "cuda-extension": lambda: not manifest.get("cuda_toolkit"),
        "torch-companions": lambda: not manifest.get("companions"),
        "gpu-cuda-available": lambda: not require_gpu and not visible_gpus()[0],
    }
    return SKIPS[cid] if cid in skips and skips[cid]() else None


def plan(manifest, require_gpu=False):
    """The checks the full self-test runs here, in its order, each with the reason it would skip it (None: it runs
    it): what a `--code-layer` run reports, so the host knows what the results it reuses must cover. The GPU's own
    checks past `gpu-cuda-available` depend on the GPUs found and are not listed."""
    ids = ["dists-match-lock", "pip-check", "python-identity", "torch-cuda-version", "torch-archs", "cuda-libraries",
           "numpy-interop", "tiny-model", "image-hygiene"]
    ids += ["project-imports"] if manifest.get("project") else []
    ids += ["apt-packages"] if manifest.get("apt") else []
    ids += ["torch-companions"] if manifest.get("companions") else []
    ids += ["torch-compile", "cuda-extension", "gpu-cuda-available"]
    ids += [f"smoke-{n}" for n in range(1, len((manifest.get("smoke") or {}).get("commands") or []) + 1)]
    return [{"id": cid, "skip": skipped(cid, manifest, require_gpu)} for cid in ids]


def image_paths(manifest=None):
    """sys.path entries of the image's environment: the venv, and the CUDA runtime prefix its .pth adds."""
    prefix = ((manifest or {}).get("layers") or {}).get("cuda_prefix")
    return [p for p in sys.path if p.startswith(sys.prefix) or (prefix and p == prefix)]


def installed(manifest=None):
    """What the image's environment holds: {canonical name: [(version, where), ...]}, read by the one reading the
    doctor's start check uses too (facts.installed_distributions)."""
    return facts.installed_distributions(image_paths(manifest))


def check_distributions(manifest):
    """`dists-match-lock` before publishing: the image is its lock exactly, so anything extra fails too, and so does
    a name installed twice (the doctor would read the other one)."""
    want = {facts.canon(k): v for k, v in manifest["distributions"].items()}
    installs = installed(manifest)
    have = {n: found[0][0] for n, found in installs.items()}
    drift = facts.lock_drift(want, installs, facts.declared_seeds(manifest))
    missing, extra, twice = drift["missing"], drift["extra"], drift["duplicates"]
    different = [f"{n} {have[n]} (lock {want[n]})" for n in drift["different"]]
    ev = {"missing": missing, "extra": extra, "different": different, "duplicates": twice, "count": len(have)}
    if missing or extra or different or twice:
        parts = []
        if twice:
            parts.append("installed twice: " + "; ".join(twice))
        if different:
            parts.append("different: " + ", ".join(different))
        if missing:
            parts.append("missing: " + ", ".join(missing))
        if extra:
            parts.append("not in the lock: " + ", ".join(extra))
        fix = "rebuild from the lock; never pip install over it"
        if twice:
            fix = "a layer installed what the image below it already held: rebuild with this imagekit (" + fix + ")"
        return check("dists-match-lock", "fail", "; ".join(parts), fix, ev)
    return check("dists-match-lock", "pass", f"{len(want)} distributions match the lock exactly", "", ev)


def check_apt(manifest):
    """`apt-packages`: every .deb the cell locked (`[image] apt`) is installed at its pinned version."""
    want = (manifest.get("apt") or {}).get("packages") or {}
    if skipped("apt-packages", manifest):
        return check("apt-packages", "skip", SKIPS["apt-packages"])
    with open(facts.DPKG_STATUS, encoding="utf-8", errors="replace") as fh:
        drift = facts.apt_drift(want, facts.dpkg_installed(fh.read()))
    if drift["missing"] or drift["different"]:
        parts = (["missing: " + ", ".join(drift["missing"])] if drift["missing"] else []) + drift["different"]
        return check("apt-packages", "fail", "; ".join(parts), "rebuild from the lock", drift)
    return check("apt-packages", "pass", f"{len(want)} Debian packages at their locked versions", "", drift)


def check_pip():
    res = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    text = (res.stdout + res.stderr).strip()
    if res.returncode == 0:
        return check("pip-check", "pass", text or "pip check: ok")
    return check("pip-check", "fail", text[-1500:], "the lock's requirements conflict; re-lock the cell")


def check_python_identity():
    """`python` and `python3` on PATH must be this environment (same sys.prefix), not merely the same binary."""
    ev = {"sys.prefix": sys.prefix}
    bad = []
    for name in ("python", "python3"):
        path = shutil.which(name)
        if not path:
            bad.append(f"{name}: not on PATH")
            continue
        res = subprocess.run([path, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
        prefix = res.stdout.strip()
        ev[name] = {"path": path, "prefix": prefix}
        if prefix != sys.prefix:
            bad.append(f"{name} -> {path} (prefix {prefix})")
    if bad:
        return check("python-identity", "fail", "; ".join(bad) + f"; the pinned environment is {sys.prefix}",
                     f"put {sys.prefix}/bin first on PATH", ev)
    return check("python-identity", "pass", f"python and python3 are the pinned environment {sys.prefix}", "", ev)


def check_torch_cuda(manifest):
    import torch

    want = manifest["torch"]["cuda"]
    got = torch.version.cuda
    ev = {"torch": torch.__version__, "torch.version.cuda": got, "manifest": want}
    if got and ".".join(got.split(".")[:2]) == want:
        return check("torch-cuda-version", "pass", f"torch {torch.__version__} is built for CUDA {got}", "", ev)
    return check("torch-cuda-version", "fail",
                 f"torch {torch.__version__} is built for CUDA {got}, the cell says {want}",
                 "the image does not match its name; rebuild from the lock", ev)


def check_torch_archs(manifest):
    """The GPU architectures the image promises (its runtime contract: what `pod create` and the templates filter
    hosts by) are compiled into its torch: the wheel's own arch flags, read without a GPU."""
    runtime = manifest.get("runtime") or {}
    sass, ptx = runtime.get("sass") or [], runtime.get("ptx")
    if skipped("torch-archs", manifest):  # decided before torch is asked, as the plan decides it
        return check("torch-archs", "skip", SKIPS["torch-archs"], "", {"sass": sass, "ptx": ptx})
    import torch

    flags_of = getattr(torch._C, "_cuda_getArchFlags", None)
    flags = flags_of() if flags_of is not None and torch.version.cuda else ""
    ev = {"arch_flags": flags, "sass": sass, "ptx": ptx}
    if not flags:
        return check("torch-archs", "fail", f"this torch ({torch.__version__}) names no compiled GPU architectures",
                     "the image does not match its name; rebuild from the lock", ev)
    problems = facts.arch_contract_problems(flags, sass, ptx)
    if problems:
        return check("torch-archs", "fail",
                     f"torch {torch.__version__} is compiled for {flags}, not what the image promises: "
                     + "; ".join(problems),
                     "imagekit's compatibility data promises more than this torch wheel holds: upgrade imagekit (its "
                     "[[arch]] tables are held to the wheels they describe) or report these flags", ev)
    return check("torch-archs", "pass", f"torch {torch.__version__} has kernels for {flags}", "", ev)


# Libraries of the CUDA runtime wheels (and of a driver install or toolkit, if one were on the library path).
CUDA_LIB = re.compile(r"lib(cublas|cublasLt|cudart|cudnn[a-z_]*|cufft|cufftw|curand|cusolver|cusparse|cusparseLt|nccl|"
                      r"nvrtc|nvrtc-builtins|nvJitLink|nvToolsExt|cupti|cufile|nvshmem_host)\.so")


def check_cuda_libraries(manifest):
    """After `import torch`, every CUDA runtime library mapped into the process comes from the image's CUDA prefix
    (the nvidia-* wheels the lock pins), none from a system path: torch found them the way it does in site-packages."""
    prefix, wheels = _cuda_wheels(manifest)
    if skipped("cuda-libraries", manifest):  # decided before torch is imported, as the plan decides it
        return check("cuda-libraries", "skip", SKIPS["cuda-libraries"])
    import torch  # noqa: F401 - loads libtorch_cuda and the CUDA runtime libraries it links

    mapped = set()
    with open("/proc/self/maps") as fh:
        for line in fh:
            path = line.split(None, 5)[5].strip() if len(line.split(None, 5)) == 6 else ""
            if CUDA_LIB.search(os.path.basename(path)):
                mapped.add(path)
    real = {p: os.path.realpath(p) for p in sorted(mapped)}
    inside = prefix.rstrip("/") + "/"
    ours = sorted(p for p, r in real.items() if r.startswith(inside))
    other = sorted(f"{p} -> {r}" if p != r else p for p, r in real.items() if not r.startswith(inside))
    ev = {"prefix": prefix, "from_prefix": [os.path.basename(p) for p in ours], "elsewhere": other}
    if other:
        return check("cuda-libraries", "fail", f"torch loaded CUDA libraries from outside {prefix}: {', '.join(other)}",
                     "a system CUDA install shadows the locked wheels; unset LD_LIBRARY_PATH or remove it", ev)
    if not ours:
        return check("cuda-libraries", "fail", f"import torch mapped no CUDA runtime library from {prefix}",
                     f"torch did not load the locked {', '.join(wheels[:3])}...; check the site-packages/nvidia link",
                     ev)
    return check("cuda-libraries", "pass", f"{len(ours)} CUDA libraries loaded from {prefix}: "
                 + ", ".join(sorted({os.path.basename(p).split('.so')[0] for p in ours})), "", ev)


def check_numpy_interop():
    if skipped("numpy-interop", {}):
        return check("numpy-interop", "skip", SKIPS["numpy-interop"])
    import warnings

    import numpy
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            total = int(torch.from_numpy(numpy.arange(4)).sum())
        except Exception as exc:  # any failure here is the finding
            return check("numpy-interop", "fail",
                         f"torch {torch.__version__} cannot use numpy {numpy.__version__}: {exc}",
                         "pin a numpy this torch was built against (e.g. numpy<2 for older torch) in the cell's "
                         "packages")
    noisy = [str(w.message) for w in caught if "numpy" in str(w.message).lower()]
    if total != 6 or noisy:
        return check("numpy-interop", "fail", f"numpy {numpy.__version__} with torch {torch.__version__}: "
                     + ("; ".join(noisy)[:500] or f"wrong sum {total}"),
                     "pin a numpy this torch was built against in the cell's packages")
    return check("numpy-interop", "pass", f"torch.from_numpy works with numpy {numpy.__version__}")


# Imports each module in one process of its own (a companion built for another torch can abort the process, as
# torchao's .so files do), saying which it is at before each: the last one said is the one that failed.
COMPANION_IMPORTS = """
import importlib, sys
import torch
for name in sys.argv[1:]:
    print("importing", name, flush=True)
    importlib.import_module(name)
print("imported all", flush=True)
"""


def check_companions(manifest):
    """`torch-companions`: each of torch's companion libraries the lock holds (torchvision, torchaudio, torchao,
    xformers, triton, ...) and what torch imports undeclared (pkg_resources, for a torch whose compiler needs it)
    imports beside this torch: a companion built for another torch fails here ("libcudart.so.13: cannot open shared
    object file", "cannot import name 'NF4Tensor'"), not in the user's first run."""
    held = manifest.get("companions") or []
    if skipped("torch-companions", manifest):
        return check("torch-companions", "skip", SKIPS["torch-companions"])
    import torch

    modules = [m for c in held for m in c.get("import") or []]
    start = time.time()
    try:
        res = subprocess.run([sys.executable, "-c", COMPANION_IMPORTS, *modules], capture_output=True, text=True,
                             timeout=600)
        out = res.stdout
    except subprocess.TimeoutExpired as exc:
        res, out = None, exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    ev = {"modules": modules, "seconds": round(time.time() - start, 2),
          "companions": {c["name"]: c.get("version") for c in held}}
    if res is not None and res.returncode == 0 and "imported all" in out:
        shown = ", ".join(f"{c['name']} {c.get('version')}" for c in held)
        return check("torch-companions", "pass", f"{shown} import beside torch {torch.__version__}", "", ev)
    said = [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("importing ")]
    failed = said[-1] if said else "torch"
    which = next((c for c in held if failed in (c.get("import") or [])), None)
    how = "did not finish in 600 s" if res is None else (
        f"ended with exit {res.returncode}: " + (res.stderr.strip().splitlines() or ["no message"])[-1][:600])
    what = f"{which['name']} {which.get('version')}" if which else failed
    why = (f" (imagekit's companion table holds {which['name']}{which.get('requires')}: {which.get('why')}; "
           f"{which.get('source')})") if which else ""
    return check("torch-companions", "fail", f"import {failed} ({what}) beside torch {torch.__version__} {how}{why}",
                 "re-lock the cell with this imagekit (the lock holds each companion to the release built for the "
                 "cell's torch); if it still fails, the table is wrong for this release: report it", ev)


def check_tiny_model():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=128, n_positions=32)
    model = GPT2LMHeadModel(config).to(device)
    ids = torch.randint(0, 128, (2, 16), device=device)
    start = time.time()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    ok = bool(torch.isfinite(loss)) and grads and all(bool(torch.isfinite(g).all()) for g in grads)
    ev = {"device": device, "loss": float(loss), "params_with_grad": len(grads),
          "seconds": round(time.time() - start, 3)}
    if ok:
        return check("tiny-model", "pass",
                     f"GPT-2 (1 layer, from config) forward+backward on {device}: loss {float(loss):.3f}", "", ev)
    return check("tiny-model", "fail", f"forward/backward on {device} gave non-finite values", "", ev)


def check_torch_compile(manifest):
    """torch.compile of a tiny function: Inductor's C++ on the CPU, Triton on a GPU; both need a C compiler and
    Python's headers at run time."""
    if skipped("torch-compile", manifest):
        return check("torch-compile", "skip", SKIPS["torch-compile"])
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = "Triton" if device == "cuda" else "Inductor C++"

    def f(x):
        return torch.sin(x) * 2 + torch.cos(x)

    start = time.time()
    try:
        x = torch.randn(256, device=device)
        got = torch.compile(f)(x)
        ok = bool(torch.allclose(got, f(x), atol=1e-5))
    except Exception as exc:  # InvalidCxxCompiler, "Failed to find C compiler", ...
        return check("torch-compile", "fail", f"torch.compile on {device} ({backend}) failed: "
                     f"{type(exc).__name__}: {exc}"[:1500],
                     "the image needs gcc/g++ and the Python headers ([image] compiler = true, the default)")
    ev = {"device": device, "backend": backend, "seconds": round(time.time() - start, 2)}
    if not ok:
        return check("torch-compile", "fail", f"torch.compile on {device} gave results that differ from eager", "", ev)
    return check("torch-compile", "pass", f"torch.compile ran a compiled function on {device} ({backend}) in "
                 f"{ev['seconds']} s", "", ev)


# `[image] cuda_toolkit`: a one-line CUDA kernel, compiled by the image's nvcc and linked against its torch
EXT_CUDA = """
__global__ void add_one_kernel(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1; }
void add_one(torch::Tensor x) { add_one_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), x.numel()); }
"""


# The same without torch: a CUDA program nvcc compiles and links alone (its runtime, its host compiler), run on a GPU
KERNEL_PROGRAM = r"""#include <cstdio>
#include <cuda_runtime.h>
__global__ void add_one(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1; }
int main() {
  float h[256] = {0}; float* d = 0;
  if (cudaMalloc(&d, sizeof h) != cudaSuccess) { std::printf("no CUDA device\n"); return 3; }
  cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
  add_one<<<1, 256>>>(d, 256);
  cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  for (int i = 0; i < 256; i++) if (h[i] != 1) { std::printf("wrong result\n"); return 4; }
  std::printf("ok\n"); return 0;
}
"""


def nvcc_kernel(home, arch, gpu):
    """Compile and link :data:`KERNEL_PROGRAM` with ``home``'s nvcc for ``arch`` (``8.0``); run it when ``gpu``.
    (ok, what happened in words, evidence): never "ran" without a GPU."""
    nvcc = os.path.join(home, "bin", "nvcc")
    digits = arch.replace(".", "")
    ev = {"arch": f"sm_{digits}"}
    with tempfile.TemporaryDirectory(prefix="imagekit-nvcc-") as build:
        src, exe = os.path.join(build, "kernel.cu"), os.path.join(build, "kernel")
        with open(src, "w") as fh:
            fh.write(KERNEL_PROGRAM)
        start = time.time()
        res = subprocess.run([nvcc, f"-gencode=arch=compute_{digits},code=sm_{digits}", "-o", exe, src],
                             capture_output=True, text=True, timeout=600)
        ev["compile_seconds"] = round(time.time() - start, 1)
        if res.returncode != 0 or not os.path.isfile(exe):
            return False, f"nvcc could not compile and link a CUDA program: {(res.stdout + res.stderr)[-1200:]}", ev
        if not gpu:
            return True, f"nvcc compiled and linked a CUDA program for sm_{digits} (no GPU: not run)", ev
        run = subprocess.run([exe], capture_output=True, text=True, timeout=120)
        ev["output"] = (run.stdout + run.stderr)[-300:]
        if run.returncode != 0 or run.stdout.strip() != "ok":
            return False, f"the compiled CUDA program failed on the GPU (exit {run.returncode}): {ev['output']}", ev
        return True, f"nvcc compiled and linked a CUDA program for sm_{digits}; it ran on the GPU", ev


def _nvcc_version(home):
    res = subprocess.run([os.path.join(home, "bin", "nvcc"), "--version"], capture_output=True, text=True)
    found = re.search(r"release (\d+\.\d+), V([\d.]+)", res.stdout)
    return found.group(2) if found else (res.stdout + res.stderr).strip()[-300:]


def check_cuda_extension(manifest):
    """`cuda-extension` (`[image] cuda_toolkit`): torch.utils.cpp_extension.load_inline compiles a one-line CUDA
    kernel with the image's nvcc (CUDA_HOME) and g++, links it against torch and imports it; with a GPU it runs it.
    Without a GPU it compiles for the first architecture the image promises (TORCH_CUDA_ARCH_LIST)."""
    toolkit = manifest.get("cuda_toolkit")
    if skipped("cuda-extension", manifest):
        return check("cuda-extension", "skip", SKIPS["cuda-extension"])
    home = os.environ.get("CUDA_HOME") or toolkit.get("home") or ""
    ev = {"CUDA_HOME": home, "nvcc": _nvcc_version(home) if os.path.isfile(os.path.join(home, "bin", "nvcc")) else None}
    if ev["nvcc"] is None:
        return check("cuda-extension", "fail", f"no nvcc at {home}/bin/nvcc", "rebuild from the lock", ev)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sass = (manifest.get("runtime") or {}).get("sass") or []
    digits = re.sub(r"\D", "", str(sass[0])) if sass else ""
    if device == "cpu" and not os.environ.get("TORCH_CUDA_ARCH_LIST") and len(digits) >= 2:  # no GPU to ask
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{digits[:-1]}.{digits[-1]}"  # sm_80 -> 8.0, sm_120 -> 12.0
    ev.update({"device": device, "TORCH_CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST")})
    # Debian's toolkit (CUDA 11.8, 12.4): first nvcc alone (its own runtime and host compiler), then through torch's
    # extension builder
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "").split(";")[0].split(" ")[0].replace("+PTX", "")
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability(0)
        arch = f"{major}.{minor}"
    if arch and toolkit.get("package"):
        ok, said, ev["program"] = nvcc_kernel(home, arch, device == "cuda")
        if not ok:
            return check("cuda-extension", "fail", said, "the image's CUDA compiler cannot build: rebuild from the "
                         "lock", ev)
    from torch.utils import cpp_extension

    start = time.time()
    with tempfile.TemporaryDirectory(prefix="imagekit-cuda-ext-") as build:
        try:
            ext = cpp_extension.load_inline("imagekit_selftest_ext", "void add_one(torch::Tensor x);", EXT_CUDA,
                                            functions=["add_one"], build_directory=build, with_cuda=True)
        except Exception as exc:  # the compiler's or the linker's own words are the finding
            ev["seconds"] = round(time.time() - start, 1)
            return check("cuda-extension", "fail", f"load_inline with nvcc {ev['nvcc']} failed: "
                         f"{type(exc).__name__}: {exc}"[-1500:],
                         "the image's CUDA compiler cannot build torch extensions: rebuild from the lock", ev)
        ev["seconds"] = round(time.time() - start, 1)
        if device == "cpu":
            return check("cuda-extension", "pass", f"nvcc {ev['nvcc']} compiled and linked a CUDA extension against "
                         f"torch {torch.__version__} in {ev['seconds']} s, and it imports (no GPU: not run)", "", ev)
        x = torch.zeros(1000, device="cuda")
        ext.add_one(x)
        torch.cuda.synchronize()
        if not bool((x == 1).all()):
            return check("cuda-extension", "fail", "the compiled kernel ran but did not add one", "", ev)
    return check("cuda-extension", "pass", f"nvcc {ev['nvcc']} built a CUDA extension in {ev['seconds']} s; its "
                 f"kernel ran on {torch.cuda.get_device_name(0)}", "", ev)


SMOKE_TAIL = 2000  # characters of a smoke command's output kept as evidence


def check_smoke(number, command, timeout):
    """`smoke-N`: one `[image] smoke` command, run by /bin/sh as a user's shell would run it in the image (its ENV,
    its PATH, /workspace), within ``timeout`` seconds; its exit code and the tail of its output are the evidence."""
    cid = f"smoke-{number}"
    ev = {"command": command, "timeout": timeout}
    if timeout <= 0:
        return check(cid, "fail", f"`{command}` was not run: the smoke commands' time is spent",
                     "make the commands before it quicker, or run fewer ([image] smoke)", ev)
    start = time.time()
    proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    kept, reader = _tail_reader(proc.stdout.fileno(), 4 * SMOKE_TAIL)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the command and whatever it started
        proc.wait()
        code = None
    reader.join(5)  # a program that left the session may hold the pipe open: its output is not waited for
    if not reader.is_alive():  # else the reader keeps its descriptor: closing it under a blocked read is unsafe
        proc.stdout.close()
    tail = bytes(kept["tail"]).decode("utf-8", "replace")[-SMOKE_TAIL:]
    ev.update({"exit": code, "output_tail": tail, "output_bytes": kept["bytes"],
               "seconds": round(time.time() - start, 2)})
    last = (tail.strip().splitlines() or [""])[-1][:300]
    if code is None:
        return check(cid, "fail", f"`{command}` did not finish within {timeout} s",
                     "see what it waits on (docker run IMAGE sh -c '...'); a smoke command should take seconds", ev)
    if code != 0:
        how = f"exited {code}" if code > 0 else f"was killed by signal {-code}"
        return check(cid, "fail", f"`{command}` {how}" + (f": {last}" if last else ""),
                     "the project's code fails in this image: fix it or the command ([image] smoke) and build again",
                     ev)
    return check(cid, "pass", f"`{command}` exited 0 in {ev['seconds']:.1f} s", "", ev)


def _tail_reader(fd, keep):
    """A thread reading ``fd`` to its end, keeping only its last ``keep`` bytes (and counting them all): a smoke
    command's output never reaches a disk, so one that prints without end fills neither the image's writable layer
    nor the host's disk under it."""
    kept = {"tail": bytearray(), "bytes": 0}

    def pump():
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            kept["bytes"] += len(chunk)
            kept["tail"] += chunk
            if len(kept["tail"]) > 2 * keep:
                del kept["tail"][:-keep]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return kept, reader


def run_smoke(manifest):
    """The manifest's smoke commands in order, each announced as it ends; together within the manifest's budget."""
    smoke = manifest.get("smoke") or {}
    commands, timeout = smoke.get("commands") or [], int(smoke.get("timeout") or 300)
    deadline = time.time() + int(smoke.get("budget") or 600)
    results = []
    for number, command in enumerate(commands, 1):
        left = min(timeout, math.ceil(deadline - time.time()))
        results.append(guarded(f"smoke-{number}", check_smoke, number, command, left))
    return results


def announce(result, seconds=None):
    """One line per check on stderr as it ends (the JSON report on stdout comes at the end): the host streams it."""
    took = ""
    if seconds is not None:
        result["seconds"] = round(seconds, 2)
        took = f" {seconds:.1f}s"
    sys.stderr.write(f"imagekit-selftest: {result['status']} {result['id']}{took}\n")
    sys.stderr.flush()
    return result


def guarded(cid, fn, *args):
    start = time.time()
    try:
        result = fn(*args)
    except Exception as exc:  # a crash is a failed check, with its text as evidence
        result = check(cid, "fail", f"{type(exc).__name__}: {exc}"[:1500])
    return announce(result, time.time() - start)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    manifest_path = os.environ.get("IMAGEKIT_MANIFEST", "/etc/imagekit/manifest.json")
    with open(manifest_path) as fh:
        manifest = json.load(fh)
    if "--only-torch-compile" in argv:
        print(json.dumps(guarded("torch-compile", check_torch_compile, manifest)))
        return 0
    if "--only-cuda-extension" in argv:
        print(json.dumps(guarded("cuda-extension", check_cuda_extension, manifest)))
        return 0
    left = hygiene.leftovers()  # before anything here writes to /tmp or /root
    if "--code-layer" in argv:  # the host reuses the results of the layers below the code layer (their digests)
        code_to = next((a.split("=", 1)[1] for a in argv if a.startswith("--code-to=/")), None)
        return finish(manifest, code_layer_checks(manifest, left, code_to), "code-layer",
                      plan(manifest, "--require-gpu" in argv))
    # torch.compile waits on a C compiler most of its time (Inductor's C++ or Triton): a process of its own from the
    # start, so the other checks run meanwhile
    compiling = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--only-torch-compile"],
                                 stdout=subprocess.PIPE, text=True)
    # `[image] cuda_toolkit`: nvcc and g++ build an extension meanwhile too (a minute of compiling on a CPU)
    extension = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--only-cuda-extension"],
                                 stdout=subprocess.PIPE, text=True) if manifest.get("cuda_toolkit") else None
    # what the image holds, read before anything else runs (the project's imports and commands may write files or
    # install packages), side by side: they read files and wait on pip
    state = [("dists-match-lock", check_distributions, manifest), ("pip-check", check_pip),
             ("python-identity", check_python_identity), ("image-hygiene", hygiene.check_hygiene, left, check)]
    if manifest.get("apt"):  # an image with `[image] apt` packages: each at its locked version
        state.append(("apt-packages", check_apt, manifest))
    results = dict(side_by_side(state))
    if manifest.get("project"):  # `[image] install`: the project's wheel shadows nothing, and imports (its code runs)
        results["project-imports"] = guarded("project-imports", check_project_imports, manifest)
    for item in [("torch-cuda-version", check_torch_cuda, manifest), ("torch-archs", check_torch_archs, manifest),
                 ("cuda-libraries", check_cuda_libraries, manifest), ("numpy-interop", check_numpy_interop),
                 ("tiny-model", check_tiny_model)]:
        results[item[0]] = guarded(*item)
    if manifest.get("companions"):  # torch's companion libraries the lock holds: each imports beside this torch
        results["torch-companions"] = guarded("torch-companions", check_companions, manifest)
    try:
        gpu = run_gpu_checks(require_gpu="--require-gpu" in argv)
    except Exception as exc:
        gpu = [check("gpu-cuda-available", "fail", f"{type(exc).__name__}: {exc}"[:1500])]
    gpu = [announce(c) for c in gpu]  # run as one block: no time of their own
    # the project's own commands (one at a time) while torch.compile and the extension's compiler finish
    smoke = Background(run_smoke, manifest)
    results["torch-compile"] = collect("torch-compile", compiling)
    results["cuda-extension"] = (collect("cuda-extension", extension) if extension else
                                 guarded("cuda-extension", check_cuda_extension, manifest))
    # the report in the order it always had: what the image is first, the project's commands last
    checks = in_report_order(results) + gpu + smoke.result()
    return finish(manifest, checks, "full")


def collect(cid, proc):
    """The result a check's own process (``--only-...``) printed, or a failure naming how it ended."""
    out, _ = proc.communicate()
    try:
        return json.loads(out)
    except ValueError:
        return announce(check(cid, "fail", f"the check's process ended with exit {proc.returncode} and no result: "
                              f"{out[-500:]!r}"))


REPORT_ORDER = ("dists-match-lock", "pip-check", "python-identity", "torch-cuda-version", "torch-archs",
                "cuda-libraries", "numpy-interop", "tiny-model", "image-hygiene", "project-imports", "apt-packages",
                "torch-companions", "torch-compile", "cuda-extension")
SIDE_BY_SIDE = 4  # checks at once: they read files and wait on child processes, two cores keep up


def in_report_order(results):
    """The results by REPORT_ORDER; one it does not name (a check added without its place) comes after them."""
    return ([results[cid] for cid in REPORT_ORDER if cid in results] +
            [result for cid, result in results.items() if cid not in REPORT_ORDER])


def side_by_side(items):
    """``(id, function, *args)`` items run as guarded checks on a few threads: [(id, result)] in the given order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(SIDE_BY_SIDE) as pool:
        futures = [(item[0], pool.submit(guarded, *item)) for item in items]
        return [(cid, future.result()) for cid, future in futures]


class Background:
    """``fn(*args)`` on a thread of its own; ``result()`` waits for it (its exception raised there)."""

    def __init__(self, fn, *args):
        self.out = {}
        self.thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self.thread.start()

    def _run(self, fn, args):
        try:
            self.out["value"] = fn(*args)
        except BaseException as exc:  # handed to result()
            self.out["error"] = exc

    def result(self):
        self.thread.join()
        if "error" in self.out:
            raise self.out["error"]
        return self.out["value"]


def _files(dist):
    """The files a distribution's RECORD installs into site-packages ("pkg/mod.py"), metadata and bytecode left out."""
    out = set()
    for f in dist.files or []:
        first = f.parts[0] if f.parts else ""
        if first in ("..", "__pycache__") or first.endswith((".dist-info", ".data")) or str(f).endswith(".pyc"):
            continue
        out.add("/".join(f.parts))
    return out


def _top_levels(files):
    """The top-level names of ``files`` (a package's folder, a module's name) and the .pth files among them."""
    names, pth = set(), []
    for f in files:
        first = f.split("/")[0]
        if "/" not in f and first.endswith(".pth"):
            pth.append(first)
        elif "/" in f or first.endswith((".py", ".so", ".pyd")):
            names.add(first.split(".")[0])
    return names, sorted(pth)


def _importable(files, names):
    """What a user would import of ``names``: Python identifiers with code in them (a folder of data is not)."""
    code = (".py", ".so", ".pyd")
    return {n for n in names if n.isidentifier() and any(f.split("/")[0].split(".")[0] == n and f.endswith(code)
                                                         for f in files)}


def _requires(dist):
    """The canonical names a distribution's Requires-Dist names (markers and extras aside)."""
    out = set()
    for req in dist.requires or []:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        if m:
            out.add(facts.canon(m.group(1)))
    return out


def _shared_packages(name, files, requires, others):
    """The project's top-level names another distribution installs too, each judged: ``accidents`` (a file both
    install, of which the one installed last replaced the other's; or one regular package both put modules in while
    neither requires the other) and ``extended`` (a namespace package, PEP 420, or a package the other distribution
    extends on purpose: one of the two requires the other, as a plugin requires what it plugs into)."""
    accidents, extended = [], []
    mine, _ = _top_levels(files)
    for other, other_files, other_requires in others:
        tops, _ = _top_levels(other_files)
        for top in sorted(mine & tops):
            under = sorted(f for f in files if f.split("/")[0].split(".")[0] == top)
            theirs = sorted(f for f in other_files if f.split("/")[0].split(".")[0] == top)
            both = sorted(set(under) & set(theirs))
            if both:
                accidents.append((top, other, False, f"{both[0]} is installed by both the project's wheel and "
                                  f"{other}: the one installed last replaced the other's"))
            elif not any(f == f"{top}/__init__.py" for f in [*under, *theirs]):
                extended.append(f"{top} (a namespace package {other} shares)")
            elif name in other_requires or other in requires:
                who = f"{other} requires {name}" if name in other_requires else f"{name} requires {other}"
                extended.append(f"{top} (also {other}'s: {who})")
            else:
                accidents.append((top, other, True, f"the project's {under[0]} goes into the package {top} that "
                                  f"{other} installs too ({theirs[0]}), and neither distribution requires the other"))
    return accidents, extended


# The project's modules imported in a process of their own (one that exits or crashes on import does not take the
# self-test with it), each announced first, so a process that dies names the module it was importing.
PROJECT_IMPORTS = r"""
import importlib, json, sys, traceback
paths, names = json.loads(sys.argv[1]), sys.argv[2:]
sys.path[:0] = [p for p in paths if p not in sys.path]
for name in names:
    print(json.dumps({"importing": name}), flush=True)
    try:
        importlib.import_module(name)
    except BaseException as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        mine = [f for f in frames if ("/" + name + "/") in f.filename or f.filename.endswith("/" + name + ".py")]
        at = (mine or frames or [None])[-1]
        where = {"file": at.filename, "line": at.lineno} if at else {}
        print(json.dumps({"failed": name, "error": (type(exc).__name__ + ": " + str(exc))[:600], **where}), flush=True)
    else:
        print(json.dumps({"imported": name}), flush=True)
"""
IMPORT_TIMEOUT = 600


def _import_each(names, paths):
    """{module: None (imported) or what went wrong}, each module of ``names`` imported in turn in one child process."""
    try:
        res = subprocess.run([sys.executable, "-c", PROJECT_IMPORTS, json.dumps(paths), *names], capture_output=True,
                             text=True, timeout=IMPORT_TIMEOUT, stdin=subprocess.DEVNULL)
        out, how = res.stdout, f"the import process ended with exit {res.returncode}: " + (
            res.stderr.strip().splitlines() or ["no message"])[-1][:400]
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        how = f"did not finish within {IMPORT_TIMEOUT} s"
    results, current = {}, None
    for line in out.splitlines():
        try:
            said = json.loads(line)
        except ValueError:
            continue  # a module's own print
        if not isinstance(said, dict):
            continue
        if "importing" in said:
            current = said["importing"]
        elif "imported" in said:
            results[said["imported"]], current = None, None
        elif "failed" in said:
            where = f" ({said['file']}, line {said['line']})" if said.get("file") else ""
            results[said["failed"]], current = f"{said.get('error')}{where}", None
    if current is not None:
        results[current] = how
    for name in names:
        results.setdefault(name, how)
    return results


def check_project_imports(manifest):
    """`project-imports`: the project's own wheel (`[image] install`, in the code layer) replaces no file below it,
    puts its modules in no other distribution's package by accident (a package extended on purpose is fine:
    _shared_packages), adds no .pth file run at every start, and each top-level module it installs imports, as a
    user would import it (the wheel's RECORD; top_level.txt where the backend wrote one), less `[image]
    skip_imports`."""
    from importlib import metadata

    project = manifest["project"]
    name, skip = facts.canon(project["name"]), set(project.get("skip_imports") or [])
    files, requires, top_level, others = set(), set(), None, []
    for dist in metadata.distributions(path=image_paths(manifest)):
        dist_name = facts.canon(dist.metadata["Name"] or "?")
        if dist_name == name:
            files, requires = _files(dist), _requires(dist)
            text = dist.read_text("top_level.txt")
            top_level = set(text.split()) if text else None
        else:
            others.append((dist_name, _files(dist), _requires(dist)))
    tops, pth = _top_levels(files)
    accidents, extended = _shared_packages(name, files, requires, others)
    ev = {"modules": sorted(tops), "pth": pth, "clashes": [a[3] for a in accidents], "extended": extended,
          "skipped": sorted(skip & tops)}
    if accidents or pth:
        said = [a[3] for a in accidents] + [f"the project's wheel adds {p}, which Python runs at every start"
                                            for p in pth]
        fixes = [f"rename the project's package {top} or leave it out of its wheel (setuptools: "
                 f"[tool.setuptools.packages.find] exclude; hatchling: [tool.hatch.build.targets.wheel] packages)"
                 + (f"; if it extends {other}'s package on purpose, add {other} to the project's dependencies"
                    if disjoint else "") for top, other, disjoint, _ in accidents[:2]]
        return check("project-imports", "fail", "; ".join(said),
                     "; ".join(fixes + (["drop the .pth file from the project's wheel"] if pth else [])), ev)
    importable = _importable(files, tops)
    if top_level:  # what the backend says the wheel's top-level modules are
        importable = (importable & top_level) or importable
    stale = sorted(skip - tops)
    names = sorted(importable - skip)
    results = _import_each(names, image_paths(manifest)) if names else {}
    failed = {n: why for n, why in results.items() if why}
    ev["imported"] = sorted(n for n, why in results.items() if not why)
    if failed:
        first = sorted(failed)[0]
        return check("project-imports", "fail", "; ".join(f"import {n} failed: {failed[n]}" for n in sorted(failed)),
                     f"fix the module, leave it out of the project's wheel, or, when it is not meant to be imported, "
                     f'skip it: [image] skip_imports = ["{first}"]', ev)
    said = (f"{len(names)} modules of the project's wheel import: " + ", ".join(names) if names else
            "the project's wheel installs no module to import")
    said += f"; skipped ([image] skip_imports): {', '.join(sorted(skip & tops))}" if skip & tops else ""
    said += f"; skip_imports names what the wheel does not install: {', '.join(stale)}" if stale else ""
    said += f"; extended on purpose: {', '.join(extended)}" if extended else ""
    return check("project-imports", "pass", said, "", ev)


def code_layer_paths(manifest, code_to):
    """Where the code layer's files lie: ``code_to`` (`[image] copy`) and, with `[image] install`, what the project's
    wheel installed (its RECORD: each top-level folder or file in site-packages, its scripts)."""
    from importlib import metadata

    paths = [code_to]
    name = facts.canon(((manifest.get("project") or {}).get("name")) or "")
    for dist in metadata.distributions(path=image_paths(manifest)) if name else []:
        if facts.canon(dist.metadata["Name"] or "?") != name:
            continue
        for f in dist.files or []:
            where = os.path.normpath(str(dist.locate_file(f)))
            if f.parts and f.parts[0] != "..":  # in site-packages: its top-level folder or file
                where = os.path.normpath(str(dist.locate_file(f.parts[0])))
            paths.append(where)
    return sorted(set(paths))


def code_layer_checks(manifest, left, code_to=None):
    """`--code-layer`: what the code layer (`[image] copy`, last) can change, when every layer below it is one a
    passing self-test ran on: the image's hygiene (a credential or .git in the copied folder), with `[image]
    install` the venv against the lock and `pip check` (the project's wheel is in that layer), and the smoke
    commands (the project's code). torch, CUDA, the compiler, numpy and the GPU live below it; with `[image] install`
    the project's wheel sits beside them in the venv: `project-imports` checks that it shadows none of them."""
    state = []
    if manifest.get("project"):
        state += [("dists-match-lock", check_distributions, manifest), ("pip-check", check_pip)]
    state.append(("image-hygiene", code_layer_hygiene, manifest, left, code_to))
    results = dict(side_by_side(state))
    if manifest.get("project"):  # after the files were judged: importing the project runs its code
        results["project-imports"] = guarded("project-imports", check_project_imports, manifest)
    order = ("dists-match-lock", "pip-check", "project-imports", "image-hygiene")  # the report's, as it always was
    return [results[cid] for cid in order if cid in results] + run_smoke(manifest)


def code_layer_hygiene(manifest, left, code_to):
    """image-hygiene of the code layer alone (the layers below it were judged by the run whose results are reused):
    ``code_to`` and the project's files, when each is a folder or file of its own there. The whole image when one
    is a link (what it names was not the code layer's to judge), the project's files cannot be found, or the host
    did not say where the code layer lies."""
    only = code_layer_paths(manifest, code_to) if code_to else None
    if only is not None:
        found_project = not manifest.get("project") or len(only) > 1
        if not found_project or any(os.path.islink(p) or not os.path.lexists(p) for p in only):
            only = None
    return hygiene.check_hygiene(left, check, "/", only)


def finish(manifest, checks, scope, planned=None):
    """The report on stdout; exit 1 on any failure. ``scope``: ``full``, or ``code-layer`` (the checks of the code
    layer alone: the host adds the results it reuses, which must cover ``planned``, what the full run would run)."""
    failed = [c["id"] for c in checks if c["status"] == "fail"]
    report = {"cell": manifest["cell"]["id"], "lock_hash": manifest["lock"]["hash"], "python": sys.version.split()[0],
              "checks": checks, "failed": failed, "passed": not failed, "scope": scope}
    if planned is not None:
        report["plan"] = planned
    print(json.dumps(report, indent=2, sort_keys=True))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
