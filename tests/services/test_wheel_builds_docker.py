"""The wheel-build stage on a real engine: a source archive with a C extension, whose setup imports the cell's torch
(no build isolation), built in a container of the cell's base with the network off, locked by the wheel's sha256,
and built again from the lock's record on a cache without the wheel: the same bytes, or a refusal naming both hashes.
Hostile archives (one reaching for the network, one writing outside its folder, one planting a link where the wheel
goes) fail with their log, leave nothing in the wheel cache and nothing on the host.

The cell is a fake one (tests/wheelfactory.py: its torch a stand-in whose ``__version__`` the build records);
setuptools is PyPI's own wheel, the compiler the base's."""

from __future__ import annotations

import io
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from imagekit.errors import CheckFailed
from imagekit.image.buildplan import base_for
from imagekit.image.image_options import ImageOptions
from imagekit.locking import resolution
from imagekit.locking import source_builds as sb
from imagekit.model import Cell
from imagekit.services import inputs
from imagekit.services.builds.base_images import present
from imagekit.services.locks import lock_cells
from imagekit.services.wheels import wheel_builds
from imagekit.services.wheels.wheel_cache import wheel_cache
from tests.wheelfactory import fake_pypi_wheels, pypi_wheel, serve, write_simple_index

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.loopback]

SETUPTOOLS = "setuptools-75.6.0-py3-none-any.whl"
PYPROJECT = """[build-system]
requires = ["setuptools>=70.1"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "1.0"
dependencies = ["numpy>=1.17"]
"""
SETUP = """import torch  # the cell's, from its torch layer: no build isolation
from setuptools import Extension, setup
{hostile}
with open("{pkg}/_torch.py", "w") as fh:
    fh.write("BUILT_WITH = %r\\n" % torch.__version__)
setup(packages=["{pkg}"], ext_modules=[Extension("{pkg}._fast", ["{pkg}/fast.c"])])
"""
FAST_C = """#include <Python.h>
static PyObject *twice(PyObject *self, PyObject *arg) { return PyLong_FromLong(2 * PyLong_AsLong(arg)); }
static PyMethodDef methods[] = {{"twice", twice, METH_O, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fast", NULL, -1, methods};
PyMODINIT_FUNC PyInit__fast(void) { return PyModule_Create(&module); }
"""
HOSTILE = {
    "netkit": 'import socket\nsocket.create_connection(("1.1.1.1", 443), timeout=5)\n',
    "writekit": 'open("/in/planted", "w").write("x")\nopen("/wheels/planted.whl", "w").write("x")\n',
    "linkkit": (
        'import os\nos.makedirs("/build/out", exist_ok=True)\n'
        'link = "/build/out/linkkit-1.0-cp311-cp311-linux_x86_64.whl"\n'
        'if not os.path.lexists(link):\n    os.symlink("/build/home/through-the-link.whl", link)\n'
    ),
}


def _sdist(out: Path, name: str, hostile: str = "") -> Path:
    """``NAME-1.0.tar.gz`` (deterministic bytes): pyproject.toml, setup.py, the package and its C file."""
    pkg = name.replace("-", "_")
    top = f"{name}-1.0"
    files = {
        f"{top}/pyproject.toml": PYPROJECT.format(name=name),
        f"{top}/setup.py": SETUP.format(pkg=pkg, hostile=hostile),
        f"{top}/{pkg}/__init__.py": "from ._fast import twice\n",
        f"{top}/{pkg}/fast.c": FAST_C,
    }
    out.mkdir(parents=True, exist_ok=True)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as tf:
        for path, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mtime, info.mode = len(data), 315532800, 0o644
            tf.addfile(info, io.BytesIO(data))
    path = out / f"{top}.tar.gz"
    path.write_bytes(raw.getvalue())
    return path


