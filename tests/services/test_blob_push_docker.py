"""imagekit's own push on the real engine and registry: layers read from the engine's store (and through `docker
save`) give the same blobs and the same manifest digest on every push, from an empty cache too; a second push reads
and sends nothing; the engine pulls the blobs back (multi-member gzip) into the same image."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest

from imagekit.effects.registry import RegistryClient, Remote
from imagekit.oci import layer_blobs, media_types
from imagekit.services.publishing import blob_push

pytestmark = pytest.mark.docker


def _text(size: int, seed: bytes) -> bytes:
    out, h = bytearray(), seed
    while len(out) < size:
        h = hashlib.sha256(h).digest()
        out += h.hex().encode() * 2
    return bytes(out[:size])


@pytest.fixture
def image(engine, tmp_path):
    """Three layers: an imported root with a file of two gzip members, and two COPY layers on it."""
    root = io.BytesIO()
    with tarfile.open(fileobj=root, mode="w") as tar:
        # named as mmdebstrap's tarballs name them (./etc/...): what `docker import` of a bootstrapped base records
        for name, data in {"./big": _text(layer_blobs.MEMBER + 4096, b"a"), "./etc/hello": b"hello\n"}.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1735689600
            tar.addfile(info, io.BytesIO(data))
    (tmp_path / "root.tar").write_bytes(root.getvalue())
    engine.import_tarball(tmp_path / "root.tar", "imagekit-test/blobs-root", "v1")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "one").write_bytes(_text(300_000, b"b"))
    (ctx / "two").write_bytes(b"two\n")
    (ctx / "Dockerfile").write_text("FROM imagekit-test/blobs-root:v1\nCOPY one /one\nCOPY two /two\n")
    image_id = engine.build(ctx, ["imagekit-test/blobs:v1"], {})
    yield image_id
    engine.remove("imagekit-test/blobs:v1")
    engine.remove("imagekit-test/blobs-root:v1")


def _push(engine, registry, image_id, repo, tag, cache, monkeypatch, via=None):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(cache))
    if via:
        monkeypatch.setenv("IMAGEKIT_PUSH_FROM", via)
    else:
        monkeypatch.delenv("IMAGEKIT_PUSH_FROM", raising=False)
    stats = blob_push.PushStats()
    remote = Remote.parse(f"{registry.address}/{repo}")
    digest = blob_push.push_image(engine, RegistryClient(), remote, image_id, tag, stats=stats)
    return digest, stats, RegistryClient().oci_manifest_json(remote, digest)


def test_the_same_image_is_the_same_blobs_and_manifest_on_every_push_and_pulls_back(
    engine, registry, image, tmp_path, monkeypatch
):
    diff_ids = engine.image(image)["RootFS"]["Layers"]
    first, stats, manifest = _push(engine, registry, image, "imagekit-test/blobs-a", "t", tmp_path / "c1", monkeypatch)
    # a repository with no image yet: each layer compressed straight into its upload
    assert (stats.sent, stats.present, stats.streamed, len(manifest["layers"])) == (3, 0, 3, 3)
    assert manifest["config"]["digest"] == image and stats.read_bytes > layer_blobs.MEMBER
    remote = Remote.parse(f"{registry.address}/imagekit-test/blobs-a")
    for layer, diff_id in zip(manifest["layers"], diff_ids, strict=True):  # each blob is its layer, gzip
        tar = gzip.decompress(RegistryClient().blob(remote, layer["digest"], 64 << 20))
        assert "sha256:" + hashlib.sha256(tar).hexdigest() == diff_id

    # another machine (an empty cache), another repository: the same blobs, so the same manifest digest
    again, stats, _ = _push(engine, registry, image, "imagekit-test/blobs-b", "t", tmp_path / "c2", monkeypatch)
    assert again == first and stats.sent == 3
    # through `docker save` (an engine whose store cannot be read here): the same again
    saved, stats, _ = _push(engine, registry, image, "imagekit-test/blobs-c", "t", tmp_path / "c3", monkeypatch, "save")
    assert saved == first and stats.sent == 3
    # another machine (an empty cache) into a repository that holds an image: each layer compressed into a file and
    # the registry asked first; it holds them all, so nothing is sent
    other, stats, _ = _push(engine, registry, image, "imagekit-test/blobs-a", "t3", tmp_path / "c4", monkeypatch)
    assert other == first and (stats.sent, stats.present, stats.streamed) == (0, 3, 0)
    assert stats.read_bytes > layer_blobs.MEMBER
    # a re-publish with the cache: nothing read, nothing sent
    _, stats, _ = _push(engine, registry, image, "imagekit-test/blobs-a", "t2", tmp_path / "c1", monkeypatch)
    assert (stats.sent, stats.present, stats.read_bytes) == (0, 3, 0)

    # the engine pulls it back: it decompresses every blob and checks each against the config's diff ids
    reference = f"{registry.address}/imagekit-test/blobs-a@{first}"
    engine.remove("imagekit-test/blobs:v1")
    engine.remove(image)
    engine.remove("imagekit-test/blobs-root:v1")
    assert engine.image(image) is None
    pulled = engine.pull(reference)
    assert pulled == image and engine.image(pulled)["RootFS"]["Layers"] == diff_ids
    engine.tag(pulled, "imagekit-test/blobs", "v1")
    assert json.loads(RegistryClient().manifest_raw(remote, "t")[1]) == manifest


def test_the_zstd_variant_is_the_same_layers_for_a_zstd_puller_and_deterministic(
    engine, registry, image, tmp_path, monkeypatch
):
    """`build --zstd`'s blobs: OCI zstd layers of exactly the image's tars, the same digests from an empty cache, and
    skopeo (containers/image, what Podman and CRI-O pull with) copies the variant down, decompressing every layer."""
    import shutil
    import subprocess

    import zstandard

    if shutil.which("skopeo") is None:
        pytest.fail("skopeo is missing: `make setup` installs it")
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "z1"))
    remote = Remote.parse(f"{registry.address}/imagekit-test/blobs-z")
    diff_ids = engine.image(image)["RootFS"]["Layers"]
    digest = blob_push.push_image(engine, RegistryClient(), remote, image, "t-zstd", gzip=layer_blobs.Zstd())
    manifest = RegistryClient().oci_manifest_json(remote, digest)
    assert manifest["mediaType"] == media_types.OCI_MANIFEST and manifest["config"]["digest"] == image
    assert {x["mediaType"] for x in manifest["layers"]} == {media_types.OCI_LAYER_ZSTD}
    for layer, diff_id in zip(manifest["layers"], diff_ids, strict=True):
        blob = RegistryClient().blob(remote, layer["digest"], 64 << 20)
        tar = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob), read_across_frames=True).read()
        assert "sha256:" + hashlib.sha256(tar).hexdigest() == diff_id
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "z2"))
    again = blob_push.push_image(engine, RegistryClient(), remote, image, "t-zstd-2", gzip=layer_blobs.Zstd())
    assert again == digest
    out = tmp_path / "pulled"
    res = subprocess.run(
        ["skopeo", "copy", "--src-tls-verify=false", "--dest-decompress",
         f"docker://{registry.address}/imagekit-test/blobs-z:t-zstd", f"dir:{out}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = {"sha256:" + hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir() if p.name != "manifest.json"}
    assert set(diff_ids) <= got  # each layer decompressed by skopeo is the image's own tar


def test_blobs_prepared_during_the_build_are_what_the_push_uploads(engine, registry, image, tmp_path, monkeypatch):
    """blob_prepare compresses each layer in its background worker while a build goes on; the push then uploads
    those files, reading no layer, and publishes the very blobs and manifest an unprepared push does."""
    from imagekit.services.publishing import blob_prepare

    plain, _, _ = _push(engine, registry, image, "imagekit-test/blobs-plain", "t", tmp_path / "c0", monkeypatch)
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "c1"))
    said: list[str] = []
    prep = blob_prepare.Prepare(engine, blob_push.default_gzip(), said.append)
    prep.add(image)
    prep.add(image)  # an image whose layers are queued already queues nothing
    stats = prep.finish()
    assert (stats.layers, stats.found, stats.failures) == (3, 0, []) and stats.read > layer_blobs.MEMBER
    files = sorted(blob_push.blob_cache_dir(blob_push.default_gzip()).glob("*.blob"))
    assert len(files) == 3
    digest, pushed, _ = _push(engine, registry, image, "imagekit-test/blobs-ready", "t", tmp_path / "c1", monkeypatch)
    assert digest == plain  # the same blobs, so the same manifest
    assert (pushed.prepared, pushed.sent, pushed.read_bytes) == (3, 3, 0)
    assert not list(files[0].parent.glob("*.blob"))  # the push took them
    # a rebuild pushing to a registry that holds these blobs (as this machine remembers them) prepares none
    holds = blob_prepare.Prepare(engine, blob_push.default_gzip(), said.append, lambda blob: True)
    holds.add(image)
    assert (holds.finish().present, holds.stats.layers, holds.pending) == (3, 0, [])

    # a prepared file that is not the size remembered is not uploaded: the push compresses that layer itself
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "c2"))
    prep = blob_prepare.Prepare(engine, blob_push.default_gzip(), said.append)
    prep.add(image)
    prep.finish()
    bad = sorted(blob_push.blob_cache_dir(blob_push.default_gzip()).glob("*.blob"), key=lambda p: p.stat().st_size)
    bad[-1].write_bytes(b"not the blob")
    digest, pushed, _ = _push(engine, registry, image, "imagekit-test/blobs-bad", "t", tmp_path / "c2", monkeypatch)
    assert digest == plain and pushed.prepared == 2 and pushed.read_bytes > layer_blobs.MEMBER

    # a build that ends without publishing removes what it prepared
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "c3"))
    prep = blob_prepare.Prepare(engine, blob_push.default_gzip(), said.append)
    prep.add(image)
    prep.finish()
    assert len(list(blob_push.blob_cache_dir(blob_push.default_gzip()).glob("*.blob"))) == 3
    prep.discard()
    assert not [p for p in blob_push.blob_cache_dir(blob_push.default_gzip()).iterdir() if p.suffix == ".blob"]
    assert not said  # nothing failed
