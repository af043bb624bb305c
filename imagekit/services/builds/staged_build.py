"""`imagekit build` on a local engine: the base stage with `docker build`, then the cell stage's steps run by imagekit.

Each `RUN` of the cell stage runs in a container of the image so far, with IMAGEKIT_STAGE set: install-layer puts
what the layer adds in a folder on the host's disk (a bind mount), imagekit writes the layer's tar from it and loads
it with the image config (`docker load`), and the next step runs on that. A step whose layer cannot be staged (apt's
`--debs`) is a container commit, as on the builder. The engine's storage driver then writes each layer's bytes once,
instead of once in the `RUN`, once read back by its diff and once again by the commit (three passes through
fuse-overlayfs, and a walk of the whole tree per layer, on the naive-diff drivers).

Step cache: the layers below and the step's command (which names each input by its sha256) key the step's diff id;
a hit is a config over layers the engine still holds (milliseconds), a miss when it no longer holds them.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from imagekit.effects import foreign_files, layer_tar
from imagekit.effects.cache import cache_root
from imagekit.effects.docker import _build_hint
from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.image import imageconfig, steps
from imagekit.trust import untrusted
from imagekit.trust.untrusted import printable

STAGE_MOUNT = "/imagekit-stage"
STAGE_MISMATCH = 75  # install-layer: the folder it sees is not the one prepared here


class Unstageable(Exception):
    """This build cannot run its steps itself (the engine sees other folders); `docker build` builds it."""


def _cache_dir() -> Path:
    return cache_root() / "steps"


def _cached(key: str) -> dict | None:
    try:  # a memo in the cache, read back as any file another process may have planted: bounded, no link
        raw = foreign_files.read_bytes(_cache_dir() / f"{key}.json", 4096)
        doc = untrusted.load_json(raw, "a step's memo", max_bytes=4096, max_depth=2)
    except (OSError, ValueError):  # foreign_files.Refused and untrusted.UntrustedData are ValueErrors
        return None
    if isinstance(doc, dict) and isinstance(doc.get("diff_id"), str) and doc["diff_id"].startswith("sha256:"):
        return doc
    return None


def _remember(key: str, diff_id: str) -> None:
    from imagekit.effects.files import write_atomic

    _cache_dir().mkdir(parents=True, exist_ok=True)
    write_atomic(_cache_dir() / f"{key}.json", json.dumps({"diff_id": diff_id}).encode())


def _clear(engine, stage: Path, image: str) -> None:
    """Empty the stage folder (install-layer's files are root's: a container removes them where this user cannot)."""
    try:
        foreign_files.remove_tree(stage)
    except PermissionError:
        command = f"rm -rf {STAGE_MOUNT}/* {STAGE_MOUNT}/.[!.]* {STAGE_MOUNT}/..?*"
        engine.run_step(image, command, env={}, binds={str(stage): STAGE_MOUNT}, extra_hosts={})
        foreign_files.remove_tree(stage)


def build_staged(
    engine,
    context: Path,
    tag: str,
    stage: Path,
    *,
    nocache: bool,
    on_line: Callable[[str], None],
    extra_hosts: dict[str, str],
    source_date_epoch: int,
    on_image: Callable[[str], None] = lambda _: None,
) -> tuple[str, list[dict]]:
    """The image of ``context`` tagged ``tag``; returns (its id, its history as config entries, oldest first).
    ``on_image`` hears of each image as it is made (the base stage's, then each step's: blob_prepare compresses
    their layers meanwhile). Raises ``Unstageable`` before anything is tagged when the engine cannot see ``stage``."""
    dockerfile = (context / "Dockerfile").read_text()
    try:
        cell_steps = steps.cell_steps(dockerfile)
    except steps.NotSteppable as exc:
        raise Unstageable(str(exc)) from None
    base_tag = f"{tag}-base"
    base_id = engine.build(context, [base_tag], {}, nocache=nocache, on_line=on_line, extra_hosts=extra_hosts,
                           target="base")  # fmt: skip
    base = engine.image(base_id) or {}
    on_image(base_id)
    history = history_of(engine, base_id, _base_of(engine, dockerfile))
    epoch = imageconfig._rfc3339(source_date_epoch)
    diff_ids = list(base.get("RootFS", {}).get("Layers", []))
    current = base_id
    # Each step's image is loaded untagged (its id is its config's digest: another build of the same steps on this
    # engine loads and runs on the very same image). They are left after the build: another build of the same steps
    # on this engine may be running on one of them right now (removing them raced two CI runners building the same
    # cell side by side). They hold no layer of their own while the final image holds them all; each is recorded
    # (STEP_IMAGES), and `imagekit prune` removes the ones no tag names.
    sweeper = _Sweeper(engine, base_id)
    sweeper.reap(stage.parent)
    try:
        current = _steps(engine, cell_steps, base, history, diff_ids, current, stage, sweeper, nocache=nocache,
                         on_line=on_line, extra_hosts=extra_hosts, sde=source_date_epoch, epoch=epoch,
                         on_image=on_image)  # fmt: skip
    finally:
        sweeper.finish()
    engine.tag(current, *tag.rsplit(":", 1))
    return current, history


def _steps(engine, cell_steps, base, history, diff_ids, current, stage, sweeper, *, nocache, on_line, extra_hosts,
           sde, epoch, on_image):  # fmt: skip
    """Each step of the cell stage in turn (a cache hit loaded, a miss run); returns the last step's image."""
    for step in cell_steps:
        began = time.monotonic()
        on_line(f"Step {step.number}/{step.total} : RUN {step.command[:120]}")
        key = steps.step_key(diff_ids, step)
        entry = steps.history_entry(step)
        hit = None if nocache else _cached(key)
        image = None
        if hit is not None:
            config = steps.layered_config(base, [*history, entry], [*diff_ids, hit["diff_id"]], epoch)
            try:
                image = engine.load_layer(config, None, len(diff_ids) + 1)
                on_line(" ---> Using cache")
                diff_id = hit["diff_id"]
            except EnvironmentFailure:
                image = None  # the engine no longer holds that layer: run the step again
        if image is None:
            diff_id, image = _run(engine, step, current, base, history, entry, diff_ids, stage, extra_hosts, sde,
                                  epoch, on_line, sweeper)  # fmt: skip
            _remember(key, diff_id)
        history.append(entry)
        diff_ids.append(diff_id)
        current = image
        _record_step_image(image)
        on_image(image)
        on_line(f"staged-layer: step {step.number} done in {time.monotonic() - began:.1f} s")
    return current


