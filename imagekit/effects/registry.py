"""Registry HTTP API v2: what a tag points at, read straight from the registry (Basic and Bearer auth).

Credentials go to the registry and to the token realm its challenge names; a redirect elsewhere (blobs served
from a CDN) is followed without them (imagekit.effects.http)."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

import httpx

from imagekit.effects import http
from imagekit.errors import EnvironmentFailure

MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.index.v1+json",
    ]
)


@dataclass(frozen=True)
class Remote:
    registry: str  # host[:port]
    name: str  # path inside the registry

    @classmethod
    def parse(cls, repository: str) -> Remote:
        first, _, rest = repository.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            return cls(first, rest)
        return cls("registry-1.docker.io", repository if "/" in repository else f"library/{repository}")

    @property
    def base(self) -> str:
        host = self.registry.split(":")[0]
        scheme = "http" if host in ("localhost", "127.0.0.1") or host.startswith("127.") else "https"
        return f"{scheme}://{self.registry}/v2/{self.name}"


@dataclass(frozen=True)
class ManifestInfo:
    digest: str
    config_digest: str | None


class RegistryClient:
    def __init__(self, username: str | None = None, password: str | None = None) -> None:
        self.username = username
        self.password = password

    def _basic(self) -> str | None:
        if self.username is None:
            return None
        token = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
        return f"Basic {token}"

    def _request(
        self,
        url: str,
        method: str = "GET",
        auth: str | None = None,
        data: bytes | None = None,
        content_type: str | None = None,
        max_bytes: int = 64 << 20,
    ) -> tuple[int, dict, bytes]:
        headers = {"Accept": MANIFEST_TYPES}
        if auth:
            headers["Authorization"] = auth
        if content_type:
            headers["Content-Type"] = content_type
        try:
            status, answer, body = http.request(method, url, headers=headers, content=data, max_bytes=max_bytes)
        except EnvironmentFailure as exc:
            raise EnvironmentFailure(
                f"registry {url.split('/v2/')[0]} is unreachable: {exc.message}",
                "start the registry, or check --registry",
            ) from None
        return status, dict(answer), body

    def _bearer(self, challenge: str) -> str | None:
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        if "realm" not in params:
            return None
        realm = http.require_http(
            params["realm"], "the registry's token realm", EnvironmentFailure, "the registry's auth challenge is broken"
        )
        query = {k: v for k, v in params.items() if k in ("service", "scope")}
        status, _, body = self._request(str(httpx.URL(realm).copy_merge_params(query)), auth=self._basic())
        if status != 200:
            return None
        doc = _json(body, f"the token service {realm}")
        token = doc.get("token") or doc.get("access_token")
        return f"Bearer {token}" if isinstance(token, str) and token else None

    def _authed(
        self,
        url: str,
        method: str = "GET",
        data: bytes | None = None,
        content_type: str | None = None,
        max_bytes: int = 64 << 20,
    ) -> tuple[int, dict, bytes]:
        status, headers, body = self._request(url, method, self._basic(), data, content_type, max_bytes)
        if status == 401:
            challenge = {k.lower(): v for k, v in headers.items()}.get("www-authenticate", "")
            auth = self._bearer(challenge) if challenge.lower().startswith("bearer") else None
            if auth is None:
                raise EnvironmentFailure(
                    f"registry {url.split('/v2/')[0]} refused the credentials (HTTP 401)",
                    "set IMAGEKIT_REGISTRY_USER and IMAGEKIT_REGISTRY_PASSWORD",
                )
            status, headers, body = self._request(url, method, auth, data, content_type, max_bytes)
        return status, headers, body

    def copy_tag(self, remote: Remote, digest: str, tag: str) -> None:
        """Point ``tag`` at the manifest ``digest`` (the same bytes, so the same digest)."""
        status, headers, body = self._authed(f"{remote.base}/manifests/{digest}")
        if status != 200:
            raise EnvironmentFailure(f"registry {remote.registry} answered HTTP {status} for {digest}")
        media = {k.lower(): v for k, v in headers.items()}.get("content-type") or _json(
            body, f"registry {remote.registry}"
        ).get("mediaType")
        status, _, answer = self._authed(f"{remote.base}/manifests/{tag}", "PUT", body, media)
        if status not in (200, 201):
            raise EnvironmentFailure(
                f"registry {remote.registry} refused tagging {tag} (HTTP {status}): {answer[:300]!r}",
                "retry; check push rights",
            )

    def blob_json(self, remote: Remote, digest: str) -> dict:
        """A JSON blob (an image config) by digest."""
        status, _, body = self._authed(f"{remote.base}/blobs/{digest}")
        if status != 200:
            raise EnvironmentFailure(f"registry {remote.registry} answered HTTP {status} for blob {digest}")
        return _json(body, f"registry {remote.registry} (blob {digest})")

    def blob(self, remote: Remote, digest: str, max_bytes: int) -> bytes:
        """A blob's bytes by digest, refused when larger than ``max_bytes``."""
        status, _, body = self._authed(f"{remote.base}/blobs/{digest}", max_bytes=max_bytes)
        if status != 200:
            raise EnvironmentFailure(f"registry {remote.registry} answered HTTP {status} for blob {digest}")
        return body

    def manifest_json(self, remote: Remote, reference: str) -> dict:
        """The manifest document itself (layers, config)."""
        status, _, body = self._authed(f"{remote.base}/manifests/{reference}")
        if status != 200:
            raise EnvironmentFailure(f"registry {remote.registry} answered HTTP {status} for {reference}")
        return _json(body, f"registry {remote.registry}")

    def manifest(self, remote: Remote, reference: str) -> ManifestInfo | None:
        """The manifest a tag or digest names, or None when the registry does not have it."""
        status, headers, body = self._authed(f"{remote.base}/manifests/{reference}")
        if status == 404:
            return None
        if status != 200:
            raise EnvironmentFailure(f"registry {remote.registry} answered HTTP {status} for {reference}")
        lowered = {k.lower(): v for k, v in headers.items()}
        doc = _json(body, f"registry {remote.registry}")
        config = doc.get("config", {}).get("digest") if isinstance(doc.get("config"), dict) else None
        return ManifestInfo(lowered.get("docker-content-digest", ""), config)


def _json(body: bytes, what: str) -> dict[str, Any]:
    doc = http.parse_json(body, what, "check --registry: it does not speak the registry API v2")
    if not isinstance(doc, dict):
        raise EnvironmentFailure(f"{what} answered JSON that is not an object", "check --registry")
    return doc
