"""Tests of imagekit/image/."""
