"""Serve a wheelhouse over HTTP on loopback while `docker build --network host` installs from it.

The URL in the Dockerfile is fixed (``http://imagekit-wheels:8765/``, plan.DEFAULT_WHEELS_URL) because a build
argument's value is part of the legacy builder's cache key and of the image's history: a changing URL would
rebuild the torch layer every time and change the image config. What changes per build is the loopback address
the name points to (``docker build --add-host imagekit-wheels:127.x.y.z``, which is in neither the cache key nor
the image): each build binds port 8765 on an address of its own in 127.0.0.0/8, so builds on one machine (two CI
runners, two terminals) never collide.
"""

from __future__ import annotations

import errno
import http.server
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from imagekit.errors import EnvironmentFailure

HOST = "imagekit-wheels"
PORT = 8765


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def copyfile(self, source, outputfile) -> None:  # type: ignore[no-untyped-def]
        """The kernel copies the file to the socket (sendfile): gigabytes of wheels without a Python loop on the
        CPUs the build is using. The headers are already sent (the socket writer is unbuffered)."""
        self.connection.sendfile(source)


def _addresses(tries: int) -> Iterator[str]:
    rng = random.SystemRandom()
    for _ in range(tries):
        yield f"127.{rng.randrange(1, 255)}.{rng.randrange(0, 256)}.{rng.randrange(1, 255)}"
    yield "127.0.0.1"  # a host whose loopback is only 127.0.0.1 (not Linux)


@contextmanager
def serve(directory: Path, port: int = PORT, address: str | None = None) -> Iterator[str]:
    """Serve ``directory``; yields the loopback address it listens on (port ``port``)."""
    handler = lambda *a, **kw: _Handler(*a, directory=str(directory), **kw)  # noqa: E731
    server = None
    for candidate in [address] if address else _addresses(16):
        try:
            server = http.server.ThreadingHTTPServer((candidate, port), handler)
            break
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                raise
    if server is None:
        raise EnvironmentFailure(
            f"no loopback address with port {port} free for the wheelhouse server",
            "wait for the other builds to finish, or stop what holds the port",
        )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[0]
    finally:
        server.shutdown()
        server.server_close()
