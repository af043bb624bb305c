"""The key of a setup.py's cached metadata: the project's files beside it count, imagekit's own outputs do not (the
first `imagekit lock` makes lockfiles/, the first build .imagekit/: neither reads setup.py again)."""

from __future__ import annotations

from pathlib import Path

from imagekit.image.buildplan import BaseRef
from imagekit.services.locks import project_metadata

BASE = BaseRef("debian-bookworm", "imagekit/base:debian-bookworm-0123456789ab", None, "3.11", "2.36")
BACKEND = "setuptools.build_meta:__legacy__"


def _key(folder: Path) -> str:
    return project_metadata._key(folder, BASE, BACKEND)


def test_imagekit_outputs_beside_setup_py_do_not_change_the_key(tmp_path: Path) -> None:
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(name='x', install_requires=['numpy'])\n")
    (tmp_path / "README.md").write_text("# x\n")
    before = _key(tmp_path)
    (tmp_path / "imagekit.toml").write_text("[matrix]\n")
    (tmp_path / "lockfiles").mkdir()
    (tmp_path / "lockfiles" / "cu124-torch2.5.1-py3.11-tf4.48.2.txt").write_text("numpy==2.0.0\n")
    (tmp_path / ".imagekit" / "reports").mkdir(parents=True)
    assert _key(tmp_path) == before
    # the project's own files still count: a README setup.py reads, a new file or folder beside it
    (tmp_path / "README.md").write_text("# x, edited\n")
    edited = _key(tmp_path)
    assert edited != before
    (tmp_path / "requirements").mkdir()
    assert _key(tmp_path) != edited
