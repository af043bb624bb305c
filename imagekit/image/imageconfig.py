"""The image's runtime config (ENV, WORKDIR, ENTRYPOINT, CMD, LABEL) and the config JSON that carries it. Pure.

A BuildKit Dockerfile states it as instructions at the end (free there). On the legacy builder every instruction is a
container commit whose diff walks the whole tree (10-20 s over a 5 GB image on fuse-overlayfs), so `imagekit build`
sets it on the built image instead: a new image config over the same layers, loaded with `docker load`, whose
history gains one entry naming what was set. Every RUN sees the same environment on both builders (none of this).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from imagekit.errors import UsageError

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
# `[image] env`: what a project may add to ENV (user_env_problem). Refused, each for its reason: every name above
# (the image's own settings: its venv, the lock's constraints, the GPU runtime's, the volume's model cache, its
# manifest), and the names below, by prefix or whole.
RESERVED_ENV_PREFIXES = {
    "NVIDIA_": "the NVIDIA container runtime reads NVIDIA_* on the host to pick the GPUs and driver libraries "
    "(NVIDIA_REQUIRE_* would replace its driver check)",
    "IMAGEKIT_": "imagekit's own programs read IMAGEKIT_* (the guard, the doctor, the start logic): set them per pod "
    "(the template's env), never in the image",
    "LD_": "the dynamic loader would take libraries before the locked CUDA wheels (the self-test's cuda-libraries)",
}
RESERVED_ENV_NAMES = {
    "PYTHONPATH": "it would put other code before the locked venv (the doctor's shadowing check warns of it)",
    "PYTHONHOME": "it would point python away from the venv",
    "PYTHONUSERBASE": "it would put a user site before the locked venv",
    "PIP_TARGET": "pip would install beside the locked venv, where the doctor does not look",
    "PIP_PREFIX": "pip would install beside the locked venv, where the doctor does not look",
    "PIP_ROOT": "pip would install beside the locked venv, where the doctor does not look",
    "PIP_USER": "pip would install into a user site, before the locked venv",
}
_OWN_WHY = {
    "PATH": "python, pip and the scripts on PATH are the locked venv: the self-test's python-identity",
    "VIRTUAL_ENV": "the locked venv",
    "PIP_CONSTRAINT": "pip keeps to the lock's pins",
    "UV_CONSTRAINT": "uv keeps to the lock's pins",
    "HF_HOME": "model downloads go to the pod's volume; the RunPod and Vast templates set it too",
    "LANG": "the one locale the base has",
}
# A published image's config is readable by everyone who can pull it.
# Words of a name (split at _): HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, GITHUB_PAT; not TOKENIZERS_PARALLELISM.
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PWD", "PW", "APIKEY", "API_KEY", "ACCESS_KEY",
                 "PRIVATE_KEY", "KEY", "PAT", "CREDENTIAL", "CREDENTIALS", "AUTH")  # fmt: skip
# A secret's word run into another (HFTOKEN, SSH_PRIVKEY, DB_PWD's PWD is a word above): the word ends its part of
# the name (TOKENIZERS_PARALLELISM is no token).
_SECRET_SUFFIX = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|APIKEY|PRIVKEY|PRIVATEKEY|CREDENTIAL)S?(_|$)")
# user:password@ in a URL's authority, with a scheme or without one (redis's default:pw@host:6379)
_URL_PASSWORD = re.compile(r"(?<![^\s/@:=,;])(?:[A-Za-z][A-Za-z0-9+.-]*://)?[^\s/@:]*:[^\s/@]+@[A-Za-z0-9\[]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}", re.ASCII)
# One printable ASCII line without the characters a Dockerfile's ENV would quote or expand (" \ $): the same value
# on BuildKit (an ENV instruction), the legacy builder (the config imagekit writes) and a commit (--change).
_ENV_VALUE = re.compile(r"[ !#%-\[\]-~]*", re.ASCII)
MAX_ENV, MAX_ENV_VALUE = 64, 1024


def user_env_problem(name: object, value: object) -> str | None:
    """Why ``name = value`` cannot be one of `[image] env`'s variables, or None."""
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        return "expected a variable name of letters, digits and _ (not starting with a digit), at most 128"
    upper = name.upper()
    if upper in dict(ENV):
        why = _OWN_WHY.get(upper, "imagekit's setting for every image")
        return f"{name} is the image's own: imagekit sets it to {dict(ENV)[upper]!r} ({why})"
    for prefix, why in RESERVED_ENV_PREFIXES.items():
        if upper.startswith(prefix):
            return f"{name} is refused: {why}"
    if upper in RESERVED_ENV_NAMES:
        return f"{name} is refused: {RESERVED_ENV_NAMES[upper]}"
    if any(f"_{word}_" in f"_{upper}_" for word in _SECRET_WORDS) or _SECRET_SUFFIX.search(upper):
        return (f"{name} looks like a secret, and a published image's config is readable by everyone who can pull "
                "it: pass it when the pod starts (the template's env, the cloud's secrets)")  # fmt: skip
    if not isinstance(value, str):
        return f"expected a string value, got {type(value).__name__}"
    if len(value) > MAX_ENV_VALUE or not _ENV_VALUE.fullmatch(value):
        return f'expected one line of printable ASCII without " \\ or $, at most {MAX_ENV_VALUE} characters'
    if _URL_PASSWORD.search(value):
        return (
            f"{name}'s value holds a URL with a password, which everyone who can pull the image reads in its "
            "config: pass it when the pod starts (the template's env, the cloud's secrets)"
        )
    return None


