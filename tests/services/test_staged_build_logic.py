"""`build_staged`'s own decisions, without Docker: an engine that records what it is asked and runs each step's
effect on this machine, writing into the folder bound at the stage mount as install-layer does in a container (the
engine interface is imagekit's own, so recording it is not a mock of Docker; test_staged_build_docker.py runs
the same code on a real engine). What it shows: `--no-cache` runs every step, a failed committed step is never kept
or built on, the stage folder is root-only while a step runs, and what a hostile step stages fails the build by name
with nothing of it loaded and nothing left staged."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.services.builds import staged_build

EPOCH = 1735689600
FROM = "imagekit/base:test"
DOCKERFILE = f"""FROM {FROM} AS base
RUN python3 -m venv /opt/venv
FROM base AS image
RUN /opt/imagekit/bin/install-layer --wheels http://w/ --target /opt/cuda-libs --requirements http://w/cuda.txt
RUN /opt/imagekit/bin/install-layer --wheels http://w/ --debs http://w/debs.txt
RUN /opt/imagekit/bin/install-layer --wheels http://w/ --venv /opt/venv --requirements http://w/app.txt
"""
Effect = Callable[[Path | None], int]


def _honest(stage: Path | None) -> int:
    """What install-layer leaves: DIR/root with the layer's files, DIR/dirs.json."""
    assert stage is not None
    (stage / "root/opt/cuda-libs").mkdir(parents=True)
    (stage / "root/opt/cuda-libs/lib.so").write_bytes(b"\x7fELF library")
    (stage / "dirs.json").write_text(json.dumps({"opt": [0o755, 0, 0]}))
    return 0


class RecordingEngine:
    """The engine interface build_staged uses. A staged step's effect gets the host folder bound at the stage mount;
    a committed step's gets None. ``commit_failed``: commit a failed step's container too (a broken engine)."""

    def __init__(self, effects: dict[str, Effect], commit_failed: bool = False) -> None:
        self.effects, self.commit_failed = effects, commit_failed
        self.images: dict[str, dict] = {
            "sha256:from": {"Id": "sha256:from", "RootFS": {"Layers": ["sha256:l0"]}},
            FROM: {"Id": "sha256:from", "RootFS": {"Layers": ["sha256:l0"]}},
            "sha256:basestage": {
                "Id": "sha256:basestage",
                "RootFS": {"Layers": ["sha256:l0", "sha256:l1"]},
                "Config": {"Env": ["PATH=/opt/venv/bin:/usr/bin"]},
                "Architecture": "amd64",
                "Os": "linux",
            },
        }
        self.held = {"sha256:l0", "sha256:l1"}  # the layers the engine holds
        self.steps: list[tuple[str, dict]] = []  # (command, what it saw)
        self.loaded: list[list[str]] = []  # each loaded image's diff ids
        self.removed: list[str] = []
        self.tagged: list[tuple[str, str, str]] = []

    def build(self, context: Path, tags: list[str], buildargs: dict, **kw: object) -> str:
        assert kw.get("target") == "base"
        return "sha256:basestage"

    def image(self, ref: str) -> dict | None:
        return self.images.get(ref)

    def history(self, ref: str) -> list[dict]:
        assert ref == "sha256:basestage"
        return [{"Id": "sha256:basestage", "CreatedBy": "/bin/sh -c python3 -m venv /opt/venv", "Size": 5},
                {"Id": "sha256:from", "CreatedBy": "import", "Size": 100, "Created": 0}]  # fmt: skip

    def run_step(
        self,
        image: str,
        command: str,
        *,
        env: dict,
        binds: dict,
        extra_hosts: dict,
        on_line: Callable[[str], None] | None = None,
        commit: bool = False,
    ) -> tuple[int, str, str | None]:
        seen: dict = {"image": image}
        stage = Path(next(iter(binds))) if binds else None
        if stage is not None:
            seen["modes"] = [stat.S_IMODE(os.stat(p).st_mode) for p in (stage, stage.parent)]
            if command.startswith("rm -rf"):
                self.steps.append((command, seen))
                return 0, "", None
        self.steps.append((command, seen))
        effect = next(fn for key, fn in self.effects.items() if key in command)
        code = effect(stage)
        committed = None
        if commit and (code == 0 or self.commit_failed):
            layers = [*self.images[image]["RootFS"]["Layers"], f"sha256:commit{len(self.steps)}"]
            committed = f"sha256:committed{len(self.steps)}"
            self.images[committed] = {"Id": committed, "RootFS": {"Layers": layers}}
            self.held.add(layers[-1])
        return code, f"exit {code}", committed

    def load_layer(self, config, layer, count: int, tags=None) -> str:  # type: ignore[no-untyped-def]
        data = None
        if layer is not None:  # the layer's chunks come first; the config may name what they hashed to
            size, chunks = layer
            data = b"".join(chunks)
            assert len(data) == size
        config = config() if callable(config) else config
        diff_ids = json.loads(config)["rootfs"]["diff_ids"]
        assert len(diff_ids) == count
        if data is None:
            if not set(diff_ids) <= self.held:
                raise EnvironmentFailure("docker load of an image failed: layer does not exist")
        else:
            assert diff_ids[-1] == "sha256:" + hashlib.sha256(data).hexdigest()  # what the engine checks
            self.held.add(diff_ids[-1])
        ident = "sha256:" + hashlib.sha256(config).hexdigest()
        self.images[ident] = {"Id": ident, "RootFS": {"Layers": diff_ids}}
        self.loaded.append(diff_ids)
        return ident

    def tag(self, image: str, repository: str, tag: str) -> None:
        self.tagged.append((image, repository, tag))

    def remove(self, ref: str) -> None:
        self.removed.append(ref)
        self.images.pop(ref, None)

    def remove_unused(self, ref: str) -> bool:
        self.removed.append(ref)
        self.images.pop(ref, None)
        return True


