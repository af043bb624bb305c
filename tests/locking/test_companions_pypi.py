"""torch's companion libraries locked from real PyPI by uv (network, resolver; metadata only, no wheel is downloaded):
a cell asking for a companion unpinned locks the release the table pairs with its torch, where PyPI's newest one (the
resolver's own pick) would be another; and torch 2.1.2 asked only for tensorboard locks numpy 1.x and a setuptools
that still ships pkg_resources."""

from __future__ import annotations

import json
import urllib.parse

import pytest

from imagekit.compat import companions
from imagekit.effects import http, remote_zip
from imagekit.locking import resolution
from imagekit.model import Cell
from imagekit.services.locks import lock_cells as lock_service

pytestmark = [pytest.mark.network, pytest.mark.resolver]


# (companion, cell, the release the table pairs with the cell's torch, PyPI's newest release of it)
CASES = [
    ("torchvision", Cell("12.6", "2.7.1", "4.48.2", "3.11"), "0.22.1", "0.29.2"),
    ("torchaudio", Cell("12.6", "2.7.1", "4.48.2", "3.11"), "2.7.1", "2.11.1"),  # the issue's: 2.11.0, CUDA 13
    ("torchao", Cell("12.8", "2.8.0", "4.48.2", "3.11"), "0.14.0", "0.18.0"),  # the issue's: NF4Tensor
    ("torchtext", Cell("12.1", "2.1.2", "4.48.2", "3.11"), "0.16.2", "0.18.0"),
    ("torchdata", Cell("12.1", "2.1.2", "4.48.2", "3.11"), "0.7.1", "0.11.0"),
    ("xformers", Cell("12.6", "2.7.1", "4.48.2", "3.11"), "0.0.31.post1", "0.0.35"),
    ("fbgemm-gpu", Cell("12.6", "2.7.1", "4.48.2", "3.11"), "1.2.0", "1.9.0"),
    ("triton", Cell("12.1", "2.1.2", "4.48.2", "3.11"), "2.1.0", "3.9.0"),
]


@pytest.mark.parametrize(("name", "cell", "matched", "newest"), CASES, ids=[c[0] for c in CASES])
def test_an_unpinned_companion_locks_the_release_that_goes_with_the_cells_torch(data, tmp_path, name, cell, matched,
                                                                                newest):  # fmt: skip
    asked = Cell(cell.cuda, cell.torch, cell.transformers, cell.python, (name,))
    res = lock_service.lock_one(asked, tmp_path, resolution.LockSettings(), data)
    assert res.status == "locked", res.error and res.error.render()
    assert res.lock.pins()[name] == matched
    # the table decided it: the newest release is on PyPI, and the constraint is what kept it out
    assert matched != newest
    held = {c.name: c for c in companions.constraints(data, cell.torch)}[name]
    assert companions.allows(held.spec, matched) and not companions.allows(held.spec, newest)
    # read back, the lock is current: what it pins is what the table allows
    assert lock_service.status_of(tmp_path, asked, resolution.LockSettings(), data).status == "up-to-date"


def test_without_the_table_the_resolver_takes_the_release_built_for_another_torch(data, tmp_path):
    """What the table prevents, shown with the same resolver: torchaudio 2.11.0 pins no torch, so uv takes it (or
    newer) for torch 2.7.1 when nothing holds it."""
    from dataclasses import replace

    from imagekit.effects import resolver

    cell = Cell("12.6", "2.7.1", "4.48.2", "3.11", ("torchaudio>=2.8",))  # past the pinned releases, as unpinned goes
    free = replace(resolution.request(cell, resolution.LockSettings(), data), constraints=())
    out = resolver.compile_uv(free)
    version = next(line.split("==")[1].split()[0] for line in out.splitlines() if line.startswith("torchaudio=="))
    assert version.startswith("2.11."), out  # a CUDA 13 build beside torch 2.7.1+cu126: what the user got
    held = resolution.request(Cell("12.6", "2.7.1", "4.48.2", "3.11", ("torchaudio",)), resolution.LockSettings(), data)
    assert "torchaudio==2.7.1" in held.constraints


def _wheel_url(name: str, version: str) -> str:
    """The py3 wheel of ``name`` ``version`` on PyPI (its JSON API)."""
    doc = json.loads(http.get(f"https://pypi.org/pypi/{name}/json"))
    files = [f for f in doc["releases"][version] if f["filename"].endswith("-py3-none-any.whl")]
    return urllib.parse.urljoin(f"https://pypi.org/pypi/{name}/json", files[0]["url"])


def test_torch_2_1_2_with_only_tensorboard_locks_numpy_1_and_a_setuptools_with_pkg_resources(data, tmp_path):
    """The issue's cell: tensorboard pulls numpy and setuptools; unheld, uv took numpy 2.4.6 (torch 2.1.2 was built
    against numpy 1: "Numpy is not available") and setuptools 84.2.1 (no pkg_resources: torch.compile fails)."""
    cell = Cell("12.1", "2.1.2", "4.48.2", "3.11", ("tensorboard",))
    res = lock_service.lock_one(cell, tmp_path, resolution.LockSettings(), data)
    assert res.status == "locked", res.error and res.error.render()
    pins = res.lock.pins()
    assert pins["numpy"].split(".")[0] == "1", pins["numpy"]
    assert int(pins["setuptools"].split(".")[0]) < 82, pins["setuptools"]
    # and that setuptools does ship it: read out of its wheel on PyPI
    source = remote_zip.read_member(_wheel_url("setuptools", pins["setuptools"]), "pkg_resources/__init__.py")
    assert b"def require(" in source or b"require =" in source
    # unheld, the same resolver takes what the user got: numpy 2 and a setuptools without pkg_resources
    from dataclasses import replace

    from imagekit.effects import resolver

    free = resolver.compile_uv(replace(resolution.request(cell, resolution.LockSettings(), data), constraints=()))
    unheld = {line.split("==")[0]: line.split("==")[1].split()[0] for line in free.splitlines() if "==" in line}
    assert unheld["numpy"].split(".")[0] == "2" and int(unheld["setuptools"].split(".")[0]) >= 82, unheld
