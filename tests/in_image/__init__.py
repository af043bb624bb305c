"""Tests of imagekit/in_image/."""
