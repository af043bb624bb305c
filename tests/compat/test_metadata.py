"""`imagekit compat refresh` parsing, on real METADATA files and a real (trimmed) simple-index page."""

from __future__ import annotations

import json

import pytest

from imagekit.compat import pypi_metadata as metadata
from tests.conftest import FIXTURES

META = FIXTURES / "metadata"


def parsed(name: str) -> metadata.PackageMeta:
    return metadata.parse_metadata((META / f"{name}.METADATA").read_text())


@pytest.mark.parametrize(
    ("fixture", "requires_python", "requires"),
    [
        ("transformers-4.48.2", ">=3.9.0", {"torch": ">=2.0"}),
        ("transformers-4.52.0", ">=3.9.0", {"torch": "<2.7,>=2.1"}),
        ("transformers-5.9.0", ">=3.10.0", {"torch": ">=2.4"}),
        ("transformers-5.24.0", ">=3.11.0", {"torch": ">=2.6"}),
        ("accelerate-1.2.1", ">=3.9.0", {"torch": ">=1.10.0"}),
        ("torchvision-0.20.1", ">=3.8", {"torch": "==2.5.1"}),
        ("trl-0.20.0", ">=3.9", {"transformers": ">=4.53.2", "accelerate": ">=1.4.0"}),
    ],
)
def test_requires(fixture, requires_python, requires):
    meta = parsed(fixture)
    assert meta.requires_python == requires_python
    for name, spec in requires.items():
        assert meta.requires[name] == spec


def test_extra_other_than_torch_is_ignored():
    # transformers lists accelerate only under extras; the torch extra is the one the image installs.
    meta = parsed("transformers-5.9.0")
    assert "torchvision" not in meta.requires  # only in the "vision"/"all" extras


@pytest.mark.parametrize(("fixture", "runtime"), [("torch-2.5.1", "12.4.127"), ("torch-2.11.0", "13.0.2")])
def test_torch_cuda_runtime(fixture, runtime):
    assert parsed(fixture).cuda_runtime == runtime


def test_torch_python_windows_and_glibc_from_wheel_tags():
    page = json.loads((META / "torch-simple-trimmed.json").read_text())
    releases = metadata.torch_releases(page, floor="2.0")
    assert releases["2.1.2"].pythons == ("3.8", "3.9", "3.10", "3.11")
    assert releases["2.5.1"].pythons == ("3.9", "3.10", "3.11", "3.12", "3.13")
    assert releases["2.9.1"].pythons[0] == "3.10" and "3.14" in releases["2.9.1"].pythons
    assert releases["2.15.0"].pythons[0] == "3.11"  # 2.15 dropped 3.10
    assert releases["2.7.1"].glibc == "2.28"


@pytest.mark.parametrize(
    ("tag", "glibc"),
    [
        ("manylinux1_x86_64", "2.5"),
        ("manylinux2014_x86_64", "2.17"),
        ("manylinux_2_28_x86_64", "2.28"),
        ("manylinux_2_28_aarch64", None),
        ("win_amd64", None),
    ],
)
def test_glibc_of(tag, glibc):
    assert metadata.glibc_of(tag) == glibc


def test_shipped_data_matches_fixture_parse(data):
    """The committed pypi-metadata.json says what parsing the real METADATA says."""
    for fixture, name, version in [("transformers-5.9.0", "transformers", "5.9.0"), ("trl-0.20.0", "trl", "0.20.0")]:
        meta = parsed(fixture)
        rel = data.package(name, version)
        assert rel.requires_python == meta.requires_python
        assert rel.requires == meta.requires
