"""Where a repository's registry ends: Docker's rule, once. Pure.

A reference's first path component names a registry host when it holds a '.' or a ':' (a domain, a port, an IPv6
literal) or is ``localhost``; otherwise the whole name is a path on Docker Hub (``acme/train``, ``ubuntu``, which
Docker reads as ``library/ubuntu``). The same as distribution/reference's splitDockerDomain, which `docker pull` uses.
"""

from __future__ import annotations

HUB = "docker.io"  # Docker Hub as references and `docker login` name it
HUB_API = "registry-1.docker.io"  # where Docker Hub's registry API answers: the host imagekit's client speaks to
_HUB_NAMES = ("docker.io", "index.docker.io")


def is_registry_host(component: str) -> bool:
    """Whether a reference's first component names a registry (``ghcr.io``, ``127.0.0.1:5000``, ``localhost``)."""
    return "." in component or ":" in component or component == "localhost"


def split(name: str) -> tuple[str | None, str]:
    """``name`` (a repository, or a reference) as (its registry host, or None for Docker Hub; the path on it)."""
    first, _, rest = name.partition("/")
    if rest and is_registry_host(first):
        return first, rest
    return None, name


def registry_of(name: str) -> str:
    """The registry a pull of ``name`` goes to, Docker Hub as ``docker.io``."""
    return split(name)[0] or HUB


def api_host(host: str) -> str:
    """The host whose registry API serves ``host``'s repositories: Docker Hub's names are one registry."""
    return HUB_API if host in _HUB_NAMES else host
