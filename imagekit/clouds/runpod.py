"""RunPod: its row of the provider registry and its template for a published image (the input of RunPod's
`saveTemplate` GraphQL mutation), with the options of `imagekit runpod-template`. Pure."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from imagekit.clouds import guard_defaults, reap
from imagekit.clouds.provider_spec import Provider, TemplateCommand, TemplateOption
from imagekit.clouds.pull import unreachable_registry as unreachable_registry  # `pod create` checks by this name
from imagekit.clouds.readme import shown_word, source_line, tested_line
from imagekit.errors import UsageError
from imagekit.in_image import facts
from imagekit.trust import untrusted
from imagekit.trust.untrusted import printable

if TYPE_CHECKING:
    from imagekit.compat.catalog import CompatData
    from imagekit.compat.contract import Contract

SAVE_TEMPLATE = (
    "mutation saveTemplate($input: SaveTemplateInput) { saveTemplate(input: $input) "
    "{ id name imageName containerDiskInGb volumeInGb volumeMountPath ports } }"
)


# RunPod REST v1 `POST /pods` allowedCudaVersions: the values its API takes
# (https://docs.runpod.io/api-reference/pods/POST/pods, PodCreateInput.allowedCudaVersions)
RUNPOD_CUDA_VERSIONS = ("11.8", "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.7", "12.8", "12.9", "13.0")


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def allowed_cuda_versions(cuda: str) -> list[str]:
    """The host CUDA versions (as RunPod names them) whose drivers run ``cuda`` wheels with every feature: the same
    or newer (a driver runs what was built for its CUDA version or older; compat-facts, NV). When RunPod's list ends
    below ``cuda`` (13.2 wheels, a list ending at 13.0), the same major's versions: CUDA's minor-version compatibility
    runs them on the major family's driver floor (compat-facts 2a), which is what the image's contract asks."""
    allowed = [v for v in RUNPOD_CUDA_VERSIONS if _key(v) >= _key(cuda)]
    if not allowed:
        allowed = [v for v in RUNPOD_CUDA_VERSIONS if _key(v)[0] == _key(cuda)[0]]
    if not allowed:
        raise UsageError(
            f"RunPod's API names no host CUDA version at or above {cuda} (it knows up to {RUNPOD_CUDA_VERSIONS[-1]})",
            "create the pod in RunPod's console, filtering by CUDA version there",
        )
    return allowed


MAX_VOLUME_GB = 10_000


def template(
    entry: dict,
    *,
    with_digest: bool = False,
    volume_gb: int = 50,
    require_gpu: bool = True,
    registry_auth: str | None = None,
    runtime: Contract | None = None,
    data: CompatData | None = None,
    guard: dict[str, str] | None = None,
) -> dict:
    """From a release-index entry (as `release_index.read_index` checked it: every field read here has its type,
    grammar and range, the optional ones may be absent): pinned to the immutable tag (optionally @digest), disk
    sized from the image, listing only the ports the image serves (22 for its sshd; 8888 when JupyterLab is in it);
    the readme says which hosts to rent (the console has no filter a template can set) from the image's ``runtime``
    contract and, with ``data``, the GPUs its torch runs on and those it does not. An entry made from the image's
    labels (``pinned``) is always named by its digest too. ``guard``: the lifetime guard's env (None: the defaults,
    `guard_defaults`), in the env and said in the readme."""
    if isinstance(volume_gb, bool) or not isinstance(volume_gb, int) or not 1 <= volume_gb <= MAX_VOLUME_GB:
        raise ValueError(f"volume_gb must be 1 to {MAX_VOLUME_GB}")
    image = entry["tag"] + (f"@{entry['digest']}" if with_digest or entry.get("pinned") is True else "")
    size_gb = entry.get("size_bytes", 0) / 1e9
    container_disk = max(20, math.ceil(size_gb * 1.5 + 10))
    cell = entry["manifest"]["cell"]
    features = entry["manifest"].get("image") or {}
    jupyter = features.get("jupyter") is True
    ports = ",".join(features.get("ports") or ["22/tcp"])
    env = [
        {"key": "HF_HOME", "value": "/workspace/.cache/huggingface"},
        {"key": "IMAGEKIT_REQUIRE_GPU", "value": "1" if require_gpu else "0"},
    ]
    guard = guard_defaults.env(guard_defaults.GuardChoice()) if guard is None else guard
    env += [{"key": k, "value": v} for k, v in guard.items()]
    env.append({"key": guard_defaults.CREATED, "value": "template"})  # `pod reap` knows the pod as imagekit's
    auth = {} if registry_auth is None else {"containerRegistryAuthId": registry_auth_id(registry_auth)}
    return {
        **auth,
        "name": f"imagekit {cell['id']}",
        "imageName": image,
        "containerDiskInGb": container_disk,
        "volumeInGb": volume_gb,
        "volumeMountPath": "/workspace",
        "ports": ports,
        "env": env,
        "isServerless": False,
        "dockerArgs": "",
        "readme": readme(entry, jupyter, runtime, data, guard),
    }


def rent_lines(runtime: Contract, data: CompatData | None) -> list[str]:
    """What to pick in RunPod's console so the pod lands on a host that runs the image (`pod create` sets the same)."""
    try:
        cuda = f"CUDA version filter: {', '.join(allowed_cuda_versions(runtime.cuda))}"
    except UsageError:
        cuda = f"no RunPod CUDA filter reaches {runtime.cuda}, pick the host by its driver"
    lines = [
        f"Rent: {cuda} (the host's driver must be >= {runtime.driver_min}; CUDA {runtime.cuda} wheels); "
        f"{runtime.platform} hosts; GPU architectures {runtime.archs_text()}.",
    ]
    if data is not None:
        from imagekit.compat import contract

        lines.append(contract.gpu_line(runtime, data))
    return lines


