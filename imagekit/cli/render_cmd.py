"""`imagekit render`: one build-context folder per cell, deterministic; `--check` finds hand edits."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import err_console, folder_option, handles_errors, selected_compatible
from imagekit.cli.options import BuilderOpt, LockDirOpt, Selection, image_options, with_groups
from imagekit.effects.files import clamp_mtimes, replace_tree
from imagekit.errors import EXIT_NO
from imagekit.image import render as render_mod
from imagekit.services.builds.build_plans import plans_for


def register(app: typer.Typer) -> None:
    @app.command(
        "render",
        epilog="Examples: imagekit render --cuda 12.4 --source pypi --out build; "
        "imagekit render --source pypi --out build --check",
    )
    @handles_errors
    @with_groups
    def render(
        *,
        out_dir: Annotated[
            Path,
            typer.Option("--out", metavar="DIR", help="Folder to write <cell id>/Dockerfile and its context into."),
        ],
        selection: Selection,
        lock_dir: LockDirOpt = Path("lockfiles"),
        builder: BuilderOpt = "buildkit",
        check: Annotated[
            bool, typer.Option("--check", help="Write nothing; exit 1 if --out differs from a fresh render.")
        ] = False,
    ) -> None:
        """Render Dockerfiles (and their build context) for the selected cells from their locks."""
        folder_option(out_dir, "--out")
        folder_option(lock_dir, "--lock-dir")
        data, config, cells = selected_compatible(selection)
        options = image_options(config, builder=builder)
        plans = plans_for([c.cell for c in cells], config, lock_dir, data, options, outputs=(out_dir,))
        files = render_mod.render_many(plans)
        console = err_console()
        if check:
            problems = render_mod.diff_tree(out_dir, files)
            for p in problems:
                console.print(f"[red]{p}[/]")
            if problems:
                console.print("hint: run the same `imagekit render` without --check to regenerate")
                raise typer.Exit(EXIT_NO)
            console.print(f"{len(plans)} cell(s) match {out_dir}")
            return
        for plan in plans:  # each cell's folder is written fresh and swapped in: no leftovers in `COPY imagekit/`
            prefix = f"{plan.cell.slug}/"
            mine = {k[len(prefix) :]: v for k, v in files.items() if k.startswith(prefix)}
            replace_tree(
                out_dir / plan.cell.slug,
                {k: v[0] for k, v in mine.items()},
                {k: v[1] for k, v in mine.items()},
                keep=("wheels",),  # fetched wheels stay: `imagekit fetch --into` put them there
            )
            clamp_mtimes(out_dir / plan.cell.slug, plan.source_date_epoch, skip=("wheels",))  # COPY keeps mtimes
            console.print(f"rendered {out_dir / plan.cell.slug}/Dockerfile")
