"""imagekit's own outputs never enter the code layer (services/builds/build_plans.code_for): a publish, a re-lock or
`ci init` in the project's folder leaves the next build's code layer as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagekit.image.code_layer import CopySpec
from imagekit.image.image_options import ImageOptions
from imagekit.services.builds.build_plans import code_for

EPOCH = 1_700_000_000


def _project(root: Path) -> ImageOptions:
    (root / "acme").mkdir(parents=True)
    (root / "acme" / "__init__.py").write_text("VERSION = 1\n")
    (root / "train.py").write_text("print('training')\n")
    (root / ".github" / "workflows").mkdir(parents=True)
    (root / ".github" / "workflows" / "tests.yml").write_text("on: push\n")  # the user's own CI: theirs
    # a .dockerignore that tries to bring imagekit's outputs back: the outputs win
    (root / ".dockerignore").write_text("!releases/index.json\n!lockfiles\n")
    return ImageOptions(copy=CopySpec(str(root), project=str(root)))


def _imagekit_writes(root: Path, n: int, state: Path) -> None:
    """What a build, a publish, a lock and `ci init` leave in the project (the ``n``-th time)."""
    (root / "releases" / "records").mkdir(parents=True, exist_ok=True)
    (root / "releases" / "index.json").write_text(json.dumps({"schema": 1, "images": {str(n): {}}}))
    (root / "releases" / "records" / f"cell-{n}.json").write_text("{}")
    (root / "lockfiles").mkdir(exist_ok=True)
    (root / "lockfiles" / f"cell-{n}.txt").write_text(f"torch=={n}\n")
    (root / ".github" / "imagekit").mkdir(parents=True, exist_ok=True)
    (root / ".github" / "imagekit" / f"imagekit-0.{n}-py3-none-any.whl").write_bytes(b"PK" * n)
    (root / ".github" / "workflows" / "images.yml").write_text(f"# installs imagekit-0.{n}-py3-none-any.whl\n")
    (root / ".imagekit" / "contexts").mkdir(parents=True, exist_ok=True)
    (root / ".imagekit" / "contexts" / f"{n}.txt").write_text("context")
    state.mkdir(parents=True, exist_ok=True)
    (state / f"report-{n}.json").write_text("{}")


@pytest.mark.parametrize("where", ["default places", "flags' places"])
def test_publishing_relocking_and_ci_init_leave_the_code_layer_as_it_was(tmp_path, monkeypatch, where):
    root = tmp_path / "project"
    options = _project(root)
    monkeypatch.chdir(root)  # imagekit runs in the project's folder: its default outputs lie there
    state = root / ("build-state" if where == "flags' places" else ".imagekit")
    outputs = (state, root / "lockfiles", root / "releases" / "index.json", root / "releases" / "records")
    if where == "flags' places":  # --state-dir, --lock-dir, --release-index, --release-records elsewhere in it
        outputs = (state, root / "locks", root / "published.json", root / "records")
    before = code_for(options, outputs)
    assert before is not None
    for n in (1, 2):
        _imagekit_writes(root, n, state)
        if where == "flags' places":
            for path in outputs[1:]:
                (path / "x" if path.suffix != ".json" else path).parent.mkdir(parents=True, exist_ok=True)
                (path / "x" if path.suffix != ".json" else path).write_text(str(n))
        after = code_for(options, outputs)
        assert after is not None
        names = [rel for rel, _, _ in after.files]
        assert names == [rel for rel, _, _ in before.files], names
        assert after.sha256(EPOCH) == before.sha256(EPOCH)
    assert ".github/workflows/tests.yml" in names and "train.py" in names  # the project's own files stay


def test_a_code_change_still_changes_the_code_layer(tmp_path, monkeypatch):
    """The excludes leave out imagekit's outputs, not the project: the test above would pass on an empty layer."""
    root = tmp_path / "project"
    options = _project(root)
    monkeypatch.chdir(root)
    before = code_for(options)
    (root / "train.py").write_text("print('training')\nprint('epoch 2')\n")
    after = code_for(options)
    assert before is not None and after is not None and after.sha256(EPOCH) != before.sha256(EPOCH)


def test_outputs_outside_the_copied_folder_change_nothing(tmp_path, monkeypatch):
    """copy = "src": imagekit's outputs lie beside it, never inside; an output folder inside is left out."""
    root = tmp_path / "project"
    _project(root)
    (root / "src").mkdir()
    (root / "src" / "model.py").write_text("x = 1\n")
    (root / "src" / "releases").mkdir()  # the project's own folder of that name, below `src`: kept
    (root / "src" / "releases" / "notes.md").write_text("v1\n")
    monkeypatch.chdir(root)
    code = code_for(ImageOptions(copy=CopySpec(str(root / "src"), project=str(root))), (root / ".imagekit",))
    assert code is not None and [rel for rel, _, _ in code.files] == ["model.py", "releases/notes.md"]
