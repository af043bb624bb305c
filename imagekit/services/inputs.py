"""The files a user hands in, read through `effects.files` (a FIFO, a folder or a non-UTF-8 file is a usage error,
not a hang): the matrix file, and the compatibility data (the curated facts shipped with imagekit, and the user's
refreshed PyPI metadata when it is there). Parsing is the pure core's (`matrix.parse`, `compat.parse`)."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

from imagekit.compat import catalog as compat
from imagekit.compat.catalog import METADATA_FILE, SHIPPED, USER, CompatData
from imagekit.effects.files import read_input
from imagekit.errors import UsageError
from imagekit.matrix import matrix_file as matrix
from imagekit.matrix.matrix_file import ConfigError, MatrixConfig


def load_matrix(path: Path | None, data: CompatData) -> MatrixConfig:
    """Read --matrix FILE, else ./imagekit.toml, else ./pyproject.toml's [tool.imagekit] when present, else the
    shipped default."""
    if path is None:
        local = Path(matrix.MATRIX_FILE)
        if local.exists() or local.is_symlink():  # a folder or a dangling link there is an error, not "absent"
            return matrix.parse(_read_toml(local), str(local), data)
        pyproject = Path("pyproject.toml")
        if pyproject.is_file():
            tool = matrix.tool_table(_read_toml(pyproject), str(pyproject))
            if tool is not None:
                return matrix.parse(tool, f"{pyproject} [tool.imagekit]", data)
        return matrix.parse(matrix.default_document(), "<default matrix>", data)
    doc = _read_toml(path)
    if path.name == "pyproject.toml":
        tool = matrix.tool_table(doc, str(path))
        if tool is None:
            raise ConfigError([f"{path}: no [tool.imagekit] table"], "add [tool.imagekit.matrix] to pyproject.toml")
        return matrix.parse(tool, f"{path} [tool.imagekit]", data)
    return matrix.parse(doc, str(path), data)


def _read_toml(path: Path) -> dict:
    try:
        text = read_input(path, "matrix file", "pass a readable TOML file to --matrix")
    except UsageError as exc:
        if "UTF-8" in exc.message:
            raise ConfigError([exc.message], "save it as UTF-8") from None
        raise
    return matrix.parse_text(text or "", str(path))


def read_user_metadata(path: Path, hint: str | None = None) -> dict | None:
    """The user's refreshed metadata (or another metadata file, with its own ``hint``): None when absent; a
    UsageError (exit 2) when it is there but unusable."""
    hint = hint or (
        f"run `imagekit compat refresh` to write it again, or delete {path} to use the data shipped with imagekit"
    )
    text = read_input(path, "compatibility data", hint, missing_ok=True)  # a FIFO or a folder there: refused
    return None if text is None else compat.parse_user_metadata(text, path, hint)


def choose_metadata(path: Path | None) -> tuple[dict, str, str, str | None]:
    """(metadata document, its path, "user" or "shipped", why a user file was passed over)."""
    shipped = compat.shipped_metadata()
    doc = read_user_metadata(path) if path is not None else None
    if doc is None or path is None:
        return shipped, compat.shipped_path(METADATA_FILE), SHIPPED, None
    why = compat.floor_problem(doc, shipped)
    if why:
        return shipped, compat.shipped_path(METADATA_FILE), SHIPPED, f"{path}: {why}"
    return doc, str(path), USER, None


def compat_data() -> CompatData:
    """The compatibility data: the curated facts shipped with imagekit, and the user's refreshed PyPI metadata when
    it is there and valid (else the shipped metadata). Cached per state of the user file."""
    path = compat.user_metadata_path()
    try:
        st = path.stat() if path is not None else None
    except OSError:
        st = None
    if path is None or st is None:  # no user file: one cache entry whatever the path (tests change HOME often)
        return _compat_data(None, None)
    return _compat_data(str(path), (st.st_mtime_ns, st.st_size))


@cache
def _compat_data(path: str | None, _signature: tuple[int, int] | None) -> CompatData:
    curated = compat.curated_document()
    metadata, where, origin, passed_over = choose_metadata(Path(path) if path is not None else None)
    if passed_over:  # an older copy (imagekit was upgraded since the refresh): the shipped data is newer
        sys.stderr.write(
            f"warning: not using {passed_over}; using the shipped data\n"
            "hint: run `imagekit compat refresh` to update it, or delete it\n"
        )
    return compat.parse(
        curated,
        metadata,
        curated_path=compat.shipped_path(compat.CURATED_FILE),
        metadata_path=where,
        metadata_origin=origin,
    )
