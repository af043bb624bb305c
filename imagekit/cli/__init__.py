"""The `imagekit` command: a thin typer shell over the services."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperArgument, TyperGroup

from imagekit import __version__
from imagekit.clouds import providers


class _Argument(TyperArgument):
    """An argument shown by its metavar, as a CLI names it (`TARGET`, `[CELL]`, `COMMAND...`), without a type."""

    def display_type_rich(self, ctx: typer.Context) -> str | None:
        return None if self.metavar else super().display_type_rich(ctx)

    def _usage_display_name(self) -> str:
        name = self.metavar or (self.name or "").upper()
        name += "..." if self.nargs != 1 and not name.endswith("...") else ""
        return name if self.required else f"[{name}]"

    def make_metavar(self, ctx: typer.Context, *args: Any, **kwargs: Any) -> str:  # typer < 0.29 builds usage here
        if kwargs.get("usage"):
            return self._usage_display_name()
        return self.metavar or super().make_metavar(ctx, *args, **kwargs)


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


# Which module defines each top-level command: `imagekit lock ...` imports the lock command's module alone, not the
# other commands' dependencies (docker, jinja2, paramiko, ...). Help, completion and errors build the whole app.
# Each GPU cloud's template command (`<name>-template`) is built by template_cmd from its row of the provider registry.
TEMPLATES = "template_cmd"
PROVIDER_COMMANDS = {p.template_command: TEMPLATES for p in providers.PROVIDERS}
COMMANDS = {
    "init": "init_cmd", "matrix": "matrix_cmd", "explain": "explain_cmd", "lock": "lock_cmd", "render": "render_cmd",
    "build": "build_cmd", "fetch": "fetch_cmd", **PROVIDER_COMMANDS, "selftest": "selftest_cmd",
    "doctor": "doctor_cmd", "audit": "audit_cmd", "sign": "sign_cmd", "verify": "sign_cmd", "prune": "prune_cmd",
}  # fmt: skip
GROUPS = {"base": "base_cmd", "compat": "compat_cmd", "pod": "pod_cmd", "release": "release_cmd", "ci": "ci_cmd"}
_ORDER = (
    "init_cmd", "matrix_cmd", "explain_cmd", "lock_cmd", "render_cmd", "build_cmd", "fetch_cmd", TEMPLATES,
    "selftest_cmd", "doctor_cmd", "audit_cmd", "sign_cmd", "prune_cmd",
)  # fmt: skip


def build_app(command: str | None = None) -> typer.Typer:
    """The CLI; with ``command`` (a top-level command name), only the module that defines it is imported."""
    import importlib

    def module(name: str) -> Any:
        return importlib.import_module(f"imagekit.cli.{name}")

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

    if command in {p.template_command for p in providers.PROVIDERS}:  # the registry as it is now
        module(TEMPLATES).register(app, only=command)
        return app
    if command in COMMANDS:
        module(COMMANDS[command]).register(app)
        return app
    if command in GROUPS:
        app.add_typer(module(GROUPS[command]).build(), name=command)
        return app
    for name in _ORDER:
        module(name).register(app)
    for group, name in GROUPS.items():
        app.add_typer(module(name).build(), name=group)
    return app


def main() -> None:
    import sys

    first = sys.argv[1] if len(sys.argv) > 1 else None
    build_app(first if first in COMMANDS or first in GROUPS else None)()
