"""Registry HTTP API v2: what a tag points at, read straight from the registry (Basic and Bearer auth).

Credentials are bound to their origin: they go to the registries the client was given them for (``registries``)
and to the token realm such a registry's challenge names; to any other registry the client speaks without them. A
redirect elsewhere (blobs served from a CDN) is followed without them (imagekit.effects.http). No URL is built from a
name or reference that is not of the distribution grammar, and what the registry answers is checked here
(imagekit.trust.untrusted), not by the callers.

Digests bind: whatever is fetched by digest (a manifest, a blob) must hash to that digest before anything reads it,
and a Docker-Content-Digest header must be the digest of the bytes served with it (by tag, that is what the tag
names). A registry that serves other bytes is refused like any other answer that is not the registry API's: exit 3
(EnvironmentFailure), naming the digest asked and the digest of what was served; no check runs on what it served.
No message shows a URL's user-info or the credentials, not even when the registry echoes them."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from imagekit.effects import http
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.oci import media_types
from imagekit.trust import registry_host, untrusted, urls, validate

MANIFEST_TYPES = ", ".join(media_types.ACCEPTED)
MAX_TOKEN = 16 << 10  # bytes of a bearer token (real ones are 1-4 KiB)
USER_VARIABLE, PASSWORD_VARIABLE = "IMAGEKIT_REGISTRY_USER", "IMAGEKIT_REGISTRY_PASSWORD"
STRIP_HINT = "strip the line ending: export {var}=$(tr -d '\\r\\n' < file)"
_USER_INFO = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://)?[^/@]*@(?!sha256:)")  # credentials before the host
_USER_INFO_IN_TEXT = re.compile(r"(?<![\w.+/-])((?:[A-Za-z][A-Za-z0-9+.-]*://)?)[^\s'\"@]+@(?!sha256:)")


def refuse_user_info(value: object, what: str) -> None:
    """A registry, repository or image reference carrying credentials (``user:password@host/...``) is refused
    without being shown: credentials come from `docker login` or the environment, never from a name."""
    if isinstance(value, str) and _USER_INFO.match(value):
        raise UsageError(
            f"{what} carries credentials (user-info before '@'); it is not shown here",
            f"name it without them; log in with `docker login HOST`, or set {USER_VARIABLE} and {PASSWORD_VARIABLE}",
        )


def without_user_info(text: str) -> str:
    """``text`` with the user-info of every reference or URL in it (``user:password@host/...``) as ``***@``."""
    return _USER_INFO_IN_TEXT.sub(lambda m: f"{m[1]}***@", text)


@dataclass(frozen=True)
class Remote:
    registry: str  # host[:port]
    name: str  # path inside the registry

    def __post_init__(self) -> None:
        """Both of the distribution grammar: they become a URL's host and path."""
        refuse_user_info(self.registry, "the registry")
        first = self.registry.partition("/")[0] if isinstance(self.registry, str) else ""
        named = isinstance(self.name, str) and isinstance(self.registry, str) and first == self.registry
        if not named or not registry_host.is_registry_host(first):
            raise UsageError(
                f"invalid registry {untrusted.printable(self.registry, 80)!r}: expected HOST[:PORT]",
                "name it as REGISTRY/NAME, e.g. ghcr.io/acme/train",
            )
        validate.repository(f"{self.registry}/{self.name}")

    @classmethod
    def parse(cls, repository: str) -> Remote:
        refuse_user_info(repository, "the repository")
        host, path = registry_host.split(repository)
        if host is not None:
            return cls(host, path)
        return cls(registry_host.HUB_API, path if "/" in path else f"library/{path}")

    @property
    def base(self) -> str:
        host = self.registry.split(":")[0]
        scheme = "http" if host in ("localhost", "127.0.0.1") or host.startswith("127.") else "https"
        return f"{scheme}://{self.registry}/v2/{self.name}"


def reference(value: object) -> str:
    """A tag (``[A-Za-z0-9_][A-Za-z0-9._-]{0,127}``) or a digest: the only references put into a URL."""
    if isinstance(value, str) and (validate.TAG.fullmatch(value) or untrusted.is_digest(value)):
        return value
    raise UsageError(
        f"{untrusted.printable(value, 80)!r} is not a tag or a digest",
        "a tag is up to 128 of [A-Za-z0-9_.-] (not starting with '.' or '-'); a digest is sha256:<64 hex digits>",
    )


