"""A project's own dependency declaration (`[matrix] requirements`), read as written: requirements files with their
`-r`/`-c` includes, pyproject.toml's `[project]` table, or what a setup.py/setup.cfg's build backend answers. Pure:
the files come in through a reader, the backend's answer as text (services/locks/project_metadata.py runs it)."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from imagekit.errors import UsageError
from imagekit.locking import direct_wheels
from imagekit.matrix import line_forms
from imagekit.trust import untrusted
from imagekit.trust.redact import redact_value

REQUIREMENTS, PYPROJECT, SETUP = "requirements", "pyproject", "setup"
SETUP_FILES = ("setup.py", "setup.cfg")
LEGACY_BACKEND = "setuptools.build_meta:__legacy__"  # what pip and uv run for a project that names no backend
MAX_FILES = 100  # requirements files one declaration may include
MAX_LINES = 5000
MAX_LINE = 1 << 16  # characters of one line, continuations joined (pip's option parser is quadratic past that)
_EXTRA = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", re.ASCII)
_COMMENT = re.compile(r"(^|\s+)#.*$")
_WHOLE_COMMENT = re.compile(r"\s*#")  # pip's COMMENT_RE.match: a line that is only a comment
_OPTION = re.compile(r"\s--?[A-Za-z]")  # where a requirement line's own options (--hash=...) start
_INDEX_OPTIONS = ("-i", "--index-url", "--extra-index-url")
_EDITABLE = ("-e", "--editable")
_FIND_LINKS = (
    "a page or folder of links is no index a lock can record: serve the wheels from a package index and name it "
    "(`--extra-index-url URL` in the file, or [lock] extra_index_urls), or name each wheel by URL with its sha256 "
    "(`name @ https://.../name-VERSION-TAGS.whl#sha256=...`), or commit it (`name @ file:wheels/NAME-...whl`)"
)
_REFUSED_OPTIONS = {
    "-f": _FIND_LINKS,
    "--find-links": _FIND_LINKS,
    "--no-index": "imagekit resolves against the indexes the matrix file names ([lock] index_url)",
    "--trusted-host": "imagekit talks to indexes over HTTPS only",
    "--no-binary": "images install wheels only (a source build is refused at lock time)",
    "--pre": "imagekit's lock takes a pre-release only where a requirement names one: pin it (`name==2.0rc1`)",
}
_IGNORED_OPTIONS = ("--prefer-binary", "--only-binary", "--require-hashes", "--use-feature")
HINT = "`imagekit matrix --help` shows what [matrix] requirements reads; docs/your-project.md explains each case"


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string. A JSON string with its non-ASCII characters as they are: JSON's escape of a
    character beyond U+FFFF is a pair of surrogates, which TOML refuses (a file name with an emoji would make the
    matrix file unreadable)."""
    import json

    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class DepsSource:
    """`[matrix] requirements`: the file (relative to the matrix file's folder, inside it), the optional-dependency
    groups chosen (pyproject.toml, setup.py, setup.cfg) and how it is read."""

    file: str
    extras: tuple[str, ...] = ()
    without: tuple[str, ...] = ()  # names the declaration states that the images leave out (canonical)

    @property
    def kind(self) -> str:
        name = posixpath.basename(self.file)
        return PYPROJECT if name == "pyproject.toml" else SETUP if name in SETUP_FILES else REQUIREMENTS

    @property
    def folder(self) -> str:
        return posixpath.dirname(self.file) or "."

    def toml(self) -> str:
        """The value as the matrix file writes it."""
        if not self.extras and not self.without:
            return toml_string(self.file)
        keys = [f"file = {toml_string(self.file)}"]
        keys += [f"{k} = [{', '.join(toml_string(e) for e in v)}]" for k, v in (("extras", self.extras),
                 ("without", self.without)) if v]  # fmt: skip
        return "{ " + ", ".join(keys) + " }"


@dataclass(frozen=True)
class Declared:
    """One requirement as the declaration states it (markers kept, an optional group's as ``extra == "g"``), where
    it stands (``requirements.txt:3``), and whether it only constrains (a ``-c`` file)."""

    requirement: str
    where: str
    constraint: bool = False

    @property
    def parsed(self) -> Requirement:
        return Requirement(self.requirement)

    @property
    def name(self) -> str:
        return canonicalize_name(self.parsed.name)

    def shown(self) -> str:
        return f"{self.where}: {self.requirement}"


