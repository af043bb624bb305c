"""`imagekit release merge`: the release index from per-image release records (one per CI runner's publish)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import err_console, handles_errors, out_json, output_file_option
from imagekit.cli.options import JsonOpt

EPILOG = """Example: imagekit release merge records/ --index releases/index.json --registry ghcr.io/acme/train

Each `imagekit build --push` writes releases/records/<cell id>-<build hash>.json beside the index; on CI each
runner uploads its record and one job merges them. Every record is checked against the registry first (its
digest, its image config, its immutable tag); one the registry does not serve is exit 1 and nothing is written.
A record may only name a registry given with --registry (or, without it, one the index already lists): one that
names another is exit 1, before any request. Registry credentials: IMAGEKIT_REGISTRY_USER and
IMAGEKIT_REGISTRY_PASSWORD, as for `imagekit build --push`; they go only to those registries."""


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
        registries: Annotated[
            list[str] | None,
            typer.Option(
                "--registry",
                metavar="HOST[/REPO]",
                help="A registry (or repository) the records may name; repeatable. Default: those the index lists.",
            ),
        ] = None,
        require_signature: Annotated[
            Path | None,
            typer.Option(
                "--require-signature",
                metavar="KEY.pub",
                help="Refuse every record whose image carries no cosign signature by this public key.",
            ),
        ] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Verify release records against the registry and add them to the release index (atomically)."""
        from imagekit.effects.registry import RegistryClient
        from imagekit.services import release
        from imagekit.services.release_index import read_index

        output_file_option(index, "--index")
        from imagekit.errors import UsageError

        signed_by = None
        if require_signature is not None:
            from imagekit.effects.files import read_input
            from imagekit.supplychain import cosign

            text = read_input(require_signature, "--require-signature", "pass the signer's cosign.pub")
            try:
                signed_by = cosign.load_public_key((text or "").encode())
            except cosign.KeyError_ as exc:
                raise UsageError(f"--require-signature {require_signature}: {exc}", "pass cosign.pub") from None
        current = read_index(index)  # a broken index is refused before the registry is asked
        allowed = release.allowed_registries(list(registries or []), current)
        console = err_console()
        from imagekit.effects import credentials

        hosts = sorted({n.registry for n in allowed[0]})
        # One registry: its credentials (env, else docker login's). Several: the env's, sent to each of them only.
        credential = credentials.for_registry(hosts[0]) if len(hosts) == 1 else credentials.from_env()
        client = RegistryClient(
            credential.username,
            credential.password,
            registries=hosts,  # the credentials go there and nowhere else
        )
        done = release.merge(
            records, index, client, log=lambda m: console.print(m, markup=False), allowed=allowed, signed_by=signed_by
        )
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
