"""What a requirements file's pip forms become in the matrix (imagekit.matrix.line_forms reads them): its
`--index-url` / `--extra-index-url` lines the lock's indexes, its `.` / `-e ./sub` lines `[image] install`, and the
name of a VCS line without `#egg=`, read from its commit's metadata."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
import re
import tarfile
import tempfile
from collections.abc import Callable
from configparser import ConfigParser
from configparser import Error as IniError
from pathlib import Path

from packaging.utils import canonicalize_name

from imagekit.errors import UsageError
from imagekit.image import project_wheel
from imagekit.matrix import project_deps
from imagekit.matrix.matrix_file import MatrixConfig
from imagekit.matrix.project_deps import Declared, ProjectDeps
from imagekit.trust import untrusted
from imagekit.trust.redact import redact_value

NAME_FILE_LIMIT = 1 << 20
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", re.ASCII)


def apply(config: MatrixConfig, deps: ProjectDeps, root: Path) -> MatrixConfig:
    """``config`` with the indexes and the folder to install that ``deps``' requirements files name."""
    return _install(_indexes(config, deps), deps, root)


def _indexes(config: MatrixConfig, deps: ProjectDeps) -> MatrixConfig:
    for ix in deps.indexes:
        if ix.main:
            if config.index_url not in (None, ix.url):
                raise UsageError(
                    f"{ix.where}: --index-url {redact_value(ix.url)} replaces the main index, which [lock] index_url "
                    f"names as {redact_value(config.index_url or '')}",
                    "name the main index once: drop one of the two, or make the other an --extra-index-url",
                )
            config = dataclasses.replace(config, index_url=ix.url)
        elif ix.url not in config.extra_index_urls and ix.url != config.index_url:
            config = dataclasses.replace(config, extra_index_urls=(*config.extra_index_urls, ix.url))
    return config


def _install(config: MatrixConfig, deps: ProjectDeps, root: Path) -> MatrixConfig:
    """Each `.` / `-e ./sub` line as `[image] install` of that folder: one the matrix file names already, else set
    when `[image] copy` copies it; refused with the keys to add otherwise."""
    for loc in deps.local:
        shown = untrusted.printable(loc.folder, 200)
        _a_package(root, loc.folder, loc.where)
        target = posixpath.normpath(posixpath.join(str(root), loc.folder))
        options = config.options
        if options.install is not None:
            if os.path.abspath(options.install) != os.path.abspath(target):
                raise UsageError(
                    f"{loc.where}: {shown} installs another folder than [image] install "
                    f"({untrusted.printable(options.install, 200)})",
                    "an image installs one package of the project: make the line and [image] install name one folder",
                )
            continue
        keys = f'[image] copy = "." and install = {project_deps.toml_string(loc.folder)}'
        if options.copy is None:
            raise UsageError(
                f"{loc.where}: {shown} installs the project's own code, which the image does not copy",
                f"add {keys} to the matrix file: the package is built into a wheel from the copied code and installed",
            )
        try:
            project_wheel.sub_folder(options.copy.source, target)
        except UsageError as exc:
            raise UsageError(f"{loc.where}: {shown}: {exc.message}", f"{exc.hint}; or set {keys}") from None
        config = dataclasses.replace(config, options=dataclasses.replace(options, install=target))
    return config


def _a_package(root: Path, folder: str, where: str) -> None:
    """``folder`` is a folder inside the project (its links resolved) holding a package pip would install."""
    from imagekit.effects import foreign_files

    shown = untrusted.printable(folder, 200)
    path = root / folder
    if not os.path.lexists(path):
        raise UsageError(f"{where}: {shown}: no such folder in the project", "name a folder of the project")
    real = foreign_files.inside(root, path)
    if real is None:
        raise UsageError(
            f"{where}: {shown} leads out of the project through a link",
            "install a folder of the project itself (replace the link by the folder)",
        )
    if not real.is_dir():
        raise UsageError(f"{where}: {shown} is not a folder", "name the package's folder (its pyproject.toml's)")
    if not any(os.path.isfile(real / f) and not os.path.islink(real / f) for f in ("pyproject.toml", "setup.py")):
        raise UsageError(
            f"{where}: {shown} holds no pyproject.toml or setup.py: nothing pip would install",
            "name the folder of the package's pyproject.toml",
        )


# ---- VCS lines without a name ------------------------------------------------------------------------------------
SetupName = Callable[[Path, str], str]  # (a source tree, its build backend) -> the Name its setup.py's hook states


def named(deps: ProjectDeps, setup_name: SetupName | None = None) -> ProjectDeps:
    """``deps`` with each VCS line without a name read as ``name @ url``, the name from its commit's pyproject.toml
    (or setup.cfg; else, with ``setup_name``, what setuptools' hook says in a container); a branch or no ref is
    refused with the commit it names today, as for a named one."""
    if not deps.nameless:
        return deps
    declared = list(deps.declared)
    for line in deps.nameless:
        name = _name_of(line.url, line.where, setup_name)
        text = f"{name} @ {line.url}" + (f" ; {line.marker}" if line.marker else "")
        declared.append(Declared(project_deps.checked_requirement(text, line.where), line.where))
    note = "named from each commit's metadata: " + ", ".join(untrusted.printable(n.url, 120) for n in deps.nameless)
    return dataclasses.replace(deps, declared=tuple(declared), nameless=(), notes=(*deps.notes, note))


