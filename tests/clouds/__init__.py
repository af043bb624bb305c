"""Tests of imagekit/clouds/."""
