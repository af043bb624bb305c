"""Property-test sizes: the full counts in `make test` (what CI runs); a fifth in `make test-fast`, which sets
IMAGEKIT_FAST_TIER=1 (the same derandomized examples first, so a failure the fast tier finds is the full run's too)."""

from __future__ import annotations

import os


def examples(full: int) -> int:
    return max(25, full // 5) if os.environ.get("IMAGEKIT_FAST_TIER") == "1" else full