@dataclass(frozen=True)
class ProjectDeps:
    """What a declaration says: its requirements, the Python it allows, the groups chosen (with those the chosen ones
    name of the project itself), the files read."""

    source: DepsSource
    declared: tuple[Declared, ...]
    requires_python: tuple[str, str] | None = None  # (specifier, where)
    extras: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)
    indexes: tuple[line_forms.Index, ...] = ()  # `--index-url` / `--extra-index-url` lines: indexes the lock uses
    local: tuple[line_forms.Local, ...] = ()  # `.`, `-e ./sub`: the project (or a package of it) to install
    nameless: tuple[
        line_forms.Nameless, ...
    ] = ()  # `git+https://...` without `#egg=`: the name comes from its metadata


def source_of(value: object) -> DepsSource:
    """`requirements = "requirements.txt"` or `{ file = "pyproject.toml", extras = ["train"], without = ["deepspeed"]
    }`, checked."""
    extras: object = []
    without: object = []
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"file", "extras", "without"})
        if unknown:
            raise UsageError(f"unknown keys {', '.join(unknown)} (allowed: file, extras, without)", HINT)
        extras, without = value.get("extras", []), value.get("without", [])
        value = value.get("file")
    return DepsSource(project_path(value), _extras(extras, value), _without(without))


def _without(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(e, str) and _EXTRA.fullmatch(e) for e in value):
        raise UsageError('without: expected a list of distribution names the file states, such as ["deepspeed"]', HINT)
    names = tuple(dict.fromkeys(canonicalize_name(e) for e in value))
    axes = [n for n in names if n in ("torch", "transformers")]
    if axes:
        raise UsageError(
            f"without: {axes[0]} is an axis of the matrix, not a package to leave out",
            f"choose {axes[0]}'s versions with [matrix] {axes[0]}; the file's requirement is checked against them",
        )
    return names


def leave_out(deps: ProjectDeps) -> ProjectDeps:
    """``deps`` less the requirements its source's ``without`` names (each must be one the declaration states: a
    misspelt name would otherwise leave nothing out, silently)."""
    if not deps.source.without:
        return deps
    stated = {  # what some image would install: not a constraint, nor a group left unchosen
        d.name
        for d in deps.declared
        if not d.constraint and any(applies(d.parsed, {**_ANY_PYTHON, **env}, deps.extras) for env in _ENVIRONMENTS)
    }
    missing = [n for n in deps.source.without if n not in stated]
    if missing:
        raise UsageError(
            f"without: {untrusted.printable(', '.join(missing), 200)} is not among what {deps.source.file} states"
            + (f" ({', '.join(sorted(stated))})" if len(stated) <= 40 else ""),
            "name a distribution the file requires (with the groups chosen), as the file spells it",
        )
    kept = tuple(d for d in deps.declared if d.name not in deps.source.without)
    note = f"left out as [matrix] requirements.without asks: {', '.join(deps.source.without)}"
    return replace(deps, declared=kept, notes=(*deps.notes, note))


def project_path(value: object) -> str:
    """A file path relative to the project's folder that stays inside it, normalised (``./a/../b.txt`` -> ``b.txt``)."""
    if not isinstance(value, str) or not value or len(value) > 1024 or not value.isprintable() or "\\" in value:
        raise UsageError(
            f"expected a file path relative to the matrix file's folder, got {untrusted.printable(repr(value))}",
            HINT,
        )
    norm = posixpath.normpath(value)
    if norm == ".":
        raise UsageError(f"{untrusted.printable(value, 200)} is the project's folder, not a file of it", HINT)
    if posixpath.isabs(value):
        raise UsageError(
            f"{untrusted.printable(value, 200)} is an absolute path",
            "name the file relative to the matrix file's folder (requirements.txt, sub/pyproject.toml)",
        )
    if norm == ".." or norm.startswith("../"):
        raise UsageError(
            f"{untrusted.printable(value, 200)} is outside the project (the matrix file's folder)",
            "name a file inside the project; move the matrix file up to reach more",
        )
    return norm


def _extras(value: object, file: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(e, str) and _EXTRA.fullmatch(e) for e in value):
        raise UsageError('extras: expected a list of optional-dependency group names, such as ["train"]', HINT)
    extras = tuple(dict.fromkeys(canonicalize_name(e) for e in value))
    if extras and isinstance(file, str) and posixpath.basename(file) not in ("pyproject.toml", *SETUP_FILES):
        raise UsageError(
            f"extras: {untrusted.printable(file, 200)} is a requirements file, which has no optional groups",
            "extras choose [project.optional-dependencies] groups of pyproject.toml, or setup.py's extras_require",
        )
    return extras


