"""Tests of imagekit/trust/."""
