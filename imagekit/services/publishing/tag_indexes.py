"""The image indexes publish writes: the immutable tag's (the image and its SBOM attestation, as BuildKit stores
them) and the alias's (one image per platform). What a registry serves back is checked before it is extended."""

from __future__ import annotations

from urllib.parse import quote

from imagekit.effects.registry import OciManifest, Remote
from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.model import AMD64
from imagekit.oci import image_index, media_types
from imagekit.services.ports import Registry
from imagekit.supplychain import sbom
from imagekit.trust import untrusted


def image_in_index(registry: Registry, remote: Remote, tag: str, platform: str) -> OciManifest | None:
    """The ``platform`` image of the index ``tag`` names (an image and its attestation, as `publish` writes)."""
    raw = registry.manifest_raw(remote, tag)
    try:
        if raw is None or raw[0] not in media_types.INDEXES:
            raise untrusted.UntrustedData("the tag changed while it was read")
        entries = image_index.entries_of(untrusted.load_json(raw[1], "the tag's image index"))
    except untrusted.UntrustedData as exc:
        raise EnvironmentFailure(
            f"{remote.registry}/{remote.name}:{tag} is neither an image nor an index imagekit can read: {exc}",
            "immutable tags never move; delete it by hand if it is not a published image",
        ) from None
    mine = [e for e in entries if e.platform == platform]
    if not mine:
        raise CheckFailed(
            f"{remote.registry}/{remote.name}:{tag} already exists without a {platform} image",
            "immutable tags never move; change the lock (and so the tag) or delete it by hand",
        )
    return registry.oci_manifest(remote, mine[0].digest)


def attach_sbom(
    registry: Registry, remote: Remote, tag: str, digest: str, platform: str, doc: dict
) -> tuple[str, dict]:
    """Upload the SBOM attestation of the image ``digest`` and name both by ``tag`` in one image index; returns the
    index's digest and what the release records of the attestation."""
    raw = registry.manifest_raw(remote, digest)
    if raw is None or raw[0] not in media_types.IMAGE_MANIFESTS:
        raise EnvironmentFailure(f"the registry does not serve {digest} as an image manifest", "retry the push")
    subject = f"pkg:docker/{remote.registry}/{remote.name}@{tag}?platform={quote(platform, safe='')}"
    att = sbom.attestation(sbom.statement(doc, subject, digest))
    for blob in (att.statement, att.config):
        if registry.blob_size(remote, sbom.digest(blob)) != len(blob):
            registry.upload_blob(remote, sbom.digest(blob), len(blob), blob)
    attestation = registry.put_manifest(remote, att.manifest_digest, att.manifest, media_types.OCI_MANIFEST)
    body = sbom.index(raw[0], digest, len(raw[1]), platform, att)
    tag_digest = registry.put_manifest(remote, tag, body, media_types.OCI_INDEX)
    recorded = {
        "attestation": attestation,
        "statement": sbom.digest(att.statement),
        "document": sbom.digest(sbom.canonical(doc)),
        **sbom.counts(doc),
    }
    return tag_digest, recorded


def point_alias(
    registry: Registry, remote: Remote, alias_tag: str, digest: str, platform: str, tagged: str | None = None
) -> str | None:
    """Point the cell's alias at the image ``digest`` just published for ``platform``: what its immutable tag names
    (``tagged``: the image with its SBOM attestation, or the manifest itself) while the cell has only a linux/amd64
    image, else an image index of every platform's image, this one replacing its platform's earlier entry (the
    attestations stay with each platform's immutable tag). Returns that index's digest, or None."""
    current = registry.manifest_raw(remote, alias_tag)
    others: list[image_index.Entry] = []
    try:
        if current is not None and current[0] in media_types.INDEXES:
            others = image_index.entries_of(untrusted.load_json(current[1], "the alias's image index"))
        elif current is not None and current[0] in media_types.IMAGE_MANIFESTS:
            doc = untrusted.load_json(current[1], "the alias's manifest")
            config = doc.get("config", {}).get("digest") if isinstance(doc, dict) else None
            earlier = image_index.platform_of_config(registry.blob_json(remote, untrusted.digest(config)))
            others = [image_index.Entry(earlier, current[2], len(current[1]), current[0])]
    except untrusted.UntrustedData as exc:
        raise EnvironmentFailure(
            f"{remote.registry}/{remote.name}:{alias_tag} is not an image or index imagekit can extend: {exc}",
            "delete the tag by hand (immutable tags keep every image) and publish again",
        ) from None
    if platform == AMD64 and all(e.platform == AMD64 for e in others):
        registry.copy_tag(remote, tagged or digest, alias_tag)  # the alias names exactly what the tag names
        return None
    mine = registry.manifest_raw(remote, digest)
    if mine is None or mine[0] not in media_types.IMAGE_MANIFESTS:
        raise EnvironmentFailure(f"the registry does not serve {digest} as an image manifest", "retry the push")
    entries = image_index.merged(others, image_index.Entry(platform, digest, len(mine[1]), mine[0]))
    return registry.put_manifest(remote, alias_tag, image_index.document(entries), media_types.DOCKER_MANIFEST_LIST)
