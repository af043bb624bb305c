"""`imagekit compat`: look at and refresh the compatibility data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from imagekit import validate
from imagekit.cli.common import err_console, handles_errors, output_file_option


def build() -> typer.Typer:
    app = typer.Typer(
        help="Compatibility data: refresh the metadata-derived part from the package index.", no_args_is_help=True
    )

    @app.command("refresh", epilog="Example: imagekit compat refresh --out imagekit/data/pypi-metadata.json")
    @handles_errors
    def refresh(
        out: Annotated[Path, typer.Option(metavar="FILE", help="Where to write the metadata JSON.")] = Path(
            "imagekit/data/pypi-metadata.json"
        ),
        index: Annotated[
            str, typer.Option(metavar="URL", help="PEP 691 simple index to read.")
        ] = "https://pypi.org/simple",
    ) -> None:
        """Regenerate Requires-Python / Requires-Dist data and torch's Python windows from package metadata."""
        from imagekit import refresh as refresh_mod

        validate.index_url(index, "--index")
        output_file_option(out, "--out")
        doc = refresh_mod.refresh(out, index)
        err_console().print(
            f"wrote {out}: torch {len(doc['torch'])} releases, "
            + ", ".join(f"{k} {len(v)}" for k, v in sorted(doc["packages"].items()))
        )

    return app
