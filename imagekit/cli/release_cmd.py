"""`imagekit release merge`: the release index from per-image release records (one per CI runner's publish);
`imagekit release page`: the page a team reads of it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import err_console, handles_errors, out_json, output_file_option
from imagekit.cli.options import JsonOpt, MatrixOpt

EPILOG = """Example: imagekit release merge records/ --index releases/index.json --registry ghcr.io/acme/train

Each `imagekit build --push` writes releases/records/<cell id>-<build hash>.json beside the index; on CI each
runner uploads its record and one job merges them. Every record is checked against the registry first (its
digest, its image config, its immutable tag); one the registry does not serve is exit 1 and nothing is written.
A record may only name a registry given with --registry (or, without it, one the index already lists): one that
names another is exit 1, before any request. Registry credentials: IMAGEKIT_REGISTRY_USER and
IMAGEKIT_REGISTRY_PASSWORD, as for `imagekit build --push`; they go only to those registries."""

PAGE_EPILOG = """Example: imagekit release page --release-index releases/index.json --out site

One HTML file with its stylesheet and copy script, nothing fetched when it is viewed, readable without JavaScript:
per Python, the torch x CUDA grid of every cell of the matrix and the index, each marked passed (self-test with its
GPU checks), GPU checks skipped, failed, excluded by a rule (its source in a note) or not published; per published
cell its tag and digest, sizes, self-test checks and where they ran, SBOM, signature key, commit, and the commands
that start it (docker pull, imagekit runpod-template, imagekit pod create). A fact its record does not hold is said
to be not recorded. Every value from a record is escaped. The same index gives the same bytes. --out is replaced
whole: a folder holding other files is refused. `imagekit ci init --pages` publishes it with GitHub Pages."""


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
    from imagekit.services.publishing import release
    from imagekit.services.publishing.release_index import read_index

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
        out_json({"index": str(done.index), "records": done.records, "added": done.added, "unchanged": done.unchanged})
    if not done.records:
        console.print(f"no release records in {', '.join(map(str, records))}; {index} unchanged", markup=False)
    else:
        console.print(
            f"{index}: {len(done.added)} added, {len(done.unchanged)} already there ({done.records} records)",
            markup=False,
        )


@handles_errors
def page(
    out: Annotated[
        Path,
        typer.Option("--out", metavar="DIR", help="The page's folder (index.html, page.css, copy.js), replaced whole."),
    ],
    release_index: Annotated[
        Path,
        typer.Option("--release-index", metavar="FILE", help="The release index the page shows."),
    ] = Path("releases/index.json"),
    matrix_file: MatrixOpt = None,
    reports: Annotated[
        list[Path] | None,
        typer.Option(
            "--reports",
            metavar="DIR",
            help="Folders of self-test reports (`imagekit build`'s .imagekit/reports, CI's artifacts): a failed "
            "one marks its cell failed (repeatable).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Write the release page: every cell on its torch x CUDA grid, what was tested, what is inside, how to start
    it."""
    from imagekit.cli.common import folder_option
    from imagekit.pages.cell_facts import STATES
    from imagekit.services.publishing import release_page

    folder_option(out, "--out")
    written = release_page.write(release_index, matrix_file, list(reports or []), out)
    counts = dict(written.page.counts)
    if as_json:
        out_json({"out": str(written.out), "files": list(written.files), "bytes": written.size, "cells": counts})
    said = ", ".join(f"{n} {STATES[state][1]}" for state, n in counts.items() if n)
    err_console().print(f"wrote {out / 'index.html'} ({written.size // 1024} KiB): {said or 'no cells'}", markup=False)


def build() -> typer.Typer:
    """The `release` group: each subcommand a function of this module, in the order `release --help` lists."""
    app = typer.Typer(help="Release index: merge the records parallel publishers wrote.", no_args_is_help=True)
    app.command("merge", epilog=EPILOG)(merge)
    app.command("page", epilog=PAGE_EPILOG)(page)
    return app
