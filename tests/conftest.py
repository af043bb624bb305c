from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from imagekit import compat
from imagekit.cli import build_app

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden from the current templates")


@pytest.fixture(scope="session")
def data() -> compat.CompatData:
    return compat.load()


@pytest.fixture(scope="session")
def app():
    return build_app()


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder, so ./pyproject.toml of the repo is not picked up as a matrix."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden")) or os.environ.get("IMAGEKIT_UPDATE_GOLDEN") == "1"
