"""Shared CLI plumbing: error rendering, consoles, checking path options, loading the selected cells."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console

from imagekit.cli.options import Selection
from imagekit.compat.catalog import CompatData
from imagekit.errors import EnvironmentFailure, ImagekitError, UsageError
from imagekit.matrix import matrix_file as matrix
from imagekit.services import inputs

F = TypeVar("F", bound=Callable[..., Any])


def err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def out(text: str) -> None:
    """Data goes to stdout, exactly as given."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def out_json(doc: object) -> None:
    out(json.dumps(doc, indent=2, sort_keys=True))


def handles_errors(fn: F) -> F:
    """Turn ImagekitError into `error:`/`hint:` on stderr and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ImagekitError as exc:
            sys.stderr.write(exc.render() + "\n")
            raise typer.Exit(exc.exit_code) from None
        except OSError as exc:  # a write the system refused (a read-only or full disk, /proc): the environment
            where = f" ({exc.filename})" if exc.filename else ""
            hint = "check the path, its permissions and the free space"
            error = EnvironmentFailure(f"{exc.strerror or exc}{where}", hint)
            sys.stderr.write(error.render() + "\n")
            raise typer.Exit(error.exit_code) from None

    return wrapper  # type: ignore[return-value]


def folder_option(path: Path, flag: str) -> Path:
    """A folder option (--out, --dir, --lock-dir, --state-dir): missing is fine (it is created), anything but a
    folder is a usage error before any work starts."""
    hint = f"pass a folder to {flag} (it is created when missing)"
    if not str(path).strip() or "\n" in str(path):
        raise UsageError(f"invalid {flag} {str(path)!r}", hint)
    try:
        if path.is_file():
            raise UsageError(f"{flag} {path} is a file, not a folder", hint)
        if (path.exists() or path.is_symlink()) and not path.is_dir():
            raise UsageError(f"{flag} {path} is not a folder", hint)
        for parent in path.parents:
            if (parent.exists() or parent.is_symlink()) and not parent.is_dir():
                raise UsageError(f"{flag} {path}: {parent} is not a folder", hint)
    except OSError as exc:  # a name too long, a loop of links
        raise UsageError(f"invalid {flag} {path}: {exc.strerror or exc}", hint) from None
    return path


def output_file_option(path: Path, flag: str) -> Path:
    """A file the command writes (--out FILE, --release-index): not a folder, not under a file."""
    if not str(path).strip() or "\n" in str(path) or path.name in ("", ".", ".."):
        raise UsageError(f"invalid {flag} {str(path)!r}", f"pass a file name to {flag}")
    try:
        if path.is_dir():
            raise UsageError(f"{flag} {path} is a folder", f"pass a file name to {flag}")
        if path.exists() and not path.is_file():
            raise UsageError(f"{flag} {path} is not a regular file", f"pass a file name to {flag}")
        for parent in path.parents:
            if (parent.exists() or parent.is_symlink()) and not parent.is_dir():
                raise UsageError(f"{flag} {path}: {parent} is not a folder", f"pass a file name to {flag}")
    except OSError as exc:
        raise UsageError(f"invalid {flag} {path}: {exc.strerror or exc}", f"pass a file name to {flag}") from None
    return path


def load(matrix_path: Path | None) -> tuple[CompatData, matrix.MatrixConfig]:
    data = inputs.compat_data()
    return data, inputs.load_matrix(matrix_path, data)


def selected_compatible(selection: Selection) -> tuple[CompatData, matrix.MatrixConfig, list[matrix.EvaluatedCell]]:
    """The compatible cells of the matrix that the selection picks; an empty pick is a usage error."""
    data, config = load(selection.matrix_file)
    evaluated = matrix.evaluate(config, data)
    selection.unknown_cells(evaluated)
    cells = [c for c in matrix.select(evaluated, selection.selector()) if c.verdict.compatible]
    cells = selection.by_source(cells, data)
    if not cells:
        asked = set(selection.selector().platforms)
        made = {c.cell.platform for c in evaluated}
        if asked and not asked & made:
            raise UsageError(
                f"the matrix makes no {', '.join(sorted(asked))} cells (its platforms: {', '.join(sorted(made))})",
                f'add them under [matrix]: platforms = ["linux/amd64", "{sorted(asked)[0]}"]',
            )
        picked = [c for c in matrix.select(evaluated, selection.selector()) if not c.verdict.compatible]
        if picked:
            why = "; ".join(f"{c.cell.key}: {v.message}" for c in picked[:2] for v in c.verdict.violations[:1])
            raise UsageError(
                f"the selection picks only excluded cells: {why}",
                "`imagekit matrix --explain` lists the cells and why some are excluded",
            )
        raise UsageError(
            "no compatible cell of the matrix matches the selection",
            "`imagekit matrix --explain` lists the cells and why some are excluded",
        )
    return data, config, cells


def print_plan(plan: Any, as_json: bool, *, build: bool) -> None:
    """A forecast (`--dry-run`): text on stdout, or its JSON; then refused when the disk cannot hold it."""
    from imagekit.services.builds import forecast

    if as_json:
        out_json(plan.to_json())
    else:
        out("\n".join(forecast.render_text(plan, build=build)))
        out(f"(planned in {plan.seconds:.1f} s; nothing was changed)")
    if plan.blockers:
        raise plan.blocked_error()
    if not plan.disk_ok:
        raise plan.disk_error()
