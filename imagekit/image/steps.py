"""The cell stage of a rendered Dockerfile as steps imagekit runs itself, and the image configs between them. Pure.

On the legacy builder every `RUN` ends in a container commit, which on a naive-diff storage driver (fuse-overlayfs)
walks the whole tree below and reads and writes the layer's bytes through the overlay twice more. `imagekit build`
runs the same `RUN` lines in a container whose writes go to a folder on the host's disk (install-layer's staged mode),
writes the layer's tar from that folder and hands it to the engine with `docker load`: one pass through the overlay.
The Dockerfile stays the one description of the image: the steps are read from it, the history names them as the
builder would, and a BuildKit build of the same context makes the same layers (up to the tar's encoding).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

CELL_STAGE = "FROM base AS image"
# bumped when the staged layers' bytes change for the same step (the step cache keys on it)
STAGED_FORMAT = "imagekit-staged-1"


def build_hash(context_digest: str) -> str:
    """The build hash of an image whose cell stage imagekit ran: the same context gives other layer bytes (imagekit's
    tar encoding) and another history than the whole Dockerfile on a builder, so another immutable tag; a tag never
    names two contents, whichever way a machine builds."""
    return hashlib.sha256(f"{STAGED_FORMAT}\0{context_digest}".encode()).hexdigest()


@dataclass(frozen=True)
class Step:
    number: int  # its place among the Dockerfile's instructions, as the builder counts them (Step N/M)
    total: int
    command: str  # the shell command, continuations joined as the builder joins them
    staged: bool  # written from the host's folder (else: a container commit, for apt's layer)

    @property
    def created_by(self) -> str:
        return f"/bin/sh -c {self.command}"


class NotSteppable(ValueError):
    """The Dockerfile's cell stage has an instruction imagekit does not run itself (a COPY: the BuildKit render)."""


def _instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, comments dropped and `\\`-continued lines joined (as the legacy builder's
    parser joins them: the backslash and newline removed, the next line's text kept as it is)."""
    out: list[str] = []
    pending = ""
    for line in dockerfile.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        out.append((pending + line).strip())
        pending = ""
    if pending:
        out.append(pending.strip())
    return out


def cell_steps(dockerfile: str) -> list[Step]:
    """The `RUN` steps after ``FROM base AS image``, numbered as the builder numbers them. Raises ``NotSteppable``
    on any other instruction there, and when the stage is missing."""
    instructions = _instructions(dockerfile)
    if CELL_STAGE not in instructions:
        raise NotSteppable(f"no `{CELL_STAGE}` stage")
    start = instructions.index(CELL_STAGE)
    steps = []
    for n, instruction in enumerate(instructions[start + 1 :], start=start + 2):
        keyword, _, command = instruction.partition(" ")
        if keyword.upper() != "RUN":
            raise NotSteppable(f"step {n} is a {keyword.upper()}")
        command = command.strip()
        staged = "install-layer" in command and " --debs " not in f" {command} "
        steps.append(Step(n, len(instructions), command, staged))
    return steps


def base_stage_steps(dockerfile: str) -> int:
    """How many instructions the base stage has (the builder numbers the cell stage's after them)."""
    instructions = _instructions(dockerfile)
    return instructions.index(CELL_STAGE) if CELL_STAGE in instructions else len(instructions)


def step_key(diff_ids: list[str], step: Step) -> str:
    """The step cache's key: the layers below and the command (which names every input by its sha256)."""
    text = json.dumps([STAGED_FORMAT, diff_ids, step.command, step.staged])
    return hashlib.sha256(text.encode()).hexdigest()


def layered_config(inspect: dict, history: list[dict], diff_ids: list[str], epoch: str) -> bytes:
    """An image config over ``diff_ids``: the base stage's config (``docker image inspect`` of it) with ``history``,
    every date ``epoch`` (RFC 3339) where none is given. The same layers give the same image ID on every build."""
    made = sum(1 for e in history if not e.get("empty_layer"))
    if made != len(diff_ids):
        raise ValueError(f"{made} history entries made a layer, the image has {len(diff_ids)}")
    cfg = dict(inspect.get("Config") or {})
    cfg["Image"] = ""
    cfg["Hostname"] = ""
    out = {
        "architecture": inspect.get("Architecture") or "amd64",
        "config": cfg,
        "created": epoch,
        "history": [{**e, "created": e.get("created") or epoch} for e in history],
        "os": inspect.get("Os") or "linux",
        "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
    }
    if inspect.get("Variant"):
        out["variant"] = inspect["Variant"]
    return json.dumps(out, sort_keys=True, separators=(",", ":")).encode()


def history_entry(step: Step) -> dict:
    entry = {"created": None, "created_by": step.created_by}
    if step.staged:
        entry["comment"] = "layer written by imagekit from the step's staged files"
    return entry
