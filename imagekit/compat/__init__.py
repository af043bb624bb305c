"""Compatibility knowledge: the curated facts and their sources, the rules, PyPI metadata and its refresh, and the
runtime contract a published image states."""
