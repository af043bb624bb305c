"""The doctor's checks of the GPUs (standard library only, Python >= 3.8): what nvidia-smi says of the driver and
the GPUs against the image's contract (driver floor, architectures, the host's CPU and glibc), and the torch CUDA
probe in a child process, with torch's own texts for why CUDA cannot be used."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys

if __package__:  # imported from the host's package, imagekit.in_image
    from . import facts
    from .doctor_expect import load_json, result
else:  # a program in the image, or sent to a pod: its sibling modules lie beside it
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import facts
    from doctor_expect import load_json, result


# Torch's own texts when CUDA cannot be used, and what each means (quoted from PyTorch / NVIDIA sources).
CUDA_CAUSES = [
    ("driver-too-old", r"The NVIDIA driver on your system is too old",
     "the host driver is older than this torch build's CUDA needs", "use a host with a newer driver, or an image "
     "with an older CUDA variant (imagekit explain --driver <version>)"),
    ("forward-compat-804", r"Error 804|forward compatibility was attempted on non supported HW",
     "CUDA forward compatibility was attempted on a GPU that does not support it (error 804)",
     "use a torch CUDA variant the host driver supports natively; remove cuda-compat libraries from the image"),
    ("driver-combination-803", r"Error 803|unsupported display driver / cuda driver combination",
     "the user-mode CUDA driver and the kernel driver do not match (error 803)",
     "restart the pod, or remove mismatched libcuda from the image"),
    ("no-driver", r"Found no NVIDIA driver on your system",
     "no NVIDIA driver is visible inside the container", "start the container with the NVIDIA runtime (--gpus all)"),
    ("no-kernel-image", r"no kernel image is available for execution on the device",
     "this torch build has no kernels for this GPU's architecture", "use a torch CUDA variant built for this GPU"),
]
SMI_FAILURES = [
    (r"Driver/library version mismatch", "the NVIDIA kernel module and user libraries differ (driver upgraded "
     "without reboot)", "reboot the host or reload the nvidia kernel module"),
    (r"couldn't communicate with the NVIDIA driver", "nvidia-smi cannot talk to the driver",
     "check that the NVIDIA driver is loaded on the host and the container runs with --gpus"),
    (r"No devices were found", "the driver is loaded but no GPU is attached", "check the GPU allocation"),
]


def parse_smi_query(text):
    """`nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total,uuid --format=csv,noheader`."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4 and re.match(r"^\d+$", parts[0]):
            gpus.append({"index": int(parts[0]), "name": parts[1], "driver": parts[2], "compute_cap": parts[3],
                         "memory": parts[4] if len(parts) > 4 else "", "uuid": parts[5] if len(parts) > 5 else ""})
    return gpus


def usable_gpu_count(gpus, cuda_visible_devices):
    """GPUs a CUDA process can use: CUDA_VISIBLE_DEVICES (indices or GPU-/MIG- UUID prefixes) filters the driver's
    list, and CUDA stops reading it at the first entry that names no GPU (so "" or "-1" hides them all)."""
    if cuda_visible_devices is None:
        return len(gpus)
    if "MIG-" in cuda_visible_devices:
        return None  # MIG instances are not in nvidia-smi's GPU list: unknown
    seen = []
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        if re.fullmatch(r"\d+", entry):
            match = [g for g in gpus if g["index"] == int(entry)]
        elif entry.startswith(("GPU-", "MIG-")):
            match = [g for g in gpus if g.get("uuid") and g["uuid"].startswith(entry)]
        else:
            match = []
        if len(match) != 1 or match[0]["index"] in seen:
            break
        seen.append(match[0]["index"])
    return len(seen)


def classify_smi_failure(text):
    for pattern, what, fix in SMI_FAILURES:
        if re.search(pattern, text, re.I):
            return what, fix
    return None


