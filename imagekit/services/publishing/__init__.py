"""Publishing: the push, tags and their indexes, signatures, the release index and records, the vulnerability gate's
files, the release page."""
