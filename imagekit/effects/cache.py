"""Where imagekit keeps downloaded wheels and bootstrapped bases between runs, and what this machine did (its state:
the pods it created, the releases it vouches for)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def cache_root() -> Path:
    """``$IMAGEKIT_CACHE``, else ``$XDG_CACHE_HOME/imagekit``, else ``~/.cache/imagekit``."""
    if os.environ.get("IMAGEKIT_CACHE"):
        return Path(os.environ["IMAGEKIT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "imagekit"


def state_root() -> Path:
    """``$IMAGEKIT_STATE``, else ``$XDG_STATE_HOME/imagekit``, else ``~/.local/state/imagekit``."""
    if os.environ.get("IMAGEKIT_STATE"):
        return Path(os.environ["IMAGEKIT_STATE"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "imagekit"


def unusable(path: Path) -> str | None:
    """Why the cache folder ``path`` cannot take files (None when it can, created if need be): it, or the nearest
    parent that exists, is a file, a FIFO or a device instead of a folder, or a folder this process may not write
    (its permissions, or a read-only mount)."""
    probe = Path(path)
    while True:
        try:
            info = os.stat(probe)  # a link to a folder is a folder
        except (FileNotFoundError, NotADirectoryError):  # look at the parent (a file there: said of it)
            if probe == probe.parent:
                return None
            probe = probe.parent
            continue
        except OSError as exc:
            return f"{probe}: {exc.strerror or exc}"
        if not stat.S_ISDIR(info.st_mode):
            kind = "a file" if stat.S_ISREG(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a device"
            return f"{probe} is {kind}, not a folder"
        if not os.access(probe, os.W_OK | os.X_OK):
            return f"{probe} is not writable (read-only)"
        return None
