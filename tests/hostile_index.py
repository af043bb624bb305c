"""A malicious package index on loopback: a real PEP 503/691 index (the small real wheels of `tests.wheelfactory`)
whose answers a test replaces path by path with crafted ones: pages listing hostile file names, sizes and hashes,
JSON nested thousands deep or holding 5,000-digit numbers, lying Content-Length headers, downloads that stall
half-way. Shared by the tests of every command that reads an index (`fetch`, `build --dry-run`, `compat refresh`).

    with HostileIndex(root) as index:          # root: a folder `write_simple_index` laid out (or None)
        index.routes["/simple/numpy/"] = Route(body=json_page([...]), headers={"Content-Type": SIMPLE_JSON})
        ... index.simple ...                   # http://127.0.0.1:PORT/simple
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import loopback
from tests.wheelfactory import _Quiet, fake_pypi_wheels, write_simple_index

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


@dataclass
class Route:
    """One crafted answer. ``content_length``: the header as sent (None: the body's length; "" : no header);
    ``stall_after``: send that many bytes of the body, then hold the connection open until `HostileIndex.release`
    (a download that never finishes); ``chunk`` bytes are flushed at a time."""

    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    content_length: str | None = None
    stall_after: int | None = None
    chunk: int = 1 << 16


class _Handler(_Quiet):
    index: HostileIndex

    def do_GET(self) -> None:
        self.index.seen.append(self.path)
        route = self.index.routes.get(self.path.split("?", 1)[0])
        if route is None:
            return super().do_GET()  # the honest index underneath
        self.send_response(route.status)
        for key, value in route.headers.items():
            self.send_header(key, value)
        if route.content_length != "":
            self.send_header("Content-Length", route.content_length or str(len(route.body)))
        self.end_headers()
        body = route.body if route.stall_after is None else route.body[: route.stall_after]
        try:
            for start in range(0, len(body), route.chunk):
                self.wfile.write(body[start : start + route.chunk])
                self.wfile.flush()
            if route.stall_after is not None:
                self.index.stalled.set()
                self.index.released.wait(60)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: what a stalled download is for


class HostileIndex:
    """A ThreadingHTTPServer on 127.0.0.1 (a free port): ``routes`` (path -> `Route`) first, else the files under
    ``root``. ``seen``: every path asked for; ``stalled``: set once a stalled route has sent its bytes."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root
        self.routes: dict[str, Route] = {}
        self.seen: list[str] = []
        self.stalled = threading.Event()
        self.released = threading.Event()
        handler_cls = type("Handler", (_Handler,), {"index": self})
        directory = str(root) if root is not None else "/nonexistent"
        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), lambda *a, **kw: handler_cls(*a, directory=directory, **kw)
        )
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.simple = f"{self.url}/simple"

    def __enter__(self) -> HostileIndex:
        loopback.start(self.server)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        loopback.stop(self.server)

    def release(self) -> None:
        """Let every stalled answer end (its connection closes short of its Content-Length)."""
        self.released.set()

    def page(self, project: str, doc: Any) -> None:
        """Serve ``doc`` (JSON-encoded unless bytes or str) as ``project``'s PEP 691 page."""
        body = doc if isinstance(doc, bytes) else (doc if isinstance(doc, str) else json.dumps(doc)).encode()
        self.routes[f"/simple/{project}/"] = Route(body=body, headers={"Content-Type": SIMPLE_JSON})

    def html(self, project: str, text: str) -> None:
        """Serve ``text`` as ``project``'s PEP 503 (HTML) page."""
        self.routes[f"/simple/{project}/"] = Route(body=text.encode(), headers={"Content-Type": "text/html"})


def honest_index(tmp: Path) -> Path:
    """The folder of a small PyPI look-alike (`fake_pypi_wheels`) laid out as a PEP 503 index."""
    root = tmp / "pypi"
    write_simple_index(root, fake_pypi_wheels(tmp / "w"))
    return root


def wheel_file(root: Path, filename: str) -> tuple[bytes, str]:
    """(bytes, sha256) of a wheel the honest index serves under /files/."""
    data = (root / "files" / filename).read_bytes()
    return data, hashlib.sha256(data).hexdigest()


def json_page(*files: dict, name: str = "project") -> dict:
    """A PEP 691 project page listing ``files`` (each a dict: filename, url, hashes, size, ...)."""
    return {"meta": {"api-version": "1.1"}, "name": name, "files": list(files)}


def nested(depth: int) -> str:
    """JSON nested ``depth`` deep (``json`` recurses once per level: past about 1,000 it raises RecursionError)."""
    return '{"files": ' + "[" * depth + "]" * depth + "}"


def huge_number(digits: int = 5000) -> str:
    """An integer past `int()`'s default digit limit (4,300): parsing or printing it raises ValueError."""
    return "9" * digits
