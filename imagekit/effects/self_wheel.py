"""The running imagekit as a wheel's files: its package (with the templates an installed wheel carries under
``imagekit/_templates``, taken from the source checkout when it runs from one) and its installed metadata."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from imagekit import __version__
from imagekit.errors import EnvironmentFailure
from imagekit.locking import wheelpack

_SKIP_PARTS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


def _tree(root: Path, prefix: str) -> dict[str, bytes]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not path.is_symlink() and not (_SKIP_PARTS & set(rel.parts)):
            if not path.name.endswith(_SKIP_SUFFIXES):
                out[f"{prefix}{rel.as_posix()}"] = path.read_bytes()
    return out


def wheel() -> tuple[str, bytes]:
    """(file name, bytes) of a wheel of the imagekit that is running."""
    package = Path(__file__).resolve().parent.parent
    files = _tree(package, "imagekit/")
    if not any(p.startswith("imagekit/_templates/") for p in files):  # a source checkout: the repository's root
        root = package.parent
        if not (root / "templates").is_dir() or not (root / "Dockerfile.base").is_file():
            raise EnvironmentFailure(
                f"this imagekit ({package}) has neither imagekit/_templates nor a source checkout's templates/",
                "reinstall imagekit from its repository: pip install git+https://... or pip install PATH",
            )
        files.update(_tree(root / "templates", "imagekit/_templates/templates/"))
        files["imagekit/_templates/Dockerfile.base"] = (root / "Dockerfile.base").read_bytes()
    try:
        dist = importlib.metadata.distribution("imagekit")
        metadata = dist.read_text("METADATA") or ""
        entry_points = dist.read_text("entry_points.txt") or ""
    except importlib.metadata.PackageNotFoundError:
        metadata, entry_points = "", ""
    if not metadata:
        raise EnvironmentFailure(
            "imagekit's installed metadata cannot be read (it runs from a folder that was never installed)",
            "install it first: pip install -e . in its repository, then run ci init again",
        )
    if f"\nVersion: {__version__}\n" not in metadata:
        raise EnvironmentFailure(
            f"imagekit's installed metadata is not of the running imagekit {__version__}",
            "reinstall it (pip install -e . in its repository) and run ci init again",
        )
    return wheelpack.filename("imagekit", __version__), wheelpack.build(
        "imagekit", __version__, files, metadata, entry_points
    )