# ---- requirements files ------------------------------------------------------------------------------------------
def read_requirements(start: str, read: Callable[[str], str]) -> ProjectDeps:
    """``start`` and every file its ``-r``/``-c`` lines include (each relative to the file naming it, inside the
    project; ``read(path)`` gives a file's text or raises). A file including itself, a loop, a path leading out of
    the project: a UsageError naming the line."""
    declared: list[Declared] = []
    notes: list[str] = []
    files: list[str] = []
    indexes: list[line_forms.Index] = []
    local: list[line_forms.Local] = []
    nameless: list[line_forms.Nameless] = []
    done: set[tuple[str, bool]] = set()

    def visit(path: str, chain: tuple[str, ...], constraint: bool, via: str = "") -> None:
        if (path, constraint) in done:
            return
        done.add((path, constraint))
        files.append(path)
        if len(files) > MAX_FILES:
            raise UsageError(f"{start} includes more than {MAX_FILES} requirements files", HINT)
        try:
            text = read(path)
        except UsageError as exc:  # an included file: said with the line that includes it
            raise UsageError(f"{via}: {exc.message}" if via else exc.message, exc.hint) from None
        for line_no, kind, value in parse_lines(text, path):
            where = f"{path}:{line_no}"
            if kind == "req":
                declared.append(Declared(value, where, constraint))
            elif kind == "note":
                notes.append(f"{where}: {value}")
            elif kind in ("index", "extra-index"):
                indexes.append(line_forms.Index(value, kind == "index", where))
            elif kind in ("local", "editable", "vcs"):
                if constraint:
                    raise UsageError(
                        f"{where}: {untrusted.printable(value, 200)} in a constraints file names no version",
                        "a constraints file narrows versions of named packages (`numpy<2`): move the line to the "
                        "requirements file",
                    )
                if kind == "vcs":
                    url, _, marker = value.partition(" ; ")
                    nameless.append(line_forms.Nameless(url, marker, where))
                else:
                    local.append(line_forms.Local(value, where, kind == "editable"))
            else:
                target = _include(path, value, where, kind)
                if target in chain or target == path:
                    loop = " -> ".join((*chain, path, target))
                    what = "includes itself" if target == path else f"makes a loop ({loop})"
                    raise UsageError(
                        f"{where}: {kind} {untrusted.printable(value, 200)} {what}", "drop the include that loops"
                    )
                visit(
                    target,
                    (*chain, path),
                    constraint or kind == "-c",
                    f"{where}: {kind} {untrusted.printable(value, 200)}",
                )

    visit(start, (), False)
    _check_constraints(declared)
    line_forms.one_main_index(indexes)
    return ProjectDeps(
        DepsSource(start),
        tuple(declared),
        files=tuple(files),
        notes=tuple(notes),
        indexes=tuple(dict.fromkeys(indexes)),
        local=tuple(local),
        nameless=tuple(nameless),
    )


def _check_constraints(declared: list[Declared]) -> None:
    """pip applies a ``-c`` line to whatever gets installed; imagekit's lock applies it to what the declaration
    requires. A constraint on anything else (a dependency of a dependency), or naming extras (pip refuses those), is
    refused rather than dropped without a word."""
    required = {d.name for d in declared if not d.constraint} | {"torch", "transformers"}  # the axes: in every image
    for d in declared:
        if d.constraint and d.parsed.extras:
            raise UsageError(
                f"{d.shown()}: a constraint cannot name extras",
                "state the extras on the requirement; constrain the name",
            )
        if d.constraint and d.name not in required:
            raise UsageError(
                f"{d.shown()}: constrains {d.name}, which the project does not require directly (imagekit applies a "
                "constraint to what the file requires)",
                f"to hold back a dependency of a dependency, name it in [matrix] packages (`{d.requirement}`): it is "
                "then locked within that range; or drop the line",
            )


