"""Matrix config -> cells -> evaluated cells. Parsing reports every problem at once. Pure (files: services/inputs)."""

from __future__ import annotations

import itertools
import keyword
import posixpath
import re
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources

from imagekit.compat import rules
from imagekit.compat.catalog import CompatData
from imagekit.errors import ConfigError, UnknownVersionError, UsageError
from imagekit.image import budget, code_layer, cuda_toolkit, imageconfig, project_wheel
from imagekit.image.buildplan import BaseRef
from imagekit.image.code_layer import CopySpec
from imagekit.image.image_options import ImageOptions
from imagekit.locking import debs, direct_wheels, source_builds
from imagekit.matrix import schema
from imagekit.matrix.project_deps import DepsSource, source_of
from imagekit.model import AMD64, Cell, Query, Targets, Verdict
from imagekit.trust import untrusted, validate

AXES = ("cuda", "torch", "transformers", "python")
DEFAULT_REPOSITORY = "127.0.0.1:5000/imagekit/train"
MATRIX_FILE = "imagekit.toml"  # found in the working folder when no --matrix is given
VALIDATORS = {
    "cuda": validate.cuda,
    "torch": lambda v: validate.version(v, "torch version"),
    "transformers": lambda v: validate.version(v, "transformers version"),
    "python": validate.python,
}


@dataclass(frozen=True)
class MatrixConfig:
    cells: tuple[Cell, ...]
    targets: Targets = field(default_factory=Targets)
    repository: str = DEFAULT_REPOSITORY
    origin: str = "<default>"
    bases: dict[str, BaseRef] = field(default_factory=dict)  # Python version -> a registry base by digest
    options: ImageOptions = field(default_factory=ImageOptions)
    index_url: str | None = None  # `[lock] index_url`: the main package index (a private one, or a mirror)
    extra_index_urls: tuple[str, ...] = ()  # `[lock] extra_index_urls`
    # `[matrix] requirements`: the project's own dependency declaration, which services.inputs reads and
    # matrix.project_axes.apply adds to every cell (the cells here hold the matrix's own packages only)
    requirements: DepsSource | None = None


@dataclass(frozen=True)
class EvaluatedCell:
    cell: Cell
    verdict: Verdict = field(default_factory=Verdict)


class _Problems:
    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.items: list[str] = []

    def check(self, key: str, fn, value):
        try:
            return fn(value)
        except UsageError as exc:
            self.items.append(f"{self.origin}: {key}: {exc.message}")
            return None

    def add(self, key: str, message: str) -> None:
        self.items.append(f"{self.origin}: {key}: {message}")


def _string_list(p: _Problems, key: str, value: object, fn) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        p.add(key, f"expected a list, got {type(value).__name__}")
        return []
    out = [p.check(f"{key}[{i}]", fn, v) for i, v in enumerate(value)]
    return [v for v in out if v is not None]


def _cell_dict(p: _Problems, key: str, entry: object, *, partial: bool, packages: tuple[str, ...]) -> dict | None:
    if not isinstance(entry, dict):
        p.add(key, f"expected a table like {{cuda = '12.4', torch = '2.5.1', ...}}, got {type(entry).__name__}")
        return None
    out: dict = {}
    for k, v in entry.items():
        if k in VALIDATORS:
            out[k] = p.check(f"{key}.{k}", VALIDATORS[k], v)
        elif k == "packages" and not partial:
            out[k] = tuple(sorted(_string_list(p, f"{key}.packages", v, direct_wheels.requirement)))
        elif k == "platform":
            out[k] = p.check(f"{key}.platform", validate.platform, v)
        else:
            allowed = ", ".join(schema.ENTRY_KEYS["matrix.exclude" if partial else "matrix.include"])
            p.add(f"{key}.{k}", f"unknown key (allowed: {allowed})")
    if not partial:
        missing = [a for a in AXES if a not in entry]
        if missing:
            p.add(key, f"missing {', '.join(missing)}")
            return None
        out.setdefault("packages", packages)
    return out