@pytest.fixture
def index(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    files = [*fake_pypi_wheels(tmp_path / "w"), pypi_wheel(tmp_path / "w", SETUPTOOLS)]
    files += [_sdist(tmp_path / "s", "opskit"), *(_sdist(tmp_path / "s", n, h) for n, h in HOSTILE.items())]
    write_simple_index(tmp_path / "pypi", files)
    with serve(tmp_path / "pypi") as url:
        yield resolution.LockSettings(index_url=f"{url}/simple")


@pytest.fixture(scope="module")
def base(engine):
    data = inputs.compat_data()
    return present(base_for("3.11", data, {}, ImageOptions()), engine, data.bases)


def _cell(name: str) -> Cell:
    return Cell("12.4", "2.5.1", "4.48.2", "3.11", (f"{name}>=1",), from_source=(name,))


def test_an_archive_with_a_c_extension_is_built_once_locked_and_built_again_to_the_same_bytes(
    engine, base, index, tmp_path
):
    data, lines = inputs.compat_data(), []
    cell = _cell("opskit")
    build = wheel_builds.builder_in(engine, base, lines.append)
    locked = lock_cells.lock_one(cell, tmp_path / "locks", index, data, build=build)
    assert locked.status == "locked", locked.error and locked.error.render()
    built = sb.recorded(locked.lock.meta)["opskit"]
    assert built.wheel == "opskit-1.0-cp311-cp311-linux_x86_64.whl" and built.version == "1.0"
    assert [r.split("==")[0] for r in built.requires] == ["setuptools"]
    pin = {e.name: e for e in locked.lock.entries}["opskit"]
    assert pin.hashes == (f"sha256:{built.wheel_sha256}",) and "numpy" in {e.name for e in locked.lock.entries}
    wheel = wheel_cache() / built.wheel_sha256 / built.wheel
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "opskit/_fast.cpython-311-x86_64-linux-gnu.so" in names, names
        assert zf.read("opskit/_torch.py") == b"BUILT_WITH = '2.5.1'\n"  # the cell's torch, seen by the build
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}  # SOURCE_DATE_EPOCH
    assert any("building opskit-1.0.tar.gz" in line for line in lines), lines
    assert not list(Path("/tmp").glob("imagekit-wheel-build-*"))  # the scratch folder is gone

    # the same inputs: the kept wheel, no build
    lines.clear()
    again = lock_cells.lock_one(cell, tmp_path / "locks", index, data, build=build, upgrade=("opskit",))
    assert again.status == "locked" and again.lock.render() == locked.lock.render()
    assert not any("building" in line for line in lines) and any("reused" in line for line in lines), lines

    # a machine without the wheel builds it again from the lock's record: the same bytes
    wheel.unlink()
    for kept in wheel_builds.built_dir().iterdir():
        kept.unlink()
    req = resolution.request(cell, index, data)
    assert wheel_builds.ensure_built(locked.lock, cell, index, data, base, engine, lines.append) == 1
    assert wheel_builds.cached(built) == wheel
    assert wheel_builds.ensure_built(locked.lock, cell, index, data, base, engine, lines.append) == 0

    # a record whose wheel this build does not give is refused, naming both hashes
    wheel.unlink()
    other = replace(built, wheel_sha256="0" * 64)
    with pytest.raises(CheckFailed) as caught:
        wheel_builds.build_one("opskit", cell, req, locked.lock, base, engine, expect=other, log=lines.append)
    assert "0" * 64 in caught.value.message and built.wheel_sha256 in caught.value.message
    assert "not reproducible" in caught.value.message


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_build_is_contained_and_fails_with_its_log(engine, base, index, tmp_path, name):
    data = inputs.compat_data()
    build = wheel_builds.builder_in(engine, base, lambda _line: None)
    result = lock_cells.lock_one(_cell(name), tmp_path / "locks", index, data, build=build)
    assert result.status == "failed" and result.error is not None
    said = result.error.render()
    assert f"{name}-1.0.tar.gz" in said, said
    if name == "netkit":
        assert "Network is unreachable" in said and "network, which is off" in said, said
    elif name == "writekit":
        assert "Read-only file system" in said, said
    else:
        assert "refused" in said and "link" in said, said
    assert not (tmp_path / "locks").exists() or not list((tmp_path / "locks").iterdir())
    assert not list(wheel_builds.built_dir().glob("*.json")) if wheel_builds.built_dir().exists() else True
    assert not list(wheel_cache().glob(f"*/{name.replace('-', '_')}-*")) if wheel_cache().exists() else True
    assert not list(Path("/tmp").glob("imagekit-wheel-build-*"))


def _git_repo(root: Path) -> str:
    """A repository of a small package (setuptools' backend), as a bare repository served over git's dumb HTTP by
    tests.wheelfactory.serve; returns its commit."""
    import subprocess

    work = root / "work"
    (work / "gitkit").mkdir(parents=True)
    (work / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=70.1"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "gitkit"\nversion = "2.0"\ndependencies = ["numpy>=1.17"]\n'
    )
    (work / "gitkit" / "__init__.py").write_text("VALUE = 2\n")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z", "HOME": str(root),
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    run = lambda *a, cwd=work: subprocess.run(["git", *a], cwd=cwd, env=env, check=True, capture_output=True, text=True)  # noqa: E731
    run("init", "-q", "-b", "main")
    run("add", ".")
    run("commit", "-q", "-m", "gitkit 2.0")
    run("clone", "-q", "--bare", str(work), str(root / "served" / "gitkit.git"), cwd=root)
    run("update-server-info", cwd=root / "served" / "gitkit.git")
    return run("rev-parse", "HEAD").stdout.strip()


