"""Read /etc/imagekit/manifest.json out of an image: from the local engine, else from its registry."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import urllib.error
import urllib.request

from imagekit.effects.registry import RegistryClient, Remote
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.naming import split_reference

MANIFEST_PATH = "etc/imagekit/manifest.json"


def _from_tar(data: bytes) -> dict | None:
    try:
        raw = gzip.decompress(data)
    except OSError:
        raw = data
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for member in tar.getmembers():
            if member.name.lstrip("./") in (MANIFEST_PATH, "manifest.json"):  # layer path, or get_archive's
                fh = tar.extractfile(member)
                return json.loads(fh.read()) if fh else None
    return None


def from_engine(reference: str) -> dict | None:
    from imagekit.effects.docker import Engine

    engine = Engine()
    if not engine.image(reference):
        return None
    from docker.errors import DockerException

    try:
        container = engine.client.containers.create(reference, ["true"], entrypoint=[])
        try:
            stream, _ = container.get_archive("/" + MANIFEST_PATH)
            found = _from_tar(b"".join(stream))
            return found if isinstance(found, dict) else None
        finally:
            container.remove(force=True)
    except (DockerException, ValueError, tarfile.TarError):  # no manifest in it, or not readable: ask the registry
        return None


def from_registry(reference: str) -> dict:
    """The manifest file out of the image's top layers, read over the registry API (no engine needed)."""
    repo, tag, digest = split_reference(reference)
    remote = Remote.parse(repo)
    client = RegistryClient()
    info = client.manifest(remote, digest or tag or "latest")
    if info is None:
        raise UsageError(f"{reference}: not in the local engine nor in its registry", "pull or publish it first")
    req = urllib.request.Request(
        f"{remote.base}/manifests/{info.digest}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            layers = json.loads(resp.read())["layers"]
        for layer in reversed(layers[-4:]):
            with urllib.request.urlopen(f"{remote.base}/blobs/{layer['digest']}", timeout=120) as resp:
                found = _from_tar(resp.read())
            if isinstance(found, dict):
                return found
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError, tarfile.TarError) as exc:
        # unreachable, an error status, or an answer that is not an image manifest / layer
        raise EnvironmentFailure(
            f"cannot read {reference}'s manifest from its registry: {exc.__class__.__name__}: {exc}",
            "check the registry, or pass --expect FILE",
        ) from None
    raise UsageError(f"{reference} has no {MANIFEST_PATH}: not an imagekit image", "pass --expect FILE instead")


def read_manifest(reference: str) -> dict:
    """From the local engine when it has the image, else from its registry."""
    try:
        found = from_engine(reference)
        if found:
            return found
    except EnvironmentFailure:
        pass
    return from_registry(reference)