def _name_of(url: str, where: str, setup_name: SetupName | None) -> str:
    from imagekit.effects import git
    from imagekit.effects.cache import cache_root
    from imagekit.locking import vcs_refs

    ref = vcs_refs.parse("(unnamed)", url)
    if not ref.pinned:
        commit = git.ls_remote(ref)
        said = "names no commit: the default branch (HEAD)" if ref.ref == "HEAD" else f"{ref.ref!r} is a branch or tag"
        if commit is None:
            raise UsageError(f"{where}: {ref.url}: the repository names no ref {ref.ref!r}", vcs_refs.HINT)
        raise UsageError(  # the line as the file writes it (`repo.git`, not `repo.git@HEAD`)
            f"{where}: {untrusted.printable(url, 300)}: {said}, which may move; today it names commit {commit}",
            f"pin it: `{ref.at(commit).url}` (the name is then read from that commit)",
        )
    memo = cache_root() / "vcs-names" / hashlib.sha256(ref.url.encode()).hexdigest()
    try:
        from imagekit.effects import foreign_files

        kept = foreign_files.read_bytes(memo, 256).decode("ascii", "replace").strip()
        if _NAME.fullmatch(kept):
            return kept
    except (foreign_files.Refused, OSError):
        pass
    with tempfile.TemporaryDirectory(prefix="imagekit-vcs-name-") as tmp:
        archive = git.archive(ref, "unnamed", Path(tmp))
        top, what = f"unnamed-{ref.ref[:12]}", f"{where}: {ref.url}"
        name = name_in_archive(archive, top, what, setup_name is not None)
        if name is None and setup_name is not None:
            name = _name_from_setup(archive, top, what, setup_name)
    memo.parent.mkdir(parents=True, exist_ok=True)
    staged = memo.with_name(f".{memo.name}.{os.getpid()}")
    staged.write_text(name + "\n")
    os.replace(staged, memo)
    return name


def name_in_archive(archive: Path, top: str, what: str, setup_next: bool = False) -> str | None:
    """The distribution name a source tree's metadata states: pyproject.toml's ``[project] name`` (static by PEP 621),
    else setup.cfg's ``[metadata] name``; None when only setup.py (a program) can say it and ``setup_next`` (it is
    then asked), else refused."""
    files = {}
    with tarfile.open(archive) as tf:
        for rel in ("pyproject.toml", "setup.cfg"):
            try:
                member = tf.getmember(f"{top}/{rel}")
            except KeyError:
                continue
            if member.isfile() and member.size <= NAME_FILE_LIMIT and (fh := tf.extractfile(member)) is not None:
                files[rel] = fh.read(NAME_FILE_LIMIT).decode("utf-8", "replace")
    name = None
    if "pyproject.toml" in files:
        try:
            project = untrusted.load_toml(files["pyproject.toml"], "pyproject.toml").get("project")
        except untrusted.UntrustedData:
            project = None
        name = project.get("name") if isinstance(project, dict) else None
    if name is None and "setup.cfg" in files:
        parser = ConfigParser(interpolation=None)
        try:
            parser.read_string(files["setup.cfg"])
            name = parser.get("metadata", "name", fallback=None)
        except IniError:
            name = None
    if (not isinstance(name, str) or not _NAME.fullmatch(name)) and setup_next and _has(archive, f"{top}/setup.py"):
        return None
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UsageError(
            f"{what}: its commit states no name imagekit can read (pyproject.toml [project] name, setup.cfg "
            "[metadata] name; setup.py is a program, not run here)",
            "name the package on the line: append #egg=NAME, or write `NAME @ git+https://...@<commit>`",
        )
    return canonicalize_name(name)


def _has(archive: Path, member: str) -> bool:
    with tarfile.open(archive) as tf:
        try:
            return tf.getmember(member).isfile()
        except KeyError:
            return False


def _name_from_setup(archive: Path, top: str, what: str, setup_name: SetupName) -> str:
    """The tree unpacked (regular files and folders only: git's archive of a commit, its links checked) and its
    setup.py's hook asked for the name, in a container."""
    with tempfile.TemporaryDirectory(prefix="imagekit-vcs-tree-") as tmp:
        with tarfile.open(archive) as tf:
            tf.extractall(tmp, members=[m for m in tf if m.isfile() or m.isdir()], filter="data")
        tree = Path(tmp) / top
        pyproject = tree / "pyproject.toml"
        text = pyproject.read_text("utf-8", "replace") if pyproject.is_file() else None
        backend = project_deps.backend_of(text, "pyproject.toml") if text is not None else project_deps.LEGACY_BACKEND
        try:
            name = setup_name(tree, backend)
        except UsageError as exc:
            raise UsageError(f"{what}: {exc.message}", exc.hint) from None
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"{what}: its setup.py states no name ({untrusted.printable(name, 80)!r})",
            "name the package on the line: append #egg=NAME, or write `NAME @ git+https://...@<commit>`",
        )
    return canonicalize_name(name)
