"""Tests of imagekit/effects/."""
