"""Progress on stderr: rich bars on a terminal, a plain line every few seconds elsewhere (CI logs), none when quiet."""

from __future__ import annotations

import os
import threading
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, ProgressColumn, SpinnerColumn, Task, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.text import Text

from imagekit.services.progress import Activity, human_bytes

QUIET_BELOW_S = 2.0  # activities shorter than this end without a line of their own


def _interval() -> float:
    try:
        return max(0.05, float(os.environ.get("IMAGEKIT_PROGRESS_INTERVAL", "15")))
    except ValueError:
        return 15.0


def _amount(done: int, total: int | None, unit: str, seconds: float) -> str:
    if unit != "B":
        return f"{done}/{total}" if total else (str(done) if done else "")
    size = f"{human_bytes(done)} of {human_bytes(total)}" if total else human_bytes(done)
    rate = f", {human_bytes(done / seconds)}/s" if seconds > 0.5 and done else ""
    return size + rate


class _AmountColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit", "")
        if unit != "B" and not task.total:
            return Text("")
        return Text(_amount(int(task.completed), int(task.total) if task.total else None, unit, task.elapsed or 0))


class _Activity:
    def __init__(self, owner: ConsoleProgress, cell: str, label: str, total: int | None, unit: str) -> None:
        self.owner, self.cell, self.label, self.total, self.unit = owner, cell, label, total, unit
        self.done = 0
        self.start = time.monotonic()
        self.finished = threading.Event()
        self.task_id = None
        if owner.bars is not None:
            self.task_id = owner.bars.add_task(f"{cell} {label}", total=total, unit=unit)
        elif not owner.quiet:
            threading.Thread(target=self._tick, daemon=True).start()

    def _tick(self) -> None:
        while not self.finished.wait(self.owner.interval):
            elapsed = time.monotonic() - self.start
            amount = _amount(self.done, self.total, self.unit, elapsed)
            self.owner.line(self.cell, f"{self.label}: {elapsed:.0f} s" + (f", {amount}" if amount else ""))

    def update(self, done: int | None = None, total: int | None = None) -> None:
        if done is not None:
            self.done = done
        if total is not None:
            self.total = total
        if self.owner.bars is not None and self.task_id is not None:
            self.owner.bars.update(self.task_id, completed=self.done, total=self.total)

    def advance(self, amount: int) -> None:
        self.update(self.done + amount)

    def finish(self, summary: str | None = None) -> None:
        if self.finished.is_set():
            return
        self.finished.set()
        elapsed = time.monotonic() - self.start
        if self.owner.bars is not None and self.task_id is not None:
            self.owner.bars.remove_task(self.task_id)
            self.owner.release()
        if summary is None:
            if elapsed < QUIET_BELOW_S:
                return
            amount = _amount(self.done, self.total if self.done == self.total else None, self.unit, elapsed)
            summary = f"{self.label}: {elapsed:.1f} s" + (f" ({amount})" if amount else "")
        if summary:
            self.owner.line(self.cell, summary)


class ConsoleProgress:
    """Progress for the CLI. ``live``: rich bars (a terminal); otherwise a line per activity every
    IMAGEKIT_PROGRESS_INTERVAL seconds (15) while it runs, and one when it ends; ``quiet``: nothing."""

    def __init__(self, console: Console, *, quiet: bool = False, live: bool | None = None) -> None:
        self.console = console
        self.quiet = quiet
        self.live = (console.is_terminal if live is None else live) and not quiet
        self.interval = _interval()
        self.bars: RichProgress | None = None
        self._users = 0
        self._lock = threading.Lock()

    def line(self, cell: str, message: str) -> None:
        if not self.quiet:
            prefix = f"[cyan]{escape(cell)}[/] " if cell else ""
            self.console.print(prefix + escape(message), highlight=False)

    def begin(self, cell: str, label: str, *, total: int | None = None, unit: str = "") -> Activity:
        if self.live:
            with self._lock:
                if self.bars is None:
                    self.bars = RichProgress(
                        SpinnerColumn(),
                        TextColumn("{task.description}"),
                        BarColumn(),
                        _AmountColumn(),
                        TimeElapsedColumn(),
                        console=self.console,
                        transient=True,
                    )
                    self.bars.start()
                self._users += 1
        return _Activity(self, cell, label, total, unit)

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self.bars is not None:
                self.bars.stop()
                self.bars = None
