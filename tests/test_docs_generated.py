"""The docs read off the code cannot fall behind it: docs/architecture.md's module map names every package and
module with its one-line purpose, and docs/cli.md every command and option, as tools/gen-docs writes them."""

from __future__ import annotations

import importlib.machinery
import importlib.util

import pytest

from tests.conftest import ROOT


def _gen():  # type: ignore[no-untyped-def]
    loader = importlib.machinery.SourceFileLoader("gen_docs", str(ROOT / "tools" / "gen-docs"))
    spec = importlib.util.spec_from_loader("gen_docs", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.seconds
def test_the_module_map_names_every_package_and_module_as_the_code_says():
    gen = _gen()
    text = gen.ARCHITECTURE.read_text()
    assert text == gen.with_map(text), "docs/architecture.md's module map is out of date: run tools/gen-docs"
    modules = [p for p in (ROOT / "imagekit").rglob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert all(f"`{p.stem}`" in text for p in modules)
    assert "(no docstring)" not in text, "a module without a docstring: say what it owns"


def test_the_cli_reference_is_what_the_commands_say():
    gen = _gen()
    assert gen.CLI.read_text() == gen.cli_reference(), "docs/cli.md is out of date: run tools/gen-docs"
    assert "## `imagekit pod create`" in gen.CLI.read_text() and "`--audit-fail-on-unrated`" in gen.CLI.read_text()
