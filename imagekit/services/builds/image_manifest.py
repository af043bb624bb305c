"""Read an image's manifest (/opt/imagekit/manifest.json; /etc/imagekit/manifest.json links to it, and was the file
itself in earlier images): from the local engine, else from its registry."""

from __future__ import annotations

import gzip
import io
import tarfile

from imagekit.effects.registry import RegistryClient, Remote
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.image.naming import split_reference
from imagekit.trust import untrusted

MANIFEST_PATHS = ("opt/imagekit/manifest.json", "etc/imagekit/manifest.json")  # now, and in earlier images
MAX_LAYER = 256 << 20
MAX_MANIFEST = 16 << 20


def _from_tar(data: bytes) -> dict | None:
    try:
        raw = gzip.decompress(data)
    except OSError:
        raw = data
    try:
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            for member in tar.getmembers():
                # a layer's path, or get_archive's (the file's name alone); a link is not the manifest
                if member.isfile() and member.name.lstrip("./") in (*MANIFEST_PATHS, "manifest.json"):
                    fh = tar.extractfile(member)
                    found = fh.read(MAX_MANIFEST + 1) if fh else None
                    return untrusted.load_json(found, "the manifest", max_bytes=MAX_MANIFEST) if found else None
    except (tarfile.TarError, ValueError) as exc:
        raise EnvironmentFailure(
            f"an image layer is not a readable tar with a JSON manifest: {exc}",
            "the image was not built by imagekit, or its manifest is damaged: build it again",
        ) from None
    return None


def from_engine(reference: str) -> dict | None:
    from imagekit.effects.docker import Engine

    engine = Engine()
    if not engine.image(reference):
        return None
    for path in MANIFEST_PATHS:
        archive = engine.read_file(reference, "/" + path)
        if archive is None:
            continue
        found = _from_tar(archive)
        if isinstance(found, dict):
            return found
    return None


def from_registry(reference: str) -> dict:
    """The manifest file out of the image's top layers, read over the registry API (no engine needed)."""
    repo, tag, digest = split_reference(reference)
    remote = Remote.parse(repo)
    client = RegistryClient()
    info = client.oci_manifest(remote, digest or tag or "latest")
    if info is None:
        raise UsageError(f"{reference}: not in the local engine nor in its registry", "pull or publish it first")
    try:
        layers = client.oci_manifest_json(remote, info.digest or digest or tag or "latest").get("layers")
        if not isinstance(layers, list):
            raise UsageError(f"{reference} is a multi-platform index or not an image", "pass --expect FILE instead")
        for layer in reversed(layers[-4:]):
            if not isinstance(layer, dict) or not isinstance(layer.get("digest"), str):
                continue
            if isinstance(layer.get("size"), int) and layer["size"] > MAX_LAYER:
                continue  # the manifest sits in a small top layer; a big one is torch or CUDA
            found = _from_tar(client.blob(remote, layer["digest"], MAX_LAYER))
            if isinstance(found, dict):
                return found
    except (ValueError, KeyError, TypeError, AttributeError, tarfile.TarError) as exc:
        # an answer that is not an image manifest or layer
        raise EnvironmentFailure(
            f"cannot read {reference}'s manifest from its registry: {exc.__class__.__name__}: {exc}",
            "check the registry, or pass --expect FILE",
        ) from None
    raise UsageError(f"{reference} has no /{MANIFEST_PATHS[0]}: not an imagekit image", "pass --expect FILE instead")


def read_manifest(reference: str) -> dict:
    """From the local engine when it has the image, else from its registry."""
    try:
        found = from_engine(reference)
        if found:
            return found
    except EnvironmentFailure:
        pass
    return from_registry(reference)
