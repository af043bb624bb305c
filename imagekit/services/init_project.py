"""`imagekit init` as a use case: the axes chosen and checked, the commented matrix written (imagekit.toml, or
pyproject.toml's [tool.imagekit]), and what to run next said."""

from __future__ import annotations

import os
import shlex
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from imagekit.compat import catalog as compat
from imagekit.effects.files import read_input, write_atomic
from imagekit.errors import UsageError
from imagekit.locking import debs, direct_wheels
from imagekit.matrix import init_document, project_axes, project_deps
from imagekit.matrix import matrix_file as matrix
from imagekit.matrix.project_deps import DepsSource
from imagekit.services import inputs
from imagekit.services.locks import init_axes
from imagekit.trust import untrusted, validate

# A small matrix from the shipped default's own axes (imagekit/data/default-matrix.toml): two torch releases on
# two CUDA variants; the rules keep the pairs torch publishes wheels for, `imagekit matrix --explain` shows the rest.
DEFAULT_AXES: dict[str, tuple[str, ...]] = {
    "cuda": ("12.4", "12.8"),
    "torch": ("2.5.1", "2.8.0"),
    "transformers": ("4.48.2",),
    "python": ("3.11",),
}
DEFAULT_PACKAGES = ("accelerate==1.2.1",)
EXAMPLES = {  # for the hint of a refused value
    "--cuda": "12.4",
    "--torch": "2.5.1",
    "--transformers": "4.48.2",
    "--python": "3.11",
    "--package": "peft",
    "--repository": "ghcr.io/acme/train",
}
NEXT = (
    ("imagekit matrix --explain", "the cells, and why the rules exclude some"),
    ("imagekit lock", "hash-lock each compatible cell into lockfiles/"),
    ("imagekit build --dry-run", "what a build would do, before building"),
)


def _toml(value: str) -> str:
    return project_deps.toml_string(value)


document = init_document.document


@dataclass(frozen=True)
class InitRequest:
    """What `imagekit init` was asked: the axes and packages (None: not given), the output and the project's own
    dependency file with its groups."""

    cuda: list[str] | None = None
    torch: list[str] | None = None
    transformers: list[str] | None = None
    python: list[str] | None = None
    package: list[str] | None = None
    repository: str | None = None
    apt: list[str] | None = None
    out: Path | None = None
    pyproject: bool = False
    from_file: Path | None = None
    extra: list[str] | None = None
    without: list[str] | None = None
    force: bool = False


def target_of(request: InitRequest) -> Path:
    """The file init writes."""
    if request.out is not None:
        return request.out
    return Path("pyproject.toml" if request.pyproject else matrix.MATRIX_FILE)


