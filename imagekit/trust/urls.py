"""URLs as text: parsed, joined, judged (http(s) with a host), compared by origin and shown redacted. Pure.

The parse is RFC 3986's, as the HTTP client (httpx) parses what it sends: the same components, the same
normalization (scheme and host lowercased, a scheme's default port dropped, ``.``/``..`` segments resolved, what a
component may not hold percent-encoded), so a URL judged here is the URL the client sends. Where the two could
differ it is stricter, never looser: a host is ASCII (a non-ASCII name is written in its ``xn--`` form: its IDNA
encoding needs tables the standard library does not have), a host holds no space or ``"<>[]^`{|}\\``, a port is
ASCII digits from 1 to 65535 after a ``:``, an IPv6 literal has no zone, a scheme is never empty, and a lone
surrogate is no URL. ``tests/trust/test_urls.py`` holds it to httpx's parse over a hostile corpus.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import unquote, urljoin

from imagekit.errors import UsageError
from imagekit.trust import untrusted
from imagekit.trust.redact import redact, redact_text

SCHEMES = ("http", "https")
MAX_LENGTH = 65536  # httpx's bound
DEFAULT_PORTS = {"ftp": 21, "http": 80, "https": 443, "ws": 80, "wss": 443}  # dropped from a URL (WHATWG)

_UNRESERVED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
_SUB_DELIMS = "!$&'()*+,;="


def _printable_except(*codes: int) -> str:
    return "".join(chr(i) for i in range(0x20, 0x7F) if i not in codes)


# What each component keeps as it is; anything else is percent-encoded (the WHATWG sets, as httpx uses them).
_FRAGMENT_SAFE = _printable_except(0x20, 0x22, 0x3C, 0x3E, 0x60)
_QUERY_SAFE = _printable_except(0x20, 0x22, 0x23, 0x3C, 0x3E)
_PATH_SAFE = _printable_except(0x20, 0x22, 0x23, 0x3C, 0x3E, 0x3F, 0x60, 0x7B, 0x7D)
_USERINFO_SAFE = _printable_except(
    *(0x20, 0x22, 0x23, 0x3C, 0x3E, 0x3F, 0x60, 0x7B, 0x7D, 0x2F, 0x3B, 0x3D, 0x40, 0x5B, 0x5C, 0x5D, 0x5E, 0x7C)
)
_HOST_CHARS = frozenset(_UNRESERVED + _SUB_DELIMS + "%")  # a reg-name (RFC 3986 3.2.2), percent-escapes as they are

_URL = re.compile(
    r"(?:(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*):)?"
    r"(?://(?P<authority>[^/?#]*))?"
    r"(?P<path>[^?#]*)"
    r"(?:\?(?P<query>[^#]*))?"
    r"(?:#(?P<fragment>.*))?",
    re.DOTALL,
)
# userinfo: up to the last '@'; host: an IP literal in brackets or anything without ':' or '@'; then ':port'
_AUTHORITY = re.compile(r"(?:(?P<userinfo>.*)@)?(?P<host>\[.*\]|[^:@]*)(?::(?P<port>.*))?", re.DOTALL)
_IPV4_LIKE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")
_ESCAPE = re.compile("%[A-Fa-f0-9]{2}")


class InvalidURL(ValueError):
    """Text that is no URL; the message says why."""


@dataclass(frozen=True)
class URL:
    """A URL in its normal form: every component ASCII, ``query``/``fragment`` None when absent ("" when empty)."""

    scheme: str
    userinfo: str
    host: str  # lowercased (an IPv6 literal without its brackets, as written)
    port: int | None  # None for the scheme's default
    path: str  # percent-encoded
    query: str | None
    fragment: str | None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        authority = "".join(
            (f"{self.userinfo}@" if self.userinfo else "", host, f":{self.port}" if self.port is not None else "")
        )
        return "".join(
            (
                f"{self.scheme}:" if self.scheme else "",
                f"//{authority}" if authority else "",
                self.path,
                f"?{self.query}" if self.query is not None else "",
                f"#{self.fragment}" if self.fragment is not None else "",
            )
        )


def parse(url: str) -> URL:
    """``url`` in its normal form; InvalidURL for what is no URL (relative references are URLs)."""
    if not isinstance(url, str):
        raise InvalidURL(f"not text but {type(url).__name__}")
    if len(url) > MAX_LENGTH:
        raise InvalidURL("URL too long")
    for idx, char in enumerate(url):
        if char.isascii() and not char.isprintable():
            raise InvalidURL(f"Invalid non-printable ASCII character in URL, {char!r} at position {idx}.")
        if "\ud800" <= char <= "\udfff":
            raise InvalidURL(f"a lone surrogate ({char!r}) at position {idx}: not Unicode text")
    match = _URL.fullmatch(url)
    assert match is not None  # every group is optional and the last matches anything
    scheme = (match["scheme"] or "").lower()
    auth = _AUTHORITY.fullmatch(match["authority"] or "")
    if auth is None:
        raise InvalidURL(f"Invalid authority: {match['authority']!r}")
    userinfo = _quote(auth["userinfo"] or "", _USERINFO_SAFE)
    host = _host(auth["host"] or "")
    port = _port(auth["port"], scheme)
    path, query, fragment = match["path"], match["query"], match["fragment"]
    has_authority = bool(userinfo or host or port is not None)
    if has_authority and path and not path.startswith("/"):
        raise InvalidURL("For absolute URLs, path must be empty or begin with '/'")
    if not scheme and not has_authority:
        if path.startswith("//"):
            raise InvalidURL("Relative URLs cannot have a path starting with '//'")
        if path.startswith(":"):
            raise InvalidURL("Relative URLs cannot have a path starting with ':'")
    if scheme or has_authority:
        path = _remove_dot_segments(path)
    return URL(
        scheme,
        userinfo,
        host,
        port,
        _quote(path, _PATH_SAFE),
        None if query is None else _quote(query, _QUERY_SAFE),
        None if fragment is None else _quote(fragment, _FRAGMENT_SAFE),
    )


def _host(host: str) -> str:
    if not host:
        return ""
    if _IPV4_LIKE.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ipaddress.AddressValueError:
            raise InvalidURL(f"Invalid IPv4 address: {host!r}") from None
        return host
    if host.startswith("[") and host.endswith("]"):
        if "%" in host:
            raise InvalidURL(f"Invalid IPv6 address: {host!r} (a zone is not part of a URL)")
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ipaddress.AddressValueError:
            raise InvalidURL(f"Invalid IPv6 address: {host!r}") from None
        return host[1:-1]
    if not host.isascii():
        raise InvalidURL(f"Invalid host: {host!r} is not ASCII (write an international name in its xn-- form)")
    bad = sorted(set(host) - _HOST_CHARS)
    if bad:
        raise InvalidURL(f"Invalid host: {host!r} holds {''.join(bad)!r}")
    return host.lower()


def _port(port: str | None, scheme: str) -> int | None:
    if not port:
        return None  # none, or an empty one ("http://host:/")
    if not (port.isascii() and port.isdigit() and len(port) <= 5) or not 0 < int(port) <= 65535:
        raise InvalidURL(f"Invalid port: {port!r}")
    number = int(port)
    return None if number == DEFAULT_PORTS.get(scheme) else number


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4: ``/a/./b/../c`` -> ``/a/c``; never above the root."""
    segments = path.split("/")
    if "." not in segments and ".." not in segments:
        return path
    out: list[str] = []
    for segment in segments:
        if segment == "..":
            if out and out != [""]:
                out.pop()
        elif segment != ".":
            out.append(segment)
    return "/".join(out)


