"""A worker process at a lower CPU priority, for work that may use only the cores the foreground leaves idle.

Its own process (started by spawning, never forking a process with threads): the work runs Python (a layer's tar
put back together) without taking the interpreter's lock from the foreground's threads. It runs under Linux's
SCHED_IDLE policy (a CPU runs it only when nothing else wants that CPU; its threads inherit it), else at niceness 19,
and in the idle I/O class where the disk's scheduler has one: the build's own steps, the engine and the containers
it runs go first. Tasks run one at a time, in the order given."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.pool import AsyncResult, Pool
from typing import Any

NICE = 19
IOPRIO_SET = {"x86_64": 251, "aarch64": 30}  # the ioprio_set system call's number
IOPRIO_IDLE = 3 << 13  # IOPRIO_CLASS_IDLE, level 0


def _lower_priority() -> None:
    """Idle CPU and I/O priority for this process (each is a courtesy: the work is the same without it)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(NICE)
        except OSError:
            pass
    number = IOPRIO_SET.get(os.uname().machine)
    if number is not None:
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).syscall(number, 1, 0, IOPRIO_IDLE)  # IOPRIO_WHO_PROCESS, this one
        except (OSError, AttributeError):
            pass


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
