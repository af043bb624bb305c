"""`imagekit init`: write a commented matrix for the user's project (imagekit.toml, or pyproject's [tool.imagekit])."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import err_console, handles_errors, output_file_option
from imagekit.matrix import matrix_file as matrix
from imagekit.services import init_project


def register(app: typer.Typer) -> None:
    @app.command(
        "init",
        epilog="Examples: imagekit init --package peft --package bitsandbytes --repository ghcr.io/acme/train; "
        "imagekit init --torch 2.5.1 --cuda 12.4 --python 3.11 --python 3.12; imagekit init --pyproject; "
        "imagekit init --from requirements.txt; imagekit init --from pyproject.toml --extra train",
    )
    @handles_errors
    def init(
        out: Annotated[
            Path | None,
            typer.Option(
                "--out",
                metavar="FILE",
                help=f"Where to write (default: ./{matrix.MATRIX_FILE}, which commands read without --matrix).",
            ),
        ] = None,
        pyproject: Annotated[
            bool,
            typer.Option(
                "--pyproject", help="Append a [tool.imagekit] section to ./pyproject.toml instead (never replaced)."
            ),
        ] = False,
        cuda: Annotated[
            list[str] | None,
            typer.Option("--cuda", metavar="VERSION", help="CUDA variant axis, e.g. 12.4 or cu124 (repeatable)."),
        ] = None,
        torch: Annotated[
            list[str] | None, typer.Option("--torch", metavar="VERSION", help="torch axis, e.g. 2.5.1 (repeatable).")
        ] = None,
        transformers: Annotated[
            list[str] | None,
            typer.Option("--transformers", metavar="VERSION", help="transformers axis, e.g. 4.48.2 (repeatable)."),
        ] = None,
        python: Annotated[
            list[str] | None,
            typer.Option("--python", metavar="VERSION", help="Python axis, e.g. 3.11 (repeatable)."),
        ] = None,
        package: Annotated[
            list[str] | None,
            typer.Option(
                "--package",
                metavar="REQUIREMENT",
                help="Extra package in every cell, e.g. peft or bitsandbytes==0.45.0 (repeatable; added to "
                f"{', '.join(init_project.DEFAULT_PACKAGES)}).",
            ),
        ] = None,
        apt: Annotated[
            list[str] | None,
            typer.Option(
                "--apt",
                metavar="PACKAGE",
                help="Debian package over the base, e.g. git-lfs or ffmpeg (repeatable; each .deb locked by sha256).",
            ),
        ] = None,
        repository: Annotated[
            str | None,
            typer.Option(
                metavar="REG/REPO",
                help="Where `imagekit build --push` publishes, e.g. ghcr.io/acme/train (default: the local demo "
                f"registry, {matrix.DEFAULT_REPOSITORY}).",
            ),
        ] = None,
        from_file: Annotated[
            Path | None,
            typer.Option(
                "--from",
                metavar="FILE",
                help="The project's own dependency declaration, which the matrix then refers to: a requirements "
                "file (its -r/-c includes too), pyproject.toml ([project] dependencies) or setup.py/setup.cfg (read by "
                "its build backend in a container of the base, network off). Its torch, transformers and Python "
                "requirements choose the axes; the rest is each cell's packages.",
            ),
        ] = None,
        extra: Annotated[
            list[str] | None,
            typer.Option(
                "--extra",
                metavar="NAME",
                help="With --from pyproject.toml or setup.py: an optional-dependency group to install too "
                "(repeatable).",
            ),
        ] = None,
        without: Annotated[
            list[str] | None,
            typer.Option(
                "--without",
                metavar="NAME",
                help="With --from: a requirement of the file the images leave out, such as one with no wheel "
                "(repeatable; written as the matrix's requirements.without).",
            ),
        ] = None,
        force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
    ) -> None:
        """Write a commented matrix for your project: imagekit.toml (or [tool.imagekit] in pyproject.toml).

        Axes not given default to a small matrix from the shipped default; every value is checked against the
        compatibility data, and the file is written only when at least one cell is compatible. With --from, the
        project's own dependency file is the list: the matrix refers to it, its torch, transformers and Python
        requirements choose the axes (a flag that conflicts with it is an error naming both), and every command reads
        it again.
        """
        request = init_project.InitRequest(
            cuda=cuda, torch=torch, transformers=transformers, python=python, package=package, repository=repository,
            apt=apt, out=out, pyproject=pyproject, from_file=from_file, extra=extra, without=without, force=force,
        )  # fmt: skip
        output_file_option(init_project.target_of(request), "--out")
        init_project.init(request, lambda line: err_console().print(line, markup=False))