def parse(doc: dict, origin: str, data: CompatData) -> MatrixConfig:
    """Parse a matrix document (the TOML's top level, or pyproject's [tool.imagekit]): every problem of the file at
    once, in the file's order, then the cells."""
    p = _Problems(origin)
    _sections(p, doc)
    table = _matrix(p, doc.get("matrix", {}))
    targets = _targets(p, doc.get("targets", {}) or {}, data)
    repository, options = _image(p, doc.get("image", {}) or {}, origin)
    bases = _bases(p, doc.get("bases", {}))
    index_url, extra_index_urls = _indexes(p, doc.get("lock", {}))
    if p.items:
        raise ConfigError(
            p.items, "fix the keys above; `imagekit matrix --help` shows the file format, `imagekit init` writes one"
        )
    cells = _cells(table, origin)
    if options.jupyter:  # JupyterLab is locked and hashed like any other package
        cells = {k: _with_jupyter(c) for k, c in cells.items()}
    if options.apt:  # resolved per cell, over that cell's base, and pinned in its lock
        cells = {k: replace(c, apt=options.apt) for k, c in cells.items()}
    if options.cuda_toolkit:  # nvcc and its headers (and ninja): locked and hashed like any other package
        # the base each Python's cells start from: Debian's toolkit is known for imagekit's own bases only
        base_of = {c.python: None if c.python in bases else getattr(data.bases.get(c.python), "name", None)
                   for c in cells.values()}  # fmt: skip
        cells = cuda_toolkit.with_toolkit(cells, origin, data, base_of)
    if table.from_source:  # built once per cell, from the source archive its requirements allow (the lock records it)
        cells = {k: replace(c, from_source=table.from_source) for k, c in cells.items()}
    if not cells:
        raise ConfigError([f"{origin}: matrix: no cells"], "give the four axes or [[matrix.include]] entries")
    return MatrixConfig(
        cells=tuple(sorted(cells.values(), key=lambda c: (c.id, c.platform))),
        targets=targets,
        repository=repository,
        origin=origin,
        bases=bases,
        options=options,
        index_url=index_url,
        extra_index_urls=extra_index_urls,
        requirements=table.requirements,
    )


SECTIONS = tuple(sorted(schema.SECTIONS))
MATRIX_KEYS = schema.names("matrix")


def _sections(p: _Problems, doc: dict) -> None:
    for k in doc:
        if k not in SECTIONS:
            p.add(k, f"unknown section (allowed: {', '.join(SECTIONS)})")


@dataclass(frozen=True)
class _MatrixTable:
    """`[matrix]` as read: the axes' values, the platforms, the packages of every cell, the exclude and include
    entries (None where an entry was refused)."""

    axes: dict[str, list[str]]
    platforms: tuple[str, ...]
    packages: tuple[str, ...]
    excludes: list[dict | None]
    includes: list[dict | None]
    requirements: DepsSource | None = None
    from_source: tuple[str, ...] = ()


def _matrix(p: _Problems, m: object) -> _MatrixTable:
    if not isinstance(m, dict):
        p.add("matrix", "expected a table")
        m = {}
    for k in m:
        if k not in MATRIX_KEYS:
            p.add(f"matrix.{k}", f"unknown key (allowed: {', '.join(MATRIX_KEYS)})")
    axes = {a: _string_list(p, f"matrix.{a}", m.get(a), VALIDATORS[a]) for a in AXES}
    platforms = tuple(dict.fromkeys(_string_list(p, "matrix.platforms", m.get("platforms"), validate.platform)))
    if "platforms" in m and not platforms and not p.items:
        p.add("matrix.platforms", "an empty list: name at least one (linux/amd64, linux/arm64)")
    packages = tuple(sorted(_string_list(p, "matrix.packages", m.get("packages"), direct_wheels.requirement)))
    excludes = [
        _cell_dict(p, f"matrix.exclude[{i}]", e, partial=True, packages=packages)
        for i, e in enumerate(m.get("exclude", []) or [])
    ]
    includes = [
        _cell_dict(p, f"matrix.include[{i}]", e, partial=False, packages=packages)
        for i, e in enumerate(m.get("include", []) or [])
    ]
    requirements = p.check("matrix.requirements", source_of, m["requirements"]) if "requirements" in m else None
    from_source = p.check("matrix.from_source", source_builds.names, m.get("from_source", [])) or ()
    return _MatrixTable(axes, platforms or (AMD64,), packages, excludes, includes, requirements, from_source)