def query_gpus():
    """(gpus, error text or None, ran) from nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return [], None, False
    try:
        res = subprocess.run([smi, "--query-gpu=index,name,driver_version,compute_cap,memory.total,uuid",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], str(exc), True
    if res.returncode != 0:
        return [], (res.stdout + res.stderr).strip(), True
    return parse_smi_query(res.stdout), None, True


def version_key(v):
    return tuple(int(x) for x in re.findall(r"\d+", v))


def check_gpus(gpu_state, manifest, require_gpu):
    gpus, error, ran = gpu_state
    if error:
        cls = classify_smi_failure(error)
        what, fix = cls if cls else ("nvidia-smi failed", "check the NVIDIA driver on the host")
        return [result("nvidia-driver", "fail", f"{what}: {error[-300:]}", fix, {"nvidia_smi": error[-1000:]})]
    if not gpus:
        status = "fail" if require_gpu else "skip"
        why = "nvidia-smi is not available" if not ran else "nvidia-smi lists no GPU"
        return [result("nvidia-driver", status, f"no GPU: {why}",
                       "run with the NVIDIA runtime (docker run --gpus all)" if require_gpu else "", {})]
    out = [result("nvidia-driver", "pass", f"{len(gpus)} GPU(s), driver {gpus[0]['driver']}: "
                  + ", ".join(g["name"] for g in gpus), "", {"gpus": gpus})]
    contract = runtime_contract(manifest)
    if contract.get("driver_min"):
        floor = contract["driver_min"]
        driver = gpus[0]["driver"]
        ev = {"driver": driver, "minimum": floor, "variant": (manifest.get("torch") or {}).get("variant")}
        if version_key(driver) < version_key(floor):
            out.append(result("driver-floor", "fail", f"driver {driver} is below {floor}, the floor of this image's "
                              f"{ev['variant']} torch: CUDA init will fail and training would fall back to the CPU",
                              "pick a host with a newer driver or an image with an older CUDA variant", ev))
        else:
            out.append(result("driver-floor", "pass", f"driver {driver} >= {floor}", "", ev))
    if contract.get("sass"):
        archs = contract["sass"]
        ptx = contract.get("ptx")
        for g in gpus:
            ok, how = arch_runs(g["compute_cap"], archs, ptx)
            ev = {"gpu": g["name"], "compute_cap": g["compute_cap"], "archs": archs, "ptx": ptx, "via": how}
            if ok:
                out.append(result("gpu-arch", "pass", f"{g['name']} (sm_{g['compute_cap'].replace('.', '')}) runs "
                                  f"via {how}", "", ev))
            else:
                out.append(result("gpu-arch", "fail", f"{g['name']} is sm_{g['compute_cap'].replace('.', '')} but this "
                                  f"torch has kernels for {' '.join(archs)}: 'no kernel image is available'",
                                  "use an image whose torch CUDA variant supports this GPU", ev))
    return out


def runtime_contract(manifest):
    """What the image needs of its host (driver floor, GPU architectures, CPU architecture, glibc): the manifest's
    ``runtime`` object, or for a manifest from before it, the same facts from its driver and torch sections."""
    manifest = manifest or {}
    runtime = manifest.get("runtime")
    if isinstance(runtime, dict):
        return runtime
    return {"driver_min": (manifest.get("driver") or {}).get("minimum"),
            "sass": (manifest.get("torch") or {}).get("archs"), "ptx": (manifest.get("torch") or {}).get("ptx")}


# platform.machine() -> the OCI architecture an image is built for
MACHINES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def check_host_contract(manifest, machine=None, glibc=None):
    """The host's CPU architecture and C library against the image's contract: an amd64 image on an arm64 host
    runs (if at all) under emulation with no GPU, and wheels built for a newer glibc fail to load."""
    contract = runtime_contract(manifest)
    want_platform, want_glibc = contract.get("platform"), contract.get("glibc_min")
    if not want_platform and not want_glibc:
        return [result("host-contract", "skip", "the manifest names no CPU architecture or glibc floor")]
    machine = platform.machine() if machine is None else machine
    if glibc is None:
        try:
            glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]  # "glibc 2.36"
        except (AttributeError, ValueError, OSError, IndexError):
            glibc = None
    have = MACHINES.get(machine, machine)
    ev = {"machine": machine, "glibc": glibc, "platform": want_platform, "glibc_min": want_glibc}
    problems = []
    if want_platform and want_platform.split("/")[-1] != have:
        problems.append(f"this host is {machine} ({have}) but the image is built for {want_platform}")
    if want_glibc and glibc and version_key(glibc) < version_key(want_glibc):
        problems.append(f"glibc {glibc} is older than {want_glibc}, the floor of this image's torch wheels")
    if problems:
        return [result("host-contract", "fail", "; ".join(problems),
                       f"run it on a {want_platform or 'matching'} host (or use an image built for this one)", ev)]
    return [result("host-contract", "pass", f"{have} host, glibc {glibc or '?'}: inside the image's contract "
                   f"({want_platform or '?'}, glibc >= {want_glibc or '?'})", "", ev)]


def arch_runs(cc, archs, ptx):
    how = facts.best_kernel(cc, archs, ptx)
    if how is None:
        return False, None
    if how[0] == "cubin":
        return True, "cubin sm_{}{}".format(*how[1])
    return True, f"PTX JIT from {ptx}"


# ---------------------------------------------------------------------------------------------------------
# Standard tier: one torch probe in a child process
# ---------------------------------------------------------------------------------------------------------
TORCH_PROBE = r"""
import json, warnings
out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        import torch
    except Exception as exc:
        print(json.dumps({"import_error": repr(exc)})); raise SystemExit(0)
    out["version"] = torch.__version__
    out["cuda"] = torch.version.cuda
    try:
        out["available"] = torch.cuda.is_available()
        out["count"] = torch.cuda.device_count() if out["available"] else 0
    except Exception as exc:
        out["available"] = False; out["init_error"] = repr(exc)
    if not out.get("available") and "init_error" not in out and out["cuda"]:
        try:
            torch.cuda.init()  # is_available() hides why; init() raises torch's own text
        except Exception as exc:
            out["init_error"] = repr(exc)
    if out.get("available"):
        out["arch_list"] = torch.cuda.get_arch_list()
        try:
            x = torch.ones(1024, device="cuda")
            out["kernel_sum"] = float((x * 2).sum().item())
        except Exception as exc:
            out["kernel_error"] = repr(exc)
