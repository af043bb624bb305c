"""`imagekit matrix`: the cells after the rules, as a table, JSON, Markdown, a GitHub matrix or a bake file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from imagekit.cli.common import err_console, folder_option, handles_errors, load, out, out_json
from imagekit.cli.options import LockDirOpt, Selection, with_groups
from imagekit.errors import UsageError
from imagekit.matrix import matrix_file as matrix_mod
from imagekit.matrix import outputs, schema
from imagekit.model import AMD64
from imagekit.services.locks import lock_cells as lock_service

FORMATS = ("table", "json", "markdown", "grid", "github", "bake")
# `\b` keeps click from rewrapping the paragraph after it: the file format stays as written.
EPILOG = (
    """Examples: imagekit matrix --explain; echo "matrix=$(imagekit matrix --format github --locked-only)" \
>> "$GITHUB_OUTPUT" (one line of JSON); \
imagekit matrix --format grid >> README.md

The matrix file: --matrix FILE, else ./imagekit.toml, else ./pyproject.toml's [tool.imagekit] (the same keys \
under tool.imagekit.), else the shipped default. Cells are the product of the four axes, then exclude drops \
the combinations it names, then include adds whole cells; the rules then drop what cannot work. Every key:

"""
    + schema.reference()
    + """

`imagekit init` writes a commented one; the README's "Your own matrix" explains each key."""
)


def register(app: typer.Typer) -> None:
    @app.command(
        "matrix",
        epilog=EPILOG,
    )
    @handles_errors
    @with_groups
    def matrix(
        *,
        selection: Selection,
        explain: Annotated[
            bool, typer.Option("--explain", help="Also list excluded cells and the rule behind each.")
        ] = False,
        fmt: Annotated[
            str,
            typer.Option(
                "--format", "-f", metavar="FORMAT", help="table, json, markdown, grid (torch × CUDA), github, bake."
            ),
        ] = "table",
        shard: Annotated[
            str | None, typer.Option(metavar="I/N", help="For --format github: take slice I of N (I/N).")
        ] = None,
        locked_only: Annotated[
            bool,
            typer.Option(
                "--locked-only",
                help="Only cells whose lock in --lock-dir is current (what CI can build); the others are named on "
                "stderr.",
            ),
        ] = False,
        lock_dir: LockDirOpt = Path("lockfiles"),
        context_root: Annotated[
            str, typer.Option(metavar="DIR", help="For --format bake: the folder `imagekit render --out` wrote.")
        ] = "build",
    ) -> None:
        """List the matrix's cells after the compatibility rules."""
        if fmt not in FORMATS:
            raise UsageError(f"invalid --format {fmt!r}", f"use one of {', '.join(FORMATS)}")
        data, config = load(selection.matrix_file)
        evaluated = matrix_mod.evaluate(config, data)
        selection.unknown_cells(evaluated)
        cells = matrix_mod.select(evaluated, selection.selector())
        cells = selection.by_source(cells, data)
        if locked_only:
            cells = _locked(cells, folder_option(lock_dir, "--lock-dir"), data)
        shown = cells if explain else [c for c in cells if c.verdict.compatible]
        if fmt == "json":
            out_json([outputs.cell_row(c, data) for c in shown])
        elif fmt == "markdown":
            out(outputs.markdown_cells(shown, data))
        elif fmt == "grid":
            out(outputs.markdown_grid(config, data))
        elif fmt == "github":
            # One line, so `echo "matrix=$(imagekit matrix --format github)" >> "$GITHUB_OUTPUT"` works.
            out(json.dumps(outputs.github_matrix(cells, data, shard), sort_keys=True, separators=(",", ":")))
        elif fmt == "bake":
            from imagekit.services.builds import bake

            folder_option(lock_dir, "--lock-dir")
            found, skipped = bake.targets([c.cell for c in cells if c.verdict.compatible], config, data, lock_dir)
            for cell_id, why in skipped:
                err_console().print(f"not in the bake file: {cell_id}: {why}", markup=False)
            for alias, tags in bake.multi_platform(found):
                err_console().print(
                    f"note: one tag for every platform of {alias.rsplit(':', 1)[1]}, after the bake pushed them: "
                    f"docker buildx imagetools create -t {alias} {' '.join(tags)}",
                    markup=False,
                )
            out_json(outputs.bake(found, context_root))
        else:
            _table(shown, data, config.origin)

    def _locked(cells: list[matrix_mod.EvaluatedCell], lock_dir: Path, data) -> list[matrix_mod.EvaluatedCell]:
        compatible = [e for e in cells if e.verdict.compatible]
        locked, others = lock_service.current_locks([e.cell for e in compatible], lock_dir, data)
        console = err_console()
        for cell, why in others:
            flag = "" if cell.platform == AMD64 else f" --platform {cell.platform}"
            console.print(f"skipped {cell.key}: {why} (`imagekit lock --cell {cell.id}{flag}`)", markup=False)
        if others:
            console.print(
                f"{len(others)} cell(s) left out by --locked-only; `imagekit lock` makes their locks", markup=False
            )
        keep = {c.key for c in locked}
        return [e for e in cells if e.cell.key in keep or not e.verdict.compatible]

    def _table(cells: list[matrix_mod.EvaluatedCell], data, origin: str) -> None:
        console = err_console()
        table = Table(title=f"imagekit matrix ({origin})", show_lines=False)
        platforms = len({e.cell.platform for e in cells}) > 1 or any(e.cell.platform != AMD64 for e in cells)
        table.add_column("cell", no_wrap=True)
        for col in ("platform",) * platforms + ("torch from", "archs", "min driver", "status"):
            table.add_column(col, no_wrap=col == "platform")
        for e in cells:
            r = outputs.cell_row(e, data)
            status = (
                "[green]ok[/]"
                if e.verdict.compatible
                else "[red]excluded[/]: " + "; ".join(f"{v.rule}: {v.message}" for v in e.verdict.violations)
            )
            first = (r["id"], r["platform"]) if platforms else (r["id"],)
            table.add_row(*first, r["torch_source"], " ".join(r["archs"]), r["min_driver"], status)
        Console(highlight=False).print(table)
        ok = sum(1 for e in cells if e.verdict.compatible)
        console.print(f"{ok} compatible cell(s)" + (f", {len(cells) - ok} excluded" if len(cells) != ok else ""))
