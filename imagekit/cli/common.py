"""Shared CLI plumbing: error rendering, consoles, selector options, loading the matrix."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from imagekit import compat, matrix, resolution
from imagekit.compat import CompatData
from imagekit.errors import EnvironmentFailure, ImagekitError, UsageError
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


MatrixOpt = Annotated[
    Path | None,
    typer.Option(
        "--matrix",
        "-m",
        metavar="FILE",
        help="Matrix TOML file (default: ./imagekit.toml, else ./pyproject.toml [tool.imagekit], else the shipped "
        "default).",
        dir_okay=False,
    ),
]
CudaOpt = Annotated[
    list[str] | None,
    typer.Option("--cuda", metavar="VERSION", help="CUDA variant, e.g. 11.8 or cu118 (repeatable)."),
]
TorchOpt = Annotated[
    list[str] | None,
    typer.Option("--torch", metavar="VERSION", help="torch version or prefix, e.g. 2.5 (repeatable)."),
]
TfOpt = Annotated[
    list[str] | None,
    typer.Option("--transformers", metavar="VERSION", help="transformers version or prefix (repeatable)."),
]
PyOpt = Annotated[
    list[str] | None, typer.Option("--python", metavar="VERSION", help="Python version, e.g. 3.11 (repeatable).")
]
CellOpt = Annotated[list[str] | None, typer.Option("--cell", metavar="CELL", help="Exact cell id (repeatable).")]
SourceOpt = Annotated[
    str,
    typer.Option(
        "--source",
        metavar="all|pypi|pytorch",
        help="Which cells by where torch comes from: all, pypi (PyPI default variant) or pytorch "
        "(needs the PyTorch index).",
    ),
]


def selector(
    cuda: list[str] | None,
    torch: list[str] | None,
    transformers: list[str] | None,
    python: list[str] | None,
    cells: list[str] | None = None,
) -> matrix.Selector:
    from imagekit import validate

    return matrix.Selector(
        cuda=tuple(validate.cuda(c) for c in cuda or ()),
        torch=tuple(torch or ()),
        transformers=tuple(transformers or ()),
        python=tuple(validate.python(p) for p in python or ()),
        ids=tuple(cells or ()),
    )


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
    data = compat.load()
    return data, inputs.load_matrix(matrix_path, data)


def by_source(cells: list[matrix.EvaluatedCell], source: str, data: CompatData) -> list[matrix.EvaluatedCell]:
    if source not in ("all", "pypi", "pytorch"):
        raise UsageError(f"invalid --source {source!r}", "use all, pypi or pytorch")
    if source == "all":
        return cells
    want_pypi = source == "pypi"
    return [c for c in cells if (c.cell.variant == data.torch_minor(c.cell.torch).pypi_default) == want_pypi]


def selected_compatible(
    matrix_path: Path | None,
    sel: matrix.Selector,
    source: str = "all",
) -> tuple[CompatData, matrix.MatrixConfig, list[matrix.EvaluatedCell]]:
    """The compatible cells of the matrix that the selectors pick; an empty pick is a usage error."""
    data, config = load(matrix_path)
    cells = [c for c in matrix.select(matrix.evaluate(config, data), sel) if c.verdict.compatible]
    cells = by_source(cells, source, data)
    if not cells:
        raise UsageError(
            "no compatible cell of the matrix matches the selection",
            "`imagekit matrix --explain` lists the cells and why some are excluded",
        )
    return data, config, cells


# The resolver settings, shared by `lock` and `build` (which re-locks stale cells): one set, one meaning.
IndexUrlOpt = Annotated[str, typer.Option(metavar="URL", help="Main index (a company proxy/mirror).")]
ExtraIndexOpt = Annotated[list[str] | None, typer.Option(metavar="URL", help="Additional index (repeatable).")]
TorchIndexOpt = Annotated[str, typer.Option(metavar="URL", help="Base of the PyTorch per-variant indexes (+ /cu118).")]
ExcludeNewerOpt = Annotated[
    str | None,
    typer.Option(
        metavar="DATE",
        help="Ignore distributions uploaded after this date (RFC 3339), for reproducible re-resolution.",
    ),
]
ResolverOpt = Annotated[
    str, typer.Option(metavar="uv|pip-tools", help="uv (default) or pip-tools (only where host == image).")
]


def lock_settings(
    index_url: str, extra_index_url: list[str] | None, torch_index_url: str, exclude_newer: str | None, resolver: str
) -> resolution.LockSettings:
    if resolver not in ("uv", "pip-tools"):
        raise UsageError(f"invalid --resolver {resolver!r}", "use uv or pip-tools")
    return resolution.LockSettings(
        index_url=index_url,
        extra_index_urls=tuple(extra_index_url or ()),
        torch_index_base=torch_index_url,
        exclude_newer=exclude_newer,
        resolver=resolver,
    )
