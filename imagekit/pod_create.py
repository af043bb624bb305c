"""`imagekit pod create`: a RunPod pod only on a host that can run the image (pure).

Two filters from the cell's compatibility facts: the host's CUDA version (RunPod's ``allowedCudaVersions``: those at or
above the image's CUDA, so its driver runs the wheels with the full feature set, PTX JIT included), and the GPU type
(refused, with the GPUs that would work, when the cell's torch build has no kernel for its architecture). The
lifetime guard's env comes from flags, checked by the guard's own parser.
"""

from __future__ import annotations

import math
import re

from imagekit import rules, runpod
from imagekit.compat import CompatData
from imagekit.errors import UsageError
from imagekit.in_image import facts
from imagekit.model import variant_of
from imagekit.validate import cc_to_sm

# RunPod REST v1 `POST /pods` allowedCudaVersions: the values its API takes
# (https://docs.runpod.io/api-reference/pods/POST/pods, PodCreateInput.allowedCudaVersions)
RUNPOD_CUDA_VERSIONS = ("11.8", "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.7", "12.8", "12.9", "13.0")
CLOUDS = ("secure", "community")
_TORCH = re.compile(r"[0-9]{1,3}(\.[0-9]{1,4}){1,3}", re.ASCII)
_CUDA = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}", re.ASCII)
_GPU_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()+-]{0,79}", re.ASCII)


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def allowed_cuda_versions(cuda: str) -> list[str]:
    """The host CUDA versions (as RunPod names them) whose drivers run ``cuda`` wheels with every feature: the same
    or newer (a driver runs what was built for its CUDA version or older; compat-facts, NV)."""
    allowed = [v for v in RUNPOD_CUDA_VERSIONS if _key(v) >= _key(cuda)]
    if not allowed:
        raise UsageError(
            f"RunPod's API names no host CUDA version at or above {cuda} (it knows up to {RUNPOD_CUDA_VERSIONS[-1]})",
            "create the pod in RunPod's console, filtering by CUDA version there",
        )
    return allowed


def known_gpu(data: CompatData, gpu: str) -> str | None:
    """The GPU imagekit knows inside ``gpu`` (RunPod's id, 'NVIDIA GeForce RTX 3090', or the short 'RTX 3090'): the
    longest known name found as whole words, so 'A100' is never read as 'A10'."""
    found = [
        name for name in data.gpus
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", gpu, re.IGNORECASE)
    ]  # fmt: skip
    return max(found, key=len) if found else None


def check_gpu(data: CompatData, torch: str, cuda: str, gpu: str, arch: str | None = None) -> str:
    """How the cell's torch build runs on ``gpu`` ('cubin sm_86', 'ptx'); a GPU it has no kernel for is refused
    naming the GPUs that would work. ``arch`` ('sm_86', '8.6') overrides what the name says."""
    if not _GPU_ID.fullmatch(gpu):
        raise UsageError(f"--gpu {gpu[:80]!r} is not a GPU type id", "give RunPod's id, e.g. 'NVIDIA GeForce RTX 3090'")
    name = known_gpu(data, gpu)
    cc = arch or (data.gpus[name] if name else None)
    if cc is None:
        raise UsageError(
            f"imagekit does not know the architecture of {gpu!r}",
            f"pass --arch sm_XY (its compute capability), or name one of {', '.join(sorted(data.gpus))}",
        )
    entry = data.arch_entry(torch, variant_of(cuda))
    if entry is None:
        raise UsageError(f"no architecture list for torch {torch}+{variant_of(cuda)}", "check the cell id")
    parsed = facts.parse_arch(cc)
    if parsed is None:
        raise UsageError(f"--arch {cc[:40]!r} is not a GPU architecture", "give its compute capability: sm_86 or 8.6")
    target = f"sm_{parsed[0]}{parsed[1]}{parsed[2]}"
    how = rules.how_arch_runs(entry, target)
    if how is None:
        works = sorted(n for n, c in data.gpus.items() if rules.how_arch_runs(entry, cc_to_sm(c)) is not None)
        have = ", ".join(cc_to_sm(a) for a in entry.archs) + (f" + PTX {cc_to_sm(entry.ptx)}" if entry.ptx else "")
        raise UsageError(
            f"torch {torch}+{variant_of(cuda)} has no kernels for {gpu} ({target}; it has {have}): "
            "every kernel would fail with 'no kernel image is available for execution on the device'",
            f"pick a GPU it runs on ({', '.join(works)}), or a cell with a newer torch/CUDA for this GPU "
            f"(imagekit explain --gpu {name or target})",
        )
    return how


