"""OCI: media types, where a registry host ends, layer blobs and publish formats, image indexes, the release record."""
