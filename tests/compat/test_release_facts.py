"""Index facts of a torch release that no other test pins: its glibc floor is its highest Linux x86_64 wheel's (the
image must install whichever wheel the resolver picks), an uncurated minor's facts come from its newest final
release, and the C++ ABI of PyPI's build of each curated minor is recorded with its source."""

from __future__ import annotations

import copy
import json

import pytest
from packaging.version import Version

from imagekit.compat import catalog as compat
from imagekit.compat import pypi_metadata as metadata
from imagekit.compat import refresh
from tests.conftest import ROOT

SHIPPED = json.loads((ROOT / "imagekit" / "data" / "pypi-metadata.json").read_text())


def _page(*filenames: str) -> dict:
    return {"files": [{"filename": f, "url": f"https://h/{f}", "hashes": {}} for f in filenames]}


@pytest.mark.parametrize("reverse", [False, True])
def test_a_releases_glibc_floor_is_its_highest_wheels(reverse):
    files = [
        "torch-9.1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux_2_34_x86_64.whl",  # one wheel: its lowest tag
        "torch-9.1.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "torch-9.1.0-cp313-cp313-manylinux1_x86_64.whl",
        "torch-9.1.0-cp313-cp313-manylinux_2_34_aarch64.whl",  # another CPU: not this floor
        "torch-9.1.0-cp313-cp313t-manylinux_2_35_x86_64.whl",  # free-threaded: not a build imagekit installs
    ]
    page = _page(*(reversed(files) if reverse else files))
    (release,) = metadata.torch_releases(page, floor="9.0").values()
    assert release.glibc == "2.28"
    assert release.pythons == ("3.11", "3.12", "3.13")
    assert metadata.glibc_of("manylinux_2_34_x86_64.manylinux2014_x86_64") == "2.17"  # installs on either
    doc = refresh.document({"torch": page, **{n: {"files": []} for n in metadata.WATCHED}}, {})
    assert doc["torch"]["9.1.0"]["glibc"] == "2.28"


def _release(runtime: str, glibc: str) -> dict:
    return {"python": ["3.12"], "glibc": glibc, "cuda_runtime": runtime, "requires": {}, "requires_python": ">=3.12"}


def test_an_uncurated_minors_facts_come_from_its_newest_final_release():
    """Listed neither oldest nor newest first, with a release that sorts last as text (2.16.9) and one newer as a
    version (2.16.10), a pre-release newer than both, and a post release of the newest."""
    doc = copy.deepcopy(SHIPPED)
    doc["torch"] |= {
        "2.16.9": _release("13.0.2", "2.17"),
        "2.16.0": _release("12.8.90", "2.17"),
        "2.16.10": _release("13.2.2", "2.28"),
        "2.16.11rc1": _release("14.0.1", "2.34"),
        "2.17.1": _release("13.0.2", "2.28"),
        "2.17.1.post1": _release("13.2.2", "2.34"),
        "2.17.0": _release("12.8.90", "2.17"),
    }
    data = compat.parse(compat.curated_document(), doc)
    tm = data.torch_minor("2.16.0")
    assert (tm.pypi_default, tm.glibc) == ("cu132", "2.28")
    assert "torch 2.16.10 " in tm.pypi_default_source and "torch 2.16.10 " in tm.glibc_source
    post = data.torch_minor("2.17.0")
    assert (post.pypi_default, post.glibc) == ("cu132", "2.34") and "2.17.1.post1" in post.glibc_source
    assert post.cxx11_abi is None  # no source says what an uncurated minor's ABI is
    assert refresh.newest_per_minor(doc["torch"])[-2:] == ["2.16.10", "2.17.1.post1"]


def test_pypis_torch_abi_is_curated_for_every_minor_with_its_source(data):
    curated = compat.curated_document()["torch"]
    assert len(curated) >= 16
    for t in curated:
        tm = data.torch_minors[t["minor"]]
        want = Version(f"{t['minor']}.0") >= Version("2.7")  # compat-facts table 1 and its fact 5
        assert tm.cxx11_abi is want, t["minor"]
        assert "compat-facts table 1" in tm.cxx11_abi_source, t["minor"]
    assert data.torch_cxx11_abi("2.7.1", "cu126")[0] is True
    assert data.torch_cxx11_abi("2.6.0", "cu124")[0] is False
    assert data.torch_cxx11_abi("2.6.0", "cu126") is None  # the PyTorch index's build: no source read says