def init(request: InitRequest, say: Callable[[str], None]) -> None:
    """Write the matrix file ``request`` asks for, checked first (at least one compatible cell), atomically; ``say``
    prints a line for the user."""
    r = request
    cuda, torch, transformers, python, package = r.cuda, r.torch, r.transformers, r.python, r.package
    repository, apt, pyproject, from_file, extra, without, force = (
        r.repository, r.apt, r.pyproject, r.from_file, r.extra, r.without, r.force
    )  # fmt: skip
    data = inputs.compat_data()
    axes = {
        axis: _axis(values, axis) for axis, values in zip(matrix.AXES, (cuda, torch, transformers, python), strict=True)
    }
    if cuda and not torch:  # the newest torch built for each CUDA asked for, not the default pair
        axes["torch"] = torch_for(axes["cuda"], data) or axes["torch"]
    own = tuple(dict.fromkeys(_valid("--package", direct_wheels.requirement, p) for p in package or ()))
    names = {validate.requirement_name(p) for p in own}
    packages = tuple(p for p in DEFAULT_PACKAGES if validate.requirement_name(p) not in names) + own
    repo = _valid("--repository", validate.repository, repository or matrix.DEFAULT_REPOSITORY)
    debs_ = tuple(dict.fromkeys(_valid("--apt", _deb_name, a) for a in apt or ()))
    unbased = [p for p in axes["python"] if p not in data.bases]
    if unbased:
        raise UsageError(
            f"no base image known for Python {', '.join(unbased)}",
            f'pick from {", ".join(sorted(data.bases))}, or add a [bases."X.Y"] table to the file by hand',
        )

    target = target_of(r)
    declared = None
    if from_file is not None:
        given = dict(zip(matrix.AXES, (cuda, torch, transformers, python), strict=True))
        chosen = (tuple(extra or ()), tuple(without or ()))
        declared, axes = from_declaration(from_file, chosen, target, axes, given, data)
        _not_over_the_declaration(target, declared, pyproject)
        packages = own  # the declaration is the list: the default packages are not added to it
    elif extra or without:
        raise UsageError(
            f"{'--extra' if extra else '--without'} chooses from the file --from names",
            "add --from FILE (pyproject.toml or setup.py for --extra)",
        )
    if pyproject:
        if target.name != "pyproject.toml":
            raise UsageError(
                f"--pyproject appends to a pyproject.toml, not {target}", "drop --out, or drop --pyproject"
            )
        section = document(
            axes, packages, repo, table="tool.imagekit.", apt=debs_, requirements=_source(declared),
            install=_install(declared),
        )  # fmt: skip
        _inside_the_project(target)
        text = _pyproject_with(target, section)
        origin = f"{target} [tool.imagekit]"
    else:
        if (target.exists() or target.is_symlink()) and not force:
            raise UsageError(f"{target} exists", "pass --force to replace it, or --out FILE to write elsewhere")
        text = document(axes, packages, repo, apt=debs_, requirements=_source(declared), install=_install(declared))
        origin = str(target)
    doc = tomllib.loads(text)
    checked = f"{origin} (not written)"  # an unknown version or an all-excluded matrix leaves the file alone
    cells, compatible = _check(doc["tool"]["imagekit"] if pyproject else doc, checked, data, declared)
    mode = target.stat().st_mode & 0o777 if pyproject else 0o644
    write_atomic(target.resolve() if pyproject else target, text, mode)
    _report(target, origin, cells, compatible, say, declared, axes["python"])
    if repository is None:
        say(
            f"note: no --repository: `imagekit build --push` publishes to {matrix.DEFAULT_REPOSITORY}, the local "
            "demo registry (`make registry` starts one); give --repository REG/REPO (e.g. ghcr.io/acme/train), "
            f"or edit [image] repository in {origin}",
        )


def from_declaration(
    path: Path,
    chosen: tuple[tuple[str, ...], tuple[str, ...]],
    target: Path,
    axes: dict[str, tuple[str, ...]],
    given: dict[str, list[str] | None],
    data: compat.CompatData,
) -> tuple[project_deps.ProjectDeps, dict[str, tuple[str, ...]]]:
    """The declaration ``--from`` names (inside the project: the folder of the file init writes), with the groups
    and the names left out ``chosen`` (--extra, --without), read as every command will read it, and the axes it asks
    for (``axes``: the flags' values and the defaults)."""
    root = Path(os.path.abspath(target)).parent
    where = Path(os.path.abspath(path))
    if not where.is_relative_to(root):
        raise UsageError(
            f"--from {path} is outside the project ({root}, the folder of {target})",
            "run `imagekit init` in the project's folder, or write the matrix file beside the project (--out)",
        )
    try:
        extras, without = chosen  # --extra groups, and --without names
        source = project_deps.source_of(
            {"file": where.relative_to(root).as_posix(), "extras": list(extras), "without": list(without)}
        )
    except UsageError as exc:
        raise UsageError(f"--from {path}: {exc.message}", exc.hint) from None
    flags = {a: axes[a] for a in matrix.AXES if given[a]}
    defaults = dict(DEFAULT_AXES, torch=axes["torch"]) if given["cuda"] else DEFAULT_AXES
    python = (flags.get("python") or DEFAULT_AXES["python"])[0]

    def setup(backend: str) -> project_deps.ProjectDeps:
        from imagekit.image.buildplan import base_for
        from imagekit.image.image_options import ImageOptions
        from imagekit.services.locks import project_metadata

        base = base_for(python, data, {}, ImageOptions())
        return project_metadata.read_setup(root, source, base, backend, data.bases)

    def setup_name(tree: Path, backend: str) -> str:
        from imagekit.image.buildplan import base_for
        from imagekit.image.image_options import ImageOptions
        from imagekit.services.locks import project_metadata

        return project_metadata.read_name(tree, base_for(python, data, {}, ImageOptions()), backend, data.bases)

    declared = inputs.read_project(root, source, setup, setup_name)
    derived = project_axes.derive(declared, flags, defaults, data)
    values, notes = init_axes.settle(dict(derived.values), declared, data, bool(given["transformers"]), defaults)
    picked = any(n.startswith("transformers ") for n in notes)  # the resolver's choice replaces derive's note
    kept = [n for n in derived.notes if not (picked and n.startswith("transformers "))]
    return replace(declared, notes=(*declared.notes, *kept, *notes)), values


