"""Layer blobs as imagekit publishes them (no Docker): the same layer gives the same gzip bytes whatever the reader's
chunking or the number of threads, the members read back as one stream with the standard library, the manifest is
the same bytes for the same inputs, the engine's tar-split records are read as hostile input, and a registry that
sends an upload elsewhere gets neither the bytes nor the credentials."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagekit.effects.layer_export import save_export
from imagekit.effects.registry import RegistryClient, Remote
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.oci import layer_blobs, media_types
from imagekit.services.publishing import blob_push
from tests import hostile_http


def _layer(size: int, seed: bytes = b"x") -> bytes:
    """Compressible, not trivially: hex of a hash chain."""
    out, h = bytearray(), seed
    while len(out) < size:
        h = hashlib.sha256(h).digest()
        out += h.hex().encode() * 3
    return bytes(out[:size])


@settings(max_examples=40, derandomize=True, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=30), st.integers(1, 4096))
def test_pieces_depend_on_the_bytes_never_on_how_they_were_read(cuts, size):
    data = _layer(sum(cuts))
    chunks, at = [], 0
    for n in cuts:
        chunks.append(data[at : at + n])
        at += n
    got = list(layer_blobs.pieces(chunks, size))
    assert b"".join(got) == data
    assert [len(p) for p in got[:-1]] == [size] * (len(got) - 1) and 0 < len(got[-1]) <= size


def _compress(data: bytes, workers: int, chunk: int) -> tuple[str, layer_blobs.Blob, bytes]:
    out = io.BytesIO()
    with ThreadPoolExecutor(workers) as pool:
        diff, blob = blob_push.compress(
            iter([data[i : i + chunk] for i in range(0, len(data), chunk)]), out, layer_blobs.Gzip(), pool
        )
    return diff, blob, out.getvalue()


@pytest.mark.seconds
def test_the_same_layer_is_the_same_blob_on_one_thread_or_four_and_reads_back_with_gzip():
    data = _layer(layer_blobs.MEMBER * 2 + 12345)  # three members
    one = _compress(data, 1, 1 << 20)
    four = _compress(data, 4, 3_000_001)
    assert one == four
    diff, blob, packed = one
    assert diff == "sha256:" + hashlib.sha256(data).hexdigest()
    assert blob.digest == "sha256:" + hashlib.sha256(packed).hexdigest() and blob.size == len(packed)
    assert packed.count(b"\x1f\x8b\x08") >= 3 and gzip.decompress(packed) == data  # members read as one stream
    assert len(packed) < len(data) // 2


def test_the_compressor_identity_names_what_the_bytes_depend_on(monkeypatch):
    ident = layer_blobs.Gzip(6).identity
    assert ident == f"gzip-libdeflate{layer_blobs.libdeflate_version()}-level6-member16m"
    assert blob_push.default_gzip() == layer_blobs.Gzip(4)
    monkeypatch.setenv("IMAGEKIT_GZIP_LEVEL", "9")
    assert blob_push.default_gzip().identity.endswith("-level9-member16m")
    for bad in ("0", "13", "six", "-1", "4; rm -rf /"):
        monkeypatch.setenv("IMAGEKIT_GZIP_LEVEL", bad)
        with pytest.raises(UsageError, match="not a gzip level") as exc:
            blob_push.default_gzip()
        assert "1 to 12" in exc.value.hint
    assert layer_blobs.Gzip(1).identity != ident
    assert layer_blobs.Gzip(1).compress(b"a" * 1000) != layer_blobs.Gzip(9).compress(b"a" * 1000 + b"b")


def test_the_manifest_is_the_same_bytes_for_the_same_config_and_layers():
    config = b'{"rootfs":{"diff_ids":[]}}'
    layers = [layer_blobs.Blob("sha256:" + "a" * 64, 10), layer_blobs.Blob("sha256:" + "b" * 64, 20)]
    body = layer_blobs.manifest(config, layers)
    assert body == layer_blobs.manifest(config, list(layers))
    doc = json.loads(body)
    assert doc["mediaType"] == media_types.DOCKER_MANIFEST and doc["schemaVersion"] == 2
    assert doc["config"] == {
        "mediaType": media_types.DOCKER_CONFIG,
        "size": len(config),
        "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
    }
    assert [x["digest"] for x in doc["layers"]] == [x.digest for x in layers]


def test_chain_ids_are_the_layer_stores():
    a, b = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    assert layer_blobs.chain_ids([a, b]) == [a, "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()]


def _segment(data: bytes) -> str:
    return json.dumps({"type": 2, "payload": base64.b64encode(data).decode()})


def test_tar_split_records_give_segments_and_file_bodies():
    raw = base64.b64encode("caf\xe9".encode("latin-1")).decode()
    lines = [
        _segment(b"header"),
        json.dumps({"type": 1, "name": "etc/", "payload": None}),  # a folder: no body
        json.dumps({"type": 1, "name": "etc/hosts", "size": 12}),
        json.dumps({"type": 1, "name_raw": raw, "size": 3}),
    ]
    got = list(layer_blobs.tar_split(lines))
    assert got[0] == layer_blobs.Segment(b"header")
    assert got[1] == layer_blobs.FileBody("etc/hosts", 12)
    assert got[2].size == 3 and got[2].name.encode("utf-8", "surrogateescape") == "caf\xe9".encode("latin-1")
    dotted = json.dumps({"type": 1, "name": "./etc//adduser.conf", "size": 5})  # as `docker import` tars name them
    assert list(layer_blobs.tar_split([dotted])) == [layer_blobs.FileBody("etc/adduser.conf", 5)]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("not json", "not JSON"),
        ("[1]", "not an object"),
        ('{"type": 3}', "unknown record type"),
        ('{"type": 2}', "without its bytes"),
        ('{"type": 2, "payload": "!!"}', "not base64"),
        ('{"type": 1, "name": "x", "size": -1}', "not a count"),
        ('{"type": 1, "name": "x", "size": true}', "not a count"),
        ('{"type": 1, "name": "x", "size": "12"}', "not a count"),
        ('{"type": 1, "name": "/etc/shadow", "size": 1}', "leaves the layer"),
        ('{"type": 1, "name": "../../etc/shadow", "size": 1}', "leaves the layer"),
        ('{"type": 1, "name": "a/../../b", "size": 1}', "leaves the layer"),
        ('{"type": 1, "name": "a/..", "size": 1}', "leaves the layer"),
        ('{"type": 1, "name": "a\\u0000b", "size": 1}', "leaves the layer"),
        ('{"type": 1, "name": "./", "size": 1}', "leaves the layer"),
        ('{"type": 1, "size": 1}', "no usable file name"),
    ],
)
def test_tar_split_records_that_are_not_the_engines_are_refused(line, why):
    with pytest.raises(layer_blobs.BadRecord, match=why):
        list(layer_blobs.tar_split([line]))


def test_docker_save_is_read_by_content_not_by_names(tmp_path):
    """`docker save`'s archive: layers and config found by their digests, whatever the files are called."""
    layer_a, layer_b = _tar({"a": b"one"}), _tar({"b": _layer(100_000)})
    diff_ids = ["sha256:" + hashlib.sha256(x).hexdigest() for x in (layer_a, layer_b)]
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    archive = _tar({"blobs/sha256/x": layer_b, "odd-name/layer.tar": layer_a, "c.json": config, "manifest.json": b"[]"})

    def squeeze(chunks, out):
        with ThreadPoolExecutor(2) as pool:
            return blob_push.compress(chunks, out, layer_blobs.Gzip(), pool)

    got_config, layers = save_export(
        lambda: iter([archive[:1000], archive[1000:]]), image_id, diff_ids, squeeze, tmp_path
    )
    assert got_config == config and sorted(layers) == sorted(diff_ids)
    assert gzip.decompress(layers[diff_ids[1]].path.read_bytes()) == layer_b
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(x.path.name for x in layers.values())  # no strays
    with pytest.raises(EnvironmentFailure, match="lacks layer"):
        save_export(lambda: iter([_tar({"c.json": config})]), image_id, diff_ids, squeeze, tmp_path)


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.loopback
def test_an_upload_the_registry_sends_to_another_origin_gets_no_bytes_and_no_credentials(tmp_path):
    blob = tmp_path / "blob"
    blob.write_bytes(b"secret layer")
    digest = "sha256:" + hashlib.sha256(b"secret layer").hexdigest()
    with hostile_http.serve() as elsewhere:
        with hostile_http.serve() as reg:
            reg.routes["/v2/team/img/blobs/uploads/"] = (202, {"Location": f"{elsewhere.url}/upload/1"}, b"")
            client = RegistryClient("ci", "pw", registries=[reg.address])
            with pytest.raises(EnvironmentFailure, match="sent the upload to another origin") as exc:
                client.upload_blob(Remote.parse(f"{reg.address}/team/img"), digest, 12, blob)
            assert "uploads only to the registry itself" in exc.value.hint
        assert elsewhere.seen == []


