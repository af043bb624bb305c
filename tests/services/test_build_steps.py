"""The build's step order and failure branches, against recording fakes of the engine and the registry (no Docker):
lock before fetch, nothing pushed unless the self-test passed, the alias only after the immutable tag, an immutable
tag never moved. The real-engine tests (`test_docker_e2e.py`) cover the same paths on a real engine and registry."""

from __future__ import annotations

import dataclasses
import json

import pytest

from imagekit.effects.registry import Remote
from imagekit.image import naming
from imagekit.locking import resolution
from imagekit.model import Cell
from imagekit.services import inputs
from imagekit.services.builds.build import BuildOptions, build_cell
from tests.fakes import RecordingEngine, RecordingRegistry

pytestmark = pytest.mark.resolver  # real uv resolutions (against loopback indexes)

CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11")
REPO = "registry.test:5000/team/train"


@pytest.fixture
def setup(tmp_path, fake_index):
    engine = RecordingEngine()
    registry = RecordingRegistry(engine.calls)
    engine.registry = registry
    opts = BuildOptions(
        repository=REPO,
        lock_dir=tmp_path / "locks",
        state_dir=tmp_path / "state",
        release_index=tmp_path / "releases.json",
        release_records=tmp_path / "records",
        push=True,
        settings=resolution.LockSettings(index_url=fake_index),
    )
    return engine, registry, opts


def _build(engine, registry, opts, log=None):
    lines: list[str] = []
    res = build_cell(CELL, opts, engine, inputs.compat_data(), lambda _c, m: lines.append(m), registry=registry)
    return res, lines


def _kinds(calls):
    return [c[0] for c in calls]


def test_steps_in_order_and_the_alias_after_the_immutable_tag(setup):
    engine, registry, opts = setup
    res, lines = _build(engine, registry, opts)
    assert res.status == "published", res.error and res.error.render()
    assert any(line.startswith("re-resolved") for line in lines)  # the lock came first (it was missing)
    kinds = _kinds(engine.calls)
    build_at, config_at, test_at = kinds.index("build"), kinds.index("load_config"), kinds.index("run")
    push_at, alias_at = kinds.index("push"), kinds.index("registry.copy_tag")
    tag_at = engine.calls.index(("registry.put_manifest", res.tag.rsplit(":", 1)[1]))
    assert build_at < config_at < test_at < push_at < tag_at < alias_at
    assert all(kind != "registry.upload_blob" for kind in kinds[tag_at:])  # every blob before the tag
    assert engine.calls[build_at][1] == naming.build_cache_tag(CELL)  # the builder's image anchors the cache
    assert engine.calls[config_at][1] == (res.tag, naming.alias_tag(REPO, CELL))  # the config image gets the tags
    # the self-test runs the image that is pushed, by its id (another build of the cell may move the tag meanwhile)
    assert engine.calls[test_at][1] == res.image_id
    assert engine.calls[push_at][1] == res.image_id and engine.calls[alias_at][1] == CELL.id
    index = json.loads(opts.release_index.read_text())
    assert res.tag in json.dumps(index) and res.digest in json.dumps(index)


def test_the_stages_run_in_the_documented_order():
    from imagekit.services.builds import build

    steps = [step for step, _ in build.STAGES]
    # the base first: a cell's `[image] apt` packages are locked over it
    assert steps == [
        "base",
        "lock",
        "fetch",
        "project",  # `[image] install`'s wheel: built from the fetched wheels of its backend, before the render
        "render",
        "build",
        "build",
        "size-budget",
        "self-test",
        "sbom",
        "audit",
        "publish",
    ]


def test_a_failed_build_stops_there_nothing_configured_tested_or_pushed(setup):
    engine, registry, opts = setup
    engine.build_error = "RUN uv pip install: exit 1"
    res, _ = _build(engine, registry, opts)
    assert (res.status, res.step) == ("failed", "build") and "exit 1" in res.error.message
    assert res.lock == "re-resolved" and res.tag is None  # the stages before it ran; none after
    assert _kinds(engine.calls)[-1] == "build" and not (opts.state_dir / "reports").exists()


def test_a_failed_selftest_pushes_and_records_nothing(setup):
    engine, registry, opts = setup
    engine.selftest_passes = False
    res, _ = _build(engine, registry, opts)
    assert (res.status, res.step) == ("failed", "self-test") and "nothing was pushed" in res.error.hint
    assert "push" not in _kinds(engine.calls) and "registry.copy_tag" not in _kinds(engine.calls)
    assert not registry.manifests and not opts.release_index.exists()
    # the refused image is under no tag it would have been published as: kept for inspection under its own
    assert res.tag == naming.refused_tag(CELL), res.tag
    assert not any(ref.startswith(f"{REPO}:") for ref in engine.images), list(engine.images)
    assert engine.images[naming.refused_tag(CELL)]["Id"] == res.image_id
    assert f"the image is kept as {naming.refused_tag(CELL)}" in res.error.hint


