"""The release record's schema: what publish writes passes the one check every reader relies on, field by field;
each variant format of the table has its field checked; the messages name the field."""

from __future__ import annotations

import pytest

from imagekit.oci import layer_blobs, publish_formats, release_record
from imagekit.oci.release_record import Published

REPO, CELL = "r.example.com/acme/train", "cu124-torch2.5.1-py3.11-tf4.48.2"
DIGEST, CONFIG, OTHER = "sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "3" * 64


def _entry(**published: object) -> dict:
    made = Published(f"{REPO}:{CELL}-0123456789ab", f"{REPO}:{CELL}", DIGEST, False, CONFIG, **published)  # type: ignore[arg-type]
    return release_record.entry(
        made,
        lock_hash="l" * 64,
        manifest={"cell": {"id": CELL, "torch": "2.5.1"}, "image": {"ports": ["8888/http"], "jupyter": True}},
        report={"passed": True},
        size=12_000_000_000,
        published_at="2026-01-02T03:04:05Z",
        layers=[{"digest": OTHER, "compressed_bytes": 7, "created_by": "RUN x"}],
    )


def test_what_publish_writes_is_a_release_record():
    entry = _entry(
        tag_digest=OTHER,
        sbom={"attestation": OTHER, "statement": OTHER, "document": OTHER, "python": 3, "dpkg": 90},
        signature={"key": OTHER, "tags": ["sha256-" + "1" * 64 + ".sig"]},
        variants={"zstd": {"tag": f"{REPO}:{CELL}-0123456789ab-zstd", "digest": OTHER}},
    )
    assert release_record.entry_problems(entry) == []
    assert entry["reference"] == f"{REPO}@{DIGEST}" and entry["compressed_bytes"] == 7
    assert entry["zstd"]["digest"] == OTHER and "variants" not in entry  # each variant is a field of its own name
    assert release_record.record_problems(entry, f"{CELL}-0123456789ab.json") == []
    index = {"schema": 1, "images": {entry["tag"]: entry}}
    assert release_record.index_problems(index) == []


def test_a_release_without_extras_has_none_of_their_fields():
    entry = _entry()
    assert not {"tag_digest", "sbom", "signature", "zstd"} & set(entry)
    assert release_record.entry_problems(entry) == []


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("tag", f"{REPO}@{DIGEST}", "tag: "),
        ("digest", "sha256:x", "digest: "),
        ("size_bytes", release_record.MAX_IMAGE_BYTES + 1, "size_bytes: expected a number of bytes from 0 to"),
        ("zstd", {"tag": "not a tag", "digest": DIGEST}, "zstd.tag: "),
        ("zstd", [], "zstd: expected an object"),
        ("signature", {"key": DIGEST, "tags": ["x.sig"]}, "signature.tags: 'x.sig' is not of the form"),
        ("sbom", {"attestation": DIGEST, "python": -1, "dpkg": 0}, "sbom.python: expected a count from 0 to"),
    ],
)
def test_each_field_is_checked_and_named(field, value, says):
    entry = {**_entry(), field: value}
    problems = release_record.entry_problems(entry)
    assert any(p.startswith(says) for p in problems), problems


def test_a_record_file_is_named_by_its_tag():
    entry = _entry()
    assert release_record.record_name(entry["tag"]) == f"{CELL}-0123456789ab.json"
    assert release_record.record_problems(entry, "other.json") == [
        f"its name is not the tag it records ({entry['tag']})"
    ]
    assert release_record.record_problems([entry], "x.json") == ["expected an object"]


def test_a_new_formats_field_is_checked_once_it_is_in_the_table(monkeypatch):
    monkeypatch.setitem(publish_formats.FORMATS, "estargz", layer_blobs.Gzip)
    entry = {**_entry(), "estargz": {"tag": f"{REPO}:x-estargz", "digest": "sha256:short"}}
    assert [p for p in release_record.entry_problems(entry) if p.startswith("estargz.digest: ")]


def test_no_format_name_is_a_field_of_the_record():
    fields = set(_entry(tag_digest=OTHER, sbom={}, signature={"key": OTHER})) | {"config_digest"}
    assert not fields & set(publish_formats.FORMATS)


def test_the_newest_release_of_a_cell_for_its_platform():
    old, new = _entry(), {**_entry(), "tag": f"{REPO}:{CELL}-ba9876543210", "published_at": "2027-01-01T00:00:00Z"}
    arm = {**new, "tag": f"{REPO}:{CELL}-arm64-1", "manifest": {"cell": {"id": CELL, "platform": "linux/arm64"}}}
    images = {e["tag"]: e for e in (old, new, arm)}
    assert release_record.newest(images, CELL) is new
    assert release_record.newest(images, f"{REPO}:{CELL}") is new  # by alias
    assert release_record.newest(images, CELL, "linux/arm64") is arm
    assert release_record.newest(images, "cu999") is None
    assert release_record.last_size(images, CELL) == 12_000_000_000
    assert release_record.last_size(images, "cu999") is None
