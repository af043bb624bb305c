"""A Progress that records what services report (the interface is imagekit's own, so recording it is not a mock
of anything the product drives)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class RecordedActivity:
    cell: str
    label: str
    total: int | None
    unit: str
    done: int = 0
    updates: int = 0
    summary: str | None = None
    finished: bool = False

    def update(self, done: int | None = None, total: int | None = None) -> None:
        if done is not None:
            self.done = done
        if total is not None:
            self.total = total
        self.updates += 1

    def advance(self, amount: int) -> None:
        self.update(self.done + amount)

    def finish(self, summary: str | None = None) -> None:
        if not self.finished:
            self.finished, self.summary = True, summary


@dataclass
class RecordingProgress:
    lines: list[tuple[str, str]] = field(default_factory=list)
    activities: list[RecordedActivity] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def line(self, cell: str, message: str) -> None:
        with self.lock:
            self.lines.append((cell, message))

    def begin(self, cell: str, label: str, *, total: int | None = None, unit: str = "") -> RecordedActivity:
        act = RecordedActivity(cell, label, total, unit)
        with self.lock:
            self.activities.append(act)
        return act

    def text(self) -> str:
        return "\n".join(message for _, message in self.lines)
