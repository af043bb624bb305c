"""What long-running services report while they work: lines, and activities with elapsed time and bytes.

Services receive a ``Progress``; the CLI supplies one that draws (rich on a terminal, periodic plain lines in CI,
nothing with ``--quiet``). ``NullProgress`` is the silent default, so library callers need not care.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Activity(Protocol):
    def update(self, done: int | None = None, total: int | None = None) -> None:
        """``done`` units so far (bytes for byte activities); ``total`` when it becomes known."""

    def advance(self, amount: int) -> None: ...

    def finish(self, summary: str | None = None) -> None:
        """End it; ``summary`` replaces the default "label: done in N s" line ("" prints nothing)."""


class Progress(Protocol):
    def line(self, cell: str, message: str) -> None: ...

    def begin(self, cell: str, label: str, *, total: int | None = None, unit: str = "") -> Activity:
        """Start an activity; ``unit="B"`` shows bytes and a rate."""


class _NullActivity:
    def update(self, done: int | None = None, total: int | None = None) -> None:
        pass

    def advance(self, amount: int) -> None:
        pass

    def finish(self, summary: str | None = None) -> None:
        pass


class NullProgress:
    def line(self, cell: str, message: str) -> None:
        pass

    def begin(self, cell: str, label: str, *, total: int | None = None, unit: str = "") -> Activity:
        return _NullActivity()


@contextmanager
def activity(
    progress: Progress, cell: str, label: str, *, total: int | None = None, unit: str = ""
) -> Iterator[Activity]:
    """An activity that ends with the block (also when the block raises: the elapsed time is still shown)."""
    act = progress.begin(cell, label, total=total, unit=unit)
    try:
        yield act
    except BaseException:
        act.finish(f"{label}: stopped")
        raise
    act.finish()


def human_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit == "GB" else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
