"""The files a user hands in, read through `effects.files` (a FIFO, a folder or a non-UTF-8 file is a usage error,
not a hang): the matrix file, and the compatibility data (the curated facts shipped with imagekit, and the user's
refreshed PyPI metadata when it is there). Parsing is the pure core's (`matrix.parse`, `compat.parse`)."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

from imagekit.compat import catalog as compat
from imagekit.compat.catalog import METADATA_FILE, SHIPPED, USER, CompatData
from imagekit.effects.files import read_input
from imagekit.errors import UsageError
from imagekit.image import project_wheel
from imagekit.matrix import matrix_file as matrix
from imagekit.matrix import project_deps
from imagekit.matrix.matrix_file import ConfigError, MatrixConfig

MAX_PROJECT_FILE = 1 << 20  # a requirements file, pyproject.toml or setup.cfg: far below this


def load_matrix(path: Path | None, data: CompatData) -> MatrixConfig:
    """Read --matrix FILE, else ./imagekit.toml, else ./pyproject.toml's [tool.imagekit] when present, else the
    shipped default; with the project's own dependency declaration (`[matrix] requirements`) read again and added
    to every cell."""
    if path is None:
        local = Path(matrix.MATRIX_FILE)
        if local.exists() or local.is_symlink():  # a folder or a dangling link there is an error, not "absent"
            return with_build_backend(with_project(matrix.parse(_read_toml(local), str(local), data), Path("."), data))
        pyproject = Path("pyproject.toml")
        if pyproject.is_file():
            tool = matrix.tool_table(_read_toml(pyproject), str(pyproject))
            if tool is not None:
                return with_build_backend(
                    with_project(matrix.parse(tool, f"{pyproject} [tool.imagekit]", data), Path("."), data)
                )
        return matrix.parse(matrix.default_document(), "<default matrix>", data)
    doc = _read_toml(path)
    if path.name == "pyproject.toml":
        tool = matrix.tool_table(doc, str(path))
        if tool is None:
            raise ConfigError([f"{path}: no [tool.imagekit] table"], "add [tool.imagekit.matrix] to pyproject.toml")
        return with_build_backend(with_project(matrix.parse(tool, f"{path} [tool.imagekit]", data), path.parent, data))
    return with_build_backend(with_project(matrix.parse(doc, str(path), data), path.parent, data))


def with_build_backend(config: MatrixConfig) -> MatrixConfig:
    """`[image] install`: the project's build backend (its `[build-system] requires`, or setuptools' for a setup.py
    alone: image.project_wheel.build_requires) added to every cell's packages, so the lock holds what its wheel is
    built with (the build runs with the network off, from the lock's wheels) without the user naming it."""
    from imagekit.matrix import project_axes

    options = config.options
    if options.install is None or options.copy is None:
        return config
    try:
        system, text = install_build_system(options.copy.source, options.install)
    except UsageError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError([f"{config.origin}: image.install: {exc.message}"], exc.hint) from None
    where = f"{options.install}/pyproject.toml [build-system] requires" if text is not None else options.install
    return project_axes.with_build_requires(config, project_wheel.build_requires(system), where)


def install_build_system(copy_source: str, install: str) -> tuple[project_wheel.BuildSystem, str | None]:
    """`[image] install`'s build system and its pyproject.toml's text (None: a setup.py alone), read from the
    project's folder as another party's files (project_text)."""
    sub = project_wheel.sub_folder(copy_source, install)
    root = Path(copy_source)
    text = project_text(root, posixpath.join(sub, "pyproject.toml"), missing_ok=True)
    files: tuple[tuple[str, bytes, int], ...] = ()
    if text is not None:
        files = (("pyproject.toml", text.encode(), 0o644),)
    elif project_text(root, posixpath.join(sub, "setup.py"), missing_ok=True) is not None:
        files = (("setup.py", b"", 0o644),)
    return project_wheel.build_system(files, install), text


def with_project(config: MatrixConfig, root: Path, data: CompatData) -> MatrixConfig:
    """``config`` with its `[matrix] requirements` declaration (a path relative to ``root``, the matrix file's
    folder) read and added to each cell, its axes checked against it (`matrix.project_axes.apply`)."""
    if config.requirements is None:
        return config
    from packaging.version import Version

    from imagekit.image.buildplan import base_for
    from imagekit.matrix import project_axes
    from imagekit.services.locks import requirement_forms

    python = min((c.python for c in config.cells), key=Version)

    def setup(backend: str) -> project_deps.ProjectDeps:
        from imagekit.services.locks import project_metadata

        base = base_for(python, data, config.bases, config.options)
        return project_metadata.read_setup(root, config.requirements, base, backend, data.bases)

    def setup_name(tree: Path, backend: str) -> str:
        from imagekit.services.locks import project_metadata

        base = base_for(python, data, config.bases, config.options)
        return project_metadata.read_name(tree, base, backend, data.bases)

    try:
        deps = read_project(root, config.requirements, setup, setup_name)
        config = requirement_forms.apply(config, deps, root)
    except UsageError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError([f"{config.origin}: matrix.requirements: {exc.message}"], exc.hint) from None
    return project_axes.apply(config, deps, data)


def read_project(
    root: Path,
    source: project_deps.DepsSource,
    setup: Callable[[str], project_deps.ProjectDeps],
    setup_name: Callable[[Path, str], str] | None = None,
) -> project_deps.ProjectDeps:
    """The declaration ``source`` names under ``root``: a requirements file and its includes, pyproject.toml's
    [project] table, or (``setup(backend)``: in a container, never here) what a setup.py's build backend answers;
    a VCS line without a name named from its commit (``setup_name(tree, backend)``: its setup.py's hook, in a
    container); less what its ``without`` leaves out."""
    from imagekit.services.locks import requirement_forms

    deps = requirement_forms.named(_read_declaration(root, source, setup), setup_name)
    return project_deps.leave_out(dataclasses.replace(deps, source=source))


def _read_declaration(
    root: Path, source: project_deps.DepsSource, setup: Callable[[str], project_deps.ProjectDeps]
) -> project_deps.ProjectDeps:
    if source.kind == project_deps.REQUIREMENTS:
        return project_deps.read_requirements(source.file, lambda rel: project_text(root, rel) or "")
    if source.kind == project_deps.PYPROJECT:
        text = project_text(root, source.file) or ""
        try:
            return project_deps.from_pyproject(text, source)
        except project_deps.NeedsBackend as exc:
            return setup(exc.backend)
    project_text(root, source.file)  # there, inside the project, and a regular file
    beside = posixpath.join(source.folder, "pyproject.toml")
    text = project_text(root, beside, missing_ok=True)
    return setup(project_deps.backend_of(text, beside) if text is not None else project_deps.LEGACY_BACKEND)


def project_text(root: Path, rel: str, *, missing_ok: bool = False) -> str | None:
    """A file of the project, as another party wrote it: inside ``root`` with its links resolved, a regular file,
    at most MAX_PROJECT_FILE bytes, UTF-8. ``missing_ok``: None when it is not there."""
    from imagekit.effects import foreign_files
    from imagekit.trust.untrusted import printable

    path = root / rel
    shown = printable(rel, 300)
    hint = f"name a file of the project (the matrix file's folder, {root})"
    try:
        there = os.path.lexists(path)
    except ValueError:  # a NUL
        there = False
    if not there:
        if missing_ok:
            return None
        raise UsageError(f"{shown}: no such file in the project", hint)
    real = foreign_files.inside(root, path)
    if real is None:
        raise UsageError(
            f"{shown} leads out of the project through a link (it is {printable(str(path.resolve()), 300)})",
            "copy the file into the project itself (replace the link by the file)",
        )
    try:
        data = foreign_files.read_bytes(real, MAX_PROJECT_FILE)
    except foreign_files.Refused as exc:
        raise UsageError(f"{shown}: it {exc.why}", hint) from None
    try:
        return data.decode("utf-8").replace("\r\n", "\n")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{shown} is not UTF-8 text ({exc.reason} at byte {exc.start})", "save it as UTF-8") from None


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
