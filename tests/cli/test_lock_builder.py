"""`imagekit lock` starts the wheel-build stage (with Docker) for a cell that needs it: `from_source` packages and
pinned git requirements alike; a git commit needs no other setting (cli/lock_cmd._in_bases). The engine is the outer
boundary: a stand-in that is never asked anything here (the builder makes the base present only when it builds)."""

from __future__ import annotations

import pytest

from imagekit.cli import lock_cmd
from imagekit.effects import docker
from imagekit.matrix.matrix_file import MatrixConfig
from imagekit.model import Cell

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PLAIN = Cell("12.4", "2.5.1", "4.48.2", "3.11", ("numpy",))


class _NoEngine:
    pass


@pytest.mark.parametrize(
    ("cell", "builds"),
    [
        (PLAIN, False),
        (Cell("12.4", "2.5.1", "4.48.2", "3.11", (f"gitkit @ git+https://git.example/o/gitkit@{COMMIT}",)), True),
        (Cell("12.4", "2.5.1", "4.48.2", "3.11", ("deepspeed",), from_source=("deepspeed",)), True),
    ],
)
def test_a_git_requirement_alone_gets_the_builder(monkeypatch, data, cell, builds):
    monkeypatch.setattr(docker, "Engine", _NoEngine)
    apt, build = lock_cmd._in_bases([PLAIN, cell], data, MatrixConfig(cells=(PLAIN, cell)), console=None)
    assert apt is None and (build is not None) == builds
