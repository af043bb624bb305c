"""Whether a GPU cloud's hosts can pull an image: the registry its reference names, and why no host could reach it (a
loopback, private, link-local or single-label registry). Pure."""

from __future__ import annotations

import ipaddress
import re

_PRIVATE_SUFFIXES = (".local", ".localhost", ".internal", ".lan", ".home.arpa")


def registry_host(image: str) -> str:
    """The registry a pod would pull ``image`` from (Docker's rule: a first component with '.' or ':' or
    'localhost' names a registry; otherwise Docker Hub)."""
    first = image.split("/", 1)[0] if "/" in image else ""
    if first and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def _inet_aton(name: str) -> ipaddress.IPv4Address | None:
    """An IPv4 address in any form inet_aton(3) accepts: 1-4 parts, each decimal, 0x-hex or 0-octal; the last part
    fills the bytes the others left (127.1 is 127.0.0.1). None for anything else."""
    parts = name.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values = []
    for part in parts:
        m = re.fullmatch(r"0[xX]([0-9a-fA-F]+)|(0[0-7]*)|([1-9][0-9]*)", part)
        if not m:
            return None
        values.append(int(m[1], 16) if m[1] else int(m[2], 8) if m[2] else int(m[3]))
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        return None
    number = last
    for i, v in enumerate(head):
        number += v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def unreachable_registry(image: str) -> str | None:
    """Why no pod could pull ``image`` (a loopback, private, link-local or single-label registry), or None."""
    host = registry_host(image)
    if host.startswith("["):
        name = host[1:].split("]")[0]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.lower().rstrip(".")
    ip = None
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        ip = _inet_aton(name)  # short and integer IPv4 forms (127.1, 2130706433), as the resolver reads them
    if ip is not None:
        if ip.is_loopback:
            return f"{host} is a loopback address"
        if not ip.is_global:
            return f"{host} is not a public address (private, link-local or shared range)"
        return None
    if name == "localhost" or name.endswith(_PRIVATE_SUFFIXES):
        return f"{host} is a local name"
    if "." not in name:
        return f"{host} is a single-label name (a local registry such as kind's or compose's)"
    return None
