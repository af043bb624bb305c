"""A worker process at idle priority, for work that may use only the cores the foreground leaves idle.

Its own process (started by spawning, never forking a process with threads): the work runs Python (a layer's tar
put back together) without taking the interpreter's lock from the foreground's threads. It runs under Linux's
SCHED_IDLE policy (a CPU runs it only when nothing else wants that CPU; its threads inherit it), else at niceness 19,
and in the idle I/O class where the disk's scheduler has one: the build's own steps, the engine and the containers
it runs go first. It dies with the process that started it (PR_SET_PDEATHSIG) and ignores Ctrl-C (the foreground
stops it). Tasks run one at a time, in the order given; a worker that dies fails its tasks (BrokenProcessPool), never
hangs them."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

NICE = 19
IOPRIO_SET = {"x86_64": 251, "aarch64": 30}  # the ioprio_set system call's number
IOPRIO_IDLE = 3 << 13  # IOPRIO_CLASS_IDLE, level 0
PR_SET_PDEATHSIG = 1


def _lower_priority() -> None:
    """In the worker: idle CPU and I/O priority, and an end with its parent (each a courtesy where it fails)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        number = IOPRIO_SET.get(os.uname().machine)
        if number is not None:
            libc.syscall(number, 1, 0, IOPRIO_IDLE)  # IOPRIO_WHO_PROCESS, this process
    except Exception:  # no ctypes, no libc: the work is the same without them
        pass
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(NICE)
        except OSError:
            pass


class Worker:
    """One background process, started on the first task."""

    def __init__(self) -> None:
        self.pool: ProcessPoolExecutor | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """``fn(*args)`` in the worker (both picklable): a future of its result."""
        if self.pool is None:
            context = multiprocessing.get_context("spawn")
            self.pool = ProcessPoolExecutor(1, mp_context=context, initializer=_lower_priority)
        return self.pool.submit(fn, *args)

    def close(self) -> None:
        """Wait for what was submitted, then end the process."""
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None

    def stop(self) -> None:
        """End the process now: tasks not started are cancelled, one under way is abandoned."""
        if self.pool is None:
            return
        processes = list(getattr(self.pool, "_processes", {}).values())  # the executor has no public kill
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.kill()
            process.join(5)
        self.pool = None
