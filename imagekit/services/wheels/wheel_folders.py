"""The folders a build reads its wheels from: the wheelhouse (links into the cache) and `fetch --into`'s context (real
files). Each layer's requirements lie beside the wheels; a folder is swapped in whole, never through a link."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from imagekit.effects.files import refuse_links, replace_folder, write_atomic
from imagekit.locking.lockfile import Lock
from imagekit.services.wheels.fetch import FetchedWheel

CONTEXT_HINT = "pass --into a folder of its own (`imagekit render --out DIR` makes one), with no links inside it"


def context_wheels(into: Path, cell_id: str) -> Path:
    """``DIR/<cell>/wheels`` for `fetch --into DIR`, refused when the cell folder or the wheels folder is a link or
    a file (DIR itself may be a link: the user named it). Checked before anything is downloaded."""
    return refuse_links(into / cell_id / "wheels", 2, "--into", CONTEXT_HINT)


def link_wheels(fetched: list[FetchedWheel], directory: Path, files: Mapping[str, str] | None = None) -> Path:
    """A folder holding exactly these wheels as real files (hard links into the cache, else copies), and
    ``files`` (each layer's requirements) beside them, for a BuildKit build context: a context carries symlinks as
    links, so links into the cache would dangle there. Built in a staging folder and swapped in whole; a link at
    ``directory`` or its parent is refused, never followed (`refuse_links`)."""
    refuse_links(directory, 2, "the wheels folder", CONTEXT_HINT)

    def fill(tmp: Path) -> None:
        for name, src in sorted({w.path.name: w.path for w in fetched}.items()):
            try:
                os.link(src, tmp / name)
            except OSError:  # another filesystem: a copy
                shutil.copyfile(src, tmp / name)
        for name, text in sorted((files or {}).items()):
            write_atomic(tmp / name, text)

    replace_folder(directory, fill)
    return directory


def requirements(lock: Lock, cuda_toolkit: bool = False) -> dict[str, str]:
    """Each layer's requirements file (name -> text): the RUN that installs a layer reads it beside the wheels
    (``cuda_toolkit``: `[image] cuda_toolkit`, the compiler's wheels a layer of their own)."""
    from imagekit.image import layering as layers

    return layers.split(lock, cuda_toolkit).requirement_files


def write_requirements(lock: Lock, directory: Path, cuda_toolkit: bool = False) -> None:
    """Each layer's requirements beside the wheels: the RUN that installs a layer reads them from there."""
    for name, text in requirements(lock, cuda_toolkit).items():
        write_atomic(directory / name, text)


def wheelhouse(fetched: list[FetchedWheel], directory: Path) -> Path:
    """A folder of links to exactly these wheels, for `pip --no-index --find-links`: swapped in whole, never
    through a link at ``directory`` or its parent (`state/wheelhouse/<cell>`)."""
    refuse_links(directory, 2, "the wheelhouse", "remove the link, or pass another --state-dir")

    def fill(tmp: Path) -> None:
        for w in fetched:
            (tmp / w.path.name).symlink_to(w.path)

    replace_folder(directory, fill)
    return directory
