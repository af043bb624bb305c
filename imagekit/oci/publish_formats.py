"""The layer formats imagekit publishes, by name: one line per format. Pure.

The image's immutable tag and its alias name its ``DEFAULT`` blobs (gzip: every engine pulls them); each other format
is a variant published beside them, never instead: the same image under ``<tag>-<name>`` and ``<alias>-<name>``, its
own immutable tag, recorded in the release record under ``<name>`` (oci.release_record checks that field for each
name here). A new format is its ``layer_blobs.LayerFormat`` (its own module) and its line in ``FORMATS``.
"""

from __future__ import annotations

from collections.abc import Callable

from imagekit.errors import UsageError
from imagekit.oci import layer_blobs
from imagekit.oci.layer_blobs import LayerFormat

DEFAULT = "gzip"
FORMATS: dict[str, Callable[[], LayerFormat]] = {
    "gzip": layer_blobs.Gzip,
    "zstd": layer_blobs.Zstd,  # Docker >= 23 and containerd pull it; Docker 20.10 cannot
}


def variants() -> tuple[str, ...]:
    """The formats published beside the default one, in the table's order."""
    return tuple(name for name in FORMATS if name != DEFAULT)


def named(name: str) -> LayerFormat:
    """The format ``name`` names; an unknown name is a usage error naming the known ones."""
    if name not in FORMATS:
        raise UsageError(f"no publish format {name[:40]!r}", f"name one of {', '.join(FORMATS)}")
    return FORMATS[name]()


def variant(name: str) -> LayerFormat:
    """The format of the variant ``name`` (published beside the default, never the default itself)."""
    if name not in variants():
        raise UsageError(f"no publish format variant {name[:40]!r}", f"name one of {', '.join(variants())}")
    return FORMATS[name]()
