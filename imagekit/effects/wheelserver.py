"""Serve a wheelhouse over HTTP on loopback while `docker build --network host` installs from it.

The URL is fixed (the Dockerfile's IMAGEKIT_WHEELS default) because a build argument's value is part of the
legacy builder's cache key: a changing port would rebuild the torch layer every time.
"""

from __future__ import annotations

import errno
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from imagekit.errors import EnvironmentFailure


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve(directory: Path, port: int = 8765) -> Iterator[str]:
    handler = lambda *a, **kw: _Handler(*a, directory=str(directory), **kw)  # noqa: E731
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise EnvironmentFailure(
                f"127.0.0.1:{port} is in use; the wheelhouse server needs it",
                "wait for the other build to finish, or stop what holds the port",
            ) from None
        raise
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.shutdown()
        server.server_close()
