"""What a built image is tagged as on the engine: its runtime config set over its layers, under the tags it is
published as; and an image the build refused withdrawn from those tags (kept for inspection under its own)."""

from __future__ import annotations

from collections.abc import Callable

from imagekit import __version__
from imagekit.errors import EnvironmentFailure
from imagekit.image import imageconfig, naming
from imagekit.model import Cell
from imagekit.services.builds import staged_build
from imagekit.services.ports import ContainerEngine


def set_runtime_config(
    engine: ContainerEngine,
    built: str,
    base: str,
    runtime: imageconfig.RuntimeConfig,
    source_date_epoch: int,
    tags: list[str],
    say: Callable[[str], None],
    history: list[dict] | None = None,
) -> str:
    """The built image with its ENV, WORKDIR, ENTRYPOINT, CMD and labels, tagged ``tags``: a new config over the same
    layers, loaded in milliseconds; when the engine's history cannot be matched to the layers, or the engine refuses
    the load, a container commit (one step's time) makes the same image but for its dates."""
    try:
        if history is not None:  # imagekit ran the steps: it knows what made each layer
            entries = history
        else:
            entries = staged_build.history_of(engine, built, base)
        built_image = engine.image(built)
        if built_image is None:
            raise imageconfig.Unknown(f"the engine has no image {built}")
        config = imageconfig.config_json(built_image, entries, runtime, source_date_epoch, __version__)
        return engine.load_config(config, tags)
    except (imageconfig.Unknown, EnvironmentFailure) as exc:
        say(f"setting the image config by a container commit ({exc})")
        return engine.commit_changes(built, runtime.instructions(" "), tags)


def withdraw(
    engine: ContainerEngine, cell: Cell, image: str, immutable: str, alias: str, alias_before: str | None
) -> str:
    """A refused image (its self-test failed, or it is over its size budget) leaves the tags it would have been
    published as: ``immutable`` is removed, ``alias`` goes back to ``alias_before`` (the image it named before the
    build) or is removed; the image is kept as naming.refused_tag, which this returns, so `docker run` of the
    published names never runs it."""
    kept = naming.refused_tag(cell)
    engine.tag(image, *kept.rsplit(":", 1))

    def names_this(tag: str) -> bool:  # another build of the cell on this engine may have moved it since
        return (engine.image(tag) or {}).get("Id") == (engine.image(image) or {}).get("Id")

    if names_this(immutable):
        engine.remove(immutable)
    if names_this(alias):
        if alias_before and alias_before != image:
            engine.tag(alias_before, *alias.rsplit(":", 1))
        else:
            engine.remove(alias)
    return kept
