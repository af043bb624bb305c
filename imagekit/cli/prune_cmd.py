"""`imagekit prune`: imagekit's own leftovers in the Docker engine, listed and removed (services/builds/prune.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from imagekit.cli.common import handles_errors, out, out_json
from imagekit.cli.options import JsonOpt


def register(app: typer.Typer) -> None:
    @app.command(
        "prune",
        epilog="Examples: imagekit prune --dry-run; imagekit prune; imagekit prune --cache",
    )
    @handles_errors
    def prune(
        dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")] = False,
        cache: Annotated[
            bool,
            typer.Option(
                "--cache",
                help="Also the build-cache anchors (imagekit/build:<cell>): the next build of a cell runs its steps "
                "again.",
            ),
        ] = False,
        as_json: JsonOpt = False,
    ) -> None:
        """Remove what imagekit's builds left in the engine: refused images (imagekit/refused:<cell>) and the step
        images of its staged builds that no tag names; and the layer blobs a killed `build --push` compressed and no
        push took. Never an image imagekit did not make; published tags stay."""
        from imagekit.effects.docker import Engine
        from imagekit.services.builds import prune as service
        from imagekit.services.progress import human_bytes

        items = service.prune(Engine(), cache=cache, dry_run=dry_run)
        if as_json:
            out_json([{"kind": i.kind, "ref": i.ref, "size": i.size, "removed": i.removed} for i in items])
            return
        verb = "would remove" if dry_run else "removed"
        for i in items:
            state = verb if dry_run or i.removed else "kept (in use)"
            out(f"{state} {i.kind} {i.ref} ({human_bytes(i.size)})")
        out(f"{len(items)} leftover(s)" + (" (dry run: nothing removed)" if dry_run else ""))
