"""Options shared by several commands, each defined once here.

A group (the cell selection, the resolver settings) is a frozen dataclass; a command declares one parameter of its
type and `with_groups` puts the group's options in its place, then hands the command the parsed group (as uv
flattens `IndexArgs` and `ResolverArgs` into each command that takes them). Single shared options are `Annotated`
aliases. A command that can lock takes `ResolverOptions`, so every such command resolves with the same settings.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from imagekit.compat.catalog import CompatData
from imagekit.errors import UsageError
from imagekit.image.image_options import BUILDERS, ImageOptions
from imagekit.locking import resolution
from imagekit.matrix import matrix_file as matrix
from imagekit.oci import publish_formats
from imagekit.trust import untrusted
from imagekit.trust.redact import redact_value

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

# ---- the cell selection: which cells of which matrix -------------------------------------------------------------
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
ReleasePlatformOpt = Annotated[
    str | None,
    typer.Option(
        "--platform",
        metavar="PLATFORM",
        help="Which platform's image of a cell published for several: linux/amd64 (default) or linux/arm64.",
    ),
]
PyOpt = Annotated[
    list[str] | None, typer.Option("--python", metavar="VERSION", help="Python version, e.g. 3.11 (repeatable).")
]
CellOpt = Annotated[list[str] | None, typer.Option("--cell", metavar="CELL", help="Exact cell id (repeatable).")]
PlatformOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--platform",
        metavar="PLATFORM",
        help="Image platform: linux/amd64 or linux/arm64 (repeatable; default: those of the matrix).",
    ),
]
SourceOpt = Annotated[
    str,
    typer.Option(
        "--source",
        metavar="all|pypi|pytorch",
        help="Which cells by where torch comes from: all, pypi (PyPI default variant) or pytorch "
        "(needs the PyTorch index).",
    ),
]


@dataclasses.dataclass(frozen=True)
class Selection:
    """--matrix, --cuda, --torch, --transformers, --python, --cell, --platform, --source."""

    matrix_file: MatrixOpt = None
    cuda: CudaOpt = None
    torch: TorchOpt = None
    transformers: TfOpt = None
    python: PyOpt = None
    cell: CellOpt = None
    platform: PlatformOpt = None
    source: SourceOpt = "all"

    def selector(self) -> matrix.Selector:
        from imagekit.trust import validate

        return matrix.Selector(
            cuda=tuple(validate.cuda(c) for c in self.cuda or ()),
            torch=tuple(self.torch or ()),
            transformers=tuple(self.transformers or ()),
            python=tuple(validate.python(p) for p in self.python or ()),
            ids=tuple(self.cell or ()),
            platforms=tuple(validate.platform(p) for p in self.platform or ()),
        )

    def unknown_cells(self, cells: list[matrix.EvaluatedCell]) -> None:
        """A --cell id that is no cell of the matrix (compatible or not) is a usage error, not an empty pick."""
        known = {c.cell.id for c in cells}
        missing = [c for c in self.cell or () if c not in known]
        if missing:
            raise UsageError(
                f"--cell {untrusted.printable(redact_value(missing[0]), 200)!r} is not a cell of the matrix",
                "`imagekit matrix --explain` lists the cells (ids as cu124-torch2.5.1-py3.11-tf4.48.2)",
            )

    def by_source(self, cells: list[matrix.EvaluatedCell], data: CompatData) -> list[matrix.EvaluatedCell]:
        if self.source not in ("all", "pypi", "pytorch"):
            raise UsageError(f"invalid --source {self.source!r}", "use all, pypi or pytorch")
        if self.source == "all":
            return cells
        want_pypi = self.source == "pypi"
        return [c for c in cells if data.torch_from_pypi(c.cell.torch, c.cell.variant, c.cell.platform) == want_pypi]


# ---- the resolver settings: one set, one meaning, for every command that can lock --------------------------------
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


@dataclasses.dataclass(frozen=True)
class ResolverOptions:
    """--index-url, --extra-index-url, --torch-index-url, --exclude-newer, --resolver."""

    index_url: IndexUrlOpt = resolution.PYPI
    extra_index_url: ExtraIndexOpt = None
    torch_index_url: TorchIndexOpt = resolution.PYTORCH_INDEX
    exclude_newer: ExcludeNewerOpt = None
    resolver: ResolverOpt = "uv"

    def settings(self, config: Any = None) -> resolution.LockSettings:
        """The options, over the matrix file's `[lock]` indexes (``config``): an option given wins."""
        from imagekit.effects import resolver

        index_url = self.index_url
        if index_url == resolution.PYPI and config is not None and config.index_url:
            index_url = config.index_url
        extras = tuple(self.extra_index_url or ()) or (tuple(config.extra_index_urls) if config is not None else ())
        settings = resolution.LockSettings(
            index_url=index_url,
            extra_index_urls=extras,
            torch_index_base=self.torch_index_url,
            exclude_newer=self.exclude_newer,
            resolver=self.resolver,
            project=project_folder(config),
        )
        resolver.for_settings(settings)  # an unknown --resolver is a usage error here, before anything runs
        return settings


