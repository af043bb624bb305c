"""The one place imagekit starts subprocesses."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from imagekit.errors import EnvironmentFailure


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run(
    argv: list[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    input_text: str | None = None,
) -> Result:
    """Run ``argv`` and capture its output; a missing program or a timeout is an environment failure."""
    full_env = {**os.environ, **(env or {})}
    try:
        proc = subprocess.run(
            argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout, input=input_text, check=False
        )
    except FileNotFoundError:
        raise EnvironmentFailure(f"{argv[0]} is not installed", f"install {Path(argv[0]).name} and retry") from None
    except subprocess.TimeoutExpired:
        raise EnvironmentFailure(f"{' '.join(argv[:3])} ... timed out after {timeout} s") from None
    return Result(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