def _build(engine: RecordingEngine, tmp_path: Path, nocache: bool = False) -> tuple[str, list[dict]]:
    context = tmp_path / "context"
    context.mkdir(exist_ok=True)
    (context / "Dockerfile").write_text(DOCKERFILE)
    lines: list[str] = []
    return staged_build.build_staged(
        engine,
        context,
        "imagekit-build/cell:latest",
        staged_build.stage_dir(tmp_path / "state", "cell"),
        nocache=nocache,
        on_line=lines.append,
        extra_hosts={},
        source_date_epoch=EPOCH,
    )


def _ran(engine: RecordingEngine) -> list[str]:
    return [c for c, _ in engine.steps if not c.startswith("rm -rf")]


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))


def _effects(**over: Effect) -> dict[str, Effect]:
    def app(stage: Path | None) -> int:
        assert stage is not None
        (stage / "root/opt/venv/lib").mkdir(parents=True)
        (stage / "root/opt/venv/lib/app.py").write_text("print('hi')\n")
        return 0

    return {"cuda.txt": _honest, "--debs": lambda stage: 0, "app.txt": app, **over}


def test_a_rebuild_is_the_step_cache_and_no_cache_runs_every_step_again(tmp_path):
    first = RecordingEngine(_effects())
    image, _ = _build(first, tmp_path)
    assert len(_ran(first)) == 3 and first.tagged[-1][0] == image
    # the step images are left to `imagekit prune` (another build of the same steps may be running on one), every
    # one recorded; the last one is the image
    loaded = staged_build.recorded_step_images()
    assert loaded[-1] == image and len(loaded) >= 3 and all(i in first.images for i in loaded), loaded
    again = RecordingEngine(_effects())
    again.held = first.held  # the engine still holds every layer
    assert _build(again, tmp_path)[0] == image
    assert _ran(again) == []  # all three from the step cache
    fresh = RecordingEngine(_effects())
    fresh.held = first.held
    assert _build(fresh, tmp_path, nocache=True)[0] == image  # the same layers, made again
    assert len(_ran(fresh)) == 3, "--no-cache used the step cache"


def test_a_cached_step_whose_layer_the_engine_lost_runs_again(tmp_path):
    _build(RecordingEngine(_effects()), tmp_path)
    forgetful = RecordingEngine(_effects())  # a pruned engine: holds the base stage's layers only
    _build(forgetful, tmp_path)
    assert len(_ran(forgetful)) == 3


@pytest.mark.parametrize("commit_failed", [False, True])
def test_a_failed_committed_step_is_never_kept_as_a_layer(tmp_path, commit_failed):
    engine = RecordingEngine(_effects(**{"--debs": lambda stage: 100}), commit_failed=commit_failed)
    with pytest.raises(CheckFailed, match="step 5 failed \\(exit 100\\)"):
        _build(engine, tmp_path)
    assert len(engine.loaded) == 1  # the first step's layer only: nothing loaded over the failed step
    committed = [i for i in engine.images if i.startswith("sha256:committed")]
    assert committed == [], f"the failed step's commit is still there: {committed}"
    assert not engine.tagged and "app.txt" not in " ".join(_ran(engine))


def test_the_stage_folder_and_its_parent_are_root_only_while_a_step_runs(tmp_path):
    state = tmp_path / "state"
    (state / "stage").mkdir(parents=True, mode=0o755)
    os.chmod(state / "stage", 0o755)
    engine = RecordingEngine(_effects())
    _build(engine, tmp_path)
    staged = [seen for c, seen in engine.steps if "install-layer" in c and "--debs" not in c]
    assert len(staged) == 2 and all(seen["modes"] == [0o700, 0o700] for seen in staged), staged
    assert not list((state / "stage").iterdir())  # nothing left staged


