"""Tests of imagekit/services/."""
