"""The image's runtime config as a config JSON over the built layers (pure), as `imagekit build` loads it."""

from __future__ import annotations

import json

import pytest

from imagekit.image import imageconfig

BASE = "sha256:" + "b" * 64
STEP = lambda n: "sha256:" + f"{n:x}" * 64  # noqa: E731


def _history(*entries):
    """(id, created_by, size) oldest first -> the history API's answer (newest first)."""
    return [{"Id": i, "Created": 1700000000 + n, "CreatedBy": by, "Size": size, "Comment": ""}
            for n, (i, by, size) in reversed(list(enumerate(entries)))]  # fmt: skip


def _built():
    history = _history(
        ("<missing>", "/bin/sh -c #(nop) ADD file:abc in /", 80_000_000),
        ("<missing>", '/bin/sh -c #(nop)  CMD ["bash"]', 0),
        (BASE, "/bin/sh -c #(nop)  ENV A=1", 0),
        (STEP(1), "/bin/sh -c #(nop) COPY dir:x in /", 120),
        (STEP(2), "/bin/sh -c true", 0),  # a RUN that changed nothing: no layer
        (STEP(3), "/bin/sh -c pip install x", 0),  # changed only metadata: a layer of size 0
    )
    layers_of = {BASE: 1, STEP(1): 2, STEP(2): 2, STEP(3): 3}
    inspect = {
        "RootFS": {"Type": "layers", "Layers": ["sha256:l1", "sha256:l2", "sha256:l3"]},
        "Architecture": "amd64",
        "Os": "linux",
        "Config": {"Env": ["PATH=/usr/bin:/bin", "A=1"], "Cmd": ["bash"], "Image": "sha256:parent", "Hostname": "h",
                   "Labels": {"from.base": "yes", "imagekit.cell": "stale"}},
    }  # fmt: skip
    return history, layers_of, inspect


def test_history_marks_layers_by_image_layer_counts_above_the_base_and_sizes_below():
    history, layers_of, _ = _built()
    entries = imageconfig.history_entries(history, layers_of, BASE, 1)
    assert [e.get("empty_layer", False) for e in entries] == [False, True, True, False, True, False]
    assert entries[0]["created"] == "2023-11-14T22:13:20Z" and entries[3]["created"] is None


def test_history_that_does_not_match_the_layers_is_refused():
    history, layers_of, _ = _built()
    with pytest.raises(imageconfig.Unknown):
        imageconfig.history_entries(history, layers_of, BASE, 2)  # the base has 2 layers, its history marks 1
    with pytest.raises(imageconfig.Unknown):
        imageconfig.history_entries(history, layers_of, "sha256:other", 1)
    with pytest.raises(imageconfig.Unknown):
        imageconfig.history_entries(history, {BASE: 1}, BASE, 1)  # steps above the base must name images


def test_config_sets_the_runtime_config_over_the_same_layers_dated_source_date_epoch():
    history, layers_of, inspect = _built()
    entries = imageconfig.history_entries(history, layers_of, BASE, 1)
    runtime = imageconfig.runtime({"imagekit.cell": "c1", "b": "2"})
    raw = imageconfig.config_json(inspect, entries, runtime, 1735689600, "9.9")
    again = imageconfig.config_json(inspect, entries, runtime, 1735689600, "9.9")
    assert raw == again  # the same image id on every build with the same layers
    cfg = json.loads(raw)
    assert cfg["rootfs"] == {"type": "layers", "diff_ids": ["sha256:l1", "sha256:l2", "sha256:l3"]}
    env = cfg["config"]["Env"]
    assert env[0] == f"PATH={dict(imageconfig.ENV)['PATH']}" and "A=1" in env  # ENV's semantics: replaced in place
    assert env.count("LANG=C.UTF-8") == 1 and env[-1] == "IMAGEKIT_MANIFEST=/etc/imagekit/manifest.json"
    assert cfg["config"]["Labels"] == {"from.base": "yes", "imagekit.cell": "c1", "b": "2"}
    assert cfg["config"]["Entrypoint"] == ["/opt/imagekit/bin/entrypoint"] and cfg["config"]["Cmd"] == []
    assert cfg["config"]["WorkingDir"] == "/workspace" and cfg["config"]["Image"] == "" == cfg["config"]["Hostname"]
    assert cfg["created"] == "2025-01-01T00:00:00Z"
    steps = cfg["history"]
    assert [s["created"] for s in steps[3:]] == ["2025-01-01T00:00:00Z"] * 4
    assert steps[-1]["empty_layer"] and steps[-1]["created_by"].startswith("imagekit 9.9: ENV LANG=")
    assert sum(1 for s in steps if not s.get("empty_layer")) == 3


def test_config_refuses_a_history_that_does_not_cover_the_layers():
    history, layers_of, inspect = _built()
    entries = imageconfig.history_entries(history, layers_of, BASE, 1)
    inspect["RootFS"]["Layers"].append("sha256:l4")
    with pytest.raises(imageconfig.Unknown):
        imageconfig.config_json(inspect, entries, imageconfig.runtime({}), 0, "x")


def test_instructions_read_as_a_dockerfile_states_them():
    ins = imageconfig.runtime({"k": "v"}).instructions(" ")
    assert ins[1:4] == ["WORKDIR /workspace", 'ENTRYPOINT ["/opt/imagekit/bin/entrypoint"]', "CMD []"]
    assert ins[4] == 'LABEL "k"="v"' and ins[0].startswith('ENV LANG="C.UTF-8" PYTHONUNBUFFERED="1"')