ABANDONED_S = 3600  # a `.swept-*` folder this old was left by a build that was killed while sweeping it


class _Sweeper:
    """A step's staged files removed while the next step runs: the stage folder is renamed aside (the next step gets
    an empty one) and a thread removes it. ``finish`` waits for them; what this user could not remove (install-layer's
    files are root's where the build runs as another user) is removed by a container, as ``_clear`` does."""

    def __init__(self, engine, image: str) -> None:
        import threading

        self.engine, self.image, self.lock = engine, image, threading.Lock()
        self.threads: list = []
        self.refused: list[Path] = []

    def put(self, stage: Path) -> None:
        if not os.path.lexists(stage):
            return
        aside = stage.parent / f".swept-{secrets.token_hex(8)}"  # in the private folder of all stages
        os.rename(stage, aside)
        self._sweep(aside)

    def reap(self, stages: Path) -> None:
        """What a killed build left renamed aside (a ``.swept-*`` folder an hour old: a sweep takes seconds) is swept
        with this build's own: a step's staged files are gigabytes. Each is renamed to a name of this build's first
        and dated now, so a build beside this one that looks at the same moment takes another or none."""
        now = time.time()
        try:
            entries = list(os.scandir(stages))
        except OSError:
            return
        for entry in entries:
            try:
                old = entry.name.startswith(".swept-") and entry.is_dir(follow_symlinks=False)
                if not old or now - entry.stat(follow_symlinks=False).st_mtime < ABANDONED_S:
                    continue
                mine = stages / f".swept-{secrets.token_hex(8)}"
                os.rename(entry.path, mine)  # fails when another build took it first
                os.utime(mine, follow_symlinks=False)
            except OSError:
                continue
            self._sweep(mine)

    def _sweep(self, aside: Path) -> None:
        import threading

        def sweep() -> None:
            try:
                foreign_files.remove_tree(aside)
            except FileNotFoundError:
                pass  # gone already
            except (PermissionError, foreign_files.Refused):
                with self.lock:
                    self.refused.append(aside)

        thread = threading.Thread(target=sweep, name="imagekit-sweep", daemon=True)
        thread.start()
        self.threads.append(thread)

    def finish(self) -> None:
        for thread in self.threads:
            thread.join()
        self.threads = []
        for aside in self.refused:
            _clear(self.engine, aside, self.image)
        self.refused = []


STEP_IMAGES = "step-images"  # under the step cache: one image id a line, each step image this machine loaded
MAX_STEP_RECORD = 1 << 20


def _record_step_image(image: str) -> None:
    _cache_dir().mkdir(parents=True, exist_ok=True)
    with open(_cache_dir() / STEP_IMAGES, "a") as fh:
        fh.write(image + "\n")


def recorded_step_images() -> list[str]:
    """The step images this machine's builds loaded (STEP_IMAGES), read as a file another process may have written:
    bounded, no link, image ids only."""
    try:
        raw = foreign_files.read_bytes(_cache_dir() / STEP_IMAGES, MAX_STEP_RECORD)
    except (OSError, ValueError):
        return []
    ids = [line.strip() for line in raw.decode("ascii", "replace").splitlines()]
    return list(dict.fromkeys(i for i in ids if re.fullmatch(r"sha256:[0-9a-f]{64}", i)))


def drop_step_image(engine, image: str) -> bool:
    """Remove a step image no tag names (never another build's tagged image), unforced; True when it is gone."""
    found = engine.image(image)
    if found is None:
        return True
    if found.get("RepoTags"):
        return False
    return engine.remove_unused(image)


