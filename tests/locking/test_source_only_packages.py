"""What has no wheel, found in one pass (services/locks/lock_cells._every_source_only): every package of the resolution
published as source archives only, at any depth, is named by one `lock` (not one per run), with the fix that builds
them (`[matrix] from_source`), against a loopback index with real wheels and archives and the real resolver."""

from __future__ import annotations

import io
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from imagekit.effects import resolver
from imagekit.locking import resolution
from imagekit.locking import source_builds as sb
from imagekit.model import Cell
from imagekit.services import inputs
from imagekit.services.locks import lock_cells
from tests.wheelfactory import build_wheel, fake_pypi_wheels, serve, write_simple_index

CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11")


def sdist(out: Path, name: str, version: str) -> Path:
    """A source archive (never built here: the lock refuses it, naming it)."""
    out.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b'[build-system]\nrequires = ["setuptools"]\n'
        info = tarfile.TarInfo(f"{name}-{version}/pyproject.toml")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    path = out / f"{name}-{version}.tar.gz"
    path.write_bytes(buf.getvalue())
    return path


def test_a_placeholder_is_a_wheel_of_that_name_and_version_with_nothing_in_it():
    filename, data = sb.placeholder_wheel("deep-src", "1.0.post1")
    assert filename == "deep_src-1.0.post1-py3-none-any.whl" and sb.wheel_named(filename, "deep-src", "1.0.post1")
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert sorted(zf.namelist()) == [f"deep_src-1.0.post1.dist-info/{f}" for f in ("METADATA", "RECORD", "WHEEL")]
        meta = zf.read("deep_src-1.0.post1.dist-info/METADATA").decode()
    assert "Name: deep-src\nVersion: 1.0.post1\n" in meta and "Requires-Dist" not in meta
    assert sb.placeholder_wheel("deep-src", "1.0.post1")[1] == data  # the same bytes every time


@pytest.fixture
def index(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    w = tmp_path / "w"
    files = [
        *fake_pypi_wheels(w),
        build_wheel(w, "midlib", "1.0", ["deepsrc>=0.5"]),  # deepsrc: a dependency of a dependency
        build_wheel(w, "other", "1.0", ["leafsrc"]),
        sdist(w, "deepsrc", "1.0"),
        sdist(w, "deepsrc", "0.4"),
        sdist(w, "topsrc", "2.0"),
        sdist(w, "leafsrc", "3.0"),
    ]
    write_simple_index(tmp_path / "pypi", files)
    with serve(tmp_path / "pypi") as url:
        yield f"{url}/simple"


@pytest.mark.resolver
def test_every_source_only_package_is_named_by_one_lock_at_any_depth(index, tmp_path):
    cell = replace(CELL, packages=("midlib", "topsrc", "other"))
    res = lock_cells.lock_one(cell, tmp_path / "locks", resolution.LockSettings(index_url=index), inputs.compat_data())
    assert res.status == "failed" and isinstance(res.error, resolver.NoWheel), res.error and res.error.render()
    assert set(res.error.names) == {"topsrc", "deepsrc", "leafsrc"}, res.error.render()
    assert "3 packages have no wheel for Python 3.11" in res.error.message
    assert 'from_source = ["' in res.error.hint and "[matrix]" in res.error.hint
    assert all(f'"{n}"' in res.error.hint for n in ("topsrc", "deepsrc", "leafsrc"))
    assert not (tmp_path / "locks").exists()  # nothing written


@pytest.mark.resolver
def test_one_source_only_package_says_from_source(index, tmp_path):
    cell = replace(CELL, packages=("midlib",))
    res = lock_cells.lock_one(cell, tmp_path / "locks", resolution.LockSettings(index_url=index), inputs.compat_data())
    assert isinstance(res.error, resolver.NoWheel) and res.error.names == ("deepsrc",), res.error
    assert "deepsrc has no wheel for Python 3.11" in res.error.message
    assert res.error.hint.startswith('build them once from their source archives: from_source = ["deepsrc"]')
