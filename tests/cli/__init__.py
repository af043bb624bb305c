"""Tests of imagekit/cli/."""