def _targets(p: _Problems, t: object, data: CompatData) -> Targets:
    """`[targets]`: the fleet's GPUs (by name or architecture) and its oldest driver."""
    archs: list[str] = []
    min_driver = None
    if not isinstance(t, dict):
        p.add("targets", "expected a table")
        return Targets((), None)
    for k in t:
        if k not in schema.names("targets"):
            p.add(f"targets.{k}", f"unknown key (allowed: {', '.join(schema.names('targets'))})")
    archs += _string_list(p, "targets.gpus", t.get("gpus"), lambda v: _gpu(v, data))
    archs += _string_list(p, "targets.archs", t.get("archs"), validate.arch)
    if "min_driver" in t:
        min_driver = p.check("targets.min_driver", validate.driver, t["min_driver"])
    return Targets(tuple(dict.fromkeys(archs)), min_driver)


def _image(p: _Problems, image: object, origin: str) -> tuple[str, ImageOptions]:
    """`[image]`: the repository, and the options (`copy`'s folder made relative to the matrix file's)."""
    repository = DEFAULT_REPOSITORY
    if isinstance(image, dict) and "repository" in image:
        repository = p.check("image.repository", validate.repository, image["repository"]) or DEFAULT_REPOSITORY
    options = _image_options(p, image)
    if options.copy is not None:  # `from` is relative to the matrix file's folder, and inside it
        given = posixpath.normpath(options.copy.source)
        if posixpath.isabs(given) or given == ".." or given.startswith("../"):
            p.add("image.copy.from", f"{options.copy.source!r} is outside the matrix file's folder: copy a folder "
                  "inside the project (move the matrix file up to copy more)")  # fmt: skip
        folder = posixpath.dirname(origin) if not origin.startswith("<") else ""
        source = posixpath.normpath(posixpath.join(folder or ".", given))
        options = replace(options, copy=replace(options.copy, source=source, project=folder or "."))
    return repository, _install_in(p, options, origin)


def _cells(table: _MatrixTable, origin: str) -> dict[str, Cell]:
    """The product of the axes on each platform less the excluded combinations, then each include: by cell key."""
    axes, platforms = table.axes, table.platforms
    cells: dict[str, Cell] = {}
    if all(axes[a] for a in AXES):
        for combo in itertools.product(*(axes[a] for a in AXES), platforms):
            values = dict(zip((*AXES, "platform"), combo, strict=True))
            if any(all(values.get(k) == v for k, v in ex.items()) for ex in table.excludes if ex):
                continue
            cell = Cell(**values, packages=table.packages)
            cells.setdefault(cell.key, cell)
    elif any(axes[a] for a in AXES):
        named = [a for a in AXES if axes[a]]
        raise ConfigError(
            [
                f"{origin}: matrix: axes {', '.join(named)} are set but "
                f"{', '.join(a for a in AXES if not axes[a])} are not"
            ],
            "give all four axes, or list cells under [[matrix.include]]",
        )
    included: dict[str, int] = {}
    for i, inc in enumerate(table.includes):
        if inc:
            # an entry without a platform is built for each of [matrix] platforms; one with a platform, for it alone
            for plat in (inc["platform"],) if inc.get("platform") else platforms:
                cell = Cell(**{**inc, "platform": plat})
                if cell.key in included:
                    raise ConfigError(
                        [
                            f"{origin}: matrix.include[{i}]: names the same cell as "
                            f"matrix.include[{included[cell.key]}] ({cell.key})"
                        ],
                        "keep one entry per cell (a cell id is CUDA variant, torch, Python and transformers; "
                        "with its platform when it is not linux/amd64)",
                    )
                included[cell.key] = i
                cells[cell.key] = cell
    return cells


