"""Tests of imagekit/oci/."""
