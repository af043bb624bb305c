"""The resolver seam (`effects/resolver.Resolver`): the lock use case drives whichever resolver the settings name
through one interface, so its own logic (the routing passes, the any_index probe's one error) runs here against a
scripted resolver, in milliseconds. Real uv runs against loopback indexes in `test_lock_routing.py`."""

from __future__ import annotations

import http.server
from collections.abc import Iterator

import pytest

from imagekit.effects import resolver
from imagekit.errors import CheckFailed, UsageError
from imagekit.locking import resolution
from imagekit.model import Cell
from imagekit.services import inputs
from imagekit.services.locks import lock_cells
from tests import loopback
from tests.fakes import ScriptedResolver

ROUTED = Cell("11.8", "2.5.1", "4.48.2", "3.11")  # torch 2.5's PyPI default is cu124: cu118 comes from its any_index


@pytest.fixture
def any_index() -> Iterator[str]:
    """A loopback server that answers every probe (any status will do)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    server.RequestHandlerClass.log_message = lambda *a: None  # type: ignore[method-assign]
    loopback.start(server)
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        loopback.stop(server)


@pytest.mark.parametrize(("name", "kind"), [("uv", resolver.UvResolver), ("pip-tools", resolver.PipToolsResolver)])
def test_the_settings_name_the_resolver(name, kind):
    assert isinstance(resolver.for_settings(resolution.LockSettings(resolver=name)), kind)


def test_an_unknown_resolver_is_a_usage_error():
    with pytest.raises(UsageError) as err:
        resolver.for_settings(resolution.LockSettings(resolver="poetry"))
    assert err.value.exit_code == 2 and "uv or pip-tools" in err.value.hint


def test_pip_tools_refuses_a_torch_from_the_pytorch_index_before_running_anything():
    req = resolution.request(ROUTED, resolution.LockSettings(resolver="pip-tools"), inputs.compat_data())
    assert req.routed
    with pytest.raises(UsageError, match="cannot pin torch to the PyTorch index"):
        resolver.PipToolsResolver().compile(req)


def test_a_family_package_missing_from_the_default_index_is_named_to_the_pytorch_index(tmp_path, any_index):
    settings = resolution.LockSettings(index_url=f"{any_index}/simple", torch_index_base=f"{any_index}/whl")
    tool = ScriptedResolver(
        [
            CheckFailed("x: no resolution:\nnvidia-nccl-cu11 was not found in the package registry", "h"),
            CheckFailed("x: no resolution: the pins conflict", "h"),
        ]
    )
    res = lock_cells.lock_one(ROUTED, tmp_path, settings, inputs.compat_data(), using=tool)
    assert res.status == "failed" and "the pins conflict" in res.error.message
    first, second = tool.requests
    assert "nvidia-nccl-cu11" not in first.routed_names() and "nvidia-nccl-cu11" in second.routed_names()
    assert not (tmp_path / f"{ROUTED.id}.txt").exists()


def test_an_unreachable_index_is_the_error_whatever_the_resolver_said(tmp_path, any_index):
    dead = "http://127.0.0.1:9/simple"  # the discard port: nothing listens on loopback
    settings = resolution.LockSettings(index_url=dead, torch_index_base=f"{any_index}/whl")
    tool = ScriptedResolver([CheckFailed("x: no resolution", "h")])
    res = lock_cells.lock_one(ROUTED, tmp_path, settings, inputs.compat_data(), using=tool)
    assert isinstance(res.error, resolver.IndexUnreachable) and "cannot reach the package index" in res.error.message