def _not_over_the_declaration(target: Path, declared: project_deps.ProjectDeps, pyproject: bool) -> None:
    """Refuses a matrix file written over the file ``--from`` reads (or one it includes): that would replace the
    project's own list (``--pyproject`` adds a table to pyproject.toml instead, keeping the rest)."""
    out = os.path.abspath(target)
    root = os.path.dirname(out)
    if pyproject or not any(os.path.abspath(os.path.join(root, f)) == out for f in declared.files):
        return
    raise UsageError(
        f"--out {target} is a file of the project's own dependency list ({declared.source.file} reads it): "
        "the matrix would replace it",
        "write the matrix beside it (imagekit.toml, the default), or into pyproject.toml's [tool.imagekit] with "
        "--pyproject",
    )


def _source(declared: project_deps.ProjectDeps | None) -> DepsSource | None:
    return declared.source if declared is not None else None


def _install(declared: project_deps.ProjectDeps | None) -> str | None:
    """The folder the file's `.` / `-e ./sub` line installs (the matrix file beside the project: the same path); a
    second, other one is refused by every command that reads the matrix, naming both."""
    return declared.local[0].folder if declared is not None and declared.local else None


def torch_for(cudas: tuple[str, ...], data: compat.CompatData) -> tuple[str, ...]:
    """The newest torch release with a wheel variant for each of ``cudas`` (``13.2``: torch 2.15.0's cu132), as the
    compatibility data knows them; a CUDA no torch is built for adds nothing (the check then says why)."""
    from packaging.version import Version

    from imagekit.errors import UnknownVersionError
    from imagekit.model import variant_of

    picked = []
    for cuda in cudas:
        for release in reversed(data.releases("torch")):
            if Version(release).is_prerelease:
                continue
            try:
                if variant_of(cuda) in data.torch_minor(release).variants:
                    picked.append(release)
                    break
            except UnknownVersionError:
                continue
    return tuple(sorted(set(picked), key=Version))


def _valid(flag: str, check: Callable[[str], str], value: str) -> str:
    try:
        return check(value)
    except UsageError as exc:
        raise UsageError(exc.message, exc.hint or f"for example {flag} {EXAMPLES[flag]}") from None


def _deb_name(value: str) -> str:
    if debs.package_name(value) is None:
        raise UsageError(f"--apt {value!r} is not a Debian package name", debs.REQUEST_HINT)
    return value


def _axis(values: list[str] | None, axis: str) -> tuple[str, ...]:
    if not values:
        return DEFAULT_AXES[axis]
    check = matrix.VALIDATORS[axis]
    return tuple(dict.fromkeys(_valid(f"--{axis}", check, v) for v in values))


def _check(
    doc: dict, origin: str, data: compat.CompatData, declared: project_deps.ProjectDeps | None = None
) -> tuple[int, int]:
    """(cells, compatible cells) of the document, with the project's declaration added to each cell; a conflict
    with it, unknown versions and an all-excluded matrix are usage errors."""
    config = matrix.parse(doc, origin, data)
    if declared is not None:
        from imagekit.services.locks import requirement_forms

        config = requirement_forms.apply(config, declared, Path(os.path.abspath(origin.split(" [")[0])).parent)
        config = project_axes.apply(config, declared, data)
    evaluated = matrix.evaluate(config, data)  # UnknownVersionError (exit 2) names each version it does not know
    compatible = [e for e in evaluated if e.verdict.compatible]
    if not compatible:
        reasons = [f"{e.cell.id}: " + "; ".join(v.message for v in e.verdict.violations) for e in evaluated]
        raise UsageError(
            f"{origin}: no cell of this matrix is compatible:\n  " + "\n  ".join(reasons),
            "pick versions that go together: `imagekit explain --cuda X --torch Y` says why a pair is excluded, "
            "and the README's compatibility grid lists the pairs torch has wheels for",
        )
    return len(evaluated), len(compatible)


