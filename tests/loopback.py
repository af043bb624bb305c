"""Loopback servers for tests: started and stopped in milliseconds.

``serve_forever`` polls for shutdown every 0.5 s by default, so every fixture that stops a server paid half a second;
across the fast tier that was most of its wall time.
"""

from __future__ import annotations

import socketserver
import threading

POLL_S = 0.01


def start(server: socketserver.BaseServer) -> threading.Thread:
    """Serve in a daemon thread; ``stop`` ends it."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True)
    thread.start()
    return thread


def stop(server: socketserver.BaseServer) -> None:
    """Stop serving and close the listening socket."""
    server.shutdown()
    server.server_close()
