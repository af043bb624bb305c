"""`imagekit compat`: look at and refresh the compatibility data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from imagekit import compat, validate
from imagekit.cli.common import err_console, handles_errors, out, out_json, output_file_option
from imagekit.errors import EnvironmentFailure, UsageError


def _user_file() -> Path:
    path = compat.user_metadata_path()
    if path is None:
        raise EnvironmentFailure(
            "no user data folder: $HOME is not set",
            "set IMAGEKIT_DATA_DIR (or XDG_DATA_HOME, or HOME), or pass --out FILE",
        )
    return path


def build() -> typer.Typer:
    app = typer.Typer(
        help="Compatibility data: see which files are in use, refresh the metadata-derived part from the index.",
        no_args_is_help=True,
    )

    @app.command(
        "refresh",
        epilog="Example: imagekit compat refresh; imagekit compat refresh --out imagekit/data/pypi-metadata.json",
    )
    @handles_errors
    def refresh(
        out_file: Annotated[
            Path | None,
            typer.Option(
                "--out",
                metavar="FILE",
                help="Write the metadata JSON here instead (an export: imagekit reads only the user data file).",
            ),
        ] = None,
        index: Annotated[
            str, typer.Option(metavar="URL", help="PEP 691 simple index to read.")
        ] = "https://pypi.org/simple",
    ) -> None:
        """Regenerate Requires-Python / Requires-Dist data and torch's Python windows from package metadata.

        Writes the user data file imagekit reads from then on: $IMAGEKIT_DATA_DIR/pypi-metadata.json, else
        $XDG_DATA_HOME/imagekit/, else ~/.local/share/imagekit/ (`imagekit compat show` says which). It is refused
        when it would know fewer torch releases, or fewer releases of a package, than the data shipped with
        imagekit. The curated facts (CUDA variants, driver floors, archs, with sources) are not refreshed: they come
        with imagekit. Lock input hashes cover the curated facts' data version, not this file, so refreshing never
        makes locks stale.
        """
        from imagekit.services import compat_refresh

        validate.index_url(index, "--index")
        target = out_file if out_file is not None else _user_file()
        output_file_option(target, "--out" if out_file is not None else "the user data file")
        doc = compat_refresh.write(target, index, floor=compat.shipped_metadata() if out_file is None else None)
        err_console().print(
            f"wrote {target}: torch {len(doc['torch'])} releases, "
            + ", ".join(f"{k} {len(v)}" for k, v in sorted(doc["packages"].items())),
            markup=False,
        )

    @app.command("show", epilog="Example: imagekit compat show --json")
    @handles_errors
    def show(
        as_json: Annotated[bool, typer.Option("--json", help="Print the JSON summary on stdout.")] = False,
    ) -> None:
        """Which compatibility data files are in use: their paths, versions and release counts."""
        user = compat.user_metadata_path()
        try:
            metadata, where, origin, passed_over = compat.choose_metadata(user)
            state = "in use" if origin == compat.USER else f"not used: {passed_over}" if passed_over else "absent"
        except UsageError as exc:  # an unusable user file: say so here (every other command refuses it)
            metadata, where, origin = (
                compat.shipped_metadata(),
                compat.shipped_path(compat.METADATA_FILE),
                compat.SHIPPED,
            )
            state = f"unusable: {exc.message}"
        data = compat.parse(
            compat.curated_document(),
            metadata,
            curated_path=compat.shipped_path(compat.CURATED_FILE),
            metadata_path=where,
            metadata_origin=origin,
        )
        doc = {
            "curated": {
                "path": data.curated_path,
                "data_version": data.data_version,
                "torch_minors": sorted(data.torch_minors, key=lambda m: tuple(int(x) for x in m.split("."))),
            },
            "metadata": {
                "path": data.metadata_path,
                "origin": data.metadata_origin,
                "releases": {name: len(data.releases(name)) for name in sorted(data.packages)},
                "newest_torch": data.releases("torch")[-1],
            },
            "user_file": {"path": str(user) if user is not None else None, "state": state},
        }
        if as_json:
            out_json(doc)
            return
        counts = ", ".join(f"{k} {v}" for k, v in doc["metadata"]["releases"].items())
        minors = doc["curated"]["torch_minors"]
        out(
            f"curated facts  {data.curated_path}\n"
            f"               data version {data.data_version}; torch {minors[0]} … {minors[-1]}\n"
            f"PyPI metadata  {data.metadata_path} ({data.metadata_origin})\n"
            f"               {counts}; newest torch {doc['metadata']['newest_torch']}\n"
            f"user file      {doc['user_file']['path']}: {state}"
        )

    return app
