"""The image's runtime config (ENV, WORKDIR, ENTRYPOINT, CMD, LABEL) and the config JSON that carries it. Pure.

A BuildKit Dockerfile states it as instructions at the end (free there). On the legacy builder every instruction is a
container commit whose diff walks the whole tree (10-20 s over a 5 GB image on fuse-overlayfs), so `imagekit build`
sets it on the built image instead: a new image config over the same layers, loaded with `docker load`, whose
history gains one entry naming what was set. Every RUN sees the same environment on both builders (none of this).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

ENV: tuple[tuple[str, str], ...] = (
    ("LANG", "C.UTF-8"),
    ("PYTHONUNBUFFERED", "1"),
    ("PIP_NO_CACHE_DIR", "1"),
    ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    (
        "PIP_CONSTRAINT",
        "/opt/imagekit/constraints.txt",
    ),  # the lock's pins (imagekit.image.pins): pip and uv keep to them
    ("UV_CONSTRAINT", "/opt/imagekit/constraints.txt"),
    ("VIRTUAL_ENV", "/opt/venv"),
    ("PATH", "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
    ("NVIDIA_VISIBLE_DEVICES", "all"),
    ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
    ("HF_HOME", "/workspace/.cache/huggingface"),
    ("IMAGEKIT_MANIFEST", "/etc/imagekit/manifest.json"),
)
WORKDIR = "/workspace"  # runs as root, as pod platforms' own images do: their volumes on /workspace are root-owned
ENTRYPOINT = ("/opt/imagekit/bin/entrypoint",)
CMD: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuntimeConfig:
    env: tuple[tuple[str, str], ...]
    workdir: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]

    def instructions(self, sep: str = " \\\n    ") -> list[str]:
        """As Dockerfile instructions, multi-line ENV and LABEL joined by ``sep`` (render's quoting filter has
        validated every value before it gets here)."""
        return [
            "ENV " + sep.join(f'{k}="{v}"' for k, v in self.env),
            f"WORKDIR {self.workdir}",
            f"ENTRYPOINT {json.dumps(list(self.entrypoint))}",
            f"CMD {json.dumps(list(self.cmd))}",
            "LABEL " + sep.join(f'"{k}"="{v}"' for k, v in self.labels),
        ]


def runtime(labels: dict[str, str], cmd: tuple[str, ...] = CMD) -> RuntimeConfig:
    """The config every image gets; ``cmd`` (`[image] command`) makes a container started without a command a job."""
    return RuntimeConfig(ENV, WORKDIR, ENTRYPOINT, tuple(cmd), tuple(sorted(labels.items())))


def _rfc3339(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge_env(inherited: list[str], ours: tuple[tuple[str, str], ...]) -> list[str]:
    """ENV's semantics: a key set again keeps its place with the new value; new keys are appended."""
    out = list(inherited)
    for key, value in ours:
        entry = f"{key}={value}"
        at = next((i for i, e in enumerate(out) if e.partition("=")[0] == key), None)
        if at is None:
            out.append(entry)
        else:
            out[at] = entry
    return out


class Unknown(Exception):
    """The built image's history cannot be matched to its layers: set the config the slow way (a commit)."""


def history_entries(history: list[dict], layers_of: dict[str, int], base_id: str, base_layers: int) -> list[dict]:
    """The built image's history as config entries, oldest first, from the engine's history API (newest first).

    The API does not say which entries made a layer. Above the base each entry names an image, which made a layer
    when it has more layers than the one below it; the base's own entries (those below it name no image) made one
    when their size is not zero, and those must add up to the base's layer count. Built steps get no date here (the
    caller dates them SOURCE_DATE_EPOCH). Raises ``Unknown`` when the counts disagree."""
    oldest_first = [item.get("Id") or "<missing>" for item in reversed(history)]
    if base_id not in oldest_first:
        raise Unknown(f"the base {base_id} is not in the image's history")
    split = oldest_first.index(base_id) + 1
    items = list(reversed(history))
    entries: list[dict] = []
    for item in items[:split]:
        entries.append(_entry(item, item.get("Size", 0) > 0, _rfc3339(int(item.get("Created") or 0))))
    if sum(1 for e in entries if not e.get("empty_layer")) != base_layers:
        raise Unknown(f"the base's history does not match its {base_layers} layer(s)")
    below = base_layers
    for item in items[split:]:
        ident = item.get("Id") or "<missing>"
        if ident not in layers_of:
            raise Unknown(f"history entry {ident} above the base names no image")
        entries.append(_entry(item, layers_of[ident] > below, None))
        below = layers_of[ident]
    return entries


def _entry(item: dict, made_layer: bool, created: str | None) -> dict:
    entry: dict = {"created": created, "created_by": item.get("CreatedBy") or ""}
    if item.get("Comment"):
        entry["comment"] = item["Comment"]
    if not made_layer:
        entry["empty_layer"] = True
    return entry


def config_json(
    inspect: dict, history: list[dict], config: RuntimeConfig, source_date_epoch: int, imagekit_version: str
) -> bytes:
    """The built image's config (from ``docker image inspect`` and ``history_entries``) with ``config`` applied, as
    the engine stores it. Built steps and the image itself are dated SOURCE_DATE_EPOCH: the same layers and the same
    config give the same image ID on every build. Raises ``Unknown`` when the history does not cover the layers."""
    diff_ids = list(inspect["RootFS"]["Layers"])
    if sum(1 for e in history if not e.get("empty_layer")) != len(diff_ids):
        raise Unknown("the history does not cover the image's layers")
    epoch = _rfc3339(source_date_epoch)
    cfg = dict(inspect.get("Config") or {})
    cfg["Env"] = _merge_env(cfg.get("Env") or [], config.env)
    cfg["WorkingDir"] = config.workdir
    cfg["Entrypoint"] = list(config.entrypoint)
    cfg["Cmd"] = list(config.cmd)
    cfg["Labels"] = {**(cfg.get("Labels") or {}), **dict(config.labels)}
    cfg["Image"] = ""  # the builder's intermediate image: differs on every build
    cfg["Hostname"] = ""
    steps = [{**e, "created": e["created"] or epoch} for e in history]
    steps.append(
        {
            "created": epoch,
            "created_by": f"imagekit {imagekit_version}: " + " ".join(config.instructions(" ")),
            "comment": "set by imagekit build without a container commit",
            "empty_layer": True,
        }
    )
    out = {
        "architecture": inspect.get("Architecture") or "amd64",
        "config": cfg,
        "created": epoch,
        "history": steps,
        "os": inspect.get("Os") or "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    if inspect.get("Variant"):
        out["variant"] = inspect["Variant"]
    return json.dumps(out, sort_keys=True, separators=(",", ":")).encode()