def test_a_git_requirement_is_locked_by_commit_and_a_branch_is_refused_with_the_commit_it_names(
    engine, base, index, tmp_path
):
    from imagekit.locking.direct_wheels import requirement
    from tests.wheelfactory import serve as serve_folder

    data = inputs.compat_data()
    commit = _git_repo(tmp_path / "git")
    build = wheel_builds.builder_in(engine, base, lambda _line: None)
    with serve_folder(tmp_path / "git" / "served") as url:
        branch = Cell("12.4", "2.5.1", "4.48.2", "3.11", (requirement(f"gitkit @ git+{url}/gitkit.git@main"),))
        refused = lock_cells.lock_one(branch, tmp_path / "locks", index, data, build=build)
        assert refused.status == "failed", refused
        assert f"today it names commit {commit}" in refused.error.message
        assert f"gitkit @ git+{url}/gitkit.git@{commit}" in refused.error.hint

        pinned = replace(branch, packages=(requirement(f"gitkit @ git+{url}/gitkit.git@{commit}"),))
        locked = lock_cells.lock_one(pinned, tmp_path / "locks", index, data, build=build)
    assert locked.status == "locked", locked.error and locked.error.render()
    record = sb.recorded(locked.lock.meta)["gitkit"]
    assert record.sdist == f"git+{url}/gitkit.git@{commit}" and record.version == "2.0"
    assert record.wheel == "gitkit-2.0-py3-none-any.whl"
    assert {e.name: e.version for e in locked.lock.entries}["gitkit"] == "2.0"
    # the lock is this cell's, and current: read back and verified as a build reads it
    assert lock_cells.verified_lock(locked.path, pinned, data, current=True) is not None


def test_a_nameless_git_line_of_a_requirements_file_is_named_locked_and_built_from_a_local_git_server(
    engine, base, index, tmp_path
):
    """pip's own form, `git+URL@<commit>` with no name (issue 50): the name read from the commit's pyproject.toml,
    then the same wheel-build stage as for a named line."""
    from tests.wheelfactory import serve as serve_folder

    data = inputs.compat_data()
    commit = _git_repo(tmp_path / "git")
    build = wheel_builds.builder_in(engine, base, lambda _line: None)
    project = tmp_path / "project"
    project.mkdir()
    with serve_folder(tmp_path / "git" / "served") as url:
        (project / "requirements.txt").write_text(f"git+{url}/gitkit.git@{commit}\n")
        (project / "imagekit.toml").write_text(
            '[matrix]\nrequirements = "requirements.txt"\n[[matrix.include]]\ncuda = "12.4"\ntorch = "2.5.1"\n'
            'transformers = "4.48.2"\npython = "3.11"\n'
        )
        (cell,) = inputs.load_matrix(project / "imagekit.toml", data).cells
        assert cell.packages == (f"gitkit @ git+{url}/gitkit.git@{commit}",)
        locked = lock_cells.lock_one(cell, tmp_path / "locks", index, data, build=build)
    assert locked.status == "locked", locked.error and locked.error.render()
    record = sb.recorded(locked.lock.meta)["gitkit"]
    assert record.sdist == f"git+{url}/gitkit.git@{commit}" and record.wheel == "gitkit-2.0-py3-none-any.whl"


def test_a_source_only_dependency_of_a_dependency_is_built_when_named(engine, base, index, tmp_path):
    """`from_source` names a package no requirement of the cell names, only a wheel it requires (`usesops`
    requires `opskit`): the first resolution meets it by placeholders, the build takes the version the tree chose,
    and the lock holds the built wheel, no placeholder."""
    from tests.wheelfactory import build_wheel

    pypi = tmp_path / "pypi"
    extra = build_wheel(tmp_path / "w2", "usesops", "1.0", ["opskit>=1"])
    files = [*(pypi / "files").iterdir(), extra]
    write_simple_index(pypi, files)  # the same index, with the wheel that requires opskit
    data, lines = inputs.compat_data(), []
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11", ("usesops",), from_source=("opskit",))
    locked = lock_cells.lock_one(cell, tmp_path / "locks", index, data, build=wheel_builds.builder_in(
        engine, base, lines.append))  # fmt: skip
    assert locked.status == "locked", locked.error and locked.error.render()
    built = sb.recorded(locked.lock.meta)["opskit"]
    pins = {e.name: e for e in locked.lock.entries}
    assert built.version == "1.0" and pins["opskit"].hashes == (f"sha256:{built.wheel_sha256}",)
    assert pins["usesops"].version == "1.0" and "numpy" in pins