def blob_digest(value: object) -> str:
    try:
        return untrusted.digest(value, "blob digest")
    except untrusted.UntrustedData as exc:
        raise UsageError(str(exc), "a blob is named by its digest, sha256:<64 hex digits>") from None


def _refused(registry: str, exc: untrusted.UntrustedData, hint: str = "check --registry") -> EnvironmentFailure:
    return EnvironmentFailure(f"registry {registry}'s answer is refused: {exc}", hint)


LIED_HINT = (
    "a digest names exactly one content: the registry (or a proxy or cache before it) is corrupt or lying, and "
    "nothing it served was used; check --registry, or publish the image again"
)


def served_as(registry: str, what: str, asked: str, body: bytes) -> bytes:
    """``body``, fetched by the digest ``asked``, if it hashes to it; else refused (exit 3) naming both digests."""
    served = "sha256:" + _sha256(body)
    if served != asked:
        raise EnvironmentFailure(
            f"registry {registry} served other bytes than {asked} (the {what} asked for by that digest): what it "
            f"served is {served}",
            LIED_HINT,
        )
    return body


@dataclass(frozen=True)
class OciManifest:
    """What a registry says of a tag or digest: its OCI (or Docker v2) manifest's digest and its config blob's. In
    imagekit "manifest" alone is the image's own /opt/imagekit/manifest.json (`buildplan.manifest`)."""

    digest: str
    config_digest: str | None


