"""How talking to a pod over SSH fails: the errors callers catch (a dropped connection is what a copy resumes from).
Also the limit on output read whole, and how a timeout reads in a message."""

from __future__ import annotations

import socket
from collections.abc import Callable

from imagekit.errors import EnvironmentFailure

Sink = Callable[[str], None]  # where a command's text goes, a piece at a time
MAX_CAPTURE = 1 << 20  # characters of a command's output read whole (a size, a sha256, a path: bytes, really)


class ConnectionLost(EnvironmentFailure):
    """The SSH connection dropped (a copy resumes from here)."""


class CommandTimeout(EnvironmentFailure):
    """A remote command ran past its timeout."""


class TooMuchOutput(EnvironmentFailure):
    """A command whose output is read whole printed more than a command of its kind can (a hostile pod)."""


class WriteFailed(EnvironmentFailure):
    """The pod could not write what was sent (a full disk, a read-only folder): sending it again will not help."""


def seconds(value: float) -> str:
    """A timeout as people say it: ``2 s``, ``1.5 s``, ``20 min``; ``no limit`` for the "0: no limit" sentinel."""
    if value >= 10**8:
        return "no limit"
    if value >= 120 and value % 60 == 0:
        return f"{value / 60:g} min"
    return f"{value:g} s"


def is_dropped(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionLost) or isinstance(exc, socket.error)
