"""`[image] install`: the project's own `[build-system] requires` joins every cell's packages when the matrix file is
read (services/inputs.with_build_backend, matrix/project_axes.with_build_requires), so the lock holds the backend the
wheel is built with, offline, and no build fails for want of `hatchling` the user had to name by hand; setuptools
older than 70.1 asks for `wheel` too (image/project_wheel.build_requires). Pure: files read, nothing run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from imagekit.errors import ConfigError
from imagekit.image import project_wheel
from imagekit.image.project_wheel import BuildSystem
from imagekit.services import inputs

MATRIX = """[matrix]
cuda = ["12.4"]
torch = ["2.5.1"]
transformers = ["4.48.2"]
python = ["3.11", "3.12"]
packages = [{packages}]

[image]
copy = "."
install = "{install}"
"""


def _project(tmp_path: Path, pyproject: str | None, *, packages: str = '"numpy"', install: str = ".") -> Path:
    (tmp_path / "acme").mkdir(exist_ok=True)
    (tmp_path / "acme" / "__init__.py").write_text("")
    if pyproject is not None:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    path = tmp_path / "imagekit.toml"
    path.write_text(MATRIX.format(packages=packages, install=install))
    return path


@pytest.mark.parametrize(
    ("system", "added"),
    [
        (BuildSystem("hatchling.build", ("hatchling>=1.25",)), ()),
        (BuildSystem("setuptools.build_meta", ("setuptools>=61",)), ("wheel",)),  # 61 asks for wheel
        (BuildSystem(project_wheel.LEGACY_BACKEND, project_wheel.LEGACY_REQUIRES), ("wheel",)),
        (BuildSystem("setuptools.build_meta", ("setuptools>=70.1",)), ()),  # bdist_wheel is its own
        (BuildSystem("setuptools.build_meta", ("setuptools==75.8.0",)), ()),
        (BuildSystem("setuptools.build_meta", ("setuptools>=61,<70",)), ("wheel",)),
        (BuildSystem("setuptools.build_meta", ("setuptools>=64", "wheel>=0.40")), ()),  # named already
    ],
)
def test_the_build_requirements_are_the_projects_and_wheel_for_an_older_setuptools(system, added):
    assert project_wheel.build_requires(system) == (*system.requires, *added)


def test_the_projects_backend_joins_every_cell_once_for_its_markers(data, tmp_path):
    pyproject = """[build-system]
requires = ["hatchling>=1.25", "hatch-vcs; python_version >= '3.12'", "numpy>=1.20"]
build-backend = "hatchling.build"
"""
    config = inputs.load_matrix(_project(tmp_path, pyproject), data)
    by_python = {c.python: c.packages for c in config.cells}
    assert by_python["3.11"] == ("hatchling>=1.25", "numpy>=1.20")  # numpy: one requirement, joined
    assert by_python["3.12"] == ("hatch-vcs", "hatchling>=1.25", "numpy>=1.20")


def test_a_setup_py_alone_builds_with_setuptools_and_wheel(data, tmp_path):
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(name='acme', version='1')\n")
    config = inputs.load_matrix(_project(tmp_path, None), data)
    assert all(c.packages == ("numpy", "setuptools>=40.8.0", "wheel") for c in config.cells)


def test_a_backend_that_disagrees_with_the_matrix_or_an_axis_is_refused_when_the_file_is_read(data, tmp_path):
    pyproject = '[build-system]\nrequires = ["hatchling>=1.25", "torch==2.4.0"]\nbuild-backend = "hatchling.build"\n'
    with pytest.raises(ConfigError) as exc:
        inputs.load_matrix(_project(tmp_path, pyproject, packages='"hatchling==1.20.0"'), data)
    problems = "\n".join(exc.value.problems)
    said = f"matrix.packages: hatchling==1.20.0 conflicts with {tmp_path}/pyproject.toml [build-system] requires: "
    assert said + "hatchling>=1.25" in problems, problems
    assert "torch 2.5.1 (matrix.torch" in problems and "torch==2.4.0" in problems
    assert exc.value.exit_code == 2 and "[build-system] requires joins each cell's packages" in exc.value.hint


def test_a_project_without_a_build_and_a_hostile_pyproject_are_refused_early(data, tmp_path):
    with pytest.raises(ConfigError) as exc:
        inputs.load_matrix(_project(tmp_path, None), data)
    assert "image.install" in exc.value.problems[0] and "has no pyproject.toml or setup.py" in exc.value.problems[0]
    (tmp_path / "outside.toml").write_text('[build-system]\nrequires = ["evil"]\n')
    inner = tmp_path / "proj"
    inner.mkdir()
    os.symlink(tmp_path / "outside.toml", inner / "pyproject.toml")
    with pytest.raises(ConfigError) as exc:
        inputs.load_matrix(_project(inner, None), data)
    assert "leads out of the project through a link" in exc.value.problems[0]
    (inner / "pyproject.toml").unlink()
    (inner / "pyproject.toml").write_text('[build-system]\nrequires = ["not a requirement!"]\n')
    with pytest.raises(ConfigError) as exc:
        inputs.load_matrix(_project(inner, None), data)
    assert "is not a requirement" in exc.value.problems[0]


def _lock(*entries: tuple[str, str]):
    from imagekit.locking.lockfile import Lock, LockEntry

    return Lock(torch=(), app=tuple(LockEntry(n, v, ("sha256:" + "a" * 64,)) for n, v in entries))


def test_the_forecast_names_what_the_wheels_build_and_install_would_refuse_before_any_download(tmp_path):
    from imagekit.model import Cell
    from imagekit.services.builds.project_build import forecast_problems

    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11")
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling>=1.25"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "acme"\nversion = "1"\n'
        'dependencies = ["numpy>=2", "trl>=0.9", "peft; sys_platform == \'win32\'", "filelock"]\n'
    )
    src = str(tmp_path)
    assert forecast_problems(src, src, cell, _lock(("numpy", "1.26.4"), ("filelock", "3.16.1"))) == [
        "its build backend (hatchling.build) needs what the lock does not hold: hatchling>=1.25 (not in the lock)",
        "the project's wheel needs what the lock does not hold: numpy>=2 (the lock has numpy 1.26.4); "
        "trl>=0.9 (not in the lock)",
    ]
    whole = _lock(("hatchling", "1.27.0"), ("numpy", "2.1.0"), ("trl", "0.12.1"), ("filelock", "3.16.1"))
    assert forecast_problems(src, src, cell, whole) == []
    # dependencies the backend computes (dynamic): known only once it built the wheel, as before
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling>=1.25"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "acme"\nversion = "1"\ndynamic = ["dependencies"]\ndependencies = ["trl"]\n'
    )
    assert forecast_problems(src, src, cell, _lock(("hatchling", "1.27.0"))) == []
