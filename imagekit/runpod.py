"""RunPod template for a published image: the input of RunPod's `saveTemplate` GraphQL mutation. Pure."""

from __future__ import annotations

import ipaddress
import math
import re

SAVE_TEMPLATE = (
    "mutation saveTemplate($input: SaveTemplateInput) { saveTemplate(input: $input) "
    "{ id name imageName containerDiskInGb volumeInGb volumeMountPath ports } }"
)


_PRIVATE_SUFFIXES = (".local", ".localhost", ".internal", ".lan", ".home.arpa")


def registry_host(image: str) -> str:
    """The registry a pod would pull ``image`` from (Docker's rule: a first component with '.' or ':' or
    'localhost' names a registry; otherwise Docker Hub)."""
    first = image.split("/", 1)[0] if "/" in image else ""
    if first and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def _inet_aton(name: str) -> ipaddress.IPv4Address | None:
    """An IPv4 address in any form inet_aton(3) accepts: 1-4 parts, each decimal, 0x-hex or 0-octal; the last part
    fills the bytes the others left (127.1 is 127.0.0.1). None for anything else."""
    parts = name.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values = []
    for part in parts:
        m = re.fullmatch(r"0[xX]([0-9a-fA-F]+)|(0[0-7]*)|([1-9][0-9]*)", part)
        if not m:
            return None
        values.append(int(m[1], 16) if m[1] else int(m[2], 8) if m[2] else int(m[3]))
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        return None
    number = last
    for i, v in enumerate(head):
        number += v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def unreachable_registry(image: str) -> str | None:
    """Why no pod could pull ``image`` (a loopback, private, link-local or single-label registry), or None."""
    host = registry_host(image)
    if host.startswith("["):
        name = host[1:].split("]")[0]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.lower().rstrip(".")
    ip = None
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        ip = _inet_aton(name)  # short and integer IPv4 forms (127.1, 2130706433), as the resolver reads them
    if ip is not None:
        if ip.is_loopback:
            return f"{host} is a loopback address"
        if not ip.is_global:
            return f"{host} is not a public address (private, link-local or shared range)"
        return None
    if name == "localhost" or name.endswith(_PRIVATE_SUFFIXES):
        return f"{host} is a local name"
    if "." not in name:
        return f"{host} is a single-label name (a local registry such as kind's or compose's)"
    return None


MAX_VOLUME_GB = 10_000


def template(
    entry: dict,
    *,
    with_digest: bool = False,
    volume_gb: int = 50,
    require_gpu: bool = True,
    registry_auth: str | None = None,
) -> dict:
    """From a release-index entry (as `services.publish.read_index` checked it: every field read here has its type,
    grammar and range, the optional ones may be absent): pinned to the immutable tag (optionally @digest), disk
    sized from the image, listing only the ports the image serves (22 for its sshd; 8888 when JupyterLab is in it)."""
    if isinstance(volume_gb, bool) or not isinstance(volume_gb, int) or not 1 <= volume_gb <= MAX_VOLUME_GB:
        raise ValueError(f"volume_gb must be 1 to {MAX_VOLUME_GB}")
    image = entry["tag"] + (f"@{entry['digest']}" if with_digest else "")
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
        "readme": readme(entry, jupyter),
    }


def readme(entry: dict, jupyter: bool) -> str:
    m = entry["manifest"]
    cell = m["cell"]
    known = lambda value: value if isinstance(value, str) and value else "?"  # noqa: E731
    driver = known((m.get("driver") or {}).get("minimum"))
    archs = ", ".join((m.get("torch") or {}).get("archs") or []) or "?"
    lines = [
        f"# imagekit {cell['id']}",
        f"torch {known(cell.get('torch'))}+{known(cell.get('variant'))}, transformers "
        f"{known(cell.get('transformers'))}, Python {known(cell.get('python'))}; "
        f"every package pinned by hash (image {entry['tag']}, digest {entry['digest']}).",
        f"Needs an NVIDIA driver >= {driver}; GPU architectures: {archs}.",
        "",
        "SSH: add your public key to the account (PUBLIC_KEY); the image runs sshd on 22/tcp with key-only root "
        "login. Use the direct TCP port for `ssh root@IP -p PORT 'cmd'`, scp, sftp and rsync (the proxied gateway "
        "is a console only). Host key fingerprints are in the pod's logs.",
        "Jupyter: JupyterLab on 8888/http, serving /workspace, password JUPYTER_PASSWORD."
        if jupyter
        else "Jupyter: not in this image (build it with `[image] jupyter = true`).",
        "Volume: /workspace is the pod's volume: it survives a stop (and is billed while stopped), not a terminate, "
        "which deletes it with the pod (only a network volume survives). HF_HOME=/workspace/.cache/huggingface keeps "
        "model downloads. Everything else is lost when the pod stops.",
        "Lifetime guard (env, off unless set): IMAGEKIT_MAX_RUNTIME=6h, IMAGEKIT_IDLE_STOP=30m, "
        "IMAGEKIT_ON_BLOCKER=stop|terminate (after IMAGEKIT_BLOCKER_GRACE, 15m), IMAGEKIT_ON_EXIT=stop|terminate "
        "(job mode; after IMAGEKIT_OUTPUTS are checksummed); it ends the pod with RunPod's in-pod key.",
        "Start check: the pod checks the environment and torch's CUDA before anything runs; on a blocker it stays "
        "up and the logs and login banner say what to fix. Launch with `imagekit-doctor && accelerate launch "
        "train.py` so training never starts on a broken pod or silently on the CPU.",
    ]
    return "\n".join(lines)


_AUTH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", re.ASCII)


def registry_auth_id(value: str) -> str:
    """The id of a registry credential saved in RunPod (Settings > Container Registry Auth)."""
    if not isinstance(value, str) or not _AUTH_ID.fullmatch(value):
        raise ValueError("a RunPod registry auth id: letters, digits, '_' and '-', at most 64")
    return value


def mutation(template_input: dict) -> dict:
    return {"query": SAVE_TEMPLATE, "variables": {"input": template_input}}
