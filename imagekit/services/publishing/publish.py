"""Publish: push only images whose self-test passed; an immutable tag never moves to other contents.

The release record publish writes is oci.release_record's (its file and the index: services.release_index); the
indexes its tags name are services.tag_indexes'; the push itself is services.blob_push's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from imagekit.effects.registry import Remote
from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.model import AMD64
from imagekit.oci import publish_formats
from imagekit.oci.layer_blobs import LayerFormat
from imagekit.oci.release_record import Published
from imagekit.services.builds.selftest_runner import SelfTestReport
from imagekit.services.ports import ContainerEngine, Registry
from imagekit.services.progress import Progress
from imagekit.services.publishing import blob_push
from imagekit.services.publishing.tag_indexes import attach_sbom, image_in_index, point_alias


def _same_contents(
    engine: ContainerEngine, registry: Registry, remote: Remote, config_digest: str | None, image_id: str
) -> bool:
    """Same layers and labels (a rebuild differing only in creation times), so the published image stands."""
    if not config_digest:
        return False
    remote_config = registry.blob_json(remote, config_digest)
    local = engine.image(image_id) or {}
    return remote_config.get("rootfs", {}).get("diff_ids") == local.get("RootFS", {}).get(
        "Layers"
    ) and remote_config.get("config", {}).get("Labels") == local.get("Config", {}).get("Labels")


def publish(
    engine: ContainerEngine,
    registry: Registry,
    *,
    image_id: str,
    repository: str,
    immutable_tag: str,
    alias_tag: str,
    report: SelfTestReport,
    log: Callable[[str], None] = lambda _: None,
    progress: Progress | None = None,
    platform: str = AMD64,
    gzip: LayerFormat | None = None,
    sbom_doc: dict | None = None,
    sign: Callable[[str], dict] | None = None,
    variants: Sequence[str] = (),
) -> Published:
    """Push the tested image, then name it by ``immutable_tag``: with ``sbom_doc``, an image index of the image and
    its SBOM attestation (as BuildKit stores them), else the image's manifest. A tag that exists already must hold
    the same image (an index's entry for ``platform``, or the manifest itself): it is never moved. ``sign`` (a
    digest -> what to record) signs what the tag names and the image itself, after the tag and before the alias:
    an alias never names an unsigned image when signing was asked for. ``variants`` (names of publish_formats): the
    same image in each of those layer formats under ``<tag>-<name>`` and ``<alias>-<name>`` too,
    for engines that pull it (zstd: Docker >= 23, containerd); never instead."""
    formats = [publish_formats.variant(n) for n in dict.fromkeys(variants)]
    if not report.passed:
        raise CheckFailed(
            f"refusing to publish {repository}:{immutable_tag}: its self-test failed "
            f"({', '.join(report.failed) or 'no report'})",
            "fix the image; only tested images are pushed",
        )
    remote = Remote.parse(repository)
    existing = registry.oci_manifest(remote, immutable_tag)
    tag_digest = existing.digest if existing is not None else None
    if existing is not None and existing.config_digest is None:  # an index: this platform's image in it
        existing = image_in_index(registry, remote, immutable_tag, platform)
    if (
        existing is not None
        and existing.config_digest != image_id
        and not _same_contents(engine, registry, remote, existing.config_digest, image_id)
    ):
        raise CheckFailed(
            f"{repository}:{immutable_tag} already exists with other contents (config {existing.config_digest}, "
            f"this build {image_id})",
            "immutable tags never move; change the lock (and so the tag) or delete it by hand",
        )
    engine.tag(image_id, repository, immutable_tag)
    attested: dict | None = None
    if existing is not None:
        digest, reused = existing.digest, True
        log(f"{repository}:{immutable_tag} already published as {digest}")
    else:
        log(f"pushing {repository}:{immutable_tag}")
        digest = blob_push.push_image(
            engine,
            registry,
            remote,
            image_id,
            None if sbom_doc is not None else immutable_tag,  # with an SBOM, the tag names the index made below
            gzip=gzip,
            progress=progress,
            label=alias_tag,
            log=log,
        )
        reused = False
        tag_digest = digest
        if sbom_doc is not None:
            tag_digest, attested = attach_sbom(registry, remote, immutable_tag, digest, platform, sbom_doc)
            log(
                f"{repository}:{immutable_tag} names an image index ({tag_digest}): the image and its SBOM "
                f"attestation ({attested['attestation']}, {attested['python']} Python distributions, "
                f"{attested['dpkg']} Debian packages)"
            )
    expected = existing.config_digest if existing is not None else image_id
    config_digest = _served_config(registry, remote, digest, expected)
    signature = _signed(sign, [tag_digest or digest, digest]) if sign is not None else None
    pushed = {
        f.name: _push_variant(engine, registry, remote, image_id, immutable_tag, alias_tag, f, progress, log)
        for f in formats
    }
    index_digest = point_alias(registry, remote, alias_tag, digest, platform, tagged=tag_digest)
    if index_digest:
        log(f"{repository}:{alias_tag} names an image index ({index_digest}) with this {platform} image")
    return Published(
        f"{repository}:{immutable_tag}",
        f"{repository}:{alias_tag}",
        digest,
        reused,
        config_digest,
        platform,
        index_digest,
        tag_digest,
        sbom=attested,
        signature=signature,
        variants=pushed,
    )


def _served_config(registry: Registry, remote: Remote, digest: str, expected: str | None) -> str | None:
    """The config the registry serves ``digest`` with, which must be ``expected`` (the image's) after the push."""
    check = registry.oci_manifest(remote, digest)
    if check is None or check.config_digest != expected:
        raise EnvironmentFailure(
            f"the registry does not serve {digest} with this image's config after the push", "retry the push"
        )
    return check.config_digest


def _signed(sign: Callable[[str], dict], digests: list[str]) -> dict:
    """Sign each digest once (what the tag names, and the image): the key's fingerprint and the signatures' tags."""
    made = [sign(d) for d in dict.fromkeys(digests)]
    return {"key": made[0]["key"], "tags": [m["tag"] for m in made]}


def _push_variant(
    engine: ContainerEngine,
    registry: Registry,
    remote: Remote,
    image_id: str,
    tag: str,
    alias: str,
    codec: LayerFormat,
    progress: Progress | None,
    log: Callable[[str], None],
) -> dict:
    """The image in another layer format under its own immutable tag (which never moves either), then its alias.
    A format that rewrites the layers' tars (``rewrites_tars``) names another config: the tag it finds holds the same
    image when this push, untagged, makes the same manifest."""
    variant, variant_alias = f"{tag}-{codec.name}", f"{alias}-{codec.name}"
    push = partial(blob_push.push_image, engine, registry, remote, image_id, gzip=codec, progress=progress, label=alias)
    existing = registry.oci_manifest(remote, variant)
    if (
        existing is not None
        and existing.config_digest != image_id
        and not (codec.rewrites_tars and push(None, log=log) == existing.digest)
    ):
        raise CheckFailed(
            f"{remote.registry}/{remote.name}:{variant} already exists with other contents",
            "immutable tags never move; change the lock (and so the tag) or delete it by hand",
        )
    digest = existing.digest if existing is not None else push(variant, log=log)
    registry.copy_tag(remote, digest, variant_alias)
    return {"tag": f"{remote.registry}/{remote.name}:{variant}", "digest": digest}


def layer_sizes(registry: Registry, remote: Remote, digest: str, config_digest: str | None) -> list[dict]:
    """Each layer of a published image, bottom first: blob digest, compressed bytes (what a pull downloads and a
    registry stores) and the step that made it (from the config's history, where `empty_layer` steps make none)."""
    layers = registry.oci_manifest_json(remote, digest).get("layers") or []
    steps: list[str] = []
    if config_digest:
        history = registry.blob_json(remote, config_digest).get("history") or []
        steps = [h.get("created_by", "") for h in history if isinstance(h, dict) and not h.get("empty_layer")]
    if len(steps) != len(layers):
        steps = [""] * len(layers)
    return [
        {"digest": layer.get("digest"), "compressed_bytes": layer.get("size"), "created_by": step[-160:]}
        for layer, step in zip(layers, steps, strict=True)
        if isinstance(layer, dict)
    ]
