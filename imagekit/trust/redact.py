"""Credentials out of what is shown or stored: URLs and texts that may carry them. Pure."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_SECRET_PARAM = re.compile(r"token|key|secret|passw|auth|sig|credential", re.I)
_TOKENISH = re.compile(r"^(?=[A-Za-z0-9_]*[0-9])(?=[A-Za-z0-9_]*[A-Za-z])[A-Za-z0-9_]{20,}$")  # e.g. /<token>/simple
# Each match may start only where its run of characters starts (the lookbehinds): tried from every position of a
# 900,000-character run, the patterns would scan the rest of it each time (quadratic: an hour, not a millisecond).
_URL_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact(url: str) -> str:
    """A URL without credentials: ``user:password@``, secret-looking query values (``?private_token=...``) and
    token-like path segments (``https://host/<token>/simple``) never reach a lockfile, a log or an error."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:  # "https://[::1": nothing of it can be shown safely
        return "<unparseable URL>"
    host = parts.netloc
    if parts.username is not None or parts.password is not None:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
    path = "/".join("***" if _TOKENISH.match(seg) else seg for seg in parts.path.split("/"))
    query = "&".join(
        f"{k}=***" if _SECRET_PARAM.search(k) else (f"{k}={v}" if sep else k)
        for k, sep, v in (pair.partition("=") for pair in parts.query.split("&") if pair)
    )
    return urlunsplit((parts.scheme, host, path, query, parts.fragment))


# `user:password@host/repo`: user-info in a reference with no scheme (not a digest's `@sha256:`)
_USERINFO = re.compile(r"(?<![^\s/@'\"])[^\s/@'\"]+@(?=[A-Za-z0-9\[])(?!sha(?:256|384|512):)")


def redact_text(text: str) -> str:
    """Every URL in a text (a resolver's stderr, an error) redacted."""
    return _URL_IN_TEXT.sub(lambda m: redact(m.group(0)), text)


def redact_value(text: str) -> str:
    """A value a user typed, as an error may echo it: URLs redacted, and user-info before a host taken out where no
    scheme marks it (``user:password@registry/repo``)."""
    out, last = [], 0
    for m in _URL_IN_TEXT.finditer(text):  # a URL's own user-info is redact's; its `@` after the host is a path's
        out += [_USERINFO.sub("***@", text[last : m.start()]), redact(m.group(0))]  # (pip's `repo.git@<commit>`)
        last = m.end()
    return "".join([*out, _USERINFO.sub("***@", text[last:])])
