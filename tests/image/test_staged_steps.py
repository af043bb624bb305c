"""imagekit runs the cell stage's steps itself: the steps read from the rendered Dockerfile, the step cache's key, the
configs between steps, and the layer tar written from a staged folder (deterministic, owners and modes kept)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from imagekit.effects import foreign_files, layer_tar
from imagekit.image import steps
from tests.conftest import ROOT

EPOCH = 1735689600
GOLDEN = ROOT / "tests" / "golden" / "cu121-torch2.1.2-py3.11-tf4.48.2"


def _dockerfile(builder: str = "legacy") -> str:
    """The golden render of the demo cell for ``builder`` (test_render keeps it what render writes)."""
    return Path(f"{GOLDEN}{'.legacy' if builder == 'legacy' else ''}.Dockerfile").read_text()


def test_the_cell_stage_of_a_legacy_render_is_its_install_steps_numbered_as_the_builder_numbers_them():
    text = _dockerfile()
    found = steps.cell_steps(text)
    assert [s.number for s in found] == list(range(5, 5 + len(found)))
    assert all(s.total == found[0].total == len(steps._instructions(text)) for s in found)
    assert all(s.staged and "install-layer" in s.command and "\\\n" not in s.command for s in found)
    assert steps.base_stage_steps(text) == 3  # FROM, COPY rootfs/base, the venv's RUN: docker build makes those
    assert found[-1].created_by.startswith("/bin/sh -c export SOURCE_DATE_EPOCH=")


def test_apts_layer_is_a_commit_and_a_buildkit_render_is_not_steppable():
    text = _dockerfile()
    with_apt = text.replace(
        "FROM base AS image\n",
        "FROM base AS image\nRUN /opt/imagekit/bin/install-layer --wheels http://w/ --debs http://w/d#sha256=00\n",
    )
    first = steps.cell_steps(with_apt)[0]
    assert not first.staged and "--debs" in first.command
    with pytest.raises(steps.NotSteppable, match="COPY"):
        steps.cell_steps(_dockerfile(builder="buildkit"))
    with pytest.raises(steps.NotSteppable, match="stage"):
        steps.cell_steps("FROM x\nRUN true\n")


def test_the_step_key_changes_with_the_layers_below_and_the_command_only():
    step = steps.cell_steps(_dockerfile())[0]
    key = steps.step_key(["sha256:a"], step)
    assert key == steps.step_key(["sha256:a"], step)
    assert key != steps.step_key(["sha256:b"], step)
    other = steps.Step(step.number, step.total, step.command + " ", step.staged)
    assert key != steps.step_key(["sha256:a"], other)


def test_a_config_between_steps_is_dated_and_must_cover_its_layers():
    inspect = {"Config": {"Env": ["A=1"], "Image": "sha256:x", "Hostname": "h"}, "Architecture": "amd64", "Os": "linux"}
    history = [{"created": "2024-01-01T00:00:00Z", "created_by": "base"}, {"created": None, "created_by": "step"}]
    out = json.loads(steps.layered_config(inspect, history, ["sha256:1", "sha256:2"], "2025-01-01T00:00:00Z"))
    assert out["rootfs"]["diff_ids"] == ["sha256:1", "sha256:2"]
    assert [h["created"] for h in out["history"]] == ["2024-01-01T00:00:00Z", "2025-01-01T00:00:00Z"]
    assert out["config"]["Image"] == "" and out["config"]["Env"] == ["A=1"]
    with pytest.raises(ValueError, match="1 history entries"):
        steps.layered_config(inspect, history[:1], ["sha256:1", "sha256:2"], "2025-01-01T00:00:00Z")


def _tree(root: Path) -> None:
    (root / "opt/venv/lib/site-packages/pkg").mkdir(parents=True)
    (root / "opt/venv/lib/site-packages/pkg/__init__.py").write_text("x = 1\n")
    (root / "opt/venv/lib/site-packages/pkg/data.bin").write_bytes(os.urandom(1) * 70000)
    os.link(root / "opt/venv/lib/site-packages/pkg/data.bin", root / "opt/venv/lib/site-packages/pkg/same.bin")
    (root / "opt/venv/bin").mkdir()
    os.symlink("/opt/cuda-libs/nvidia", root / "opt/venv/lib/site-packages/nvidia")
    (root / "opt/venv/bin/tool").write_text("#!/opt/venv/bin/python\n")
    (root / "opt/venv/bin/tool").chmod(0o755)
    os.utime(root / "opt/venv/bin/tool", (1, 1))  # older than SOURCE_DATE_EPOCH: kept


def test_the_layer_tar_is_the_same_bytes_for_the_same_files_whenever_they_were_written(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _tree(a)
    _tree(b)
    data_bin = "opt/venv/lib/site-packages/pkg/data.bin"
    (b / data_bin).write_bytes((a / data_bin).read_bytes())
    os.utime(b / "opt/venv/lib/site-packages/pkg/__init__.py", (2e9, 2e9))  # written "later": clamped either way
    folders = {"opt": [0o755, 0, 0], "opt/venv": [0o755, 0, 0]}
    with open(tmp_path / "a.tar", "wb") as fh:
        got_a = layer_tar.write_layer(a, fh, EPOCH, folders)
    assert layer_tar.write_layer(a, None, EPOCH, folders) == got_a  # measured without writing: the same
    digest = "sha256:" + hashlib.sha256((tmp_path / "a.tar").read_bytes()).hexdigest()
    assert got_a == (digest, (tmp_path / "a.tar").stat().st_size)
    assert layer_tar.measure_layer(a, EPOCH, folders) == got_a[1]  # its size from the entries, nothing read
    stream = layer_tar.stream_layer(a, EPOCH, folders, got_a[1])
    assert stream.diff_id is None  # known once every chunk was taken
    assert b"".join(stream) == (tmp_path / "a.tar").read_bytes() and stream.diff_id == got_a[0]
    assert layer_tar.write_layer(b, None, EPOCH, folders) == got_a  # the same files written at another time
    with tarfile.open(tmp_path / "a.tar") as tar:
        members = {m.name: m for m in tar.getmembers()}
    names = list(members)
    assert names[0] == "opt" and all(n.rpartition("/")[0] in names[:i] for i, n in enumerate(names) if "/" in n)
    assert members["opt/venv/bin/tool"].mtime == 1 and members["opt/venv/bin/tool"].mode == 0o755
    assert members["opt/venv/lib/site-packages/pkg/__init__.py"].mtime == EPOCH
    assert members["opt/venv/lib/site-packages/nvidia"].issym()
    assert members["opt/venv/lib/site-packages/pkg/same.bin"].islnk()  # stored once
    assert all(m.uname == "" and m.gname == "" for m in members.values())
    with pytest.raises(ValueError, match="changed"):
        list(layer_tar.stream_layer(a, EPOCH, folders, got_a[1] + 512))
    (a / "opt/venv/grown.bin").write_bytes(b"x" * (layer_tar.CHUNK + 1))  # more than measured: the read stops
    with pytest.raises(ValueError, match="changed"):
        list(layer_tar.stream_layer(a, EPOCH, folders, got_a[1]))


def test_measuring_a_layer_reads_no_file(tmp_path, monkeypatch):
    """The size comes from the entries alone: no file is opened (the stream that follows reads each file once)."""
    root = tmp_path / "root"
    (root / "opt").mkdir(parents=True)
    (root / "opt/big.bin").write_bytes(b"\1" * (layer_tar.CHUNK * 2 + 7))
    (root / "opt/small").write_bytes(b"abc")
    expected = layer_tar.write_layer(root, None, EPOCH)[1]

    def opened(_entry):
        raise AssertionError("a file was read to measure the layer")

    monkeypatch.setattr(foreign_files.Entry, "open", opened)
    assert layer_tar.measure_layer(root, EPOCH) == expected


def test_folders_the_image_has_keep_their_owner_and_mode(tmp_path):
    root = tmp_path / "root"
    (root / "root/.ssh").mkdir(parents=True)
    (root / "root/.ssh/authorized_keys").write_text("k\n")
    (tmp_path / "dirs.json").write_text(json.dumps({"root": [0o700, 0, 0], "root/.ssh": [0o700, 0, 0]}))
    folders = layer_tar.read_folders(tmp_path)
    out = io.BytesIO()
    layer_tar.write_layer(root, out, EPOCH, folders)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        assert tar.getmember("root").mode == 0o700 and tar.getmember("root/.ssh").mode == 0o700
    (tmp_path / "dirs.json").write_text(json.dumps({"root": [-1, 0, 0]}))
    with pytest.raises(ValueError, match="mode, uid, gid"):
        layer_tar.read_folders(tmp_path)


def test_a_device_or_fifo_in_a_staged_folder_is_refused(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ValueError, match="pipe: is a FIFO"):
        layer_tar.write_layer(tmp_path, None, EPOCH)


def test_the_load_archive_carries_the_layer_then_the_config_and_a_manifest_naming_every_layer():
    config = b'{"rootfs":{}}'
    archive = b"".join(layer_tar.load_archive(config, (3, iter([b"abc"])), 3))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        assert tar.extractfile("2/layer.tar").read() == b"abc"  # type: ignore[union-attr]
    digest = hashlib.sha256(config).hexdigest()
    assert names == ["2/layer.tar", f"{digest}.json", "manifest.json"]
    layers = ["0/layer.tar", "1/layer.tar", "2/layer.tar"]
    assert manifest == [{"Config": f"{digest}.json", "RepoTags": [], "Layers": layers}]
    later = b"".join(layer_tar.load_archive(lambda: config, (3, iter([b"abc"])), 3))  # a config made after
    assert later == archive
    only_config = b"".join(layer_tar.load_archive(config, None, 2))
    with tarfile.open(fileobj=io.BytesIO(only_config)) as tar:
        assert tar.getnames() == [f"{digest}.json", "manifest.json"]


def test_an_image_imagekit_stepped_has_a_build_hash_of_its_own():
    """The same context built the two ways gives two contents: never one immutable tag for both."""
    digest = "a" * 64
    assert steps.build_hash(digest) != digest and steps.build_hash(digest) == steps.build_hash(digest)
    assert steps.build_hash(digest) != steps.build_hash("b" * 64) and len(steps.build_hash(digest)) == 64
