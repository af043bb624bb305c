"""The files a user hands in, read through `effects.files` (a FIFO, a folder or a non-UTF-8 file is a usage error,
not a hang): the matrix file. Parsing is the pure core's (`matrix.parse`)."""

from __future__ import annotations

from pathlib import Path

from imagekit import matrix
from imagekit.compat import CompatData
from imagekit.effects.files import read_input
from imagekit.errors import UsageError
from imagekit.matrix import ConfigError, MatrixConfig


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