class RegistryClient:
    def __init__(
        self, username: str | None = None, password: str | None = None, registries: Iterable[str] = ()
    ) -> None:
        """``registries``: the hosts (``host[:port]``) the credentials were given for; none: they go nowhere."""
        self.username = username
        self.password = password
        self.registries = frozenset(r.lower() for r in registries)

    def bound_to(self, registry: str) -> bool:
        return self.username is not None and registry.lower() in self.registries

    def _basic(self, registry: str) -> str | None:
        if not self.bound_to(registry):
            return None
        user = _credential(self.username or "", USER_VARIABLE, user=True)
        password = _credential(self.password or "", PASSWORD_VARIABLE, user=False)
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        return f"Basic {token}"

    def _request(self, url: str, *args: Any, **kw: Any) -> tuple[int, dict, bytes]:
        status, answer, body, _ = self._request_final(url, *args, **kw)
        return status, answer, body

    def _request_final(
        self,
        url: str,
        method: str = "GET",
        auth: str | None = None,
        data: bytes | None = None,
        content_type: str | None = None,
        max_bytes: int = 64 << 20,
    ) -> tuple[int, dict, bytes, str]:
        headers = {"Accept": MANIFEST_TYPES}
        if auth:
            headers["Authorization"] = auth
        if content_type:
            headers["Content-Type"] = content_type
        try:
            status, answer, body, final = http.request_final(
                method, url, headers=headers, content=data, max_bytes=max_bytes
            )
        except EnvironmentFailure as exc:
            raise EnvironmentFailure(
                f"registry {urls.display(url.split('/v2/')[0])} is unreachable: {exc.message}",
                "start the registry, or check --registry",
            ) from None
        return status, dict(answer), body, final

    def _bearer(self, remote: Remote, challenge: str, own: bool = True) -> str | None:
        """A token for the challenge; the registry's credentials go to its realm only when the challenge is the
        registry's ``own`` (not one from a server a redirect led to)."""
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        if "realm" not in params:
            return None
        realm = urls.require_http(
            params["realm"], "the registry's token realm", EnvironmentFailure, "the registry's auth challenge is broken"
        )
        query = {k: v for k, v in params.items() if k in ("service", "scope")}
        status, _, body = self._request(
            str(httpx.URL(realm).copy_merge_params(query)),
            auth=self._basic(remote.registry) if own else None,
            max_bytes=1 << 20,
        )
        if status != 200:
            return None
        doc = _json(body, f"the token service {urls.display(realm)}")
        token = doc.get("token") or doc.get("access_token")
        what = f"the token service of registry {remote.registry}"
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN:
            raise EnvironmentFailure(f"{what} answered no usable token", "check the registry's auth service")
        try:
            untrusted.header_value(token, "its token")
        except untrusted.UntrustedData as exc:
            raise EnvironmentFailure(
                f"{what} answered a token that cannot be sent: {exc}", "check the registry"
            ) from None
        return f"Bearer {token}"

    def _authed(
        self,
        remote: Remote,
        url: str,
        method: str = "GET",
        data: bytes | None = None,
        content_type: str | None = None,
        max_bytes: int = 64 << 20,
    ) -> tuple[int, dict, bytes]:
        status, headers, body, _ = self._authed_as(remote, url, method, data, content_type, max_bytes)
        return status, headers, body

    def _authed_as(
        self,
        remote: Remote,
        url: str,
        method: str = "GET",
        data: bytes | None = None,
        content_type: str | None = None,
        max_bytes: int = 64 << 20,
    ) -> tuple[int, dict, bytes, str | None]:
        """Like ``_authed``, and the Authorization that got the answer (for a request that cannot be sent twice)."""
        auth = self._basic(remote.registry)
        status, headers, body, final = self._request_final(url, method, auth, data, content_type, max_bytes)
        if status == 401:
            challenge = {k.lower(): v for k, v in headers.items()}.get("www-authenticate", "")
            own = urls.origin(final) == urls.origin(url)  # a challenge from where a redirect led is not the registry's
            auth = self._bearer(remote, challenge, own) if challenge.lower().startswith("bearer") else None
            if auth is None:
                given = self.bound_to(remote.registry)
                raise EnvironmentFailure(
                    f"registry {remote.registry} refused the credentials (HTTP 401)"
                    if given
                    else f"registry {remote.registry} asks for credentials (HTTP 401); none are given for it",
                    f"run `docker login {remote.registry}`, or set {USER_VARIABLE} and {PASSWORD_VARIABLE}"
                    + ("" if given else " and name the registry (--registry) they are for"),
                )
            status, headers, body = self._request(url, method, auth, data, content_type, max_bytes)
        return status, headers, body, auth

    def _shown(self, answer: bytes) -> str:
        """A registry's answer as an error may show it: printable, and without these credentials (a registry or a
        proxy may echo the request's headers)."""
        text = untrusted.printable(answer, len(answer) + 1)  # whole, so no credential is cut where it would show
        if self.username is not None and self.password:
            basic = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            secrets = {self.password, " ".join(self.password.split()), basic} - {""}  # as printable shows them
            for secret in sorted(secrets, key=len, reverse=True):
                text = re.sub(re.escape(secret), "***", text, flags=re.I)
        return untrusted.printable(text)

    def check_access(self, remote: Remote) -> None:
        """Ask the registry's API root with these credentials (or none): a registry that refuses them, or asks for
        some when none are given, raises now, before a build that would end in a refused push."""
        root = remote.base.split("/v2/", 1)[0] + "/v2/"
        status, _, _ = self._authed(remote, root, max_bytes=1 << 20)
        if status in (401, 403):
            raise EnvironmentFailure(
                f"registry {remote.registry} refuses these credentials (HTTP {status})",
                f"check {USER_VARIABLE}/{PASSWORD_VARIABLE}, or run `docker login {remote.registry}` again",
            )

    def copy_tag(self, remote: Remote, digest: str, tag: str) -> None:
        """Point ``tag`` at the manifest ``digest`` (the same bytes, so the same digest)."""
        digest = untrusted_digest(digest)
        found = self.manifest_raw(remote, digest)
        if found is None:
            raise EnvironmentFailure(
                f"registry {remote.registry} answered HTTP 404 for {digest}", "publish the image again; no tag moved"
            )
        media, body, _ = found
        self.put_manifest(remote, tag, body, media)

    def _manifest(self, remote: Remote, ref: str, max_bytes: int = 64 << 20) -> tuple[dict, bytes, str] | None:
        """A manifest by tag or digest, bound to it: (headers, bytes, their digest), or None when missing. By digest
        the bytes must hash to it; a Docker-Content-Digest must be their digest (by tag, it is what the tag names)."""
        ref = reference(ref)
        status, headers, body = self._authed(remote, f"{remote.base}/manifests/{ref}", max_bytes=max_bytes)
        if status == 404:
            return None
        if status != 200:
            raise EnvironmentFailure(
                f"registry {remote.registry} answered HTTP {status} for {ref}", "check --registry and the reference"
            )
        if untrusted.is_digest(ref):
            served_as(remote.registry, "manifest", ref, body)
        digest = "sha256:" + _sha256(body)
        claimed = {k.lower(): v for k, v in headers.items()}.get("docker-content-digest")
        if claimed is not None:
            try:
                untrusted.digest(claimed, "its Docker-Content-Digest")
            except untrusted.UntrustedData as exc:
                hint = "the registry does not speak the registry API v2; check --registry"
                raise _refused(remote.registry, exc, hint) from None
            if claimed != digest:
                raise EnvironmentFailure(
                    f"registry {remote.registry} says {ref} is {claimed} (its Docker-Content-Digest), but served "
                    f"other bytes than {claimed}: what it served is {digest}",
                    LIED_HINT,
                )
        return headers, body, digest

    def manifest_raw(self, remote: Remote, ref: str) -> tuple[str, bytes, str] | None:
        """What a tag or digest names, as served: (media type, bytes, their digest: ``ref`` itself when a digest),
        or None when missing."""
        found = self._manifest(remote, ref, max_bytes=4 << 20)
        if found is None:
            return None
        headers, body, digest = found
        media = {k.lower(): v for k, v in headers.items()}.get("content-type") or _json(
            body, f"registry {remote.registry}"
        ).get("mediaType")
        try:
            media = untrusted.header_value(media if isinstance(media, str) else "", "its media type")
        except untrusted.UntrustedData as exc:
            raise _refused(remote.registry, exc) from None
        return media.split(";", 1)[0].strip(), body, digest

    def put_manifest(self, remote: Remote, tag: str, body: bytes, media: str) -> str:
        """Store ``body`` (a manifest or an image index) under ``tag``; returns its digest (of the bytes sent)."""
        tag = reference(tag)
        status, _, answer = self._authed(remote, f"{remote.base}/manifests/{tag}", "PUT", body, media)
        if status not in (200, 201):
            raise EnvironmentFailure(
                f"registry {remote.registry} refused tagging {tag} (HTTP {status}): {self._shown(answer)!r}",
                "retry; check push rights (an index's images must be in the same repository)",
            )
        return "sha256:" + _sha256(body)

    def blob_size(self, remote: Remote, digest: str) -> int | None:
        """The size of the blob the registry holds under ``digest``, or None when it has none."""
        digest = blob_digest(digest)
        status, headers, _ = self._authed(remote, f"{remote.base}/blobs/{digest}", "HEAD", max_bytes=0)
        if status == 404:
            return None
        if status != 200:
            raise EnvironmentFailure(f"registry {remote.registry} answered HTTP {status} for blob {digest}")
        length = {k.lower(): v for k, v in headers.items()}.get("content-length", "")
        if not length.isascii() or not length.isdigit() or len(length) > 15:
            return None  # no usable size: treat as missing, so the blob is sent again
        return int(length)

    def upload_blob(self, remote: Remote, digest: str, size: int, source: Path | bytes) -> None:
        """Upload a blob in one request (the API's monolithic upload: POST, then PUT of the bytes with their digest),
        from a file or bytes. The upload URL the registry answers must be on the registry's own origin: the bytes and
        the credentials go nowhere else, and the PUT follows no redirect."""
        digest = blob_digest(digest)
        upload = self.start_upload(remote)
        sent = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        body = source if isinstance(source, bytes) else _FileBody(source)
        self._complete(upload, digest, sent, body)

    def start_upload(self, remote: Remote) -> Upload:
        """Open a blob upload (POST): where its bytes go, checked to be on the registry's own origin."""
        start = f"{remote.base}/blobs/uploads/"
        status, headers, answer, auth = self._authed_as(remote, start, "POST", b"", max_bytes=1 << 20)
        if status != 202:
            raise EnvironmentFailure(
                f"registry {remote.registry} refused an upload (HTTP {status}): {self._shown(answer)[:200]!r}",
                "check push rights to the repository",
            )
        return Upload(remote, _upload_location(remote, start, headers), auth)

    def stream_upload(self, upload: Upload, chunks: Iterable[bytes]) -> Upload:
        """Send the bytes of an open upload as they come (one PATCH, chunked: their size and digest are not known
        yet); the upload's next location. Not retried: ``chunks`` is read once."""
        sent = {"Content-Type": "application/octet-stream", **({"Authorization": upload.auth} if upload.auth else {})}
        status, headers, answer, _ = http.request_final("PATCH", upload.url, headers=sent, content=chunks,
                                                        max_bytes=1 << 20, redirects=False)  # fmt: skip
        if status != 202:
            raise EnvironmentFailure(
                f"registry {upload.remote.registry} refused a streamed upload (HTTP {status}): "
                f"{self._shown(answer)[:200]!r}",
                "imagekit uploads each layer from a file instead",
            )
        return Upload(upload.remote, _upload_location(upload.remote, upload.url, headers), upload.auth)

    def finish_upload(self, upload: Upload, digest: str) -> None:
        """Close a streamed upload as the blob ``digest`` (the registry checks the bytes it got against it)."""
        self._complete(upload, blob_digest(digest), {"Content-Length": "0"}, b"")

    def cancel_upload(self, upload: Upload) -> None:
        """Drop an open upload (its bytes are not wanted: the registry holds the blob already, or they were not the
        layer's); a registry that cannot is left to expire it."""
        sent = {"Authorization": upload.auth} if upload.auth else {}
        try:
            http.request_final("DELETE", upload.url, headers=sent, max_bytes=1 << 20, redirects=False)
        except EnvironmentFailure:
            pass

    def _complete(self, upload: Upload, digest: str, sent: dict[str, str], body: bytes | Iterable[bytes]) -> None:
        url = str(httpx.URL(upload.url).copy_merge_params({"digest": digest}))
        if upload.auth:
            sent["Authorization"] = upload.auth
        status, _, answer, _ = http.request_final("PUT", url, headers=sent, content=body, max_bytes=1 << 20,
                                                  redirects=False)  # fmt: skip
        if status != 201:
            raise EnvironmentFailure(
                f"registry {upload.remote.registry} refused blob {digest} (HTTP {status}): "
                f"{self._shown(answer)[:200]!r}",
                "retry the publish; nothing was tagged",
            )

    def holds_tags(self, remote: Remote) -> bool | None:
        """Whether the repository has a tag (one is asked for); None when the registry does not say (an error, an
        answer that is not the API's). A repository without one holds no image a layer could be shared with."""
        try:
            status, _, body = self._authed(remote, f"{remote.base}/tags/list?n=1", max_bytes=1 << 20)
        except EnvironmentFailure:
            return None
        if status == 404:
            return False
        if status != 200:
            return None
        try:
            tags = untrusted.load_json(body, "the registry's tag list").get("tags")
        except (untrusted.UntrustedData, AttributeError):
            return None
        return bool(tags) if tags is None or isinstance(tags, list) else None

    def blob_json(self, remote: Remote, digest: str) -> dict:
        """A JSON blob (an image config) by digest."""
        digest = blob_digest(digest)
        status, _, body = self._authed(remote, f"{remote.base}/blobs/{digest}")
        if status != 200:
            raise EnvironmentFailure(
                f"registry {remote.registry} answered HTTP {status} for blob {digest}", "check --registry"
            )
        return _json(served_as(remote.registry, "blob", digest, body), f"registry {remote.registry} (blob {digest})")

    def blob(self, remote: Remote, digest: str, max_bytes: int) -> bytes:
        """A blob's bytes by digest (refused unless they hash to it), refused when larger than ``max_bytes``."""
        digest = blob_digest(digest)
        status, _, body = self._authed(remote, f"{remote.base}/blobs/{digest}", max_bytes=max_bytes)
        if status != 200:
            raise EnvironmentFailure(
                f"registry {remote.registry} answered HTTP {status} for blob {digest}", "check --registry"
            )
        return served_as(remote.registry, "blob", digest, body)

    def oci_manifest_json(self, remote: Remote, ref: str) -> dict:
        """The manifest document itself (layers, config), bound to ``ref`` (``_manifest``)."""
        found = self._manifest(remote, ref)
        if found is None:
            shown = reference(ref)
            raise EnvironmentFailure(
                f"registry {remote.registry} answered HTTP 404 for {shown}", "check --registry and the reference"
            )
        return _json(found[1], f"registry {remote.registry}")

    def oci_manifest(self, remote: Remote, ref: str) -> OciManifest | None:
        """The manifest a tag or digest names, or None when the registry does not have it. Its digest is the sha256
        of the bytes served (``ref`` itself when a digest; a Docker-Content-Digest must agree: ``_manifest``)."""
        found = self._manifest(remote, ref)
        if found is None:
            return None
        _, body, digest = found
        doc = _json(body, f"registry {remote.registry}")
        config = doc.get("config", {}).get("digest") if isinstance(doc.get("config"), dict) else None
        try:
            if config is not None:
                untrusted.digest(config, "a config digest")
        except untrusted.UntrustedData as exc:
            hint = "the registry does not speak the registry API v2; check --registry"
            raise _refused(remote.registry, exc, hint) from None
        return OciManifest(digest, config)


