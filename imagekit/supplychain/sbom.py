"""An image's SBOM from what is known, not from a scan: every Python distribution of its lock (version, hashes,
index, layer) and every Debian package its dpkg database lists, as an SPDX 2.3 JSON document; and the pieces that
publish it as BuildKit stores SBOM attestations (moby/buildkit docs/attestations/attestation-storage.md): an in-toto
statement (predicateType https://spdx.dev/Document) whose subject is the image manifest, in an attestation manifest
that the image index lists with platform unknown/unknown. Pure: deterministic bytes for the same inputs.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from imagekit.image import layering as layers
from imagekit.locking.lockfile import Lock
from imagekit.oci.media_types import (
    ATTESTATION_MANIFEST,
    IN_TOTO,
    IN_TOTO_PREDICATE,
    OCI_CONFIG,
    OCI_INDEX,
    OCI_MANIFEST,
    REFERENCE_DIGEST,
    REFERENCE_TYPE,
)
from imagekit.supplychain.dpkg_status import DebPackage

PREDICATE_TYPE = "https://spdx.dev/Document"
STATEMENT_TYPE = "https://in-toto.io/Statement/v0.1"
PYTHON_PREFIX, DEB_PREFIX = "SPDXRef-Python-", "SPDXRef-Deb-"


@dataclass(frozen=True)
class ImageFacts:
    """What names the image the document describes."""

    cell: str
    repository: str  # registry/name
    tag: str
    image_id: str  # sha256:<hex> of its config: the image, whatever compression a registry gets
    platform: str  # linux/amd64
    base: str  # what its FROM named
    distro: str  # os-release's ID-VERSION_ID, e.g. debian-12 (purl's distro qualifier)
    created: int  # SOURCE_DATE_EPOCH
    tool: str  # imagekit-<version>


def _spdx_id(prefix: str, *parts: str) -> str:
    return prefix + "-".join(re.sub(r"[^A-Za-z0-9.]+", "-", p) for p in parts)


def _purl_version(version: str) -> str:
    return quote(version, safe=":.-_~")


def python_purl(name: str, version: str) -> str:
    return f"pkg:pypi/{name.lower().replace('_', '-')}@{_purl_version(version)}"


def deb_purl(pkg: DebPackage, distro: str) -> str:
    vendor = distro.split("-", 1)[0] or "debian"
    upstream = f"&upstream={quote(pkg.source, safe='')}" if pkg.source != pkg.name else ""
    return (
        f"pkg:deb/{vendor}/{quote(pkg.name, safe='.+-')}@{_purl_version(pkg.version)}"
        f"?arch={quote(pkg.architecture, safe='')}{upstream}&distro={quote(distro, safe='.-')}"
    )


def _rfc3339(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def document(image: ImageFacts, lock: Lock, debs: list[DebPackage], layering: layers.Layering | None = None) -> dict:
    """The SPDX 2.3 document: the image, the Python distributions by layer, the Debian packages; each with a purl.
    ``layering``: the plan's (the build's layers as they were made, the CUDA compiler's own among them); None: the
    lock's default split (an image read back, whose plan is not at hand)."""
    index = (lock.meta.get("index") or "https://pypi.org/simple").rstrip("/")
    image_ref = "SPDXRef-Image"
    packages: list[dict] = [
        {
            "SPDXID": image_ref,
            "name": image.repository,
            "versionInfo": image.tag,
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False,
            "primaryPackagePurpose": "CONTAINER",
            "checksums": [{"algorithm": "SHA256", "checksumValue": image.image_id.removeprefix("sha256:")}],
            "comment": f"imagekit cell {image.cell} ({image.platform}) on {image.base}; the checksum is the "
            "image's config digest (its ID)",
        }
    ]
    layering = layering if layering is not None else layers.split(lock)
    for layer in layering.layers:
        for entry in layer.entries:
            hashes = [h.removeprefix("sha256:") for h in entry.hashes]
            package = {
                "SPDXID": _spdx_id(PYTHON_PREFIX, entry.name),
                "name": entry.name,
                "versionInfo": entry.version,
                "downloadLocation": entry.url or f"{index}/{entry.name}/",
                "filesAnalyzed": False,
                "primaryPackagePurpose": "LIBRARY",
                "externalRefs": [
                    {
                        "referenceCategory": "PACKAGE-MANAGER",
                        "referenceType": "purl",
                        "referenceLocator": python_purl(entry.name, entry.version),
                    }
                ],
                "comment": f"layer {layer.name} ({layer.target}); the lock's sha256 of its files: {', '.join(hashes)}",
            }
            if len(hashes) == 1:
                package["checksums"] = [{"algorithm": "SHA256", "checksumValue": hashes[0]}]
            packages.append(package)
    for pkg in debs:
        packages.append(
            {
                "SPDXID": _spdx_id(DEB_PREFIX, pkg.name, pkg.architecture),
                "name": pkg.name,
                "versionInfo": pkg.version,
                "downloadLocation": "NOASSERTION",
                "filesAnalyzed": False,
                "primaryPackagePurpose": "OPERATING-SYSTEM" if pkg.name == "base-files" else "LIBRARY",
                "sourceInfo": f"built package from: {pkg.source} {pkg.source_version}",
                "externalRefs": [
                    {
                        "referenceCategory": "PACKAGE-MANAGER",
                        "referenceType": "purl",
                        "referenceLocator": deb_purl(pkg, image.distro),
                    }
                ],
            }
        )
    relationships = [
        {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": image_ref}
    ]
    relationships += [
        {"spdxElementId": image_ref, "relationshipType": "CONTAINS", "relatedSpdxElement": p["SPDXID"]}
        for p in packages[1:]
    ]
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{image.repository}:{image.tag}",
        "documentNamespace": f"https://imagekit.invalid/spdx/{image.cell}/{image.image_id.removeprefix('sha256:')}",
        "creationInfo": {"created": _rfc3339(image.created), "creators": [f"Tool: {image.tool}"]},
        "documentDescribes": [image_ref],
        "packages": packages,
        "relationships": relationships,
    }