def jupyter_line(entry: dict, jupyter: bool) -> str:
    if jupyter:
        return "Jupyter: JupyterLab on 8888/http, serving /workspace, password JUPYTER_PASSWORD."
    if "source" in entry and "jupyter" not in (entry["manifest"].get("image") or {}):
        return "Jupyter: the image's labels do not say whether JupyterLab is in it; this template opens 22/tcp only."
    return "Jupyter: not in this image (build it with `[image] jupyter = true`)."


def readme(
    entry: dict,
    jupyter: bool,
    runtime: Contract | None = None,
    data: CompatData | None = None,
    guard: dict[str, str] | None = None,
) -> str:
    m = entry["manifest"]
    cell = m["cell"]
    known = shown_word
    driver = known((m.get("driver") or {}).get("minimum"))
    archs = ", ".join(shown_word(a) for a in (m.get("torch") or {}).get("archs") or []) or "?"
    needs = (
        rent_lines(runtime, data)
        if runtime is not None
        else [f"Needs an NVIDIA driver >= {driver}; GPU architectures: {archs}."]
    )
    lines = [
        f"# imagekit {shown_word(cell.get('id'))}",
        f"torch {known(cell.get('torch'))}+{known(cell.get('variant'))}, transformers "
        f"{known(cell.get('transformers'))}, Python {known(cell.get('python'))}; "
        f"every package pinned by hash (image {entry['tag']}, digest {entry['digest']}).",
        *needs,
        *tested_line(entry),
        *source_line(entry),
        "",
        "SSH: add your public key to the account (PUBLIC_KEY); the image runs sshd on 22/tcp with key-only root "
        "login. Use the direct TCP port for `ssh root@IP -p PORT 'cmd'`, scp, sftp and rsync (the proxied gateway "
        "is a console only). Host key fingerprints are in the pod's logs.",
        jupyter_line(entry, jupyter),
        "Volume: /workspace is the pod's volume: it survives a stop (and is billed while stopped), not a terminate, "
        "which deletes it with the pod (only a network volume survives). HF_HOME=/workspace/.cache/huggingface keeps "
        "model downloads. Everything else is lost when the pod stops.",
        guard_defaults.readme_line(
            guard_defaults.env(guard_defaults.GuardChoice()) if guard is None else guard,
            "imagekit runpod-template",
            " It ends the pod with RunPod's in-pod key; from outside, `imagekit pod reap` stops the pods it missed "
            "(IMAGEKIT_CREATED marks them) once past their --deadline, and with --older-than 1d those a day old that "
            "RunPod reports no GPU or CPU work on (age alone never ends a pod that trains).",
        ),
        "Start check: the pod checks the environment and torch's CUDA before anything runs; on a blocker it stays "
        "up and the logs and login banner say what to fix. Launch with `imagekit-doctor && accelerate launch "
        "train.py` so training never starts on a broken pod or silently on the CPU.",
    ]
    return "\n".join(lines)


def volumes(pod: dict) -> tuple[float, bool, str]:
    """(the pod volume's size in GB, whether a network volume is attached, where the volume is mounted) from RunPod's
    `GET /v2/pods/{id}` answer: ``mounts.persistent`` ({size, path}: the pod volume, deleted with the pod) or
    ``mounts.network`` ([{volumeId, path}]: it outlives the pod). Hostile until read here: a field of another type
    counts as absent."""
    mounts = pod.get("mounts") if isinstance(pod.get("mounts"), dict) else {}
    persistent = mounts.get("persistent") if isinstance(mounts.get("persistent"), dict) else {}
    size = persistent.get("size")
    gb = float(size) if isinstance(size, int | float) and not isinstance(size, bool) and 0 < size < 1e6 else 0.0
    network = mounts.get("network")
    attached = isinstance(network, list) and any(
        isinstance(n, dict) and isinstance(n.get("volumeId"), str) and n["volumeId"].strip() for n in network
    )
    mount = persistent.get("path")
    path = mount if isinstance(mount, str) and re.fullmatch(r"/[A-Za-z0-9._/-]{0,200}", mount) else "/workspace"
    return gb, attached, path


