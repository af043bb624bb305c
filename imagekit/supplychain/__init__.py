"""What an image is made of and who vouches for it: SBOM, cosign signatures, the vulnerability gate, dpkg's data."""