out["warnings"] = [str(w.message) for w in caught]
print(json.dumps(out))
"""


HIDING_CVD = ("", "-1", "none", "void", "nodevfiles")


def classify_cuda_failure(text, torch_cuda, cuda_visible_devices=None):
    if torch_cuda is None:
        return ("cpu-only-wheel", "this torch is a CPU-only build (torch.version.cuda is None)",
                "install the CUDA build the image pins; a CPU wheel replaced it")
    if cuda_visible_devices is not None and cuda_visible_devices.strip().lower() in HIDING_CVD:
        return ("cuda-visible-devices", f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} hides every GPU from torch",
                "unset CUDA_VISIBLE_DEVICES, or list the GPUs to use (e.g. CUDA_VISIBLE_DEVICES=0,1)")
    for cid, pattern, what, fix in CUDA_CAUSES:
        if re.search(pattern, text or "", re.I):
            return cid, what, fix
    return ("unknown", "CUDA could not be initialised", "read the warnings in the evidence")


def start_torch_probe(python):
    """Start the probe in a child now (importing torch is most of its time) and read it later. It may import torch
    where the image refuses it (cuda_guard.py, IMAGEKIT_ALLOW_CPU): it is what says why."""
    return subprocess.Popen([python, "-c", TORCH_PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "IMAGEKIT_ALLOW_CPU": "1"})


def probe_problem(probe):
    """The first field of the probe's answer that is not of the type TORCH_PROBE prints, or None."""
    if not isinstance(probe, dict):
        return "not an object"
    for field, kinds in (("import_error", str), ("init_error", str), ("kernel_error", str), ("version", str),
                         ("cuda", (str, type(None))), ("available", bool), ("count", int), ("kernel_sum", float)):
        if field in probe and not isinstance(probe[field], kinds):
            return f"{field} has the wrong type"
    for field in ("warnings", "arch_list"):
        if field in probe and not (isinstance(probe[field], list) and all(isinstance(w, str) for w in probe[field])):
            return f"{field} is not a list of strings"
    if "import_error" not in probe and not isinstance(probe.get("version"), str):
        return "version is missing"
    if probe.get("available") and not isinstance(probe.get("count"), int):
        return "count is missing"
    return None


