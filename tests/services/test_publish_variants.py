"""A publish format added as the interface says (its class and its line in the table, nothing else) is published
beside gzip like zstd is: its own immutable tag and alias, its blobs' annotations in an OCI manifest, a config that
names the tars it rewrote, its field in the release record; a tag it finds is kept when it holds the same image
and refused when not. Recording fakes, no Docker."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass

import pytest

from imagekit.effects.registry import Remote
from imagekit.errors import CheckFailed
from imagekit.oci import layer_blobs, media_types, publish_formats, release_record
from imagekit.services.builds.selftest_runner import SelfTestReport
from imagekit.services.publishing import publish
from tests.fakes import RecordingEngine, RecordingRegistry

REPO = "127.0.0.1:5000/t"
TOC = "org.example.toc.digest"


@dataclass(frozen=True)
class Tocked:
    """A stand-in for eStargz: the whole tar at once, a table of contents appended to it (so another tar, as
    eStargz's TOC entry makes), gzipped; the TOC's digest an annotation of the blob."""

    name = "tocked"
    media_type = "application/vnd.oci.image.layer.v1.tar+gzip"
    rewrites_tars = True
    identity = "tocked-1"

    def encode(self, chunks: Iterable[bytes], write: Callable[[bytes], object], pool: Executor) -> layer_blobs.Blob:
        tar = b"".join(chunks)
        toc = b"TOC " + layer_blobs.sha256(tar).encode()
        content = tar + toc
        blob = gzip.compress(content, mtime=0)
        write(blob)
        sha = layer_blobs.sha256
        return layer_blobs.Blob(sha(blob), len(blob), self.media_type, {TOC: sha(toc)}, diff_id=sha(content))


@pytest.fixture
def world(monkeypatch, tmp_path):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(publish_formats.FORMATS, "tocked", Tocked)  # the format's one line in the table
    engine = RecordingEngine()
    registry = RecordingRegistry(engine.calls)
    engine.registry = registry
    config = {"architecture": "amd64", "os": "linux", "config": {}, "rootfs": {"type": "layers", "diff_ids": []}}
    config["rootfs"]["diff_ids"] = [engine._layer("one"), engine._layer("two")]
    image = engine.load_config(json.dumps(config).encode(), [])
    return engine, registry, image


def _publish(engine, registry, image: str, tag: str = "cell-1", **kw):
    report = SelfTestReport(image, True, {"passed": True, "failed": [], "checks": []})
    return publish.publish(
        engine, registry, image_id=image, repository=REPO, immutable_tag=tag, alias_tag="cell", report=report, **kw
    )


def test_a_new_format_is_published_beside_gzip_under_its_own_tags_and_recorded(world, tmp_path):
    engine, registry, image = world
    published = _publish(engine, registry, image, variants=["tocked"])
    remote = Remote.parse(REPO)
    variant = registry.manifests[(remote.name, "cell-1-tocked")]
    assert registry.manifests[(remote.name, "cell-tocked")] == variant
    assert variant["mediaType"] == media_types.OCI_MANIFEST
    assert [layer["mediaType"] for layer in variant["layers"]] == [Tocked.media_type] * 2
    assert all(set(layer["annotations"]) == {TOC} for layer in variant["layers"])
    config = registry.blobs[variant["config"]["digest"]]
    assert variant["config"]["digest"] != image  # the tars it rewrote are what its config names
    tars = [engine.contents[d] for d in json.loads(engine.configs[image])["rootfs"]["diff_ids"]]
    assert config["rootfs"]["diff_ids"] == [
        layer_blobs.sha256(t + b"TOC " + layer_blobs.sha256(t).encode()) for t in tars
    ]
    assert registry.manifests[(remote.name, "cell-1")]["config"]["digest"] == image  # the tag: gzip, as always
    assert published.variants == {
        "tocked": {"tag": f"{REPO}:cell-1-tocked", "digest": published.variants["tocked"]["digest"]}
    }
    entry = release_record.entry(
        published, lock_hash="l", manifest={"cell": {"id": "cell"}}, report={}, size=1, published_at="now"
    )
    assert entry["tocked"] == published.variants["tocked"] and release_record.entry_problems(entry) == []
    assert not (tmp_path / "cache" / "blobs" / "tocked-1").exists()  # annotated blobs are encoded on each push


def test_a_tag_of_the_new_format_holding_the_same_image_is_kept_and_one_holding_another_refused(world):
    engine, registry, image = world
    first = _publish(engine, registry, image, variants=["tocked"])
    again = _publish(engine, registry, image, variants=["tocked"])
    assert again.variants == first.variants and again.reused
    assert engine.calls.count(("registry.put_manifest", "cell-1-tocked")) == 1  # the tag never written again
    remote = Remote.parse(REPO)
    registry.manifests[(remote.name, "cell-2-tocked")] = {"config": {"digest": "sha256:" + "0" * 64}, "layers": []}
    with pytest.raises(CheckFailed, match="cell-2-tocked already exists with other contents"):
        _publish(engine, registry, image, "cell-2", variants=["tocked"])
    assert registry.manifests[(remote.name, "cell-2-tocked")]["layers"] == []


def test_a_zstd_tag_holding_another_image_is_refused_before_anything_is_pushed(world):
    engine, registry, image = world
    remote = Remote.parse(REPO)
    registry.manifests[(remote.name, "cell-1-zstd")] = {"config": {"digest": "sha256:" + "0" * 64}, "layers": []}
    with pytest.raises(CheckFailed, match="cell-1-zstd already exists with other contents"):
        _publish(engine, registry, image, variants=("zstd",))
    assert engine.calls.count(("push", image)) == 1  # the gzip image only
    assert ("registry.copy_tag", "cell") not in engine.calls  # the alias never moved
