"""The published image a template or a pod is made of: its release record in the local release index, else (an image
CI published, its records merged elsewhere) what the image says of itself in its registry.

A reference the index does not record (``REGISTRY/REPO:TAG``, ``REGISTRY/REPO@sha256:...``) is read over the registry
API: the tag resolved to its manifest, an image index narrowed to the platform's image (the SBOM attestation beside
it is not an image), the image manifest and its config blob fetched by digest (`effects.registry` refuses bytes that
do not hash to the digest asked, and bounds what it reads), and the config's imagekit labels turned into a release
entry pinned to the image's digest (`clouds.label_record`). An answer that is not the registry API's is exit 3; an
image that is not imagekit's, or whose labels are not as imagekit writes them, exit 2 (error: and hint:).
"""

from __future__ import annotations

from pathlib import Path

from imagekit.clouds import label_record
from imagekit.effects.registry import RegistryClient, Remote, refuse_user_info, served_as, without_user_info
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.image import naming
from imagekit.model import AMD64
from imagekit.oci import image_index, media_types, release_record
from imagekit.services.ports import Registry
from imagekit.services.publishing.release_index import read_index
from imagekit.trust import untrusted, validate
from imagekit.trust.redact import redact_value

MAX_CONFIG = 4 << 20  # bytes of an image config read for its labels (imagekit's are a few KiB)
MAX_LAYERS = 1024  # layers an image manifest may list (imagekit's have a few dozen)


def is_image_reference(ref: str) -> bool:
    """Whether ``ref`` names an image in a registry (``REGISTRY/REPO:TAG``, ``REPO@sha256:...``), not a cell id or a
    tag of the release index alone."""
    if "/" not in ref:
        return False
    try:
        _, tag, digest = naming.split_reference(ref)
    except UsageError:
        return False
    return bool(tag or digest)


def release(index_path: Path, ref: str, platform: str | None = None, registry: Registry | None = None) -> dict:
    """The release ``ref`` names: the local index's (its immutable tag, alias or cell id, as `newest_release`
    finds it), else, for an image reference, the entry its own labels give (``source`` says where they were read)."""
    found = release_record.newest(read_index(index_path).get("images", {}), ref, platform)
    if found is not None:
        return found
    if not is_image_reference(ref):
        raise UsageError(
            f"{untrusted.printable(redact_value(ref), 120)} is not in {index_path}",  # never a password it carries
            "publish it with `imagekit build --push` first, or name the published image as REGISTRY/REPO:TAG "
            "(its labels say the rest)",
        )
    return from_registry(ref, platform, registry)


def _client(remote: Remote) -> RegistryClient:
    from imagekit.effects import credentials

    credential = credentials.for_registry(remote.registry)
    return RegistryClient(credential.username, credential.password, registries=[remote.registry])


def _document(body: bytes, what: str, remote: Remote) -> dict:
    try:
        doc = untrusted.load_json(body, what)
    except untrusted.UntrustedData as exc:
        raise EnvironmentFailure(
            f"registry {remote.registry}'s answer is refused: {exc}", "check the reference"
        ) from None
    if not isinstance(doc, dict):
        raise EnvironmentFailure(f"registry {remote.registry}'s {what} is not a JSON object", "check the reference")
    return doc


def _platform_image(registry: Registry, remote: Remote, ref: str, platform: str | None) -> tuple[str, bytes]:
    """The image manifest ``ref`` names for ``platform``: (its digest, its bytes). What is fetched by digest must
    hash to it, whichever Registry served it (the real client checks it too)."""
    shown = f"{remote.registry}/{remote.name}{'@' if untrusted.is_digest(ref) else ':'}{ref}"
    found = registry.manifest_raw(remote, ref)
    if found is None:
        raise UsageError(
            f"{shown}: the registry has no such image",
            "check the reference (`imagekit build --push` prints what it published)",
        )
    media, body, digest = found
    if untrusted.is_digest(ref):
        digest = ref
        served_as(remote.registry, "manifest", ref, body)
    if media in media_types.INDEXES:
        try:
            entries = image_index.entries_of(_document(body, "image index", remote))
        except untrusted.UntrustedData as exc:
            raise EnvironmentFailure(
                f"{shown} is not an image index imagekit can read: {exc}",
                "name the image by its digest",
            ) from None
        if not entries:
            raise UsageError(
                f"{shown} is an image index with no linux/amd64 or linux/arm64 image",
                label_record.NOT_IMAGEKIT_HINT,
            )
        mine = [e for e in entries if e.platform == (platform or AMD64)] or entries  # as the release index does
        digest = mine[0].digest
        found = registry.manifest_raw(remote, digest)  # by digest: the bytes must hash to it
        if found is None:
            raise EnvironmentFailure(
                f"registry {remote.registry} lists {digest} in {shown}'s index but does not serve it", "retry"
            )
        media, body = found[0], served_as(remote.registry, "manifest", digest, found[1])
    if media not in media_types.IMAGE_MANIFESTS:
        raise UsageError(
            f"{shown} is not an image (its manifest is {untrusted.printable(media, 80)})",
            label_record.NOT_IMAGEKIT_HINT,
        )
    return digest, body


def _config_and_size(doc: dict, where: str) -> tuple[str, int]:
    """The config's digest and the layers' compressed bytes of an image manifest (another party's JSON)."""
    config, layers = doc.get("config"), doc.get("layers")
    try:
        digest = untrusted.digest(config.get("digest") if isinstance(config, dict) else None, "its config digest")
    except untrusted.UntrustedData as exc:
        raise EnvironmentFailure(f"{where}'s manifest is refused: {exc}", "check the reference") from None
    if not isinstance(layers, list) or len(layers) > MAX_LAYERS:
        raise EnvironmentFailure(f"{where}'s manifest lists no layers, or too many", "check the reference")
    sizes = [x.get("size") if isinstance(x, dict) else None for x in layers]
    if any(
        isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= release_record.MAX_IMAGE_BYTES for s in sizes
    ):
        raise EnvironmentFailure(f"{where}'s manifest gives a layer no usable size", "check the reference")
    return digest, sum(sizes)  # type: ignore[arg-type]


def from_registry(ref: str, platform: str | None = None, registry: Registry | None = None) -> dict:
    """The release entry of the image ``ref`` names in its registry (of an index, ``platform``'s image when it has
    one, default linux/amd64, as the release index picks), made from its config's imagekit labels and pinned to the
    image manifest's digest."""
    refuse_user_info(ref, "the image reference")
    try:
        validate.image_ref(ref)
    except UsageError as exc:
        raise UsageError(without_user_info(exc.message), exc.hint) from None
    repository, tag, asked = naming.split_reference(ref)
    if not tag and not asked:
        raise UsageError(
            f"{ref} names no tag or digest", "name the image as REGISTRY/REPO:TAG or REGISTRY/REPO@sha256:..."
        )
    remote = Remote.parse(repository)
    client = registry if registry is not None else _client(remote)
    digest, body = _platform_image(client, remote, asked or tag, platform)
    where = f"{repository}@{digest}"
    config_digest, compressed = _config_and_size(_document(body, "image manifest", remote), where)
    served = served_as(remote.registry, "image config", config_digest, client.blob(remote, config_digest, MAX_CONFIG))
    config = _document(served, "image config", remote)
    return label_record.entry(repository, tag, digest, config, compressed)