def check_torch_probe(python, gpu_state, timeout, gpu_required=False, proc=None, in_image=True):
    """The torch CUDA probe. GPUs visible to the driver (or required) while torch sees none is a blocker."""
    gpus = gpu_state[0]
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    proc = proc or start_torch_probe(python)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return result("torch-probe", "error", f"the torch probe did not finish in {timeout} s",
                      "a hung CUDA init often means a wedged GPU; check nvidia-smi", {})
    try:
        probe = load_json(stdout.strip().splitlines()[-1], "the torch probe's answer")
    except (ValueError, IndexError):
        return result("torch-probe", "error", f"the torch probe crashed: {stderr.strip()[-500:]}", "", {})
    problem = probe_problem(probe)
    if problem:
        return result("torch-probe", "error", f"the torch probe answered in the wrong shape: {problem}",
                      f"check that {python} is a Python interpreter (--python)", {})
    if "import_error" in probe:
        fix = ("the environment is broken; rebuild or re-pull the image" if in_image else
               f"install torch into {python}'s environment, or pass --python for the one your training runs")
        return result("torch-probe", "fail", f"import torch failed: {probe['import_error']}", fix, probe)
    text = " ".join(probe.get("warnings", [])) + " " + probe.get("init_error", "") + " " + probe.get("kernel_error", "")
    if probe.get("available"):
        if "kernel_error" in probe:
            cid, what, fix = classify_cuda_failure(text, probe.get("cuda"), cvd)
            return result("torch-probe", "fail", f"a CUDA kernel failed: {what}", fix, probe)
        return result("torch-probe", "pass", f"torch {probe['version']} sees {probe['count']} GPU(s); a kernel ran",
                      "", probe)
    if gpus or gpu_required:
        cid, what, fix = classify_cuda_failure(text, probe.get("cuda"), cvd)
        probe["cause"] = cid
        probe["cuda_visible_devices"] = cvd
        seen = f"{len(gpus)} GPU(s) visible to the driver" if gpus else "a GPU is required (IMAGEKIT_REQUIRE_GPU=1)"
        return result("cpu-fallback", "fail", f"{seen} but torch sees none: {what}. Training would silently run "
                      "on the CPU", fix, probe)
    return result("torch-probe", "skip", f"torch {probe['version']} imports; no GPU to probe", "", probe)


def gpu_checks(ctx):
    """The driver and the GPUs against the image's contract, and the host's CPU and glibc."""
    ctx.gpu_results = check_gpus(ctx.gpu_state, ctx.manifest, ctx.require_gpu)
    return ctx.gpu_results + check_host_contract(ctx.manifest)


def probe_checks(ctx):
    """The torch CUDA probe started at the beginning (standard and deep tiers; the start tier where a GPU is
    expected); with no nvidia-smi in the container (NVIDIA_DRIVER_CAPABILITIES without utility) but kernels running,
    the driver check becomes a warning."""
    if ctx.probe_proc is None:
        return []
    probe = check_torch_probe(ctx.python, ctx.gpu_state, ctx.args.timeout, ctx.require_gpu, ctx.probe_proc,
                              ctx.in_image)
    driver = ctx.gpu_results[0] if ctx.gpu_results else None
    if driver is not None and probe["status"] == "pass" and driver["status"] == "fail" and not ctx.gpu_state[2]:
        driver.update(status="warn", message=f"nvidia-smi is not available, but torch sees "
                      f"{probe['evidence'].get('count')} GPU(s)",
                      fix="add utility to NVIDIA_DRIVER_CAPABILITIES to get driver and architecture checks")
    return [probe]
