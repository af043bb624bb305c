"""A layer compressed straight into its upload (blob_push.stream_layer): against Debian's docker-registry on loopback
the streamed bytes are the blob the registry checks against the digest the PUT names; a registry that refuses the
stream gets each layer from a file instead, the same blobs; a registry that sends the stream elsewhere gets nothing
(tests/hostile_http.py's recording server as that registry)."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from imagekit.effects.registry import RegistryClient, Remote, Upload
from imagekit.errors import EnvironmentFailure
from imagekit.oci import layer_blobs
from imagekit.services.progress import NullProgress
from imagekit.services.publishing import blob_push
from tests.fakes import FakeStore
from tests.hostile_http import serve
from tests.registry import Registry, free_port

pytestmark = pytest.mark.loopback


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = Registry(tmp_path_factory.mktemp("stream-reg"), free_port()).start()
    yield reg
    reg.stop()


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_a_streamed_upload_is_the_blob_its_digest_names_and_a_wrong_digest_is_refused(registry):
    client = RegistryClient()
    remote = Remote.parse(f"{registry.address}/imagekit-test/stream")
    assert client.holds_tags(remote) is False  # no such repository yet
    pieces = [b"a" * 70000, bytearray(b"b" * 5), b"c" * 1000]
    data = b"".join(pieces)
    upload = client.stream_upload(client.start_upload(remote), iter(pieces))
    client.finish_upload(upload, _sha(data))
    assert client.blob(remote, _sha(data), 1 << 20) == data

    wrong = client.stream_upload(client.start_upload(remote), iter([b"not what the digest names"]))
    with pytest.raises(EnvironmentFailure, match="refused blob"):
        client.finish_upload(wrong, _sha(b"something else"))
    assert client.blob_size(remote, _sha(b"something else")) is None

    config = b'{"rootfs":{"type":"layers","diff_ids":[]}}'
    client.upload_blob(remote, _sha(config), len(config), config)
    body = layer_blobs.manifest(config, [])
    client.put_manifest(remote, "t", body, layer_blobs.manifest_type(body))
    assert client.holds_tags(remote) is True


class _RefusesStreams(RegistryClient):
    """The client of a registry that answers a streamed PATCH with an error after reading some of it."""

    def stream_upload(self, upload: Upload, chunks):
        next(iter(chunks))
        raise EnvironmentFailure("registry refused a streamed upload (HTTP 400)", "uploaded from a file instead")


def _push(client: RegistryClient, registry, repo: str, store: FakeStore, diff_ids: list[str], tmp: Path):
    push = blob_push._Push(None, client, Remote.parse(f"{registry.address}/{repo}"), layer_blobs.Gzip(),  # type: ignore[arg-type]
                           NullProgress(), "t", None)  # fmt: skip
    push.stream = True
    with ThreadPoolExecutor(2) as pool, ThreadPoolExecutor(2) as uploads:
        push.uploads = uploads
        push.from_store(store, diff_ids, tmp, pool)
        push.wait()
    return push


def test_layers_stream_into_an_empty_repository_and_go_through_files_where_the_stream_is_refused(
    registry, tmp_path, monkeypatch
):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    tars = [bytes(range(256)) * 300_000, b"small layer\n" * 10]  # the first is several gzip members
    diff_ids = [_sha(t) for t in tars]
    store = FakeStore(b"{}", dict(zip(diff_ids, tars, strict=True)))
    streamed = _push(RegistryClient(), registry, "imagekit-test/streamed", store, diff_ids, tmp_path)
    assert (streamed.stats.streamed, streamed.stats.sent, streamed.stream) == (2, 2, True)
    assert not list(tmp_path.glob("layer-*"))  # no file between the compression and the upload

    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache2"))
    refused = _push(_RefusesStreams(), registry, "imagekit-test/refused", store, diff_ids, tmp_path)
    assert (refused.stats.streamed, refused.stats.sent, refused.stream) == (0, 2, False)
    assert refused.blobs == streamed.blobs  # the same blobs either way
    remote = Remote.parse(f"{registry.address}/imagekit-test/refused")
    for i, tar in enumerate(tars):
        blob = RegistryClient().blob(remote, refused.blobs[i].digest, 64 << 20)
        assert layer_blobs.sha256(blob) == streamed.blobs[i].digest
        import gzip

        assert gzip.decompress(blob) == tar


def test_a_layer_that_is_not_its_diff_id_is_never_completed(registry, tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    store = FakeStore(b"{}", {_sha(b"claimed"): b"other bytes"})
    with pytest.raises(Exception, match="hashes to"):
        _push(RegistryClient(), registry, "imagekit-test/mismatch", store, [_sha(b"claimed")], tmp_path)
    remote = Remote.parse(f"{registry.address}/imagekit-test/mismatch")
    import gzip

    assert RegistryClient().blob_size(remote, layer_blobs.sha256(gzip.compress(b"other bytes"))) is None
    assert RegistryClient().holds_tags(remote) is False


def test_a_streamed_upload_sent_to_another_origin_is_refused_and_sends_it_nothing():
    with serve() as elsewhere, serve() as hostile:
        hostile.routes["/v2/x/y/blobs/uploads/"] = (202, {"Location": "/v2/x/y/blobs/uploads/1"}, b"")
        hostile.routes["/v2/x/y/blobs/uploads/1"] = (202, {"Location": f"{elsewhere.url}/steal"}, b"")
        client = RegistryClient()
        remote = Remote.parse(f"{hostile.address}/x/y")
        upload = client.start_upload(remote)
        with pytest.raises(EnvironmentFailure, match="another origin"):
            client.stream_upload(upload, iter([b"layer bytes"]))
        assert [(s.method, s.body) for s in hostile.seen][-1] == ("PATCH", b"layer bytes")
        assert elsewhere.seen == []


@pytest.mark.parametrize(
    ("answer", "holds"),
    [
        ((200, {}, b'{"name":"x/y","tags":["a"]}'), True),
        ((200, {}, b'{"name":"x/y","tags":[]}'), False),
        ((200, {}, b'{"name":"x/y","tags":null}'), False),
        ((404, {}, b'{"errors":[{"code":"NAME_UNKNOWN"}]}'), False),
        ((200, {}, b'["not", "the API"]'), None),
        ((200, {}, b'{"tags":"a"}'), None),
        ((200, {}, b"not json"), None),
        ((500, {}, b""), None),
    ],
)
def test_whether_a_repository_holds_an_image_is_read_as_untrusted_and_unknown_is_not_empty(answer, holds):
    with serve({"/v2/x/y/tags/list": answer}) as hostile:
        assert RegistryClient().holds_tags(Remote.parse(f"{hostile.address}/x/y")) is holds