def _base_of(engine, dockerfile: str) -> str:
    """The base stage's FROM image (where history_entries splits the history)."""
    return next(line.split()[1] for line in dockerfile.splitlines() if line.startswith("FROM ") and " AS base" in line)


def history_of(engine, image: str, base: str) -> list[dict]:
    """``image``'s history as config entries, from the engine's history of a build FROM ``base`` (see
    imageconfig.history_entries). Raises ``imageconfig.Unknown`` when the history cannot be matched to the layers."""
    found = engine.history(image)
    layers_of = {
        item["Id"]: len((engine.image(item["Id"]) or {}).get("RootFS", {}).get("Layers", []))
        for item in found
        if item.get("Id", "<missing>") != "<missing>"
    }
    below = engine.image(base) or {}
    return imageconfig.history_entries(
        found, layers_of, below.get("Id", ""), len(below.get("RootFS", {}).get("Layers", []))
    )


def _run(engine, step, current, base, history, entry, diff_ids, stage, extra_hosts, sde, epoch, on_line, sweeper):
    """Run ``step`` on ``current``; returns (the new layer's diff id, the new image)."""
    if not step.staged:
        code, tail, committed = engine.run_step(current, step.command, env={}, binds={}, extra_hosts=extra_hosts,
                                                on_line=on_line, commit=True)  # fmt: skip
        try:
            if code != 0 or committed is None:
                raise CheckFailed(f"step {step.number} failed (exit {code}):\n{tail}", _build_hint(tail))
            diff_id = (engine.image(committed) or {})["RootFS"]["Layers"][-1]
            config = steps.layered_config(base, [*history, entry], [*diff_ids, diff_id], epoch)
            return diff_id, engine.load_layer(config, None, len(diff_ids) + 1)
        finally:
            if committed is not None:  # a failed step's commit too: never kept, never built on
                engine.remove(committed)
    _clear(engine, stage, current)
    private(stage)
    nonce = secrets.token_hex(16)
    (stage / ".nonce").write_text(nonce)
    try:
        code, tail, _ = engine.run_step(
            current,
            step.command,
            env={"IMAGEKIT_STAGE": STAGE_MOUNT, "IMAGEKIT_STAGE_NONCE": nonce},
            binds={str(stage.resolve()): STAGE_MOUNT},
            extra_hosts=extra_hosts,
            on_line=on_line,
        )
        if code == STAGE_MISMATCH and not os.path.lexists(stage / "root"):
            raise Unstageable(f"the engine does not see {stage} as this machine does")
        if code != 0:
            raise CheckFailed(f"step {step.number} failed (exit {code}):\n{tail}", _build_hint(tail))
        root = stage / "root"
        if not os.path.lexists(root):
            raise Unstageable(f"step {step.number} staged nothing in {stage}: is it an install-layer step?")
        try:
            began = time.monotonic()
            folders = layer_tar.read_folders(stage)
            size = layer_tar.measure_layer(root, sde, folders)  # `docker load`'s archive says it first
            measured = time.monotonic() - began
            began = time.monotonic()
            stream = layer_tar.stream_layer(root, sde, folders, size)  # read once: hashed while the engine loads it

            def config() -> bytes:  # the archive's last part: the config names the diff id the stream hashed to
                assert stream.diff_id is not None
                return steps.layered_config(base, [*history, entry], [*diff_ids, stream.diff_id], epoch)

            image = engine.load_layer(config, (size, stream), len(diff_ids) + 1)
            diff_id = stream.diff_id or ""  # set: the engine took the config that names it
        except foreign_files.Refused as exc:
            raise CheckFailed(
                f"step {step.number} left what no layer of installs holds: {printable(exc.path, 300)} {exc.why}; "
                "nothing of it was loaded",
                "a package installed in this or an earlier layer runs code in the build (a .pth file, an atexit "
                "hook): find it in the step's output above, remove or pin it, and build again",
            ) from None
        on_line(f"staged-layer: {size / 1e6:.0f} MB tar measured in {measured:.1f} s, hashed and loaded in "
                f"{time.monotonic() - began:.1f} s")  # fmt: skip
        return diff_id, image
    finally:
        sweeper.put(stage)  # removed while the next step runs


def private(stage: Path) -> None:
    """The stage folder and the folder of all stages made root-only (0700) before a step writes there: a setuid
    program a step plants, or anything it stages, is out of every other local user's reach while it is there."""
    try:
        foreign_files.private_dir(stage, levels=2)
    except foreign_files.Refused as exc:
        raise EnvironmentFailure(
            f"cannot make the stage folder private: {printable(exc.path, 300)} {exc.why}",
            "remove it (imagekit makes it again) or pass another --state-dir",
        ) from None


def stage_dir(state_dir: Path, slug: str) -> Path:
    return state_dir / "stage" / slug


def available(engine) -> bool:
    """Whether ``engine`` runs steps for imagekit (the Docker engine on this machine; see Engine.staged_steps)."""
    return bool(getattr(engine, "staged_steps", lambda: False)())