def terminate_warning(pod_id: str, pod: dict) -> str | None:
    """What `pod terminate` says before it deletes a pod whose files die with it: a pod volume and no network
    volume (RunPod deletes the pod volume on terminate; only a network volume outlives the pod)."""
    gb, network, path = volumes(pod)
    if network or not gb:
        return None
    return (
        f"pod {pod_id} has no network volume: terminate deletes its {gb:g} GB pod volume on {path} with every file "
        f"on it. Copy what you need first (imagekit pod cp TARGET:{path}/out ./out), or `imagekit pod stop "
        f"{pod_id}` keeps the volume (billed while stopped)"
    )


_AUTH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", re.ASCII)


def registry_auth_id(value: str) -> str:
    """The id of a registry credential saved in RunPod (Settings > Container Registry Auth)."""
    if not isinstance(value, str) or not _AUTH_ID.fullmatch(value):
        raise ValueError("a RunPod registry auth id: letters, digits, '_' and '-', at most 64")
    return value


def check_registry_auth(value: str) -> None:
    """--registry-auth: RunPod's id of registry credentials, or a usage error."""
    try:
        registry_auth_id(value)
    except ValueError as exc:
        raise UsageError(
            f"invalid --registry-auth {printable(value)[:80]!r}: {exc}",
            "pass the id RunPod shows under Settings > Container Registry Auth",
        ) from None


def mutation(template_input: dict) -> dict:
    return {"query": SAVE_TEMPLATE, "variables": {"input": template_input}}


def _pod_create():  # type: ignore[no-untyped-def]
    """`clouds.pod_create` (RunPod's create request), imported when asked: it builds on this module's template."""
    from imagekit.clouds import pod_create

    return pod_create


_STATUSES = ("RUNNING", "EXITED", "TERMINATED")
_STARTING = ("PROVISIONING", "STARTING")  # on its way to RUNNING, billed as one
_POD_ID = re.compile(r"[A-Za-z0-9_]{4,64}", re.ASCII)


def reap_pod(pod: dict, records: list[reap.Record]) -> reap.Pod | None:
    """A pod of RunPod's REST v2 `GET /v2/pods` (``id``, ``name``, ``status``, ``env``, ``startedAt``, ``cost``,
    ``runtime``) as `pod reap` reads it, or None when it has no id imagekit could act on."""
    pod_id = pod.get("id")
    if not isinstance(pod_id, str) or not _POD_ID.fullmatch(pod_id):
        return None
    env = pod.get("env") if isinstance(pod.get("env"), dict) else {}
    name = pod.get("name")
    name = untrusted.printable(name, 80) if isinstance(name, str) else "?"
    status = pod.get("status")
    status = "RUNNING" if status in _STARTING else status if status in _STATUSES else "?"
    started = guard_defaults.parse_stamp(pod.get("startedAt"))
    ours, created, deadline = reap.whose(pod_id, env, records, started)
    return reap.Pod(pod_id, name, status, ours, created, started, deadline, reap.price(pod, ("cost",)), work(pod))


def work(pod: dict) -> tuple[float, ...] | None:
    """The utilisation RunPod reports of a running pod (``runtime.gpus[].util``, then ``runtime.cpu.util``, each
    0-100), or None when it reports none (``runtime`` null, or no number where one should be)."""
    runtime = pod.get("runtime")
    if not isinstance(runtime, dict):
        return None
    gpus = runtime.get("gpus") if isinstance(runtime.get("gpus"), list) else []
    found = [reap.percent(g.get("util")) for g in gpus if isinstance(g, dict)]
    cpu = runtime.get("cpu")
    found.append(reap.percent(cpu.get("util")) if isinstance(cpu, dict) else None)
    known = tuple(f for f in found if f is not None)
    return known or None


PROVIDER = Provider(
    facts.provider_named("runpod"),
    account_key="RUNPOD_API_KEY",
    template_api="https://api.runpod.io/graphql",
    template=template,
    command=TemplateCommand(
        display="RunPod",
        summary="Print the RunPod template (saveTemplate input) for a published image; --create saves it on RunPod.",
        api_url_help="RunPod GraphQL endpoint.",
        examples=("cu121-torch2.1.2-py3.11-tf4.48.2", "CELL --create"),
        options=(
            TemplateOption("digest", bool, False, "Pin imageName with @sha256 as well.", keyword="with_digest"),
            TemplateOption(
                "volume_gb", int, 50, "Volume size (GB) mounted at /workspace.", "GB", minimum=1, maximum=MAX_VOLUME_GB
            ),
            TemplateOption(
                "registry_auth",
                str,
                None,
                "RunPod's id of the registry credentials pods pull a private image with (containerRegistryAuthId).",
                "ID",
                check=check_registry_auth,
                after_api_url=True,
            ),
        ),
        request=mutation,
        answer_key="saveTemplate",
        pull_credentials="registry_auth",
        pull_credentials_hint="save the registry's credentials in RunPod (Settings > Container Registry Auth) and "
        "pass their id: --registry-auth ID",
    ),
    pod_body=lambda *args, **kw: _pod_create().body(*args, **kw),
    pod_price=lambda answer: _pod_create().cost(answer),
    terminate_warning=terminate_warning,
    pod_clouds=("secure", "community"),
    ssh_gateway="ssh.runpod.io",
    reap_pod=reap_pod,
)
