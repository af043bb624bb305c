"""The `imagekit` command: a thin typer shell over the services."""

from __future__ import annotations

import typer

from imagekit import __version__


def _version(value: bool) -> None:
    if value:
        typer.echo(f"imagekit {__version__}")
        raise typer.Exit(0)


def build_app() -> typer.Typer:
    from imagekit.cli import (
        build_cmd,
        compat_cmd,
        doctor_cmd,
        explain_cmd,
        lock_cmd,
        matrix_cmd,
        pod_cmd,
        render_cmd,
    )

    app = typer.Typer(
        name="imagekit",
        help="Build pinned, tested GPU training images: matrix, rules, lock, render, build, test, publish.\n\n"
        "Exit codes: 0 ok; 1 the check/test/build said no; 2 bad usage or config; 3 the environment failed.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def root(
        version: bool = typer.Option(
            False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ) -> None:
        """imagekit."""

    for module in (matrix_cmd, explain_cmd, lock_cmd, render_cmd, build_cmd, doctor_cmd):
        module.register(app)
    app.add_typer(compat_cmd.build(), name="compat")
    app.add_typer(pod_cmd.build(), name="pod")
    return app


def main() -> None:
    build_app()()