def _image_options(p: _Problems, image: object) -> ImageOptions:
    """`[image]`'s options: each key of :meth:`ImageOptions.keys` checked here (a true/false one by the loop at the
    end)."""
    if not isinstance(image, dict):
        p.add("image", "expected a table")
        return ImageOptions()
    allowed = schema.names("image")
    for k in image:
        if k not in allowed:
            p.add(f"image.{k}", f"unknown key (allowed: {', '.join(allowed)})")
    flags: dict = {}
    if "copy" in image:
        spec = _copy(p, image["copy"])
        if spec is not None:
            flags["copy"] = spec
    if "command" in image:
        cmd = image["command"]
        if (
            not isinstance(cmd, list)
            or not cmd
            or len(cmd) > 64
            or not all(isinstance(a, str) and 0 < len(a) <= 1024 and a.isprintable() for a in cmd)
        ):
            p.add("image.command", 'expected a list of printable strings, such as ["python", "/opt/app/train.py"]')
        else:
            flags["command"] = tuple(cmd)
    if "apt" in image:
        names = image["apt"]
        if not isinstance(names, list) or len(names) > 200:
            p.add("image.apt", debs.REQUEST_HINT)
        else:
            bad = [n for n in names if debs.package_name(n) is None]
            if bad:
                shown = ", ".join(untrusted.printable(repr(n), 60) for n in bad[:3])
                p.add("image.apt", f"not a Debian package name: {shown}; {debs.REQUEST_HINT}")
            else:
                flags["apt"] = tuple(sorted(set(names)))
    _project_options(p, image, flags)
    if "size_budget" in image:
        try:
            flags["size_budget"] = budget.parse(image["size_budget"]).text
        except UsageError as exc:
            p.add("image.size_budget", f"{exc.message}; {exc.hint}")
    for k in ImageOptions.switches():
        if k in image:
            if isinstance(image[k], bool):
                flags[k] = image[k]
            else:
                p.add(f"image.{k}", f"expected true or false, got {image[k]!r}")
    if flags.get("cuda_toolkit") and flags.get("compiler") is False:  # nvcc compiles the host code with g++
        p.add("image.cuda_toolkit", "needs the host compiler: nvcc and torch's extension builder run g++ "
              "(leave compiler = true, the default)")  # fmt: skip
    return ImageOptions(**flags)


_INSTALL = re.compile(r"[A-Za-z0-9._/-]{1,300}", re.ASCII)
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}", re.ASCII)
MAX_SKIP_IMPORTS = 64
_SKIP_HINT = (
    f"expected a list of at most {MAX_SKIP_IMPORTS} top-level module names of the project's wheel, such as "
    '["recipes"] (project-imports imports each top-level module of the wheel, not the modules inside them)'
)
MAX_SMOKE = 16
_SMOKE_HINT = (
    f"expected a list of 1 to {MAX_SMOKE} shell commands (one line each of printable characters, no tab, at most "
    "1024), such as "
    '["python -c \'import alignment\'", "python /opt/app/scripts/run_sft.py --help"]'
)


def _project_options(p: _Problems, image: dict, flags: dict) -> None:
    """`install` (a folder of the copied project, built into a wheel), `env` (variables in the image's config) and
    `smoke` (commands the self-test runs in the image)."""
    if "install" in image:
        value = image["install"]
        if not isinstance(value, str) or not _INSTALL.fullmatch(value):
            p.add("image.install", 'expected a folder of the project, such as "." (letters, digits and . _ - /)')
        elif "copy" not in image:
            p.add("image.install", 'the wheel is built from the code [image] copy puts in the image: add copy = "."')
        else:
            flags["install"] = value
    if "skip_imports" in image:
        names = image["skip_imports"]
        if not isinstance(names, list) or len(names) > MAX_SKIP_IMPORTS or not all(isinstance(n, str) for n in names):
            p.add("image.skip_imports", _SKIP_HINT)
        elif bad := [n for n in names if not _MODULE.fullmatch(n) or keyword.iskeyword(n)]:
            dotted = [n for n in bad if all(_MODULE.fullmatch(part) for part in n.split("."))]
            shown = ", ".join(untrusted.printable(repr(n), 60) for n in bad[:3])
            why = (
                f"name the top-level module ({dotted[0].split('.')[0]!r}): a module inside it is never imported "
                "on its own"
                if dotted
                else _SKIP_HINT
            )
            p.add("image.skip_imports", f"not a top-level module name: {shown}; {why}")
        elif "install" not in image:
            p.add("image.skip_imports", "only the project's wheel's modules are imported: set install too")
        else:
            flags["skip_imports"] = tuple(sorted(set(names)))
    if "env" in image:
        table = image["env"]
        if not isinstance(table, dict) or len(table) > imageconfig.MAX_ENV:
            p.add("image.env", f'expected a table of at most {imageconfig.MAX_ENV} variables, such as '
                  '{ WANDB_PROJECT = "sft", TOKENIZERS_PARALLELISM = "false" }')  # fmt: skip
        else:
            bad = [(k, imageconfig.user_env_problem(k, v)) for k, v in table.items()]
            for name, problem in bad:
                if problem:
                    p.add(f"image.env.{untrusted.printable(str(name), 60)}", problem)
            if not any(problem for _, problem in bad):
                flags["env"] = tuple(sorted(table.items()))
    if "smoke" in image:
        cmds = image["smoke"]
        if (
            not isinstance(cmds, list)
            or not cmds
            or len(cmds) > MAX_SMOKE
            or not all(isinstance(c, str) and c.strip() and len(c) <= 1024 and c.isprintable() for c in cmds)
        ):
            p.add("image.smoke", _SMOKE_HINT)
        else:
            flags["smoke"] = tuple(cmds)


