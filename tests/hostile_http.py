"""Far sides that lie, on 127.0.0.1: a recording HTTP server (every request with its headers), a registry that
serves whatever images it is given (and records every Authorization header it receives), and RunPod API answers a
malicious or broken provider sends. Real ``http.server`` servers in threads; reused by every remote feature's tests.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tests import loopback

Answer = tuple[int, dict[str, str], bytes]
Route = Callable[["Seen"], Answer]
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    """A real HTTP/1.0 server: ``routes`` maps a path (without its query) to an answer or a function of the
    request; ``fallback`` answers every other path. It records every request it gets, headers included."""

    routes: dict[str, Answer | Route] = field(default_factory=dict)
    fallback: Route | None = None
    seen: list[Seen] = field(default_factory=list)
    port: int = 0
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def auth_seen(self) -> list[str | None]:
        return [s.headers.get("Authorization") for s in self.seen]

    def credentials_seen(self) -> list[tuple[str, str]]:
        """(path, Authorization) of every request that carried credentials."""
        return [(s.path, s.headers["Authorization"]) for s in self.seen if s.headers.get("Authorization")]


@contextmanager
def serve(
    routes: dict[str, Answer | Route] | None = None, fallback: Route | None = None, host: str = "127.0.0.1"
) -> Iterator[Server]:
    """``host``: the address to listen on (a container reaches the host at its bridge's gateway)."""
    state = Server(dict(routes or {}), fallback, host=host)

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self) -> None:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                body = bytearray()
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    body += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
            else:
                body = bytearray(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            req = Seen(self.command, self.path, dict(self.headers.items()), bytes(body))
            state.seen.append(req)
            route = state.routes.get(self.path.split("?")[0]) or state.fallback or (404, {}, b"not here")
            status, headers, body = route(req) if callable(route) else route
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            if "Content-Length" not in headers and headers.get("X-No-Length") is None:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_PATCH = do_HEAD = do_DELETE = _answer

    server = http.server.ThreadingHTTPServer((host, 0), Handler)
    state.port = server.server_address[1]
    loopback.start(server)
    try:
        yield state
    finally:
        loopback.stop(server)


def redirect(to: str, code: int = 302) -> Answer:
    return code, {"Location": to}, b""


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def json_answer(doc: object, status: int = 200) -> Answer:
    return status, {"Content-Type": "application/json"}, json.dumps(doc).encode()


def raw_json(text: str, status: int = 200) -> Answer:
    return status, {"Content-Type": "application/json"}, text.encode()


def nested(depth: int) -> str:
    """JSON nested ``depth`` levels deep (Python's json recurses per level)."""
    return "[" * depth + "]" * depth


HUGE_NUMBER = "9" * 5000  # int() of it raises in Python >= 3.11 (the 4300-digit limit)


# ---- a registry ----------------------------------------------------------------------------------------------------
@dataclass
class FakeImage:
    manifest: bytes
    digest: str
    config: bytes
    config_digest: str
    media: str = MANIFEST_V2


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class RegistryState:
    """What a registry on loopback serves: manifests by (repo, tag or digest), blobs by digest; and, to misbehave,
    ``override`` answers a request before the registry does (return None to let it through), and ``lies`` answers
    a path (without its query) with other bytes than the registry holds there (``serve_manifest_as``,
    ``serve_blob_as``). It takes pushes too: manifests PUT by tag or digest, blobs by a monolithic upload."""

    server: Server
    manifests: dict[tuple[str, str], FakeImage] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    override: Route | None = None
    lies: dict[str, Answer] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def seen(self) -> list[Seen]:
        return self.server.seen

    def add_image(self, repo: str, tag: str, payload: str = "layer") -> FakeImage:
        layer = payload.encode()
        config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"diff_ids": [_sha(layer)]}}).encode()
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST_V2,
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": _sha(config)},
                "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "digest": _sha(layer)}],
            }
        ).encode()
        image = FakeImage(manifest, _sha(manifest), config, _sha(config))
        self.manifests[(repo, tag)] = self.manifests[(repo, image.digest)] = image
        self.blobs[image.config_digest], self.blobs[_sha(layer)] = config, layer
        return image

    def add_manifest(self, repo: str, tag: str, body: bytes, media: str = MANIFEST_V2) -> str:
        """Any manifest or index, as given, under ``tag`` and its digest; returns the digest."""
        image = FakeImage(body, _sha(body), b"", "", media)
        self.manifests[(repo, tag)] = self.manifests[(repo, image.digest)] = image
        return image.digest

    def add_blob(self, data: bytes) -> str:
        self.blobs[_sha(data)] = data
        return _sha(data)

    def serve_manifest_as(self, repo: str, asked: str, served: bytes, header: str | None = "served") -> None:
        """A lie: ``/manifests/<asked>`` answers ``served``, with a Docker-Content-Digest of ``header``: "served"
        (the digest of what it serves), "asked", None (no header) or any other text (sent as it is)."""
        digest = {"served": _sha(served), "asked": asked}.get(header or "", header)
        headers = {"Content-Type": MANIFEST_V2, **({"Docker-Content-Digest": digest} if digest else {})}
        self.lies[f"/v2/{repo}/manifests/{asked}"] = (200, headers, served)

    def serve_blob_as(self, repo: str, asked: str, served: bytes) -> None:
        """A lie: ``/blobs/<asked>`` answers ``served``."""
        self.lies[f"/v2/{repo}/blobs/{asked}"] = (200, {}, served)

    def answer(self, req: Seen) -> Answer:
        if self.override is not None and (forced := self.override(req)) is not None:
            return forced
        path = req.path.split("?")[0]
        if req.method in ("GET", "HEAD") and path in self.lies:
            return self.lies[path]
        if path in ("/v2/", "/v2"):
            return json_answer({})
        if req.method == "POST" and path.startswith("/v2/") and path.endswith("/blobs/uploads/"):
            return 202, {"Location": f"{path}{len(self.seen)}"}, b""
        if req.method == "PUT" and path.startswith("/v2/") and "/blobs/uploads/" in path:
            digest = req.path.partition("digest=")[2].replace("%3A", ":")
            if digest != _sha(req.body):
                return json_answer({"errors": [{"code": "DIGEST_INVALID"}]}, 400)
            self.blobs[digest] = req.body
            return 201, {"Docker-Content-Digest": digest}, b""
        if path.startswith("/v2/") and "/manifests/" in path:
            repo, _, ref = path[4:].rpartition("/manifests/")
            if req.method == "PUT":
                media = req.headers.get("Content-Type", MANIFEST_V2)
                return 201, {"Docker-Content-Digest": self.add_manifest(repo, ref, req.body, media)}, b""
            image = self.manifests.get((repo, ref))
            if image is None:
                return json_answer({"errors": [{"code": "MANIFEST_UNKNOWN"}]}, 404)
            return 200, {"Content-Type": image.media, "Docker-Content-Digest": image.digest}, image.manifest
        if path.startswith("/v2/") and "/blobs/" in path:
            blob = self.blobs.get(path.rpartition("/blobs/")[2])
            return (200, {}, blob) if blob is not None else json_answer({"errors": [{"code": "BLOB_UNKNOWN"}]}, 404)
        return 404, {}, b"not a registry path"


