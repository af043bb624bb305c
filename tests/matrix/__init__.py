"""Tests of imagekit/matrix/."""
