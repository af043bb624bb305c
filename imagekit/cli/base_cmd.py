"""`imagekit base bootstrap`: a base image from Debian/Ubuntu packages (mmdebstrap), imported, optionally pushed."""

from __future__ import annotations

from typing import Annotated

import typer

from imagekit.cli.common import err_console, handles_errors, out, out_json
from imagekit.cli.options import JsonOpt
from imagekit.errors import UsageError
from imagekit.services import inputs
from imagekit.trust.validate import repository as validate_repository


def build() -> typer.Typer:
    base_app = typer.Typer(
        help="Base images: bootstrap from Debian/Ubuntu packages (no registry needed).", no_args_is_help=True
    )

    @base_app.command(
        "bootstrap",
        epilog="Examples: imagekit base bootstrap --python 3.11; "
        "imagekit base bootstrap --python 3.11 --push ghcr.io/acme/base >> imagekit.toml",
    )
    @handles_errors
    def bootstrap(
        python: Annotated[
            list[str] | None,
            typer.Option(
                "--python",
                metavar="VERSION",
                help="Which base (by its Python), repeatable; default: all bootstrappable bases.",
            ),
        ] = None,
        push: Annotated[
            str | None,
            typer.Option(
                "--push",
                metavar="REG/REPO",
                help="Also push it to REG/REPO and print its [bases] entry (by digest) for imagekit.toml, so CI "
                "runners and `docker buildx bake` pull the very same base.",
            ),
        ] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Build the base with mmdebstrap (SOURCE_DATE_EPOCH: identical inputs, identical tarball) and import it."""
        from imagekit.effects.docker import Engine
        from imagekit.services.builds.base_images import ensure_base

        data = inputs.compat_data()
        wanted = python or sorted(data.bases)
        unknown = [p for p in wanted if p not in data.bases]
        if unknown:
            raise UsageError(f"no base for Python {', '.join(unknown)}", f"known: {', '.join(sorted(data.bases))}")
        repository = validate_repository(push) if push is not None else None
        engine, console, done = Engine(), err_console(), []
        for py in wanted:
            ref = ensure_base(data.bases[py], engine, log=console.print)
            console.print(f"{ref.reference} ({ref.digest})")
            row = {"python": py, "reference": ref.reference, "digest": ref.digest, "glibc": ref.glibc}
            if repository:
                from imagekit.effects import credentials
                from imagekit.effects.registry import Remote
                from imagekit.services.builds.base_images import push_base

                credential = credentials.for_registry(Remote.parse(repository).registry)
                pushed = push_base(engine, ref, repository, credential.username, credential.password)
                console.print(f"pushed {pushed}")
                row["pushed"] = pushed
                if not as_json:
                    out(f'[bases."{py}"]\nreference = "{pushed}"\nglibc = "{ref.glibc}"\n')
            done.append(row)
        if as_json:
            out_json(done)

    return base_app