def test_a_refused_image_gives_the_alias_back_to_the_image_it_named_before(setup):
    engine, registry, opts = setup
    good, _ = _build(engine, registry, dataclasses.replace(opts, push=False))
    assert good.status == "passed" and engine.images[naming.alias_tag(REPO, CELL)]["Id"] == good.image_id
    engine.selftest_passes = False
    engine.size += 1  # another image than the good one (its config differs)
    bad, _ = _build(engine, registry, dataclasses.replace(opts, push=False, options=dataclasses.replace(
        opts.options, env=(("CHANGED", "1"),))))  # fmt: skip
    assert bad.status == "failed" and bad.image_id != good.image_id
    assert engine.images[naming.alias_tag(REPO, CELL)]["Id"] == good.image_id  # the good one, as before
    assert engine.images[good.tag]["Id"] == good.image_id  # its own immutable tag untouched
    assert engine.images[naming.refused_tag(CELL)]["Id"] == bad.image_id


def test_an_image_whose_torch_is_not_what_its_name_says_is_never_published(setup):
    """The field's complaint: an image tagged "torch 2.8" that ships 2.4. The labels' claims meet the self-test's
    readings inside the image; a mismatch fails the self-test, and nothing is pushed."""
    engine, registry, opts = setup
    engine.selftest_torch = "2.4.0"
    res, _ = _build(engine, registry, opts)
    assert (res.status, res.step) == ("failed", "self-test"), res.error and res.error.render()
    assert res.error.message.splitlines()[0] == "self-test failed: labels-match-contents"
    shown = res.error.message.splitlines()[1]  # the check's message under it, not only its name
    assert shown.startswith("  labels-match-contents: ") and "imagekit.torch.version='2.5.1', but its torch" in shown
    truth = next(c for c in res.report["checks"] if c["id"] == "labels-match-contents")
    assert "label imagekit.torch.version='2.5.1', but its torch is '2.4.0'" in truth["message"]
    assert "push" not in _kinds(engine.calls) and not registry.manifests


def test_a_failed_push_moves_no_alias_and_records_nothing(setup):
    engine, registry, opts = setup
    registry.upload_error = "connection reset"
    res, _ = _build(engine, registry, opts)
    assert (res.status, res.step) == ("failed", "publish") and "connection reset" in res.error.message
    assert "registry.copy_tag" not in _kinds(engine.calls) and not opts.release_index.exists()
    assert "registry.put_manifest" not in _kinds(engine.calls)  # no tag names a partial upload


def test_an_immutable_tag_the_registry_holds_with_other_contents_is_never_moved(setup):
    engine, registry, opts = setup
    first, _ = _build(engine, registry, dataclasses.replace(opts, push=False))  # learn the tag this build makes
    engine.calls.clear()
    tag = first.tag.rsplit(":", 1)[1]
    registry.holds(Remote.parse(REPO), tag, "sha256:" + "e" * 64, {"rootfs": {"diff_ids": ["sha256:other"]}})
    res, _ = _build(engine, registry, opts)
    assert (res.status, res.step) == ("failed", "publish")
    assert "already exists with other contents" in res.error.message and "never move" in res.error.hint
    assert "push" not in _kinds(engine.calls) and "registry.copy_tag" not in _kinds(engine.calls)


def test_an_image_over_its_budget_is_neither_tested_nor_pushed(setup):
    engine, registry, opts = setup
    opts = dataclasses.replace(opts, options=dataclasses.replace(opts.options, size_budget="1 GB"))
    res, _ = _build(engine, registry, opts)
    assert (res.status, res.step) == ("failed", "size-budget")
    assert "run" not in _kinds(engine.calls) and "push" not in _kinds(engine.calls)
    assert not any(ref.startswith(f"{REPO}:") for ref in engine.images)  # refused: under no published name
    assert f"docker history {naming.refused_tag(CELL)}" in res.error.hint


def test_a_rebuild_gives_the_same_image_and_publishes_it_once(setup):
    engine, registry, opts = setup
    first, _ = _build(engine, registry, opts)
    engine.calls.clear()
    again, lines = _build(engine, registry, opts)
    assert again.status == "published" and again.image_id == first.image_id and again.digest == first.digest
    assert "push" not in _kinds(engine.calls)  # the registry has it: nothing to push
    assert any("already published" in line for line in lines)


def test_with_zstd_the_same_image_is_also_published_with_zstd_layers_beside_gzip(setup):
    engine, registry, opts = setup
    res, _ = _build(
        engine, registry, dataclasses.replace(opts, options=dataclasses.replace(opts.options, variants=("zstd",)))
    )
    assert res.status == "published", res.error and res.error.render()
    remote = Remote.parse(REPO)
    tag = res.tag.rsplit(":", 1)[1]
    variant = registry.manifests[(remote.name, f"{tag}-zstd")]
    assert variant["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert {x["mediaType"] for x in variant["layers"]} == {"application/vnd.oci.image.layer.v1.tar+zstd"}
    assert registry.manifests[(remote.name, f"{CELL.id}-zstd")] == variant
    index = registry.manifests[(remote.name, tag)]  # the tag itself: the gzip image (and its SBOM), as without zstd
    assert index["manifests"][0]["digest"] == res.digest != entry_digest(registry, remote, f"{tag}-zstd")
    entry = json.loads(opts.release_index.read_text())["images"][res.tag]
    assert entry["zstd"]["tag"] == f"{REPO}:{tag}-zstd" and entry["zstd"]["digest"].startswith("sha256:")
    calls = engine.calls  # the alias moves last, after both variants are complete
    assert calls.index(("registry.copy_tag", f"{CELL.id}-zstd")) < calls.index(("registry.copy_tag", CELL.id))


def entry_digest(registry, remote, tag):
    return registry.oci_manifest(remote, tag).digest