def _outside(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh/id_ed25519").write_text("PRIVATE KEY\n")
    return home


def _root_link(target: str) -> Effect:
    def effect(stage: Path | None) -> int:
        assert stage is not None
        _honest(stage)
        import shutil

        shutil.rmtree(stage / "root")
        (stage / "root").symlink_to(target)
        return 0

    return effect


def _plant(make: Callable[[Path], None]) -> Effect:
    def effect(stage: Path | None) -> int:
        assert stage is not None
        _honest(stage)
        make(stage)
        return 0

    return effect


def _setuid(stage: Path) -> None:
    (stage / "root/opt/cuda-libs/sh").write_bytes(b"\x7fELF")
    os.chmod(stage / "root/opt/cuda-libs/sh", 0o4755)


HOSTILE = {
    "root -> ../../..": (_root_link("../../.."), "root is a symbolic link"),
    "root -> home": (None, "root is a symbolic link"),
    "setuid": (_plant(_setuid), "opt/cuda-libs/sh is setuid or setgid"),
    "fifo": (_plant(lambda s: os.mkfifo(s / "root/opt/cuda-libs/pipe")), "opt/cuda-libs/pipe is a FIFO"),
    "dirs.json fifo": (_plant(lambda s: (os.unlink(s / "dirs.json"), os.mkfifo(s / "dirs.json"))), "dirs.json"),
    "dirs.json -> /dev/zero": (
        _plant(lambda s: (os.unlink(s / "dirs.json"), os.symlink("/dev/zero", s / "dirs.json"))),
        "dirs.json is a symbolic link",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_what_a_hostile_step_stages_fails_the_build_by_name_with_nothing_loaded_or_left(tmp_path, case):
    home = _outside(tmp_path)
    effect, said = HOSTILE[case]
    engine = RecordingEngine(_effects(**{"cuda.txt": effect or _root_link(str(home))}))
    with pytest.raises(CheckFailed) as caught:
        _build(engine, tmp_path)
    message = caught.value.render() if hasattr(caught.value, "render") else str(caught.value)
    assert f"step 4 left what no layer of installs holds: {said}" in str(caught.value), message
    assert "PRIVATE" not in message
    assert engine.loaded == [] and not engine.tagged
    assert not list((tmp_path / "state/stage").iterdir())  # nothing left staged
    assert (home / ".ssh/id_ed25519").read_text() == "PRIVATE KEY\n"


def test_a_steps_staged_files_this_user_cannot_remove_are_removed_by_a_container(tmp_path, monkeypatch):
    """Each step's stage is swept while the next step runs; files of root's that this user may not remove (a build
    run by a user in the docker group) are removed by a container of the base stage before the build returns."""
    real = staged_build.foreign_files.remove_tree
    refused: list[str] = []

    def remove_tree(path: Path) -> None:  # refused until a container emptied the folder (the third call)
        if Path(path).name.startswith(".swept-") and refused.count(Path(path).name) < 2:
            refused.append(Path(path).name)
            raise PermissionError(13, "Permission denied")
        real(path)

    monkeypatch.setattr(staged_build.foreign_files, "remove_tree", remove_tree)
    engine = RecordingEngine(_effects())
    _build(engine, tmp_path)
    swept = [(c, seen) for c, seen in engine.steps if c.startswith("rm -rf")]
    assert len(set(refused)) == 2 and len(swept) == 2, (refused, swept)  # the two staged steps' folders
    assert all(seen["image"] == "sha256:basestage" for _, seen in swept)
    assert not list((tmp_path / "state/stage").iterdir())  # nothing left staged


def test_what_a_killed_build_left_renamed_aside_is_swept_by_the_next_build(tmp_path):
    """A build killed while sweeping a step's stage (gigabytes of torch) left its `.swept-*` folder for ever. The next
    build sweeps one an hour old; a fresh one is a build beside it sweeping now, and a link is nobody's folder."""
    import os
    import time

    stages = tmp_path / "state" / "stage"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the build's\n")
    for name in (".swept-killed", ".swept-now"):
        (stages / name / "opt" / "venv").mkdir(parents=True)
        (stages / name / "opt" / "venv" / "torch.so").write_bytes(b"\0" * 1000)
    (stages / ".swept-link").symlink_to(outside)
    hours_ago = time.time() - 2 * staged_build.ABANDONED_S
    for name in (".swept-killed", ".swept-link"):
        os.utime(stages / name, (hours_ago, hours_ago), follow_symlinks=False)
    _build(RecordingEngine(_effects()), tmp_path)
    left = sorted(p.name for p in stages.iterdir())
    assert left == [".swept-link", ".swept-now"], left
    assert (stages / ".swept-now" / "opt" / "venv" / "torch.so").is_file()
    assert (outside / "keep").read_text() == "not the build's\n"