@contextmanager
def registry() -> Iterator[RegistryState]:
    """A registry on loopback that serves what it is given to anyone and records every request (so a test sees
    each Authorization header that reached it): as the attacker's registry, or, with ``override``, a lying one."""
    holder: list[RegistryState] = []
    with serve(fallback=lambda req: holder[0].answer(req)) as server:
        holder.append(RegistryState(server))
        yield holder[0]


# ---- RunPod's API, as a hostile or broken provider answers ---------------------------------------------------------
SPOOF = "bad input\n\x1b[2K\x1b[1Gerror: \x1b]8;;http://evil.example/\x07click\x1b]8;;\x07 \x1b[31mrm -rf ~\u202e"

RUNPOD_ANSWERS: dict[str, Answer] = {
    "no saveTemplate": json_answer({"data": {}}),
    "data is null": json_answer({"data": None}),
    "id is a number": json_answer({"data": {"saveTemplate": {"id": 7}}}),
    "id too long": json_answer({"data": {"saveTemplate": {"id": "x" * 5000}}}),
    "id with escapes": json_answer({"data": {"saveTemplate": {"id": "t\x1b[31m1\nerror: spoofed"}}}),
    "deeply nested": raw_json('{"data": ' + nested(100_000) + "}"),
    "huge number": raw_json('{"data": {"saveTemplate": {"id": "t1", "volumeInGb": ' + HUGE_NUMBER + "}}}"),
    "errors of the wrong shape": json_answer({"errors": {"message": "x"}}),
    "errors not a list of objects": json_answer({"errors": [[["x"]]]}),
}


@contextmanager
def runpod(answer: Answer | Route) -> Iterator[Server]:
    """RunPod's API as a hostile or broken provider: every request (GraphQL or REST) gets ``answer`` (one of
    ``RUNPOD_ANSWERS``, or a function of the request), and is recorded with its headers."""
    with serve(fallback=answer if callable(answer) else lambda req: answer) as server:
        yield server