def project_folder(config: Any) -> str:
    """The folder of the matrix file (or pyproject.toml) ``config`` was read from: where the project's own wheels
    (`NAME @ file:wheels/...whl`) lie; the current folder for the built-in matrix."""
    origin = getattr(config, "origin", None) or "<default>"
    return "." if origin.startswith("<") else os.path.dirname(origin.removesuffix(" [tool.imagekit]")) or "."


# ---- the image's options: the matrix file's `[image]`, with a command's flags over them ---------------------------
BuilderOpt = Annotated[
    str,
    typer.Option(
        metavar="buildkit|legacy",
        help="buildkit: any BuildKit builder (docker buildx build/bake), wheels bind-mounted from "
        "<cell>/wheels (`imagekit fetch --into DIR`); legacy: the engine's legacy builder, as "
        "`imagekit build` uses it.",
    ),
]
ZstdOpt = Annotated[
    bool,
    typer.Option(
        "--zstd",
        help="With --push: also publish each image with zstd layers as <tag>-zstd and <cell>-zstd (smaller, "
        "faster to unpack; Docker >= 23 and containerd pull it, Docker 20.10 cannot). Same as --variant zstd.",
    ),
]
VariantOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--variant",
        metavar="FORMAT",
        help="With --push: also publish each image in this layer format as <tag>-FORMAT and <cell>-FORMAT, beside "
        "the gzip image (repeatable; formats: " + ", ".join(publish_formats.variants()) + ").",
    ),
]


def image_options(
    config: matrix.MatrixConfig,
    *,
    builder: str | None = None,
    zstd: bool | None = None,
    variants: list[str] | None = None,
) -> ImageOptions:
    """The image's options as one value, from here to the render: the matrix file's `[image]`, with the flags the
    command was given over them (None: not a flag of the command)."""
    if builder is not None and builder not in BUILDERS:
        raise UsageError(f"invalid --builder {builder!r}", "use buildkit or legacy")
    named = [*(variants or []), *(["zstd"] if zstd else [])]
    for name in named:
        publish_formats.variant(name)  # an unknown format is a usage error naming the known ones
    flags = {"builder": builder, "variants": tuple(dict.fromkeys(named)) if named else None}
    return dataclasses.replace(config.options, **{k: v for k, v in flags.items() if v is not None})


# ---- single shared options ---------------------------------------------------------------------------------------
LockDirOpt = Annotated[Path, typer.Option("--lock-dir", metavar="DIR", help="Where lockfiles live.")]
OldLockDirOpt = Annotated[Path | None, typer.Option("--dir", metavar="DIR", hidden=True)]  # `lock --dir`, kept
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout (what the command reports as text).")]
OldIndexOpt = Annotated[str | None, typer.Option("--index", metavar="URL", hidden=True)]  # `compat refresh --index`
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr; only the result.")]
ReleaseIndexOpt = Annotated[
    Path,
    typer.Option(
        "--release-index",
        metavar="FILE",
        help="Release index JSON (tag, digest, manifest, self-test report per published image).",
    ),
]

GROUPS = (Selection, ResolverOptions)


def renamed(new: T, default: T, old: T | None, flag: str, old_flag: str) -> tuple[T, str]:
    """An option given under its name or its older, hidden spelling: (value, the flag the user gave). Both at once
    only when they agree (or the new one is left at its default)."""
    if old is None:
        return new, flag
    if new not in (default, old):
        raise UsageError(f"{old_flag} {old} and {flag} {new} disagree", f"{old_flag} is the older spelling: pass one")
    return old, old_flag


def with_groups(fn: F) -> F:
    """Replace each parameter whose type is an option group by the group's options, in its place; call ``fn`` with
    the group built from them. Typer sees the group's options as the command's own."""
    sig = inspect.signature(fn, eval_str=True)
    params: list[inspect.Parameter] = []
    grouped: dict[str, tuple[type, list[str]]] = {}
    for param in sig.parameters.values():
        group = param.annotation if param.annotation in GROUPS else None
        if group is None:
            params.append(param)
            continue
        names = []
        hints = inspect.get_annotations(group, eval_str=True)
        for f in dataclasses.fields(group):
            params.append(
                inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
            )
            names.append(f.name)
        grouped[param.name] = (group, names)
    taken = [p.name for p in params]
    if len(taken) != len(set(taken)):
        raise TypeError(f"{fn.__name__}: an option group repeats a parameter name ({taken})")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for name, (group, names) in grouped.items():
            kwargs[name] = group(**{n: kwargs.pop(n) for n in names})
        return fn(*args, **kwargs)

    kinds = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
    wrapper.__signature__ = sig.replace(parameters=kinds)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in kinds}
    return wrapper  # type: ignore[return-value]
