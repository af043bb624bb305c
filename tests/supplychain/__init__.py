"""Tests of imagekit/supplychain/."""
