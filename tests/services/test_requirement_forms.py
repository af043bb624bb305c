"""What a requirements file's pip forms become in the matrix (services.requirement_forms): its index lines the
lock's indexes, its `.` / `-e ./sub` lines `[image] install`, a VCS line without a name named from its commit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from imagekit.errors import ConfigError
from imagekit.services import inputs

CELL = '[[matrix.include]]\ncuda = "12.4"\ntorch = "2.5.1"\ntransformers = "4.48.2"\npython = "3.11"\n'
PYPROJECT = (
    '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n[project]\nname = "app"\n'
)


def _project(root: Path, requirements: str, image: str = "", lock: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "requirements.txt").write_text(requirements)
    (root / "pyproject.toml").write_text(PYPROJECT)
    head = '[matrix]\nrequirements = "requirements.txt"\n'
    (root / "m.toml").write_text(
        head + CELL + (f"[image]\n{image}" if image else "") + (f"[lock]\n{lock}" if lock else "")
    )
    return root / "m.toml"


def _refused(path: Path, data) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        inputs.load_matrix(path, data)
    return info.value


def test_index_lines_become_the_locks_indexes(tmp_path, data):
    m = _project(tmp_path, "--index-url https://mirror.example/simple\n--extra-index-url https://a.example/simple\n"
                 "numpy\n", lock='extra_index_urls = ["https://b.example/simple"]\n')  # fmt: skip
    config = inputs.load_matrix(m, data)
    assert config.index_url == "https://mirror.example/simple"
    assert config.extra_index_urls == ("https://b.example/simple", "https://a.example/simple")
    assert config.cells[0].packages == ("numpy",)


def test_a_main_index_that_contradicts_lock_index_url_is_refused_naming_both(tmp_path, data):
    m = _project(tmp_path, "-i https://mirror.example/simple\n", lock='index_url = "https://other.example/simple"\n')
    err = _refused(m, data)
    assert "requirements.txt:1: --index-url https://mirror.example/simple replaces the main index" in str(err)
    assert "https://other.example/simple" in str(err)


@pytest.mark.parametrize("line", [".", "-e .", "./", "-e ./."])
def test_the_project_itself_becomes_image_install_when_the_image_copies_it(tmp_path, data, line):
    m = _project(tmp_path, f"numpy\n{line}\n", image='copy = "."\n')
    config = inputs.load_matrix(m, data)
    assert config.options.install == os.path.normpath(str(tmp_path))
    assert config.cells[0].packages == ("numpy",)


def test_a_package_of_the_project_becomes_image_install(tmp_path, data):
    m = _project(tmp_path, "-e ./sub\n", image='copy = "."\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "setup.py").write_text("from setuptools import setup\nsetup(name='sub')\n")
    assert inputs.load_matrix(m, data).options.install == str(tmp_path / "sub")


def test_install_named_already_is_kept_and_another_folder_refused(tmp_path, data):
    (tmp_path / "sub").mkdir(parents=True)
    (tmp_path / "sub" / "pyproject.toml").write_text(PYPROJECT)
    m = _project(tmp_path, ".\n", image='copy = "."\ninstall = "."\n')
    assert inputs.load_matrix(m, data).options.install == str(tmp_path)
    m = _project(tmp_path, "./sub\n", image='copy = "."\ninstall = "."\n')
    err = _refused(m, data)
    assert "requirements.txt:1: sub installs another folder than [image] install" in str(err)


def test_the_project_without_copy_is_refused_with_the_keys_to_add(tmp_path, data):
    err = _refused(_project(tmp_path, "-e .\n"), data)
    assert "requirements.txt:1: . installs the project's own code, which the image does not copy" in str(err)
    assert err.hint is not None and '[image] copy = "." and install = "."' in err.hint


def test_a_folder_outside_the_copied_one_is_refused(tmp_path, data):
    (tmp_path / "tools").mkdir(parents=True)
    (tmp_path / "tools" / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "src").mkdir()
    err = _refused(_project(tmp_path, "./tools\n", image='copy = "src"\n'), data)
    assert "requirements.txt:1: tools: [image] install" in str(err) and "not inside the copied folder" in str(err)


def test_hostile_folders_are_refused(tmp_path, data):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "pyproject.toml").write_text(PYPROJECT)
    root = tmp_path / "p"
    m = _project(root, "./escape\n", image='copy = "."\n')
    (root / "escape").symlink_to(outside)
    assert "escape leads out of the project through a link" in str(_refused(m, data))
    m = _project(root, "./missing\n", image='copy = "."\n')
    assert "missing: no such folder in the project" in str(_refused(m, data))
    (root / "empty").mkdir()
    m = _project(root, "./empty\n", image='copy = "."\n')
    assert "holds no pyproject.toml or setup.py" in str(_refused(m, data))
    (root / "file.txt").write_text("x")
    m = _project(root, "./file.txt\n", image='copy = "."\n')
    assert "file.txt is not a folder" in str(_refused(m, data))
    m = _project(root, "../outside\n", image='copy = "."\n')
    assert "../outside is outside the project" in str(_refused(m, data))
