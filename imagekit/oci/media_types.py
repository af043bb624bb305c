"""Every OCI and Docker media type, and every annotation key, imagekit writes or reads: one table, imported from
here by every module that names one (a test keeps the literals out of the others). Pure."""

from __future__ import annotations

# Docker's image manifest schema 2: what `docker push` writes, and what Docker 20.10 pulls.
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"  # the one compressed layer type it has

# The OCI image specification: a manifest whose layers Docker's schema has no type for (zstd) is one of these.
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"  # Docker >= 23 and containerd pull it

# The payloads of the SBOM attestation and of a cosign signature.
IN_TOTO = "application/vnd.in-toto+json"
SIMPLESIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"

IMAGE_MANIFESTS = (DOCKER_MANIFEST, OCI_MANIFEST)  # what names one image
INDEXES = (DOCKER_MANIFEST_LIST, OCI_INDEX)  # what names several (one per platform, an image and its attestation)
ACCEPTED = (DOCKER_MANIFEST, OCI_MANIFEST, DOCKER_MANIFEST_LIST, OCI_INDEX)  # a registry client's Accept, in order

# Annotation keys (and the one value imagekit writes) of an attestation manifest in an image index, as BuildKit
# stores them (moby/buildkit docs/attestations/attestation-storage.md), of its in-toto layer, and of a cosign
# signature layer (sigstore/cosign specs/SIGNATURE_SPEC.md).
REFERENCE_TYPE = "vnd.docker.reference.type"
REFERENCE_DIGEST = "vnd.docker.reference.digest"
ATTESTATION_MANIFEST = "attestation-manifest"  # REFERENCE_TYPE's value
IN_TOTO_PREDICATE = "in-toto.io/predicate-type"
COSIGN_SIGNATURE = "dev.cosignproject.cosign/signature"