@dataclass(frozen=True)
class Upload:
    """A blob upload the registry opened: where its bytes go next, and the Authorization that opened it."""

    remote: Remote
    url: str
    auth: str | None


def _upload_location(remote: Remote, sent_to: str, headers: Any) -> str:
    """The upload location a registry answered, on the registry's own origin (the bytes and the credentials go
    nowhere else)."""
    location = {k.lower(): v for k, v in dict(headers).items()}.get("location", "")
    try:
        untrusted.header_value(location, "its upload location")
        target = httpx.URL(sent_to).join(location)
        elsewhere = urls.origin(str(target)) != urls.origin(sent_to)
    except (untrusted.UntrustedData, httpx.InvalidURL, urls.InvalidURL) as exc:
        raise _refused(remote.registry, untrusted.UntrustedData(f"no usable upload location: {exc}")) from None
    if elsewhere:
        raise EnvironmentFailure(
            f"registry {remote.registry} sent the upload to another origin ({urls.display(str(target))})",
            "imagekit uploads only to the registry itself; check --registry",
        )
    return str(target)


class _FileBody:
    """A file's bytes as a request body that can be sent again (a retried PUT reads the file from the start)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __iter__(self) -> Iterator[bytes]:
        with open(self.path, "rb") as fh:
            while data := fh.read(1 << 20):
                yield data


def untrusted_digest(value: object) -> str:
    try:
        return untrusted.digest(value, "manifest digest")
    except untrusted.UntrustedData as exc:
        raise UsageError(str(exc), "a manifest is named by its digest, sha256:<64 hex digits>") from None


def _sha256(body: bytes) -> str:
    import hashlib

    return hashlib.sha256(body).hexdigest()


def _credential(value: str, variable: str, *, user: bool) -> str:
    """A user name or password as Basic auth carries it (RFC 7617): no control characters (a line ending read from
    a file), no ':' in the user name. The error names the variable, never the value."""
    bad = next((c for c in value if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F), None)
    if bad is not None:
        raise UsageError(
            f"{variable} holds {untrusted.char_name(bad)}, which no registry accepts",
            STRIP_HINT.format(var=variable),
        )
    if user and ":" in value:
        raise UsageError(f"{variable} holds a ':', which Basic auth cannot carry in a user name", "check the name")
    return value


def _json(body: bytes, what: str) -> dict[str, Any]:
    doc = http.parse_json(body, what, "check --registry: it does not speak the registry API v2")
    if not isinstance(doc, dict):
        raise EnvironmentFailure(f"{what} answered JSON that is not an object", "check --registry")
    return doc


def anonymous_refusal(remote: Remote, ref: str) -> str | None:
    """Why a client with no credentials (a pod that has no registry auth) cannot read ``ref``'s manifest, or None
    when it can. A registry that cannot be reached from here raises (EnvironmentFailure)."""
    ref = reference(ref)
    try:
        status, _, _ = RegistryClient()._authed(remote, f"{remote.base}/manifests/{ref}", max_bytes=4 << 20)
    except EnvironmentFailure as exc:
        if "asks for credentials" in exc.message:
            return "it asks for credentials (HTTP 401)"
        raise
    if status in (401, 403):
        return f"it refuses a pull without credentials (HTTP {status})"
    if status == 404:
        return "a client without credentials does not find it (HTTP 404: a private repository, or not pushed)"
    return None
