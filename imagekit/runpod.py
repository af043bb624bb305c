"""RunPod template for a published image: the input of RunPod's `saveTemplate` GraphQL mutation. Pure."""

from __future__ import annotations

import math

SAVE_TEMPLATE = (
    "mutation saveTemplate($input: SaveTemplateInput) { saveTemplate(input: $input) "
    "{ id name imageName containerDiskInGb volumeInGb volumeMountPath ports } }"
)


def template(
    entry: dict,
    *,
    with_digest: bool = False,
    volume_gb: int = 50,
    ports: str = "8888/http,22/tcp",
    require_gpu: bool = True,
) -> dict:
    """From a release-index entry: pinned to the immutable tag (optionally @digest), disk sized from the image."""
    image = entry["tag"] + (f"@{entry['digest']}" if with_digest else "")
    size_gb = entry.get("size_bytes", 0) / 1e9
    container_disk = max(20, math.ceil(size_gb * 1.5 + 10))
    cell = entry["manifest"]["cell"]
    env = [
        {"key": "HF_HOME", "value": "/workspace/.cache/huggingface"},
        {"key": "IMAGEKIT_REQUIRE_GPU", "value": "1" if require_gpu else "0"},
    ]
    return {
        "name": f"imagekit {cell['id']}",
        "imageName": image,
        "containerDiskInGb": container_disk,
        "volumeInGb": volume_gb,
        "volumeMountPath": "/workspace",
        "ports": ports,
        "env": env,
        "isServerless": False,
        "dockerArgs": "",
        "readme": (
            f"torch {cell['torch']}+{cell['variant']}, transformers {cell['transformers']}, Python {cell['python']}. "
            f"Needs an NVIDIA driver >= {entry['manifest']['driver']['minimum']}; GPUs: "
            f"{', '.join(entry['manifest']['torch']['archs'])}. The entrypoint runs `imagekit doctor` (quick tier) "
            "and refuses to start on a blocker."
        ),
    }


def mutation(template_input: dict) -> dict:
    return {"query": SAVE_TEMPLATE, "variables": {"input": template_input}}
