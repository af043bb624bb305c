"""Atomic file writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder, fsync, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_tree_atomic(root: Path, files: dict[str, str | bytes], modes: dict[str, int] | None = None) -> None:
    """Write every file of ``files`` (relative paths) under ``root``, each atomically."""
    for rel, data in sorted(files.items()):
        write_atomic(root / rel, data, (modes or {}).get(rel, 0o644))


def replace_tree(root: Path, files: dict[str, str | bytes], modes: dict[str, int] | None = None) -> None:
    """Write ``files`` into a fresh sibling folder and swap it in for ``root``: nothing is left over from an
    earlier or a killed write, and a reader never sees a half-written folder."""
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".tmp", dir=root.parent))
    old = root.with_name(f".{root.name}.{os.getpid()}.old")
    try:
        os.chmod(tmp, 0o755)
        write_tree_atomic(tmp, files, modes)
        if root.exists():
            os.replace(root, old)
        os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not root.exists():
            os.replace(old, root)
        raise
    shutil.rmtree(old, ignore_errors=True)