def _install_in(p: _Problems, options: ImageOptions, origin: str) -> ImageOptions:
    """`install`, resolved as `copy`'s `from` is (relative to the matrix file's folder), inside the copied folder."""
    if options.install is None or options.copy is None:
        return options
    folder = posixpath.dirname(origin) if not origin.startswith("<") else ""
    install = posixpath.normpath(posixpath.join(folder or ".", options.install))
    try:
        project_wheel.sub_folder(options.copy.source, install)
    except UsageError as exc:
        p.add("image.install", f"{options.install!r} is not inside the copied folder ({options.copy.source}): "
              f"{exc.hint}")  # fmt: skip
        return options
    return replace(options, install=install)


def _indexes(p: _Problems, table: object) -> tuple[str | None, tuple[str, ...]]:
    """`[lock] index_url` and `extra_index_urls`: URLs only, never a credential (the file is committed; the
    credentials come from IMAGEKIT_INDEX_USER/IMAGEKIT_INDEX_PASSWORD or a netrc)."""
    if not isinstance(table, dict):
        p.add("lock", "expected a table")
        return None, ()
    for k in table:
        if k not in schema.names("lock"):
            p.add(f"lock.{k}", f"unknown key (allowed: {', '.join(schema.names('lock'))})")

    def url(key: str, value: object) -> str | None:
        checked = p.check(key, lambda v: validate.index_url(v, key), value)
        if checked and "@" in checked.split("//", 1)[-1].split("/", 1)[0]:
            p.add(key, "a URL with a credential in it (the matrix file is committed): give the URL alone, and the "
                  "credentials as IMAGEKIT_INDEX_USER / IMAGEKIT_INDEX_PASSWORD or in ~/.netrc")  # fmt: skip
            return None
        return checked

    main = url("lock.index_url", table["index_url"]) if "index_url" in table else None
    extras = table.get("extra_index_urls", [])
    if not isinstance(extras, list):
        p.add("lock.extra_index_urls", "expected a list of index URLs")
        extras = []
    found = [url(f"lock.extra_index_urls[{i}]", u) for i, u in enumerate(extras)]
    return main, tuple(u for u in found if u)


def _copy(p: _Problems, value: object) -> CopySpec | None:
    """`copy = "."` or `copy = { from = "src", to = "/opt/app", exclude = ["data/"] }`; ``from`` relative to the
    matrix file's folder (resolved in :func:`parse`, which knows where the file is)."""
    if isinstance(value, str):
        value = {"from": value}
    if not isinstance(value, dict):
        p.add("image.copy", 'expected a folder ("." or "src") or a table with from, to and exclude')
        return None
    unknown = set(value) - set(schema.ENTRY_KEYS["image.copy"])
    if unknown:
        p.add("image.copy", f"unknown keys {', '.join(sorted(unknown))} (allowed: "
              f"{', '.join(schema.ENTRY_KEYS['image.copy'])})")  # fmt: skip
    source = value.get("from", ".")
    if not isinstance(source, str) or not source or "\0" in source or not source.isprintable():
        p.add("image.copy.from", "expected a folder path, relative to the matrix file's folder")
        return None
    to = value.get("to", code_layer.DEFAULT_TO)
    problem = code_layer.destination_problem(to)
    if problem:
        p.add("image.copy.to", problem)
        return None
    exclude = value.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(x, str) and x.isprintable() for x in exclude):
        p.add("image.copy.exclude", 'expected a list of .dockerignore patterns, such as ["data/", "*.ckpt"]')
        return None
    return CopySpec(source, to.rstrip("/"), tuple(exclude))


def _with_jupyter(cell: Cell) -> Cell:
    names = {validate.requirement_name(r) for r in cell.packages}
    if "jupyterlab" in names:
        return cell
    return replace(cell, packages=tuple(sorted((*cell.packages, "jupyterlab"))))


