"""The `imagekit` command: a thin typer shell over the services."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperArgument, TyperGroup

from imagekit import __version__


class _Argument(TyperArgument):
    """An argument shown by its metavar, as a CLI names it (`TARGET`, `[CELL]`, `COMMAND...`), without a type."""

    def display_type_rich(self, ctx: typer.Context) -> str | None:
        return None if self.metavar else super().display_type_rich(ctx)

    def _usage_display_name(self) -> str:
        name = self.metavar or (self.name or "").upper()
        name += "..." if self.nargs != 1 and not name.endswith("...") else ""
        return name if self.required else f"[{name}]"


class _Group(TyperGroup):
    """The root group: plain help (no Rich markup, so `[tool.imagekit]` shows as written), arguments by metavar."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_arguments(self)


def _plain_arguments(command: Any) -> None:  # a click command, as typer builds it
    for sub in getattr(command, "commands", {}).values():
        _plain_arguments(sub)
    for param in command.params:
        if type(param) is TyperArgument and param.metavar:
            param.__class__ = _Argument


def _version(value: bool) -> None:
    if value:
        typer.echo(f"imagekit {__version__}")
        raise typer.Exit(0)


def build_app() -> typer.Typer:
    from imagekit.cli import (
        build_cmd,
        ci_cmd,
        compat_cmd,
        doctor_cmd,
        explain_cmd,
        init_cmd,
        lock_cmd,
        matrix_cmd,
        pod_cmd,
        release_cmd,
        render_cmd,
        selftest_cmd,
    )

    app = typer.Typer(
        name="imagekit",
        help="Build pinned, tested GPU training images: matrix, rules, lock, render, build, test, publish.\n\n"
        "Exit codes: 0 ok; 1 the check/test/build said no; 2 bad usage or config; 3 the environment failed.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,  # help as written: Rich markup would swallow `[tool.imagekit]` and `[image]`
        cls=_Group,
        context_settings={"max_content_width": 120},
    )

    @app.callback()
    def root(
        version: bool = typer.Option(
            False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ) -> None:
        """imagekit."""

    for module in (init_cmd, matrix_cmd, explain_cmd, lock_cmd, render_cmd, build_cmd, selftest_cmd, doctor_cmd):
        module.register(app)
    app.add_typer(compat_cmd.build(), name="compat")
    app.add_typer(pod_cmd.build(), name="pod")
    app.add_typer(release_cmd.build(), name="release")
    app.add_typer(ci_cmd.build(), name="ci")
    return app


def main() -> None:
    build_app()()
