"""OCI: media types, layer blobs, image indexes, the release record."""