def _bases(p: _Problems, table: object) -> dict[str, BaseRef]:
    """`[bases."3.12"]`: `reference = "REG/NAME@sha256:..."`, `glibc = "2.36"`, optional `python = "/usr/..."`."""
    if not isinstance(table, dict):
        p.add("bases", "expected a table keyed by Python version")
        return {}
    out = {}
    for py, entry in table.items():
        key = f"bases.{py}"
        py_ok = p.check(key, validate.python, py)
        if not isinstance(entry, dict):
            p.add(key, "expected a table with reference, glibc and optionally python")
            continue
        unknown = set(entry) - set(schema.names("bases"))
        if unknown:
            p.add(key, f"unknown keys {', '.join(sorted(unknown))} (allowed: {', '.join(schema.names('bases'))})")
        ref = p.check(f"{key}.reference", validate.image_ref, entry.get("reference"))
        if ref and "@sha256:" not in ref:
            p.add(f"{key}.reference", "a registry base must be referenced by digest (NAME@sha256:...)")
            ref = None
        glibc = p.check(f"{key}.glibc", validate.glibc, entry.get("glibc"))
        exe = p.check(f"{key}.python", validate.abs_path, entry["python"]) if "python" in entry else None
        if py_ok and ref and glibc:
            name = ref.split("@")[0].rsplit("/", 1)[-1].replace(":", "-")
            out[py_ok] = BaseRef(name, ref, ref.split("@", 1)[1], py_ok, glibc, exe, registry=True)
    return out


def _gpu(value: object, data: CompatData) -> str:
    if not isinstance(value, str) or value.lower() not in {k.lower() for k in data.gpus}:
        raise UsageError(
            f"unknown GPU {value!r} (known: {', '.join(sorted(data.gpus))})",
            "name the compute capability under targets.archs instead",
        )
    return validate.arch(value, data.gpus)


def default_document() -> dict:
    return tomllib.loads(resources.files("imagekit.data").joinpath("default-matrix.toml").read_text())


def tool_table(doc: dict, where: str) -> dict | None:
    """pyproject.toml's [tool.imagekit] table, or None when it has none."""
    tool = doc.get("tool", {})
    table = tool.get("imagekit") if isinstance(tool, dict) else None
    if table is not None and not isinstance(table, dict):
        raise ConfigError([f"{where}: tool.imagekit: expected a table"], "write it as [tool.imagekit.matrix] etc.")
    return table


def parse_text(text: str, where: str) -> dict:
    try:
        return untrusted.load_toml(text, untrusted.printable(where, 200))
    except untrusted.UntrustedData as exc:
        raise ConfigError([str(exc)], "fix the TOML syntax") from None


def evaluate(config: MatrixConfig, data: CompatData) -> list[EvaluatedCell]:
    """Every cell with its verdict; unknown versions are collected into one error."""
    out, unknown, hints = [], [], []
    for cell in config.cells:
        base = config.bases.get(cell.python) or data.bases.get(cell.python)
        try:
            verdict = rules.evaluate(Query.of(cell, config.targets, base.glibc if base else None), data)
        except UnknownVersionError as exc:
            unknown.append(f"{config.origin}: {cell.key}: {exc.message}")
            if exc.hint and exc.hint not in hints:
                hints.append(exc.hint)
            continue
        out.append(EvaluatedCell(cell, verdict))
    if unknown:  # each distinct fix once: a refresh for releases newer than the metadata, curated facts otherwise
        raise UnknownVersionError("\n".join(unknown), "\nhint: ".join(hints) or None)
    return out


@dataclass(frozen=True)
class Selector:
    """--cuda/--torch/--transformers/--python filters (prefix match on versions: --torch 2.5 matches 2.5.1)."""

    cuda: tuple[str, ...] = ()
    torch: tuple[str, ...] = ()
    transformers: tuple[str, ...] = ()
    python: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()

    def matches(self, cell: Cell) -> bool:
        def ok(wanted: tuple[str, ...], have: str) -> bool:
            return not wanted or any(have == w or have.startswith(w + ".") for w in wanted)

        return (
            ok(self.cuda, cell.cuda)
            and ok(self.torch, cell.torch)
            and ok(self.transformers, cell.transformers)
            and ok(self.python, cell.python)
            and (not self.ids or cell.id in self.ids)
            and (not self.platforms or cell.platform in self.platforms)
        )


def select(cells: list[EvaluatedCell], selector: Selector) -> list[EvaluatedCell]:
    return [c for c in cells if selector.matches(c.cell)]
