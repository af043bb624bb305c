"""The wheel cache hands out only wheels that fit the image's Python and platform."""

from __future__ import annotations

import hashlib

import pytest

from imagekit.errors import EnvironmentFailure
from imagekit.lockfile import Lock, LockEntry
from imagekit.services import fetch


def _cached(cache, filename: str, payload: bytes) -> str:
    sha = hashlib.sha256(payload).hexdigest()
    (cache / "wheels" / sha).mkdir(parents=True)
    (cache / "wheels" / sha / filename).write_bytes(payload)
    return f"sha256:{sha}"


def _lock(*hashes: str) -> Lock:
    entry = LockEntry("numpy", "1.26.4", tuple(sorted(hashes)))
    return Lock((), (entry,), {"index": "http://127.0.0.1:9/simple"})  # nothing listens there


def test_a_cache_hit_must_fit_the_image(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path))
    cp312 = _cached(tmp_path, "numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", b"312")
    cp311 = _cached(tmp_path, "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", b"311")
    (got,) = fetch.fetch_lock(_lock(cp312, cp311), "3.11", "2.36")
    assert "cp311" in got.path.name and not got.downloaded
    (got,) = fetch.fetch_lock(_lock(cp312, cp311), "3.12", "2.36")
    assert "cp312" in got.path.name


def test_a_cache_holding_only_another_pythons_wheel_is_a_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path))
    cp312 = _cached(tmp_path, "numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", b"312")
    with pytest.raises(EnvironmentFailure):  # goes to the index (unreachable here) instead of the cp312 wheel
        fetch.fetch_lock(_lock(cp312, "sha256:" + "0" * 64), "3.11", "2.36")
