"""`imagekit pod create`: a RunPod pod only on a host that can run the image (pure).

Two filters from the image's runtime contract (its release record): the host's CUDA version (RunPod's
``allowedCudaVersions``: those at or above the image's CUDA, so its driver runs the wheels with the full feature set,
PTX JIT included), and the GPU type (refused, with the GPUs that would work, when the image's torch build has no
kernel for its architecture). The
lifetime guard's env is `guard_defaults`' (armed unless --no-guard), checked by the guard's own parser.
"""

from __future__ import annotations

import math
import re

from imagekit.clouds import providers, runpod
from imagekit.compat import contract
from imagekit.compat.catalog import CompatData
from imagekit.compat.contract import Contract
from imagekit.errors import UsageError
from imagekit.in_image import facts

CLOUDS = providers.pod_provider().pod_clouds
GRACE_GPUS = contract.GRACE_GPUS
# RunPod's GPU type id as --gpu takes it (the release page quotes the GPU a self-test ran on only when it fits)
GPU_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()+-]{0,79}", re.ASCII)


def known_gpu(data: CompatData, gpu: str) -> str | None:
    """The GPU imagekit knows inside ``gpu`` (RunPod's id, 'NVIDIA GeForce RTX 3090', or the short 'RTX 3090'): the
    longest known name found as whole words, so 'A100' is never read as 'A10'."""
    found = [
        name for name in data.gpus
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", gpu, re.IGNORECASE)
    ]  # fmt: skip
    return max(found, key=len) if found else None


def platform_of_gpu(data: CompatData, gpu: str) -> str:
    """The platform of the hosts ``gpu`` comes on: linux/arm64 for a Grace GPU, else linux/amd64."""
    return "linux/arm64" if known_gpu(data, gpu) in GRACE_GPUS else "linux/amd64"


def check_gpu(data: CompatData, runtime: Contract, gpu: str, arch: str | None = None) -> str:
    """How the image's torch build runs on ``gpu`` ('cubin sm_86', 'PTX sm_90'), by the image's runtime contract; a GPU
    it has no kernel for is refused naming the GPUs that would work. ``arch`` ('sm_86', '8.6') overrides the name."""
    if not GPU_ID.fullmatch(gpu):
        raise UsageError(f"--gpu {gpu[:80]!r} is not a GPU type id", "give RunPod's id, e.g. 'NVIDIA GeForce RTX 3090'")
    name = known_gpu(data, gpu)
    cc = arch or (data.gpus[name] if name else None)
    if cc is None:
        raise UsageError(
            f"imagekit does not know the architecture of {gpu!r}",
            f"pass --arch sm_XY (its compute capability), or name one of {', '.join(sorted(data.gpus))}",
        )
    parsed = facts.parse_arch(cc)
    if parsed is None:
        raise UsageError(f"--arch {cc[:40]!r} is not a GPU architecture", "give its compute capability: sm_86 or 8.6")
    if name in GRACE_GPUS and runtime.platform != "linux/arm64":
        raise UsageError(
            f"{gpu} hosts are arm64 (Grace CPUs), and this image is {runtime.platform}: it would not start there",
            "pick a GPU on an x86_64 host (H100, H200, B200), or build the cell for linux/arm64 ([matrix] platforms)",
        )
    if name is not None and name not in GRACE_GPUS and runtime.platform == "linux/arm64":
        raise UsageError(
            f"{gpu} hosts are x86_64, and this image is {runtime.platform}: it would not start there",
            f"pick a Grace GPU ({', '.join(GRACE_GPUS)}), or the cell's linux/amd64 image",
        )
    target = f"sm_{parsed[0]}{parsed[1]}{parsed[2]}"
    how = runtime.how_runs(target)
    if how is None:
        works = contract.gpus(runtime, data)[0]
        raise UsageError(
            f"the image's torch has no kernels for {gpu} ({target}; it has {runtime.archs_text()}): "
            "every kernel would fail with 'no kernel image is available for execution on the device'",
            f"pick a GPU it runs on ({', '.join(works) or 'none imagekit knows'}), or a cell whose torch and CUDA "
            f"have kernels for it (imagekit explain --arch {name or target} --torch X --cuda Y)",
        )
    return how


MIN_VOLUME_GB = 10  # RunPod REST v2: a persistent mount's size is at least 10 GB


def body(
    entry: dict,
    data: CompatData,
    gpu: str,
    *,
    count: int = 1,
    cloud: str = CLOUDS[0],
    volume_gb: int = 50,
    registry_auth: str | None = None,
    arch: str | None = None,
    guard: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> dict:
    """RunPod's `POST /v2/pods` body for a release-index entry: the template's image, disk, ports and env, plus the
    host filters (the GPU type, its count, the host CUDA versions), the pod volume on /workspace, the guard's env
    (``guard``, `guard_defaults.env`; None: its defaults) and ``env`` (the marks `pod reap` finds the pod by,
    `guard_defaults.marks`)."""
    runtime = contract.from_record(entry, data)
    check_gpu(data, runtime, gpu, arch)
    if cloud not in CLOUDS:
        raise UsageError(f"--cloud {cloud[:40]!r}: {' or '.join(CLOUDS)}", "RunPod's cloudType")
    if isinstance(count, bool) or not 1 <= count <= 8:
        raise UsageError(f"--count {count}: 1 to 8 GPUs", "one pod's GPUs")
    if registry_auth is not None:
        try:
            runpod.registry_auth_id(registry_auth)
        except ValueError as exc:
            raise UsageError(f"invalid --registry-auth: {exc}", "the id RunPod shows for the credentials") from None
    if isinstance(volume_gb, bool) or not MIN_VOLUME_GB <= volume_gb <= 10_000:
        raise UsageError(f"--volume {volume_gb}: {MIN_VOLUME_GB} to 10000 GB", "RunPod's pod volumes start at 10 GB")
    template = runpod.template(entry, volume_gb=volume_gb, registry_auth=registry_auth, guard=guard)
    pod_env = {e["key"]: e["value"] for e in template["env"]} | (env or {})
    out = {
        "name": template["name"],
        "image": template["imageName"],
        "gpu": {"id": gpu, "count": count, "allowedCudaVersions": runpod.allowed_cuda_versions(runtime.cuda)},
        "cloud": cloud.upper(),
        "disk": template["containerDiskInGb"],
        "mounts": {"persistent": {"size": volume_gb, "path": "/workspace"}},
        "ports": template["ports"].split(","),
        "env": pod_env,
    }
    if registry_auth is not None:
        out["registry"] = template["containerRegistryAuthId"]
    return out


def cost(answer: dict) -> str:
    """The pod's price per hour from RunPod's answer (v2's ``cost``), shown as plain text ('0.74 $/h'), or '?'."""
    for key in ("cost", "adjustedCostPerHr", "costPerHr"):
        value = answer.get(key)
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(number) and 0 <= number < 10_000:
            return f"{number:.2f} $/h"
    return "?"
