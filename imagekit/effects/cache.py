"""Where imagekit keeps downloaded wheels and bootstrapped bases between runs."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$IMAGEKIT_CACHE``, else ``$XDG_CACHE_HOME/imagekit``, else ``~/.cache/imagekit``."""
    if os.environ.get("IMAGEKIT_CACHE"):
        return Path(os.environ["IMAGEKIT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "imagekit"