def _quote(text: str, safe: str) -> str:
    """``text`` with what is neither unreserved nor in ``safe`` percent-encoded (UTF-8); escapes kept as they are."""
    keep = _UNRESERVED + safe
    out, at = [], 0
    for escape in _ESCAPE.finditer(text):
        out.append(_encode(text[at : escape.start()], keep))
        out.append(escape.group())
        at = escape.end()
    out.append(_encode(text[at:], keep))
    return "".join(out)


def _encode(text: str, keep: str) -> str:
    return "".join(c if c in keep else "".join(f"%{b:02X}" for b in c.encode()) for c in text)


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port made explicit: whom a request to ``url`` reaches, to decide
    whether credentials may follow a redirect. InvalidURL for what is no URL."""
    u = parse(url)
    return u.scheme, u.host.lower(), u.port or {"http": 80, "https": 443}.get(u.scheme)


def join(base: str, href: str) -> str:
    """``href`` made absolute against ``base`` (an index page's link); ``href`` as it is when either is no URL."""
    try:
        return str(parse(urljoin(str(parse(base)), str(parse(href)))))
    except InvalidURL:
        return href


def filename(url: str) -> str:
    """The last path segment, percent-decoded (``%2B`` -> ``+``); "" for what is no URL."""
    try:
        path = parse(url).path
    except InvalidURL:
        return ""
    return unquote(path or "/").rsplit("/", 1)[-1]


def require_http(url: str, what: str = "URL", error: type[Exception] = UsageError, hint: str | None = None) -> str:
    """``url`` when it is http(s) with a host; anything else (file://, ftp://, a bare path) is refused."""
    try:
        u = parse(url)
    except InvalidURL as exc:
        raise error(
            f"{what} {display(url)!r} is not a valid URL: {reason(exc)}", hint or "pass an http(s):// URL"
        ) from None
    if u.scheme not in SCHEMES or not u.host:
        raise error(f"{what} {display(url)!r} is not an http(s) URL", hint or "pass an http(s):// URL")
    return url


def display(url: str) -> str:
    """The URL as it may be shown: no user-info, no query (signatures, tokens), no token-like path segment, no
    control characters (imagekit.trust.redact.redact, then imagekit.trust.untrusted.printable)."""
    if not isinstance(url, str):
        return "<not a URL>"
    return untrusted.printable(redact(url.split("?", 1)[0]), 500)


def reason(exc: BaseException) -> str:
    """A library's error text as it may be shown: URLs in it redacted, printable, bounded. (Header values never get
    here: callers check them with imagekit.trust.untrusted.header_value before a request is built.)"""
    return untrusted.printable(redact_text(str(exc)))
