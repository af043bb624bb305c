"""`imagekit ci init`: write the GitHub Actions workflow that builds the matrix on CI runners."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import err_console, handles_errors, output_file_option

EPILOG = """Examples: imagekit ci init; imagekit ci init --registry ghcr.io/acme/train --gpu-runner gpu

The workflow: plan (locks current, every cell renders, the matrix of cells with a current lock), build (one
runner per cell: build, self-test inside the image, push, upload its release record), release (verify the records
against the registry, merge them into releases/index.json, commit it on the default branch). It runs on pushes
that touch lockfiles/, imagekit.toml, pyproject.toml or templates/, weekly, and by hand. Without --gpu-runner the
runners have no GPU: the self-test's GPU checks are skipped, and the job summary says so. With the default
registry (ghcr.io/<owner>/<repo>) the workflow logs in with GITHUB_TOKEN; another registry takes the secrets
REGISTRY_USERNAME and REGISTRY_PASSWORD. A self-hosted runner's labels go in .github/actionlint.yaml for actionlint."""


def build() -> typer.Typer:
    app = typer.Typer(
        help="Continuous integration: a workflow that builds the matrix on CI runners.", no_args_is_help=True
    )

    @app.command("init", epilog=EPILOG)
    @handles_errors
    def init(
        out: Annotated[Path, typer.Option("--out", metavar="PATH", help="Where to write the workflow.")] = Path(
            ".github/workflows/images.yml"
        ),
        registry: Annotated[
            str | None,
            typer.Option(metavar="REG/REPO", help="Where the build jobs push (default: ghcr.io/<owner>/<repo>)."),
        ] = None,
        gpu_runner: Annotated[
            list[str] | None,
            typer.Option(
                "--gpu-runner",
                metavar="LABEL",
                help="runs-on label of a GPU runner (repeatable); the build then self-tests with --require-gpu.",
            ),
        ] = None,
        install: Annotated[
            str, typer.Option(metavar="SPEC", help="What `pip install` gets imagekit from (., imagekit==X, a URL).")
        ] = "imagekit",
        force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
    ) -> None:
        """Write .github/workflows/images.yml: plan, build and self-test each cell on its own runner, release."""
        from imagekit import ci
        from imagekit.effects.files import write_atomic
        from imagekit.errors import UsageError

        output_file_option(out, "--out")
        text = ci.workflow(ci.validated(registry, gpu_runner, install))
        if (out.exists() or out.is_symlink()) and not force:
            raise UsageError(f"{out} exists", "pass --force to replace it, or --out PATH to write elsewhere")
        write_atomic(out, text)
        err_console().print(f"wrote {out}: commit it; the first push that touches lockfiles/ runs it", markup=False)

    return app
