"""Wheels built from source (services/wheels/wheel_builds.py), held against bugs planted on purpose (issue 49): a short
commit is not a pin, a wheel built again from a lock's record must have the sha256 the lock records, and a built
wheel found in the cache is hashed again before it is used. The build itself is the container's: a stand-in engine
at that outer boundary leaves a wheel where the real build would; the archive, the cache and the lock are real.

Each test names its bug (`# Planted:`); each was run with it planted, and failed, and without it, and passed."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from imagekit.errors import CheckFailed
from imagekit.image.buildplan import BaseRef
from imagekit.locking import source_builds as sb
from imagekit.locking import vcs_refs
from imagekit.locking.lockfile import Lock
from imagekit.locking.resolution import LockSettings, request
from imagekit.model import Cell
from imagekit.services.wheels import wheel_builds

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11", packages=("tinypkg==1.0",))


# Planted: vcs_refs.COMMIT `[0-9a-f]{40}` -> `[0-9a-f]{7,40}` (a short commit taken for a pin).
@pytest.mark.parametrize("ref", ["0123456", COMMIT[:12], COMMIT[:39], COMMIT + "0", COMMIT.upper(), "v1.2.3"])
def test_a_short_commit_is_not_a_pin(ref):
    assert not vcs_refs.parse("x", f"git+https://h.example/o/r@{ref}").pinned
    assert vcs_refs.parse("x", f"git+https://h.example/o/r@{COMMIT}").pinned


def _wheel(version: str, extra: bytes = b"") -> bytes:
    """A wheel's bytes, the same for the same arguments (fixed timestamps)."""
    out = io.BytesIO()
    meta = f"Metadata-Version: 2.1\nName: tinypkg\nVersion: {version}\n"
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in (
            ("tinypkg/__init__.py", b"x = 1\n" + extra),
            (f"tinypkg-{version}.dist-info/METADATA", meta),
        ):
            zf.writestr(zipfile.ZipInfo(name, date_time=(2025, 1, 1, 0, 0, 0)), data)
    return out.getvalue()


def _sdist() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        data = b'[build-system]\nrequires = []\nbuild-backend = "setuptools.build_meta"\n'
        info = tarfile.TarInfo("tinypkg-1.0/pyproject.toml")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


class _Builder:
    """The container that builds: it leaves ``wheel`` in the build folder's out/, as the real build script does."""

    def __init__(self, wheel: bytes) -> None:
        self.wheel, self.builds = wheel, 0

    def run(self, image, argv, **kw):  # type: ignore[no-untyped-def]
        self.builds += 1
        for host, how in (kw.get("volumes") or {}).items():
            if how["bind"] == "/build":
                (Path(host) / "out").mkdir()
                (Path(host) / "out" / "tinypkg-1.0-py3-none-any.whl").write_bytes(self.wheel)
        return 0, "built\n", ""


@pytest.fixture
def recorded(tmp_path, monkeypatch, data) -> sb.Built:
    """The lock's record of tinypkg 1.0 built from its archive, the archive in the cache (nothing is downloaded)."""
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    archive = _sdist()
    sha = hashlib.sha256(archive).hexdigest()
    built = sb.Built(
        "tinypkg", "1.0", "https://files.example/tinypkg-1.0.tar.gz", sha, "tinypkg-1.0-py3-none-any.whl",
        hashlib.sha256(_wheel("1.0")).hexdigest(), (),
    )  # fmt: skip
    path = wheel_builds.sdist_path(sb.Sdist("tinypkg", "1.0", "tinypkg-1.0.tar.gz", built.sdist, sha))
    path.parent.mkdir(parents=True)
    path.write_bytes(archive)
    return built


def _rebuild(built: sb.Built, engine: _Builder, data) -> wheel_builds.Outcome:  # type: ignore[no-untyped-def]
    base = BaseRef("debian-bookworm", "imagekit/base:x", None, "3.11", "2.36")
    req = request(CELL, LockSettings(), data)
    return wheel_builds.build_one(
        "tinypkg", CELL, req, Lock((), (), {}), base, engine, expect=built, log=lambda _: None
    )


# Planted: wheel_builds.build_one without `if expect is not None and sha != expect.wheel_sha256: raise CheckFailed`.
def test_a_rebuilt_wheel_is_compared_with_the_recorded_sha256(recorded, data):
    other = _Builder(_wheel("1.0", extra=b"# built on another day\n"))
    with pytest.raises(CheckFailed, match="this package's build is not reproducible here"):
        _rebuild(recorded, other, data)
    same = _Builder(_wheel("1.0"))
    done = _rebuild(recorded, same, data)
    assert done.built.wheel_sha256 == recorded.wheel_sha256 and not done.reused and same.builds == 1


# Planted: wheel_builds.cached without `sha256_of(path) == built.wheel_sha256` (a file at the path is taken).
def test_a_cached_built_wheel_is_hashed_again_against_the_lock_before_use(recorded, data):
    from imagekit.services.wheels.wheel_cache import wheel_cache

    path = wheel_cache() / recorded.wheel_sha256 / recorded.wheel
    path.parent.mkdir(parents=True)
    path.write_bytes(_wheel("1.0", extra=b"import os; os.system('id')\n"))  # another wheel under the locked name
    assert wheel_builds.cached(recorded) is None
    lock = Lock((), (), dict([recorded.meta()]))
    base = BaseRef("debian-bookworm", "imagekit/base:x", None, "3.11", "2.36")
    engine = _Builder(_wheel("1.0"))
    assert wheel_builds.ensure_built(lock, CELL, LockSettings(), data, base, engine, lambda _: None) == 1
    assert engine.builds == 1 and wheel_builds.cached(recorded) == path  # built again: the locked bytes
    assert hashlib.sha256(path.read_bytes()).hexdigest() == recorded.wheel_sha256
