"""The GPU architectures the data promises, held to the torch wheels they describe: the shipped [[arch]] tables against
the arch flags recorded from PyPI's wheels (pypi-metadata.json `archs`, read by `imagekit compat refresh`), a refresh
that refuses curated tables promising more than a wheel it read, and (network) the record against the real wheels."""

from __future__ import annotations

import copy
import json
import urllib.parse

import pytest
from packaging.version import Version

from imagekit.compat import catalog as compat
from imagekit.compat import pypi_metadata as metadata
from imagekit.compat import refresh
from imagekit.in_image import facts
from imagekit.model import variant_of_runtime
from tests.compat.test_compat_data import SHIPPED, cli, index_of

CURATED = compat.curated_document()


def test_the_shipped_arch_tables_promise_nothing_the_recorded_wheels_lack():
    assert refresh.arch_overpromises(CURATED, SHIPPED) == []


def test_every_torch_minor_has_its_pypi_wheels_arch_flags_recorded():
    """The record a test can hold the tables to: the newest release of each minor, PyPI's x86_64 build."""
    newest = refresh.newest_per_minor(SHIPPED["torch"])
    assert len(newest) >= 17
    for v in newest:
        flags = SHIPPED["torch"][v].get("archs")
        assert flags and facts.compiled_archs(flags)[0], v


def test_pypi_cu130_builds_have_no_ptx_and_the_data_says_so(data):
    """The issue's finding, as the record and the data now say it: 2.11 to 2.14's cu130 wheels list sm_75 ... sm_120
    and no compute_* entry."""
    for torch in ("2.11.0", "2.12.1", "2.13.0", "2.14.1"):
        assert SHIPPED["torch"][torch]["archs"] == "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"
        entry = data.arch_entry(torch, "cu130")
        assert entry is not None and entry.ptx is None and entry.archs[-1] == "12.0", torch
        assert "WHEEL" in entry.source


# Every [[arch]] table for PyPI's own build of a minor whose wheel the record has: (minor, variant) pairs
def _pypi_tables():
    out = []
    for v in refresh.newest_per_minor(SHIPPED["torch"]):
        rel = SHIPPED["torch"][v]
        minor = f"{Version(v).major}.{Version(v).minor}"
        variant = variant_of_runtime(rel["cuda_runtime"])
        if any(minor in a["torch"] and variant in a["variants"] for a in CURATED["arch"]):
            out.append((minor, variant, v))
    return out


def test_the_check_covers_most_pypi_builds():
    """The shipped tables for PyPI's builds are nearly all held to a wheel (the rest come from the wheel itself)."""
    assert len(_pypi_tables()) >= 15


@pytest.mark.parametrize(
    ("planted", "words"),
    [
        ({"torch": ["2.11"], "variants": ["cu130"], "ptx": "12.0"}, "PTX for sm_120"),  # the finding
        ({"torch": ["2.8"], "variants": ["cu128"], "archs_add": "12.1"}, "sm_121 cubin"),
        ({"torch": ["2.1"], "variants": ["cu121"], "archs_add": "3.7"}, "sm_37 cubin"),
    ],
)
def test_a_table_that_promises_more_than_the_wheel_is_named(planted, words):
    curated = copy.deepcopy(CURATED)
    table = next(
        a for a in curated["arch"] if planted["torch"][0] in a["torch"] and planted["variants"][0] in a["variants"]
    )
    if "ptx" in planted:
        table["ptx"] = planted["ptx"]
    if "archs_add" in planted:
        table["archs"] = [*table["archs"], planted["archs_add"]]
    found = refresh.arch_overpromises(curated, SHIPPED)  # one a minor the table covers
    assert found and all(words in f and "PyPI's torch" in f for f in found)
    assert any(f"[[arch]] torch {planted['torch'][0]} " in f for f in found)


def test_packed_arch_flags_are_read_too():
    """torch 2.8.0 and 2.9.x's x86_64 libtorch_python.so hold the list right after another constant, with no NUL
    before it ('...std::string ipc_hsm_70 sm_75 ...')."""
    lib = b"\x7fELF\x00_handle(Device device, std::string ipc_hsm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120\x00x\x00"
    assert metadata.arch_flags(lib) == "sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"
    # a NUL-framed list wins over a packed one elsewhere
    assert metadata.arch_flags(lib + b"\x00sm_80 sm_90\x00") == "sm_80 sm_90"


@pytest.mark.loopback
def test_a_refresh_refuses_to_write_when_a_wheel_holds_less_than_the_data_promises(tmp_path):
    doc = copy.deepcopy(SHIPPED)
    doc["torch"]["2.11.0"]["archs"] = "sm_75 sm_80 sm_86 sm_90 sm_100"  # served: no sm_120
    out = tmp_path / "m.json"
    with index_of(doc) as (index, _):
        res = cli("compat", "refresh", "--index-url", index, "--out", str(out), data_dir=tmp_path / "data")
    assert res.returncode == 1, res.stderr
    assert "error: imagekit's curated GPU architectures promise more than the torch wheels hold" in res.stderr
    assert "[[arch]] torch 2.11 cu130" in res.stderr and "sm_120 cubin" in res.stderr and "hint:" in res.stderr
    assert not out.exists()


@pytest.mark.network
@pytest.mark.parametrize("torch", ["2.8.0", "2.11.0", "2.12.1", "2.15.0"])
def test_the_record_is_what_pypis_wheel_says(torch):
    """Read out of the real wheel on PyPI (a range read of its libtorch_python.so): the recorded flags are its own."""
    from imagekit.effects import http, remote_zip

    doc = json.loads(http.get("https://pypi.org/pypi/torch/json"))
    wheel = next(
        f for f in doc["releases"][torch] if "-cp311-cp311-manylinux" in f["filename"] and "x86_64" in f["filename"]
    )
    url = urllib.parse.urljoin("https://pypi.org/pypi/torch/json", wheel["url"])
    flags = metadata.arch_flags(remote_zip.read_member(url, "torch/lib/libtorch_python.so"))
    assert flags == SHIPPED["torch"][torch]["archs"]
    assert not facts.compiled_archs(flags)[1]  # no PTX in PyPI's builds of these