def user_env(env: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """`[image] env`, checked again where it enters the config (an ImageOptions may be made without the file)."""
    if len(env) > MAX_ENV:
        raise UsageError(f"[image] env: {len(env)} variables", f"at most {MAX_ENV}")
    names = [name for name, _ in env]
    if len(set(names)) != len(names):
        raise UsageError("[image] env: a variable named twice", "name each once")
    for name, value in env:
        problem = user_env_problem(name, value)
        if problem:
            raise UsageError(f"[image] env: {problem}", "`imagekit matrix --help` shows what [image] env takes")
    return tuple(env)


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


def runtime(
    labels: dict[str, str],
    cmd: tuple[str, ...] = CMD,
    env: tuple[tuple[str, str], ...] = (),
    cuda_home: str | None = None,
) -> RuntimeConfig:
    """The config every image gets; ``cmd`` (`[image] command`) makes a container started without a command a job;
    ``env`` (`[image] env`) comes after imagekit's own variables, none of which it may set again; ``cuda_home``
    (`[image] cuda_toolkit`: the manifest's ``cuda_toolkit.home``): CUDA_HOME, and its bin/ on PATH after the venv's."""
    own = ENV
    if cuda_home is not None:
        if any(name.upper() == "CUDA_HOME" for name, _ in env):
            raise UsageError("[image] env: CUDA_HOME is the image's own with [image] cuda_toolkit = true",
                             "leave CUDA_HOME out of [image] env")  # fmt: skip
        path = dict(ENV)["PATH"]
        if f"{cuda_home}/bin" not in path.split(":"):  # Debian's toolkit (CUDA_HOME=/usr) is on PATH already
            path = path.replace("/opt/venv/bin:", f"/opt/venv/bin:{cuda_home}/bin:", 1)
        own = (*((k, path if k == "PATH" else v) for k, v in ENV), ("CUDA_HOME", cuda_home))
    return RuntimeConfig((*own, *user_env(env)), WORKDIR, ENTRYPOINT, tuple(cmd), tuple(sorted(labels.items())))


def cuda_home(manifest: dict) -> str | None:
    """The image's CUDA_HOME, as its manifest names it (`[image] cuda_toolkit`), or None."""
    toolkit = manifest.get("cuda_toolkit")
    return toolkit.get("home") if isinstance(toolkit, dict) and isinstance(toolkit.get("home"), str) else None


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