@pytest.mark.loopback
@pytest.mark.parametrize("location", ["http://127.0.0.1:0/upload/1", "//127.0.0.1:65536/upload/1"])
def test_an_upload_location_that_names_no_server_is_refused(tmp_path, location):
    """httpx takes port 0 (and connects to 80) and ports past 65535; the origin rule refuses them, as an answer."""
    blob = tmp_path / "blob"
    blob.write_bytes(b"secret layer")
    digest = "sha256:" + hashlib.sha256(b"secret layer").hexdigest()
    with hostile_http.serve() as reg:
        reg.routes["/v2/team/img/blobs/uploads/"] = (202, {"Location": location}, b"")
        with pytest.raises(EnvironmentFailure, match="no usable upload location: Invalid port"):
            RegistryClient("ci", "pw", registries=[reg.address]).upload_blob(
                Remote.parse(f"{reg.address}/team/img"), digest, 12, blob
            )
        assert [r.method for r in reg.seen] == ["POST"]


@pytest.mark.loopback
def test_an_upload_is_one_put_of_the_bytes_with_their_digest_on_the_registrys_own_origin(tmp_path):
    blob = tmp_path / "blob"
    blob.write_bytes(b"layer bytes")
    digest = "sha256:" + hashlib.sha256(b"layer bytes").hexdigest()
    with hostile_http.serve() as reg:
        reg.routes["/v2/team/img/blobs/uploads/"] = (202, {"Location": "/v2/team/img/blobs/uploads/u1?state=s"}, b"")
        reg.routes["/v2/team/img/blobs/uploads/u1"] = (201, {}, b"")
        RegistryClient().upload_blob(Remote.parse(f"{reg.address}/team/img"), digest, 11, blob)
        put = reg.seen[-1]
        assert put.method == "PUT" and put.body == b"layer bytes"
        assert f"digest={digest.replace(':', '%3A')}" in put.path and "state=s" in put.path
    with hostile_http.serve() as reg:
        reg.routes["/v2/team/img/blobs/uploads/"] = (202, {"Location": "/u"}, b"")
        reg.routes["/u"] = (400, {}, b'{"errors":[{"code":"DIGEST_INVALID"}]}')
        with pytest.raises(EnvironmentFailure, match=r"refused blob .*DIGEST_INVALID"):
            RegistryClient().upload_blob(Remote.parse(f"{reg.address}/team/img"), digest, 11, blob)


