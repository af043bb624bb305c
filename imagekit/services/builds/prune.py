"""`imagekit prune`: what imagekit's builds leave in the engine that no published tag needs, found and removed. Only
what imagekit made: images kept as refused (naming.REFUSED), the step images its staged builds loaded and recorded
(staged_build.recorded_step_images) that no tag names, and with ``cache`` the build-cache anchors (naming.BUILD_CACHE:
the next build of a cell then runs its steps again). Never an image imagekit did not record or tag. And the layer
blobs a killed `build --push` prepared and no push took (blob_prepare.leftovers): files of imagekit's cache."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from imagekit.image import naming
from imagekit.services.builds import staged_build
from imagekit.services.ports import ContainerEngine
from imagekit.services.publishing import blob_prepare


@dataclass(frozen=True)
class Leftover:
    kind: str  # refused | step | cache | blob
    ref: str  # a tag, a step image's id, or a prepared blob's file
    size: int  # the image's size as the engine reports it (shared layers counted in each)
    removed: bool = False


def leftovers(engine: ContainerEngine, *, cache: bool = False) -> list[Leftover]:
    """What `prune` would remove, in the order it removes it."""
    found = [Leftover("refused", tag, size) for tag, _, size in engine.images_named(naming.REFUSED)]
    for image in staged_build.recorded_step_images():
        inspect = engine.image(image)
        if inspect is not None and not inspect.get("RepoTags"):
            found.append(Leftover("step", image, int(inspect.get("Size") or 0)))
    if cache:
        found += [Leftover("cache", tag, size) for tag, _, size in engine.images_named(naming.BUILD_CACHE)]
    found += [Leftover("blob", str(path), size) for path, size in blob_prepare.leftovers()]
    return found


def prune(engine: ContainerEngine, *, cache: bool = False, dry_run: bool = False) -> list[Leftover]:
    """Remove the leftovers (untag the tags; a step image only when no container uses it); each says if it went."""
    out = []
    for item in leftovers(engine, cache=cache):
        if dry_run:
            out.append(item)
            continue
        if item.kind == "step":
            gone = staged_build.drop_step_image(engine, item.ref)
        elif item.kind == "blob":
            Path(item.ref).unlink(missing_ok=True)
            gone = not os.path.lexists(item.ref)
        else:
            engine.remove(item.ref)
            gone = engine.image(item.ref) is None
        out.append(Leftover(item.kind, item.ref, item.size, gone))
    return out
