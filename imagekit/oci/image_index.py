"""Multi-platform image indexes: one tag naming an image per platform (what `docker pull` on an amd64 host and on a
Grace host each resolve to their own image). Pure: documents in, documents out; what a registry sends is checked.

A cell's alias tag (its id) names an index once the cell is published for more than one platform; each platform's
image keeps its own immutable tag and release record. Publishing one platform again replaces that platform's entry
and keeps the others, so building only the amd64 image later never drops the arm64 one from the tag.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from imagekit.model import DEBIAN_ARCH, PLATFORMS
from imagekit.oci.media_types import DOCKER_MANIFEST_LIST, IMAGE_MANIFESTS, INDEXES
from imagekit.trust import untrusted

MAX_ENTRIES = 16  # real indexes list a few platforms (and attestations); more is not an index imagekit wrote
_BY_ARCH = {arch: platform for platform, arch in DEBIAN_ARCH.items()}


@dataclass(frozen=True, order=True)
class Entry:
    """One platform's image in an index: its manifest's digest, size and media type."""

    platform: str  # linux/amd64, linux/arm64
    digest: str
    size: int
    media_type: str

    def to_json(self) -> dict:
        os_, arch = self.platform.split("/", 1)
        return {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
            "platform": {"architecture": arch, "os": os_},
        }


def platform_of_config(config: dict) -> str:
    """The platform an image config names (``architecture``, ``os``); one imagekit does not build raises."""
    arch, os_ = config.get("architecture"), config.get("os")
    platform = _BY_ARCH.get(arch) if os_ == "linux" and isinstance(arch, str) else None
    if platform is None:
        shown = f"{untrusted.printable(os_, 20)}/{untrusted.printable(arch, 20)}"
        raise untrusted.UntrustedData(f"the image config names platform {shown!r}, not one of {', '.join(PLATFORMS)}")
    return platform


def entries_of(doc: object) -> list[Entry]:
    """The platform images an index from a registry lists (attestations and unknown platforms left out); a
    document that is not an index of this shape raises ``UntrustedData``."""
    if not isinstance(doc, dict) or doc.get("mediaType", DOCKER_MANIFEST_LIST) not in INDEXES:
        raise untrusted.UntrustedData("the tag does not name an image index")
    manifests = doc.get("manifests")
    if not isinstance(manifests, list) or len(manifests) > MAX_ENTRIES:
        raise untrusted.UntrustedData(f"an image index lists 0 to {MAX_ENTRIES} manifests")
    out: dict[str, Entry] = {}
    for item in manifests:
        if not isinstance(item, dict) or not isinstance(item.get("platform"), dict):
            raise untrusted.UntrustedData("an image index entry has no platform")
        media, size = item.get("mediaType"), item.get("size")
        if (
            media not in IMAGE_MANIFESTS
            or isinstance(size, bool)
            or not isinstance(size, int)
            or not 0 < size < 1 << 22
        ):
            continue  # an attestation manifest, or something no engine pulls as an image
        try:
            platform = platform_of_config(item["platform"])
        except untrusted.UntrustedData:
            continue  # another platform (unknown/unknown attestations): not ours to keep or drop
        if platform in out:
            raise untrusted.UntrustedData(f"an image index lists {platform} twice")
        out[platform] = Entry(platform, untrusted.digest(item.get("digest"), "an index entry's digest"), size, media)
    return sorted(out.values())


def merged(existing: list[Entry], new: Entry) -> list[Entry]:
    """``existing`` with ``new``'s platform replaced by ``new`` (sorted by platform: the same set, the same bytes)."""
    return sorted([e for e in existing if e.platform != new.platform] + [new])


def document(entries: list[Entry]) -> bytes:
    """The index's bytes: a Docker manifest list (the children are Docker v2 manifests, what `docker push` writes;
    Docker 20.10 and containerd pull it), deterministic for the same entries."""
    if not entries:
        raise ValueError("an image index needs at least one image")
    doc = {"schemaVersion": 2, "mediaType": DOCKER_MANIFEST_LIST, "manifests": [e.to_json() for e in sorted(entries)]}
    return json.dumps(doc, indent=3).encode()