def _include(path: str, value: str, where: str, kind: str) -> str:
    if "://" in value:
        raise UsageError(
            f"{where}: {kind} {untrusted.printable(value, 200)} names a URL",
            "include files of the project only: copy the file into it",
        )
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), value))
    if posixpath.isabs(value) or joined == ".." or joined.startswith("../"):
        raise UsageError(
            f"{where}: {kind} {untrusted.printable(value, 200)} is outside the project (the matrix file's folder)",
            "include files inside the project only: copy the file into it, or move the matrix file up",
        )
    return joined


def parse_lines(text: str, path: str) -> list[tuple[int, str, str]]:
    """A requirements file's lines as pip reads them (continuations joined, comments dropped): ``(line, "req",
    requirement)``, ``(line, "-r" | "-c", path)`` or ``(line, "note", what was ignored)``. An option imagekit cannot
    honour is a UsageError naming the line and the way instead."""
    out: list[tuple[int, str, str]] = []
    lines = text.removeprefix("\ufeff").splitlines()  # a byte order mark, as some editors on Windows write
    if len(lines) > MAX_LINES:
        raise UsageError(f"{path}: more than {MAX_LINES} lines", "is this a requirements file?")
    pending, first, joining = "", 0, False
    for number, raw in enumerate(lines, 1):
        if not joining:
            first = number
        whole_comment = _WHOLE_COMMENT.match(raw) is not None  # pip never continues a comment line
        if len(pending) + len(raw) > MAX_LINE:
            raise UsageError(
                f"{path}:{first}: a line of {len(pending) + len(raw)} characters (at most {MAX_LINE})",
                "is this a requirements file? a requirement with its hashes is a few thousand characters",
            )
        if raw.endswith("\\") and not whole_comment:
            if joining and _COMMENT.search(pending):
                out.append((number, "note", line_forms.swallowed(first)))
            pending, joining = pending + raw.strip("\\"), True  # joined as pip joins: no space added
            continue
        if joining and _COMMENT.search(pending) and raw.strip() and not whole_comment:
            out.append((number, "note", line_forms.swallowed(first)))
        line = _COMMENT.sub("", pending + (" " + raw if whole_comment and joining else raw)).strip()
        pending, joining = "", False
        if line:
            out.extend((first, kind, value) for kind, value in _line(line, f"{path}:{first}"))
    if joining:  # a last line ending in a backslash: pip reads what was joined
        line = _COMMENT.sub("", pending).strip()
        if line:
            out.extend((first, kind, value) for kind, value in _line(line, f"{path}:{first}"))
    return out


def _line(line: str, where: str) -> list[tuple[str, str]]:
    if "${" in line:
        raise UsageError(f"{where}: environment variables (${{...}}) are not expanded", "write the value itself")
    if not line.startswith("-"):
        found = _OPTION.search(line)
        requirement, options = (line[: found.start()], line[found.start() :].split()) if found else (line, [])
        bad = [o for o in options if o.startswith("-") and not o.startswith("--hash")]
        if bad:
            raise UsageError(
                f"{where}: the per-requirement option {untrusted.printable(bad[0], 80)} is not honoured", "drop it"
            )
        kind, value = line_forms.form(requirement.strip(), where)
        return [(kind, checked_requirement(value, where) if kind == "req" else value)]
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}", "fix the quoting") from None
    option, _, value = words[0].partition("=")
    if option.startswith("-") and not option.startswith("--") and len(option) > 2:
        option, value = option[:2], option[2:]
    if not value and len(words) > 1:
        value = words[1]
    if option in ("-r", "--requirement", "-c", "--constraint"):
        if not value:
            raise UsageError(f"{where}: {option} names no file", "write -r FILE")
        return [("-r" if option in ("-r", "--requirement") else "-c", value)]
    if option in _INDEX_OPTIONS:
        if "download.pytorch.org" in value:
            shown = untrusted.printable(redact_value(value), 200)
            return [("note", f"{option} {shown} ignored: imagekit takes the torch family from the PyTorch index "
                     "of each cell's CUDA variant itself")]  # fmt: skip
        return [("index" if option != "--extra-index-url" else "extra-index", line_forms.index(option, value, where))]
    if option in _EDITABLE:
        kind, value = line_forms.editable(value, where)
        return [(kind, checked_requirement(value, where) if kind == "req" else value)]
    if option in _REFUSED_OPTIONS:
        raise UsageError(f"{where}: {option} is not honoured", _REFUSED_OPTIONS[option])
    if option in _IGNORED_OPTIONS:
        return [("note", f"{option} ignored (imagekit locks wheels, each by its hash)")]
    raise UsageError(f"{where}: unknown option {untrusted.printable(option, 80)}", "drop it, or write it as pip does")


