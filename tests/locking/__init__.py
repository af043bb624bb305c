"""Tests of imagekit/locking/."""