def _inside_the_project(path: Path) -> None:
    """pyproject.toml is written where its links lead (it keeps its mode and its link): never out of the project
    (the folder it is named in), where a link planted in a cloned repository would have init write another file."""
    from imagekit.effects.foreign_files import inside

    root = Path(os.path.abspath(path)).parent
    if (path.exists() or path.is_symlink()) and inside(root, path) is None:
        raise UsageError(
            f"{path} is a link that leads out of the project ({root}): init would write where it leads",
            "replace the link by the file itself, or drop --pyproject to write imagekit.toml",
        )


def _pyproject_with(path: Path, section: str) -> str:
    """pyproject.toml's text with ``section`` appended; refused when it has a [tool.imagekit] already."""
    hint = "run `imagekit init --pyproject` in your project's folder, or drop --pyproject to write imagekit.toml"
    text = read_input(path, "pyproject file", hint) or ""
    try:
        doc = untrusted.load_toml(text, str(path))
    except untrusted.UntrustedData as exc:
        raise UsageError(str(exc), "fix its syntax first") from None
    tool = doc.get("tool")
    if isinstance(tool, dict) and "imagekit" in tool:
        raise UsageError(
            f"{path} already has a [tool.imagekit] section",
            "edit it in place (`imagekit matrix --help` shows the keys), or drop --pyproject to write imagekit.toml",
        )
    kept = text.rstrip("\n")
    joined = (kept + "\n\n" if kept else "") + section
    try:
        untrusted.load_toml(joined, str(path))
    except untrusted.UntrustedData as exc:  # e.g. `tool = {...}` written as an inline table
        raise UsageError(
            f"{path}: a [tool.imagekit] section cannot be added to it ({exc})", "write imagekit.toml"
        ) from None
    return joined


def _report(
    target: Path,
    origin: str,
    cells: int,
    compatible: int,
    say: Callable[[str], None],
    declared: project_deps.ProjectDeps | None = None,
    pythons: tuple[str, ...] = (),
) -> None:
    from packaging.version import Version

    excluded = cells - compatible
    summary = f"{cells} cell(s), {compatible} compatible" + (
        f" ({excluded} excluded by the rules: `imagekit matrix --explain` says why)" if excluded else ""
    )
    say(f"wrote {origin}: {summary}")
    if declared is not None:
        python = min(pythons, key=Version)
        wanted = {i.name for i in project_axes.for_env(declared, python) if not i.constraint}
        say(
            f"requirements: {_shown(declared.source.file)} ({len(wanted)} distribution(s) for Python {python}"
            + (f", groups {', '.join(declared.extras)}" if declared.extras else "")
            + f"), read again by every command; {len(declared.files)} file(s) read"
        )
        for note in declared.notes:
            say(f"note: {_shown(note)}")
    found = _read_by_default()
    flag = ""
    if found is None or not _same(found, target):
        flag = f" --matrix {shlex.quote(str(target))}"
        if found is not None:
            say(f"note: without --matrix, commands run here read ./{found} first")
    say("next:")
    width = max(len(cmd + flag) for cmd, _ in NEXT)
    for cmd, why in NEXT:
        say(f"  {cmd + flag:<{width}}   # {why}")


def _shown(text: str) -> str:
    """What a note quotes of the project's files, as the terminal may show it: credentials in URLs taken out, escape
    sequences and control characters removed, one bounded line."""
    from imagekit.trust.redact import redact_value

    return untrusted.printable(redact_value(text), 1000)


def _read_by_default() -> Path | None:
    """The file `--matrix`-less commands run here read (as `inputs.load_matrix`), or None: the shipped default."""
    local, pyproject = Path(matrix.MATRIX_FILE), Path("pyproject.toml")
    if local.exists() or local.is_symlink():
        return local
    if not pyproject.is_file():
        return None
    try:
        tool = untrusted.load_toml(pyproject.read_text(encoding="utf-8"), "pyproject.toml").get("tool")
    except (OSError, UnicodeDecodeError, untrusted.UntrustedData):
        return None
    return pyproject if isinstance(tool, dict) and "imagekit" in tool else None


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False