def guard_env(max_runtime: str | None, idle_stop: str | None, on_exit: str | None) -> dict[str, str]:
    """The lifetime guard's settings for the pod's env, checked as the guard reads them."""
    env = {}
    for flag, name, value in (
        ("--max-runtime", "IMAGEKIT_MAX_RUNTIME", max_runtime),
        ("--idle-stop", "IMAGEKIT_IDLE_STOP", idle_stop),
    ):
        if value is not None:
            try:
                facts.parse_duration(value, flag)
            except facts.SettingError as exc:
                raise UsageError(str(exc), f"for example {flag} 6h") from None
            env[name] = value.strip()
    if on_exit is not None:
        if on_exit not in facts.GUARD_ACTIONS:
            raise UsageError(f"--on-exit {on_exit[:40]!r}: stop or terminate", "stop keeps the volume; terminate not")
        env["IMAGEKIT_ON_EXIT"] = on_exit
    return env


def body(
    entry: dict,
    data: CompatData,
    gpu: str,
    *,
    count: int = 1,
    cloud: str = "secure",
    volume_gb: int = 50,
    registry_auth: str | None = None,
    arch: str | None = None,
    env: dict[str, str] | None = None,
) -> dict:
    """RunPod's `POST /pods` body for a release-index entry: the template's image, disk, ports and env, plus the host
    filters and the guard's env."""
    cell = entry["manifest"]["cell"]
    torch, cuda = cell.get("torch"), cell.get("cuda")
    if not (isinstance(torch, str) and _TORCH.fullmatch(torch) and isinstance(cuda, str) and _CUDA.fullmatch(cuda)):
        raise UsageError(
            f"the release index's entry for {entry['tag']} does not name its torch and CUDA versions",
            "publish it again with this imagekit (`imagekit build --push`)",
        )
    check_gpu(data, torch, cuda, gpu, arch)
    if cloud not in CLOUDS:
        raise UsageError(f"--cloud {cloud[:40]!r}: secure or community", "RunPod's cloudType")
    if isinstance(count, bool) or not 1 <= count <= 8:
        raise UsageError(f"--count {count}: 1 to 8 GPUs", "one pod's GPUs")
    template = runpod.template(entry, volume_gb=volume_gb, registry_auth=registry_auth)
    pod_env = {e["key"]: e["value"] for e in template["env"]} | (env or {})
    out = {
        "name": template["name"],
        "imageName": template["imageName"],
        "computeType": "GPU",
        "gpuTypeIds": [gpu],
        "gpuCount": count,
        "allowedCudaVersions": allowed_cuda_versions(cuda),
        "cloudType": cloud.upper(),
        "containerDiskInGb": template["containerDiskInGb"],
        "volumeInGb": volume_gb,
        "volumeMountPath": "/workspace",
        "ports": template["ports"].split(","),
        "env": pod_env,
    }
    if registry_auth is not None:
        out["containerRegistryAuthId"] = template["containerRegistryAuthId"]
    return out


def cost(answer: dict) -> str:
    """The pod's price per hour from RunPod's answer, shown as plain text ('0.74 $/h'), or '?'."""
    for key in ("adjustedCostPerHr", "costPerHr"):
        value = answer.get(key)
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(number) and 0 <= number < 10_000:
            return f"{number:.2f} $/h"
    return "?"
