"""Tests of imagekit/compat/."""