def _store(tmp_path, files: dict[str, bytes]):
    """A layer store laid out as the engine's (image db, layer db with tar-split, the layer's folder) for one layer
    whose tar holds ``files``; returns the reader and the layer's folder."""
    from imagekit.effects.layer_export import StoreExport

    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w", format=tarfile.PAX_FORMAT) as out:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    raw = tar.getvalue()
    records, at = [], 0
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as back:
        for member in back.getmembers():
            records.append(_segment(raw[at : member.offset_data]))
            records.append(json.dumps({"type": 1, "name": member.name, "size": member.size}))
            at = member.offset_data + member.size
    records.append(_segment(raw[at:]))
    diff_id = "sha256:" + hashlib.sha256(raw).hexdigest()
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    db = tmp_path / "image" / "overlay2"
    (db / "imagedb" / "content" / "sha256").mkdir(parents=True)
    (db / "imagedb" / "content" / "sha256" / image_id.split(":")[1]).write_bytes(config)
    meta = db / "layerdb" / "sha256" / diff_id.split(":")[1]
    meta.mkdir(parents=True)
    (meta / "cache-id").write_text("abc")
    (meta / "tar-split.json.gz").write_bytes(gzip.compress("\n".join(records).encode()))
    folder = tmp_path / "overlay2" / "abc" / "diff"
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return StoreExport(tmp_path, "overlay2", image_id), folder, diff_id


