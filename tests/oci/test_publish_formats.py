"""The publish formats: one table by name, one interface (a whole tar in, a blob out) that gzip, zstd and a format
with a table of contents all fit, and the manifest that names what they made."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from imagekit.errors import UsageError
from imagekit.oci import layer_blobs, media_types, publish_formats
from imagekit.trust import validate


@pytest.mark.parametrize("name", sorted(publish_formats.FORMATS))
def test_each_format_in_the_table_is_a_layer_format_named_by_its_key(name):
    codec = publish_formats.named(name)
    assert codec.name == name and isinstance(codec.rewrites_tars, bool)
    assert validate.TAG.fullmatch(f"cu124-torch2.5.1-py3.11-tf4.48.2-0123456789ab-{name}")  # a tag suffix
    assert codec.identity.startswith(name) and codec.media_type in vars(media_types).values()
    assert callable(codec.encode)


def test_the_default_is_never_a_variant_and_an_unknown_name_is_refused():
    assert publish_formats.DEFAULT == "gzip" and publish_formats.variants() == ("zstd",)
    assert publish_formats.variant("zstd") == layer_blobs.Zstd()
    with pytest.raises(UsageError, match="no publish format variant 'gzip'"):
        publish_formats.variant("gzip")
    with pytest.raises(UsageError, match="no publish format 'estargz'") as exc:
        publish_formats.named("estargz")
    assert exc.value.hint == "name one of gzip, zstd"


@pytest.mark.parametrize("codec", [layer_blobs.Gzip(1), layer_blobs.Zstd()])
def test_encoding_in_pieces_is_the_pieces_compressed_in_order(codec):
    data = bytes(range(256)) * ((layer_blobs.MEMBER // 256) + 7)
    written: list[bytes] = []
    with ThreadPoolExecutor(3) as pool:
        blob = codec.encode(iter([data[:100], data[100:]]), written.append, pool)
    expected = b"".join(codec.compress(p) for p in layer_blobs.pieces([data]))
    assert b"".join(written) == expected and len(written) == 2
    assert blob == layer_blobs.Blob(layer_blobs.sha256(expected), len(expected), codec.media_type)


def test_a_layer_type_dockers_schema_lacks_makes_an_oci_manifest_with_its_annotations():
    toc = {"org.example.toc.digest": "sha256:" + "9" * 64}
    lazy = layer_blobs.Blob("sha256:" + "1" * 64, 10, "application/vnd.oci.image.layer.v1.tar+gzip", toc)
    plain = layer_blobs.Blob("sha256:" + "2" * 64, 20)
    doc = json.loads(layer_blobs.manifest(b"{}", [plain, lazy]))
    assert doc["mediaType"] == media_types.OCI_MANIFEST and doc["config"]["mediaType"] == media_types.OCI_CONFIG
    assert doc["layers"][1]["annotations"] == toc and "annotations" not in doc["layers"][0]
    assert list(doc["layers"][0]) == ["mediaType", "size", "digest"]  # gzip's descriptors as before
    assert json.loads(layer_blobs.manifest(b"{}", [plain]))["mediaType"] == media_types.DOCKER_MANIFEST


def test_a_config_names_the_tars_a_format_rewrote_and_is_kept_byte_for_byte_otherwise():
    config = b'{"architecture": "amd64", "rootfs": {"type": "layers", "diff_ids": ["sha256:a"]}}'
    assert layer_blobs.config_naming(config, ["sha256:a"]) is config
    renamed = json.loads(layer_blobs.config_naming(config, ["sha256:b"]))
    assert renamed == {"architecture": "amd64", "rootfs": {"type": "layers", "diff_ids": ["sha256:b"]}}
    assert layer_blobs.config_naming(config, ["sha256:b"]) == layer_blobs.config_naming(config, ["sha256:b"])
