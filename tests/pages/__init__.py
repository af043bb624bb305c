"""Tests of imagekit/pages/."""
