"""A worker process at a lower CPU priority, for work that may use only the cores the foreground leaves idle.

Its own process (started by spawning, never forking a process with threads): the work runs Python (a layer's tar
put back together) without taking the interpreter's lock from the foreground's threads, and its niceness (10) lets
the build's own steps, the engine and the containers it runs (all at 0) go first. Tasks run one at a time, in the
order given."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.pool import AsyncResult, Pool
from typing import Any

NICE = 10


def _lower_priority() -> None:
    try:
        os.nice(NICE)
    except OSError:
        pass  # a priority is a courtesy: the work is the same


class Worker:
    """One background process, started on the first task."""

    def __init__(self) -> None:
        self.pool: Pool | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> AsyncResult:
        """``fn(*args)`` in the worker (both picklable); ``.get()`` gives its result or raises its exception."""
        if self.pool is None:
            self.pool = multiprocessing.get_context("spawn").Pool(1, initializer=_lower_priority)
        return self.pool.apply_async(fn, args)

    def close(self) -> None:
        """Wait for what was submitted, then end the process."""
        if self.pool is not None:
            self.pool.close()
            self.pool.join()
            self.pool = None

    def stop(self) -> None:
        """End the process now; a task under way is abandoned."""
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None