def counts(doc: dict) -> dict[str, int]:
    """How many Python distributions and Debian packages a document lists."""
    ids = [p.get("SPDXID", "") for p in doc.get("packages", []) if isinstance(p, dict)]
    return {"python": sum(i.startswith(PYTHON_PREFIX) for i in ids), "dpkg": sum(i.startswith(DEB_PREFIX) for i in ids)}


def canonical(doc: object) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def statement(doc: dict, subject: str, manifest_digest: str) -> bytes:
    """The in-toto statement: the SPDX document about the image manifest ``manifest_digest``."""
    body = {
        "_type": STATEMENT_TYPE,
        "predicateType": PREDICATE_TYPE,
        "subject": [{"name": subject, "digest": {"sha256": manifest_digest.removeprefix("sha256:")}}],
        "predicate": doc,
    }
    return canonical(body)


@dataclass(frozen=True)
class Attestation:
    """The blobs and manifest of one image's SBOM attestation."""

    statement: bytes
    config: bytes
    manifest: bytes

    @property
    def manifest_digest(self) -> str:
        return digest(self.manifest)


def attestation(statement_bytes: bytes) -> Attestation:
    """The attestation manifest holding ``statement_bytes`` as its one layer, with the config BuildKit writes."""
    statement_digest = digest(statement_bytes)
    config = canonical(
        {
            "architecture": "unknown",
            "os": "unknown",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [statement_digest]},
        }
    )
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": digest(config), "size": len(config)},
            "layers": [
                {
                    "mediaType": IN_TOTO,
                    "digest": statement_digest,
                    "size": len(statement_bytes),
                    "annotations": {IN_TOTO_PREDICATE: PREDICATE_TYPE},
                }
            ],
        }
    )
    return Attestation(statement_bytes, config, manifest)


def index(image_media_type: str, image_digest: str, image_size: int, platform: str, att: Attestation) -> bytes:
    """The image index a tag names: the runnable image for ``platform``, then its attestation (unknown/unknown)."""
    os_name, _, arch = platform.partition("/")
    arch, _, variant = arch.partition("/")
    image_platform = {"architecture": arch, "os": os_name, **({"variant": variant} if variant else {})}
    return canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {"mediaType": image_media_type, "digest": image_digest, "size": image_size, "platform": image_platform},
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": att.manifest_digest,
                    "size": len(att.manifest),
                    "annotations": {REFERENCE_DIGEST: image_digest, REFERENCE_TYPE: ATTESTATION_MANIFEST},
                    "platform": {"architecture": "unknown", "os": "unknown"},
                },
            ],
        }
    )


_OS_FIELD = re.compile(r'^(ID|VERSION_ID)="?([a-z0-9._-]{1,32})"?$', re.M)


def distro(os_release: str) -> str:
    """os-release's ``ID-VERSION_ID`` (``debian-12``, ``ubuntu-24.04``), or ``unknown``."""
    fields = dict(_OS_FIELD.findall(os_release[:8192]))
    if "ID" not in fields:
        return "unknown"
    return fields["ID"] + (f"-{fields['VERSION_ID']}" if "VERSION_ID" in fields else "")
