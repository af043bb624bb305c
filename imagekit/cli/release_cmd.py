"""`imagekit release merge`: the release index from per-image release records (one per CI runner's publish)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import err_console, handles_errors, out_json, output_file_option
from imagekit.cli.options import JsonOpt

EPILOG = """Example: imagekit release merge records/ --index releases/index.json

Each `imagekit build --push` writes releases/records/<cell id>-<build hash>.json beside the index; on CI each
runner uploads its record and one job merges them. Every record is checked against the registry first (its
digest, its image config, its immutable tag); one the registry does not serve is exit 1 and nothing is written.
Registry credentials: IMAGEKIT_REGISTRY_USER and IMAGEKIT_REGISTRY_PASSWORD, as for `imagekit build --push`."""


def build() -> typer.Typer:
    app = typer.Typer(help="Release index: merge the records parallel publishers wrote.", no_args_is_help=True)

    @app.command("merge", epilog=EPILOG)
    @handles_errors
    def merge(
        records: Annotated[
            list[Path],
            typer.Argument(metavar="RECORDS_DIR...", help="Folders of release records (searched recursively)."),
        ],
        index: Annotated[
            Path, typer.Option("--index", metavar="FILE", help="The release index to create or update.")
        ] = Path("releases/index.json"),
        as_json: JsonOpt = False,
    ) -> None:
        """Verify release records against the registry and add them to the release index (atomically)."""
        from imagekit.effects.registry import RegistryClient
        from imagekit.services import release
        from imagekit.services.publish import read_index

        output_file_option(index, "--index")
        read_index(index)  # a broken index is refused before the registry is asked
        console = err_console()
        client = RegistryClient(os.environ.get("IMAGEKIT_REGISTRY_USER"), os.environ.get("IMAGEKIT_REGISTRY_PASSWORD"))
        done = release.merge(records, index, client, log=lambda m: console.print(m, markup=False))
        if as_json:
            out_json(
                {"index": str(done.index), "records": done.records, "added": done.added, "unchanged": done.unchanged}
            )
        if not done.records:
            console.print(f"no release records in {', '.join(map(str, records))}; {index} unchanged", markup=False)
        else:
            console.print(
                f"{index}: {len(done.added)} added, {len(done.unchanged)} already there ({done.records} records)",
                markup=False,
            )

    return app