def test_a_layer_is_read_back_from_the_store_as_the_exact_tar_its_diff_id_names(tmp_path):
    store, _, diff_id = _store(tmp_path, {"etc/hello": b"hello\n", "opt/big": _layer(100_000)})
    assert json.loads(store.config())["rootfs"]["diff_ids"] == [diff_id]
    assert "sha256:" + hashlib.sha256(b"".join(store.layer([diff_id], 0))).hexdigest() == diff_id


@pytest.mark.parametrize("swap", ["symlinked folder", "symlink", "fifo", "other size"])
def test_a_store_whose_files_are_not_the_recorded_regular_files_is_never_read(tmp_path, swap):
    """A folder that is a link out of the layer, a file that is a link, a FIFO (a read would block), a file of another
    size: a mismatch, before a byte of it is read."""
    import os

    from imagekit.effects.layer_export import LayerMismatch

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"host secret")
    store, folder, diff_id = _store(tmp_path / "s", {"etc/hello": b"hello\n", "opt/big": b"x" * 11})
    target = folder / "opt" / "big"
    if swap == "symlinked folder":
        (folder / "opt" / "big").unlink()
        (folder / "opt").rmdir()
        (folder / "opt").symlink_to(outside)
    elif swap == "symlink":
        target.unlink()
        target.symlink_to(outside / "big")
    elif swap == "fifo":
        target.unlink()
        os.mkfifo(target)
    else:
        target.write_bytes(b"x" * 12)
    with pytest.raises(LayerMismatch, match="opt/big") as exc:
        b"".join(store.layer([diff_id], 0))
    assert "host secret" not in exc.value.render()


def test_a_push_with_a_cache_that_cannot_take_files_still_pushes_and_remembers_nothing(tmp_path, monkeypatch):
    """The blob cache is a cache: a file where its folder should be costs the memory of blobs, not the publish."""
    from imagekit.effects.registry import Remote as R
    from tests.fakes import RecordingEngine, RecordingRegistry

    blocked = tmp_path / "cache"
    blocked.write_text("not a folder")
    monkeypatch.setenv("IMAGEKIT_CACHE", str(blocked))
    engine = RecordingEngine()
    registry = RecordingRegistry(engine.calls)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [engine._layer("one")]},
    }
    image = engine.load_config(json.dumps(config).encode(), [])
    digest = blob_push.push_image(engine, registry, R.parse("127.0.0.1:5000/t"), image, "v1")
    assert registry.manifests[("t", "v1")]["config"]["digest"] == image and digest
    assert [c for c in engine.calls if c[0] == "registry.upload_blob"]  # the layer and the config went up


def test_the_zstd_variant_is_frames_of_fixed_pieces_deterministic_and_an_oci_manifest():
    import io

    import zstandard

    data = bytes(range(256)) * ((layer_blobs.MEMBER // 256) + 300)
    codec = layer_blobs.Zstd()
    frames = [codec.compress(p) for p in layer_blobs.pieces([data])]
    assert len(frames) == 2 and frames == [codec.compress(p) for p in layer_blobs.pieces([data[:5], data[5:]])]
    joined = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(b"".join(frames)), read_across_frames=True).read()
    assert joined == data
    assert codec.identity.startswith("zstd-zstandard0.25.0-level3-member16m")
    blob = layer_blobs.Blob("sha256:" + "1" * 64, 10, codec.media_type)
    body = layer_blobs.manifest(b"{}", [blob])
    doc = __import__("json").loads(body)
    assert doc["mediaType"] == media_types.OCI_MANIFEST and doc["config"]["mediaType"] == media_types.OCI_CONFIG
    assert doc["layers"][0]["mediaType"] == "application/vnd.oci.image.layer.v1.tar+zstd"
    assert layer_blobs.manifest_type(body) == media_types.OCI_MANIFEST
    gz = layer_blobs.manifest(b"{}", [layer_blobs.Blob("sha256:" + "1" * 64, 10)])
    assert layer_blobs.manifest_type(gz) == media_types.DOCKER_MANIFEST  # gzip images keep Docker's schema