def checked_requirement(text: str, where: str) -> str:
    """A PEP 508 requirement in canonical form, markers kept; a wheel by URL only with its sha256."""
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        path_like = text.startswith((".", "/")) or text.endswith((".tar.gz", ".zip", ".whl"))
        hint = (
            "a local path or archive is built from source: name the package on an index instead, or a wheel by URL "
            "with its sha256 (`name @ https://...whl#sha256=...`)"
            if path_like
            else "write it as a PEP 508 requirement, such as accelerate>=1.0"
        )
        said = str(exc).splitlines()[0] if str(exc) else "unreadable"
        raise UsageError(f"{where}: {untrusted.printable(text, 200)} is not a requirement ({said})", hint) from None
    _versions_and_marker(req, text, where)
    marker = req.marker
    req.marker = None
    try:
        base = direct_wheels.requirement(str(req))
    except UsageError as exc:
        raise UsageError(f"{where}: {exc.message}", exc.hint) from None
    return f"{base} ; {marker}" if marker is not None else base


def _versions_and_marker(req: Requirement, text: str, where: str) -> None:
    """What packaging's grammar lets through but nothing after it can use (direct_wheels.requirement_problem)."""
    problem = direct_wheels.requirement_problem(req)
    if problem:
        raise UsageError(f"{where}: {untrusted.printable(text, 200)}: {problem}", direct_wheels.REQUIREMENT_HINT)


# ---- pyproject.toml ----------------------------------------------------------------------------------------------
class NeedsBackend(Exception):
    """pyproject.toml's dependencies are dynamic: only its build backend knows them."""

    def __init__(self, backend: str) -> None:
        super().__init__(backend)
        self.backend = backend


def backend_of(text: str, path: str) -> str:
    """The build backend pyproject.toml names (setuptools' when it names none, as pip and uv assume)."""
    system = _toml(text, path).get("build-system")
    backend = system.get("build-backend") if isinstance(system, dict) else None
    return backend if isinstance(backend, str) else LEGACY_BACKEND


def from_pyproject(text: str, source: DepsSource) -> ProjectDeps:
    """`[project] dependencies`, the chosen `[project.optional-dependencies]` groups (and those they name of the
    project itself, ``name[test]``) and `requires-python`. Dynamic dependencies: NeedsBackend."""
    path = source.file
    doc = _toml(text, path)
    project = doc.get("project")
    if not isinstance(project, dict):
        raise UsageError(
            f"{path} has no [project] table",
            "name the file that declares the dependencies: a requirements file, or setup.py / setup.cfg",
        )
    dynamic = project.get("dynamic", [])
    if isinstance(dynamic, list) and (
        "dependencies" in dynamic or (source.extras and "optional-dependencies" in dynamic)
    ):
        raise NeedsBackend(backend_of(text, path))
    name = canonicalize_name(str(project.get("name", "")))
    groups = project.get("optional-dependencies", {})
    if not isinstance(groups, dict):
        raise UsageError(f"{path}: [project.optional-dependencies] is not a table", HINT)
    declared = _entries(project.get("dependencies", []), f"{path} [project] dependencies", "")
    for group, entries in groups.items():
        name_ = group_name(group, f"{path} [project.optional-dependencies]")
        declared += _entries(entries, f"{path} [project.optional-dependencies] {name_}", name_)
    pep735 = doc.get("dependency-groups")
    only_there = [e for e in source.extras if isinstance(pep735, dict) and e in map(canonicalize_name, pep735)]
    if only_there and not any(canonicalize_name(g) == only_there[0] for g in groups):
        raise UsageError(
            f"{path}: {only_there[0]} is a [dependency-groups] group (PEP 735, for development tools), "
            "which an image's dependencies do not come from",
            "move what the image needs into [project.optional-dependencies] (an extra), or into [matrix] packages",
        )
    rp, where = project.get("requires-python"), f"{path} [project] requires-python"
    requires_python = (python_specifier(rp, where), where) if rp is not None else None
    return chosen_groups(source, declared, requires_python, name, list(groups), (path,))


