"""The one place imagekit starts subprocesses."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
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


class Aborted(Exception):
    """``run``'s ``abort`` said stop: the process was killed."""


def run(
    argv: list[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    input_text: str | None = None,
    abort: Callable[[], bool] | None = None,
) -> Result:
    """Run ``argv`` and capture its output; a missing program or a timeout is an environment failure.
    ``abort``, asked every 50 ms while it runs, kills the process when it answers True (raises Aborted)."""
    full_env = {**os.environ, **(env or {})}
    if abort is not None:
        return _run_abortable(argv, cwd, full_env, timeout, input_text, abort)
    try:
        proc = subprocess.run(
            argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout, input=input_text, check=False
        )
    except FileNotFoundError:
        raise EnvironmentFailure(f"{argv[0]} is not installed", f"install {Path(argv[0]).name} and retry") from None
    except subprocess.TimeoutExpired:
        raise EnvironmentFailure(f"{' '.join(argv[:3])} ... timed out after {timeout} s") from None
    return Result(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


def _run_abortable(
    argv: list[str],
    cwd: Path | None,
    env: dict[str, str],
    timeout: float | None,
    input_text: str | None,
    abort: Callable[[], bool],
) -> Result:
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
        )  # fmt: skip
    except FileNotFoundError:
        raise EnvironmentFailure(f"{argv[0]} is not installed", f"install {Path(argv[0]).name} and retry") from None
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = input_text
    while True:
        try:
            out, err = proc.communicate(pending, timeout=0.05)
            return Result(tuple(argv), proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            pending = None  # sent with the first call
            if abort() or (deadline is not None and time.monotonic() > deadline):
                proc.kill()
                proc.communicate()
                if abort():
                    raise Aborted(argv[0]) from None
                raise EnvironmentFailure(f"{' '.join(argv[:3])} ... timed out after {timeout} s") from None
