"""Credentials for private package indexes, from the environment or a netrc only: never from a file imagekit
writes, and never into one (a lock, a render, a log). Locks record index URLs without credentials, so every
resolution and every fetch asks here again.

In this order, for a request to an index's host:
1. ``IMAGEKIT_INDEX_USER`` / ``IMAGEKIT_INDEX_PASSWORD``, for the hosts of the configured private indexes only
   (``index_url`` / ``extra_index_urls`` of the matrix file or the options, PyPI and the PyTorch index excepted);
2. the netrc entry for that host (``$NETRC``, else ``~/.netrc``), as pip and uv read it.
uv gets the same credentials through a netrc of its own run (mode 0600, gone when it ends): none on its command line.
"""

from __future__ import annotations

import base64
import netrc
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from imagekit.errors import UsageError
from imagekit.trust import untrusted

USER_VARIABLE = "IMAGEKIT_INDEX_USER"
PASSWORD_VARIABLE = "IMAGEKIT_INDEX_PASSWORD"
PUBLIC_HOSTS = frozenset({"pypi.org", "files.pythonhosted.org", "download.pytorch.org", "download-r2.pytorch.org"})


def host_of(url: str) -> str:
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        return f"{host}:{parts.port}" if parts.port else host
    except ValueError:
        return ""


def _netrc_path() -> Path:
    return Path(os.environ.get("NETRC") or Path.home() / ".netrc")


def _from_netrc(host: str) -> tuple[str, str] | None:
    path = _netrc_path()
    try:
        entries = netrc.netrc(str(path))
    except (OSError, netrc.NetrcParseError):
        return None
    found = entries.authenticators(host) or entries.authenticators(host.split(":", 1)[0])
    if not found:
        return None
    login, _, password = found
    return (login or "", password or "")


def _checked(value: str, variable: str) -> str:
    """A credential that can be sent in a header and written to a netrc (which has no quoting: a space, a `#` or a
    quote would end or comment out the token)."""
    try:
        untrusted.header_value(value, variable)
    except untrusted.UntrustedData:
        raise UsageError(
            f"{variable} holds a line break or a control character", f"set {variable} to the bare value"
        ) from None
    if any(c in value for c in " \t#'\"") or not value.isascii():
        raise UsageError(
            f"{variable} holds a space, '#', a quote or a non-ASCII character, which a netrc cannot carry",
            "use a token of printable ASCII without those (index tokens are), or a ~/.netrc entry you write yourself",
        )
    return value


@dataclass(frozen=True)
class IndexAuth:
    """Who gets which credentials: ``private`` are the configured private indexes' hosts (``host[:port]``)."""

    private: frozenset[str] = frozenset()
    env: tuple[str, str] | None = field(default=None, repr=False)

    def credentials(self, url: str) -> tuple[str, str] | None:
        host = host_of(url)
        if not host:
            return None
        if self.env is not None and host in self.private:
            return self.env
        return _from_netrc(host)

    def headers(self, url: str) -> dict[str, str]:
        """The Authorization header for a request to ``url`` (redirects elsewhere drop it: imagekit.effects.http)."""
        found = self.credentials(url)
        if found is None:
            return {}
        token = base64.b64encode(f"{found[0]}:{found[1]}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    def netrc_text(self) -> str | None:
        """A netrc for a resolver's run: the user's own, and the environment's credentials for the private hosts;
        None when there is nothing to add to what the resolver reads by itself."""
        if self.env is None or not self.private:
            return None
        own = ""
        try:
            own = _netrc_path().read_text()
        except OSError:
            pass
        user, password = self.env
        lines = [own.rstrip("\n")] if own.strip() else []
        for host in sorted(self.private):
            lines.append(f"machine {host.split(':', 1)[0]} login {user} password {password}")
        return "\n".join(lines) + "\n"

    @property
    def source(self) -> str:
        """Where credentials come from, as it may be shown (never the values)."""
        if self.env is not None and self.private:
            return f"{USER_VARIABLE}/{PASSWORD_VARIABLE} for {', '.join(sorted(self.private))}"
        return f"netrc ({_netrc_path()})" if _netrc_path().is_file() else "none"


def for_indexes(urls: Iterable[str]) -> IndexAuth:
    """The credentials for these index URLs (the lock's or the settings'): the environment's go to the private ones."""
    private = frozenset(h for h in (host_of(u) for u in urls) if h and h.split(":", 1)[0] not in PUBLIC_HOSTS)
    user = os.environ.get(USER_VARIABLE)
    env = None
    if user:
        env = (_checked(user, USER_VARIABLE), _checked(os.environ.get(PASSWORD_VARIABLE, ""), PASSWORD_VARIABLE))
    return IndexAuth(private, env)