def group_name(value: object, where: str) -> str:
    """An optional-dependency group's name, canonical: a name (PEP 685), never empty (a group named "" would be
    ``extra == ""``, which every image matches) nor one holding a quote or a newline (it goes into a marker)."""
    if not isinstance(value, str) or not _EXTRA.fullmatch(value):
        raise UsageError(
            f"{where}: {untrusted.printable(repr(value), 80)} is not a group name",
            "name optional-dependency groups with letters, digits, '.', '_' and '-' (PEP 685), such as train",
        )
    return canonicalize_name(value)


def _toml(text: str, path: str) -> dict:
    try:
        return untrusted.load_toml(text, untrusted.printable(path, 200))
    except untrusted.UntrustedData as exc:
        raise UsageError(str(exc), "fix its syntax") from None


def _entries(value: object, where: str, group: str) -> list[Declared]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{where}: expected a list of requirement strings", HINT)
    out = []
    for text in value:
        req = checked_requirement(text, where)
        out.append(Declared(with_extra(req, group) if group else req, where))
    return out


def with_extra(requirement: str, group: str) -> str:
    base, _, marker = requirement.partition(" ; ")
    return f'{base} ; ({marker}) and extra == "{group}"' if marker else f'{base} ; extra == "{group}"'


def python_specifier(value: object, where: str) -> str:
    """A requires-python: a text of version specifiers (``3``, a number, is refused, never ignored)."""
    hint = 'write it as a text of version specifiers, such as requires-python = ">=3.10"'
    if isinstance(value, str) and len(value) <= 200:
        try:
            specs = SpecifierSet(value)
        except InvalidSpecifier:
            pass
        else:
            bad = next((s for s in specs if direct_wheels.version_problem(s.version.removesuffix(".*"))), None)
            if bad is None:
                return str(specs)
    raise UsageError(f"{where}: {untrusted.printable(repr(value), 80)} is not a version specifier", hint)


def chosen_groups(
    source: DepsSource,
    declared: list[Declared],
    requires_python: tuple[str, str] | None,
    name: str,
    groups: list[str],
    files: tuple[str, ...],
) -> ProjectDeps:
    """The chosen groups checked against those declared, grown by what they name of the project itself
    (``dev = ["pkg[test]"]``); such self-references are dropped."""
    known = sorted({canonicalize_name(g) for g in groups})
    unknown = [e for e in source.extras if e not in known]
    if unknown:
        raise UsageError(
            f"{source.file} has no optional-dependency group {', '.join(unknown)}",
            f"its groups: {', '.join(known) or 'none'}",
        )
    extras = set(source.extras)
    own = [d for d in declared if name and d.name == name]
    for d in own:
        _same_everywhere(d, known)
    grown = True
    while grown:
        grown = False
        for d in own:
            if applies(d.parsed, _ANY_PYTHON, extras) and not {canonicalize_name(e) for e in d.parsed.extras} <= extras:
                extras |= {canonicalize_name(e) for e in d.parsed.extras}
                grown = True
    kept = tuple(d for d in declared if not (name and d.name == name))
    return ProjectDeps(source, kept, requires_python, tuple(sorted(extras)), files)


def _same_everywhere(d: Declared, groups: list[str]) -> None:
    """A reference of the project to its own groups is followed once for every cell; one whose marker asks for a
    Python or a platform would be judged for one of them only: refused."""
    marker = d.parsed.marker
    if marker is None:
        return
    for extra in ("", *groups):
        if len({_safe(marker, {**_ANY_PYTHON, **env, "extra": extra}) for env in _ENVIRONMENTS}) > 1:
            raise UsageError(
                f"{d.shown()}: a reference to the project's own groups whose marker depends on the Python or the "
                "platform (imagekit follows it once, for every cell)",
                "state the group's requirements with that marker each, or drop the marker from the reference",
            )


def _safe(marker, env: dict[str, str]) -> bool | None:
    return direct_wheels.evaluated(marker, env)


_ENVIRONMENTS = tuple(
    {"python_version": v, "python_full_version": f"{v}.0", "platform_machine": m}
    for v in ("3.9", "3.10", "3.11", "3.12", "3.13", "3.14")
    for m in ("x86_64", "aarch64")
)
_ANY_PYTHON = direct_wheels.MARKER_ENV


def applies(req: Requirement, env: dict[str, str], extras: set[str] | tuple[str, ...]) -> bool:
    """Whether ``req`` is asked for in the image's marker environment ``env`` with the groups ``extras`` chosen."""
    if req.marker is None:
        return True
    return any(direct_wheels.evaluated(req.marker, {**env, "extra": e}) is not False for e in ("", *extras))
