"""A prepared blob (services/publishing/blob_prepare) is a file in the cache another local process could have
planted or changed: the push takes it only as a regular file of this user's, with no other name, of the size and
the sha256 remembered, moved out of the cache (never followed through a link); anything else is removed and the
layer compressed again. Files only: no engine, no registry."""

from __future__ import annotations

import hashlib
import os

import pytest

from imagekit.oci import layer_blobs
from imagekit.services.publishing import blob_push

DIFF = "sha256:" + "d" * 64
BLOB = b"the blob's bytes" * 100


@pytest.fixture
def codec(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    codec = blob_push.default_gzip()
    digest = "sha256:" + hashlib.sha256(BLOB).hexdigest()
    blob_push.remember(codec, DIFF, layer_blobs.Blob(digest, len(BLOB)))
    return codec


def test_a_prepared_blob_is_moved_to_the_push_and_taken_once(codec, tmp_path):
    blob_push.prepared_path(codec, DIFF).write_bytes(BLOB)
    got = blob_push.take_prepared(codec, DIFF, tmp_path / "one")
    assert got is not None and got.size == len(BLOB) and (tmp_path / "one").read_bytes() == BLOB
    assert not blob_push.prepared_path(codec, DIFF).exists()
    assert blob_push.take_prepared(codec, DIFF, tmp_path / "two") is None  # taken: another push compresses


@pytest.mark.parametrize("plant", ["other bytes", "a link", "a second name", "a folder", "a FIFO"])
def test_what_is_not_the_remembered_blob_is_not_taken(codec, tmp_path, plant):
    path = blob_push.prepared_path(codec, DIFF)
    elsewhere = tmp_path / "secret"
    elsewhere.write_bytes(BLOB)  # the right bytes, elsewhere: a link to it must not be followed
    if plant == "other bytes":
        path.write_bytes(b"X" * len(BLOB))  # the size remembered, not the bytes
    elif plant == "a link":
        path.symlink_to(elsewhere)
    elif plant == "a second name":
        os.link(elsewhere, path)  # another name of a file someone else may change
    elif plant == "a FIFO":
        os.mkfifo(path)  # opened, it would block the push forever
    else:
        path.mkdir()
    assert blob_push.take_prepared(codec, DIFF, tmp_path / "dest") is None
    assert not os.path.lexists(tmp_path / "dest")  # nothing left where the push writes the layer itself
    assert elsewhere.read_bytes() == BLOB


def test_nothing_is_taken_without_a_remembered_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    codec = blob_push.default_gzip()
    blob_push.prepared_path(codec, DIFF).parent.mkdir(parents=True)
    blob_push.prepared_path(codec, DIFF).write_bytes(BLOB)
    assert blob_push.take_prepared(codec, DIFF, tmp_path / "dest") is None


@pytest.mark.parametrize(("value", "on"), [("0", False), ("false", False), (" OFF\n", False), ("no", False),
                                           ("1", True), ("yes", True), ("On", True)])  # fmt: skip
def test_preparing_is_turned_on_or_off_the_ways_a_user_writes_it(monkeypatch, value, on):
    from imagekit.services.publishing import blob_prepare

    monkeypatch.setenv("IMAGEKIT_PREPARE_BLOBS", value)
    assert blob_prepare.enabled(cpus=2) is on and blob_prepare.enabled(cpus=64) is on


@pytest.mark.parametrize("value", [None, "", "auto", " AUTO "])
def test_by_default_blobs_are_prepared_only_where_cores_are_left_to_compress_on(monkeypatch, value):
    from imagekit.services.publishing import blob_prepare

    if value is None:
        monkeypatch.delenv("IMAGEKIT_PREPARE_BLOBS", raising=False)
    else:
        monkeypatch.setenv("IMAGEKIT_PREPARE_BLOBS", value)
    assert [blob_prepare.enabled(cpus=n) for n in (1, 2, 3, 4, 16)] == [False, False, False, True, True]
    assert blob_prepare.enabled() is (len(os.sched_getaffinity(0)) >= blob_prepare.MIN_CPUS)


@pytest.mark.parametrize("value", ["maybe", "nan", "2", "on\noff", "1e9"])
def test_a_value_that_is_not_on_off_or_auto_is_a_clear_error(monkeypatch, value):
    from imagekit.errors import UsageError
    from imagekit.services.publishing import blob_prepare

    monkeypatch.setenv("IMAGEKIT_PREPARE_BLOBS", value)
    with pytest.raises(UsageError, match="is not on, off or auto") as caught:
        blob_prepare.enabled(cpus=8)
    assert "unset it" in caught.value.hint
