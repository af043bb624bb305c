"""Cell -> tags and OCI labels. Pure."""

from __future__ import annotations

from imagekit.model import Cell
from imagekit.trust import validate


def alias_tag(repository: str, cell: Cell) -> str:
    return f"{repository}:{cell.id}"


BUILD_CACHE = "imagekit/build"


def build_cache_tag(cell: Cell) -> str:
    """What the legacy builder made before the runtime config was set: kept tagged, it anchors the cell's build cache
    (the config is a new image beside it, not a child of it). Local only; `docker rmi` frees it."""
    return f"{BUILD_CACHE}:{cell.slug}"


REFUSED = "imagekit/refused"


def refused_tag(cell: Cell) -> str:
    """Where a built image its build refused (self-test, size budget) is kept for inspection: never under the tags
    it would have been published as, so `docker run` of those never runs it. Local only; the next refusal of the
    cell moves it, and `imagekit prune` removes it."""
    return f"{REFUSED}:{cell.slug}"


def immutable_tag(repository: str, cell: Cell, build_hash: str) -> str:
    """``<cell id>-<12 hex>`` (``<cell id>-arm64-<12 hex>`` on linux/arm64): the hash covers the lock and everything
    else the image is built from. The alias (the cell id) names every platform's image at once (an image index)."""
    return f"{repository}:{cell.slug}-{build_hash[:12]}"


def split_reference(ref: str) -> tuple[str, str | None, str | None]:
    """``repo:tag@digest`` -> (repo, tag, digest), using the OCI grammar (a registry port is not a tag)."""
    m = validate.IMAGE_REF.fullmatch(validate.image_ref(ref))
    assert m is not None
    return m["name"], m["tag"], m["digest"]


RUNTIME_KEYS = ("driver_min", "cuda", "cuda_major", "sass", "ptx", "platform", "glibc_min")


def runtime_label(runtime: dict) -> str:
    """The runtime contract as one label value a Dockerfile LABEL can carry (no quotes):
    ``driver_min=525.60.13 cuda=12.1 cuda_major=12 sass=sm_80,sm_90 ptx=sm_90 platform=linux/amd64 glibc_min=2.17``."""
    parts = []
    for key in RUNTIME_KEYS:
        value = runtime.get(key)
        parts.append(f"{key}={','.join(value) if isinstance(value, list) else ('' if value is None else value)}")
    return " ".join(parts)


def parse_runtime_label(text: str) -> dict[str, str | list[str] | None]:
    """:func:`runtime_label` read back (what a registry or a pod says: unknown keys are dropped)."""
    out: dict[str, str | list[str] | None] = {}
    for part in text.split():
        key, _, value = part.partition("=")
        if key in RUNTIME_KEYS:
            out[key] = value.split(",") if key == "sass" else (value or None)
    return out


def labels(manifest: dict) -> dict[str, str]:
    """OCI labels carrying the manifest's facts (``org.opencontainers.image.*`` plus ``imagekit.*``)."""
    cell = manifest["cell"]
    return {
        "org.opencontainers.image.title": f"imagekit {cell['id']}",
        "org.opencontainers.image.description": (
            f"torch {cell['torch']}+{cell['variant']}, transformers {cell['transformers']}, Python {cell['python']}"
        ),
        "org.opencontainers.image.version": f"{cell['id']}-{manifest['lock']['hash'][:12]}",
        "org.opencontainers.image.revision": manifest["source_revision"],
        "org.opencontainers.image.base.name": manifest["base"]["reference"],
        "org.opencontainers.image.base.digest": manifest["base"]["digest"] or "",
        "org.opencontainers.image.vendor": "imagekit",
        "imagekit.cell": cell["id"],
        "imagekit.cuda": cell["cuda"],
        "imagekit.torch": cell["torch"],
        "imagekit.torch.version": manifest["torch"]["version"],
        "imagekit.torch.cuda": manifest["torch"]["cuda"],
        "imagekit.transformers": cell["transformers"],
        "imagekit.python": cell["python"],
        "imagekit.lock.hash": manifest["lock"]["hash"],
        "imagekit.archs": ",".join(manifest["torch"]["archs"])
        + (f",{manifest['torch']['ptx']}+PTX" if manifest["torch"]["ptx"] else ""),
        "imagekit.driver.min": manifest["driver"]["minimum"],
        **({"imagekit.runtime": runtime_label(manifest["runtime"])} if "runtime" in manifest else {}),
        "imagekit.version": manifest["imagekit_version"],
    }
