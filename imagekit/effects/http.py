"""The tool's one HTTP client (httpx): timeouts, retries, redirects that never carry credentials to another origin,
JSON answers checked, and downloads streamed to disk with a size bound.

Redirects are followed here, not by httpx: only to http(s), at most ``MAX_REDIRECTS``, and when a redirect leaves
the origin (scheme, host, port) every credential header is dropped. httpx drops ``Authorization`` itself on a
cross-origin redirect, but keeps it on an http->https upgrade of the same host and knows no other credential header;
the rule here is the strict one, whatever the library version does. What a URL is (parsed, http(s), its origin, how
it is shown) is pure and lives in imagekit.trust.urls.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.trust import untrusted
from imagekit.trust.urls import display, origin, reason, require_http

if TYPE_CHECKING:
    import httpx
else:

    class _Httpx:
        """httpx, imported on first use: the import costs every command's start-up (about 50 ms), and most commands
        (`lock` with a warm cache among them) read nothing over HTTP."""

        def __getattr__(self, name: str) -> Any:
            import httpx as module

            globals()["httpx"] = module
            return getattr(module, name)

    httpx = _Httpx()

T = TypeVar("T")
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 10
# Headers that prove who the caller is: never sent to an origin the caller did not address.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"})
TIMEOUT = (30.0, 10.0)  # (read/write/pool, connect) seconds
DOWNLOAD_TIMEOUT = (120.0, 10.0)
MAX_DOWNLOAD = 8 << 30  # no wheel is larger (the biggest CUDA wheels are ~4 GiB); an index cannot ask for more
RETRY_METHODS = frozenset({"GET", "HEAD", "PUT"})  # idempotent: safe to send again after a 5xx or a dropped reply


def provider_answer(provider: str, url: str, final: str, status: int, key_variable: str) -> None:
    """A provider API's answer, checked before it is read: one from where a redirect led is not the provider's (the
    key stayed behind), and a refused key says which variable holds it."""
    if origin(final) != origin(url):
        raise EnvironmentFailure(
            f"the {provider} API at {display(url)} redirected to another server ({display(final)}): its answer is "
            f"not {provider}'s, and nothing was done",
            f"check --api-url: it must be {provider}'s own endpoint",
        )
    if status in (401, 403):
        raise EnvironmentFailure(f"{provider} refused the API key (HTTP {status})", f"check {key_variable}")


# httpx reads these when a client is made: a client is shared only while they stay as they were
_CLIENT_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR")


def shared() -> httpx.Client:
    """The process's client (connection pool shared by threads), made on first use and again when the proxy or
    certificate environment changes."""
    return _shared(tuple(os.environ.get(k) or os.environ.get(k.lower()) for k in _CLIENT_ENV))


@functools.cache
def _shared(_env: tuple[str | None, ...]) -> httpx.Client:
    return make_client()


def _timeout(value: httpx.Timeout | tuple[float, float]) -> httpx.Timeout:
    return httpx.Timeout(value[0], connect=value[1]) if isinstance(value, tuple) else value


def make_client(timeout: httpx.Timeout | tuple[float, float] = TIMEOUT) -> httpx.Client:
    from imagekit import __version__

    return httpx.Client(
        timeout=_timeout(timeout),
        follow_redirects=False,  # followed by `stream`, with the credential rule above
        headers={"User-Agent": f"imagekit/{__version__}"},
    )


def _strip_credentials(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in CREDENTIAL_HEADERS}


@contextmanager
def stream(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    content: bytes | Iterable[bytes] | None = None,
    timeout: httpx.Timeout | None = None,
    attempts: int = 3,
    client: httpx.Client | None = None,
    redirects: bool = True,
) -> Iterator[httpx.Response]:
    """The final answer (any status) after redirects (``redirects=False``: the first answer, a redirect too), its
    body not yet read. Retries connection failures, and 5xx answers of idempotent methods (an iterable ``content``
    must then be one that can be iterated again); raises EnvironmentFailure when the server cannot be reached."""
    require_http(url)
    pool = client or shared()
    method = method.upper()
    sent = dict(headers or {})
    first = origin(url)
    hops = 0
    attempt = 0
    while True:
        request = pool.build_request(method, url, headers=sent, content=content, timeout=_timeout(timeout or TIMEOUT))
        try:
            response = pool.send(request, stream=True)
        except httpx.TransportError as exc:
            attempt += 1
            retry = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout) or method in RETRY_METHODS
            if retry and attempt < attempts:
                time.sleep(0.2 * attempt)
                continue
            raise EnvironmentFailure(
                f"cannot reach {display(url)}: {exc.__class__.__name__}: {reason(exc)}", "check network access to it"
            ) from None
        if response.status_code >= 500 and method in RETRY_METHODS and attempt + 1 < attempts:
            response.close()
            attempt += 1
            time.sleep(0.2 * attempt)
            continue
        location = response.headers.get("Location")
        if response.status_code not in REDIRECTS or not location or not redirects:
            try:
                yield response
            finally:
                response.close()
            return
        response.close()
        hops += 1
        if hops > MAX_REDIRECTS:
            raise EnvironmentFailure(f"{display(url)}: more than {MAX_REDIRECTS} redirects", "check the URL")
        try:
            target = str(response.url.join(location))
        except httpx.InvalidURL:
            raise EnvironmentFailure(f"{display(url)} redirected to an invalid URL", "check the URL") from None
        require_http(
            target,
            f"{display(url)} redirected to",
            EnvironmentFailure,
            "the server redirects outside http(s); use another server or mirror",
        )
        if origin(target) != first:
            sent = _strip_credentials(sent)  # once another origin, always: never back to the first with them
        if response.status_code == 303 or (response.status_code in (301, 302) and method == "POST"):
            method, content = ("HEAD" if method == "HEAD" else "GET"), None
            sent = {k: v for k, v in sent.items() if k.lower() not in ("content-type", "content-length")}
        url, attempt = target, 0


def unreachable(url: str, timeout: float) -> str | None:
    """Why the server of ``url`` cannot be reached (connection refused, a DNS failure, no answer within
    ``timeout`` seconds), or None when it answers anything at all: any status, a 401 or a 404 included, is for
    the caller that uses the URL to judge. One HEAD request, no retry."""
    try:
        with stream("HEAD", url, timeout=httpx.Timeout(timeout), attempts=1):
            return None
    except EnvironmentFailure as exc:
        if "Timeout" in exc.message:
            return f"no answer within {timeout:g} s ({exc.message.split(': ', 1)[-1]})"
        return exc.message.removeprefix(f"cannot reach {display(url)}: ")


def request(method: str, url: str, **kw: Any) -> tuple[int, httpx.Headers, bytes]:
    """(status, headers, body) of the final answer, whatever its status; the body bounded by ``max_bytes``
    (the keywords of :func:`request_final`)."""
    status, answer, body, _ = request_final(method, url, **kw)
    return status, answer, body


def request_final(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    content: bytes | Iterable[bytes] | None = None,
    max_bytes: int = 64 << 20,
    client: httpx.Client | None = None,
    redirects: bool = True,
) -> tuple[int, httpx.Headers, bytes, str]:
    """Like :func:`request`, and the URL that gave the final answer (after redirects): a caller deciding whether to
    answer its challenge with credentials must know whose challenge it is."""
    with stream(method, url, headers=headers, content=content, client=client, redirects=redirects) as resp:
        try:
            return resp.status_code, resp.headers, _read(resp, max_bytes, url), str(resp.url)
        except httpx.HTTPError as exc:
            raise EnvironmentFailure(
                f"reading {display(url)} failed: {reason(exc)}", "retry; check network access"
            ) from None


def _read(resp: httpx.Response, max_bytes: int, url: str) -> bytes:
    chunks, size = [], 0
    for chunk in resp.iter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise EnvironmentFailure(f"{display(url)} answered more than {max_bytes} bytes", "check the URL")
        chunks.append(chunk)
    return b"".join(chunks)


def get(
    url: str, accept: str | None = None, *, headers: Mapping[str, str] | None = None, max_bytes: int = 64 << 20
) -> bytes:
    """The body of a 200/206 answer; any other status is an EnvironmentFailure naming it."""
    sent = {**({"Accept": accept} if accept else {}), **(headers or {})}
    status, _, body = request("GET", url, headers=sent, max_bytes=max_bytes)
    if status in (401, 403):
        raise EnvironmentFailure(
            f"GET {display(url)} answered HTTP {status} (authentication required or refused)",
            "give the index's credentials: IMAGEKIT_INDEX_USER and IMAGEKIT_INDEX_PASSWORD (for the indexes the matrix "
            "file or --index-url names), or a ~/.netrc entry for its host",
        )
    if status not in (200, 206):
        raise EnvironmentFailure(f"GET {display(url)} answered HTTP {status}", "check the index URL")
    return body


def parse_json(body: bytes, what: str, hint: str = "check the URL: it does not serve the expected API") -> Any:
    """JSON out of an answer, bounded (imagekit.trust.untrusted.load_json: size, depth, numbers); anything else is an
    EnvironmentFailure (exit 3) saying what was wrong, its start shown as plain text."""
    try:
        return untrusted.load_json(body, what)
    except untrusted.UntrustedData as exc:
        if str(exc).startswith(f"{what} is not JSON") or str(exc).startswith(f"{what} is not UTF-8"):
            start = untrusted.printable(body[:80].decode("utf-8", "replace").strip(), 80)
            raise EnvironmentFailure(f"{what} did not answer JSON (it began {start!r})", hint) from None
        raise EnvironmentFailure(str(exc), hint) from None


def get_json(url: str, accept: str | None = None) -> dict:
    doc = parse_json(get(url, accept), f"GET {display(url)}")
    if not isinstance(doc, dict):
        raise EnvironmentFailure(f"GET {display(url)} answered JSON that is not an object", "check the index URL")
    return doc


def download(
    url: str,
    dest: Path,
    *,
    sha256: str,
    max_bytes: int = MAX_DOWNLOAD,
    client: httpx.Client | None = None,
    on_bytes: Callable[[int], None] | None = None,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Stream ``url`` into ``dest`` (atomically: a temporary file in the same folder, renamed when the bytes are
    all there, of the right hash, within ``max_bytes``). Nothing is left behind on any failure. ``dest``'s folder
    must exist: a folder removed meanwhile (an interrupted fetch discarding its partial downloads) is never made
    again, so nothing is left in it when the process exits."""
    max_bytes = min(max_bytes, MAX_DOWNLOAD)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".download-")
    h = hashlib.sha256()
    too_big = EnvironmentFailure(
        f"{display(url)} is larger than the {max_bytes} bytes its index declares",
        "the index served different bytes than it listed; do not build from it",
    )
    try:
        with (
            os.fdopen(fd, "wb") as out,
            stream(
                "GET",
                url,
                headers={"Accept-Encoding": "identity", **(headers or {})},
                timeout=_timeout(DOWNLOAD_TIMEOUT),
                client=client,
            ) as resp,
        ):
            if resp.status_code != 200:
                raise EnvironmentFailure(f"cannot download {display(url)}: HTTP {resp.status_code}", "check the index")
            declared = resp.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise too_big
            size = 0
            for block in resp.iter_bytes(1 << 20):
                size += len(block)
                if size > max_bytes:
                    raise too_big
                h.update(block)
                out.write(block)
                if on_bytes is not None:
                    on_bytes(len(block))
        if h.hexdigest() != sha256:
            raise CheckFailed(
                f"{display(url)} has sha256 {h.hexdigest()}, the lock says {sha256}",
                "the index served different bytes than it listed; do not build from it",
            )
        os.replace(tmp, dest)
    except httpx.HTTPError as exc:
        raise EnvironmentFailure(
            f"cannot download {display(url)}: {reason(exc)}", "check network access to the index"
        ) from None
    except OSError as exc:
        raise EnvironmentFailure(f"cannot write {dest}: {exc}", "check free space in the cache") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def map_concurrently(fn: Callable[[str], T], items: list[str], workers: int = 8) -> list[T]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))
