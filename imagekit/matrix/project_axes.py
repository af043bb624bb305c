"""What a project's dependency declaration becomes: its torch, transformers and Python constraints the matrix's axes
(chosen by `imagekit init --from`, checked against every cell after), the rest of it each cell's packages, one of
each name. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from imagekit.compat.catalog import CompatData
from imagekit.compat.pypi_metadata import image_marker_env
from imagekit.errors import ConfigError, UsageError
from imagekit.locking import direct_wheels
from imagekit.matrix.matrix_file import MatrixConfig
from imagekit.matrix.project_deps import ProjectDeps, applies
from imagekit.model import AMD64, MACHINES, Cell
from imagekit.trust import validate

AXIS_PACKAGES = ("torch", "transformers")  # a requirement on these is an axis of the matrix, not a package
ONE_LIST = (
    "keep one list: change the pin in the project's file, or the axis in the matrix file (`imagekit init --from FILE "
    "--force` writes the axes again from the file)"
)


@dataclass(frozen=True)
class Item:
    """A requirement with where it was stated (``requirements.txt:3``, ``matrix.packages``)."""

    req: Requirement
    where: str
    constraint: bool = False

    @property
    def name(self) -> str:
        return canonicalize_name(self.req.name)

    def shown(self) -> str:
        return f"{self.where}: {self.req}"


def exact(req: Requirement) -> str | None:
    """The version an ``==`` or ``===`` pin names (local label kept), else None."""
    pins = [s.version for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
    return pins[0] if pins else None


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def admits(item: Item, version: str) -> bool:
    """Whether ``item`` allows ``version``; a pin's local label (``torch==2.4.0+cu121``: the CUDA variant's) is judged
    apart, by :func:`local_label`."""
    for spec in item.req.specifier:
        if spec.operator in ("==", "===") and "+" in spec.version:
            if _version(spec.version.split("+")[0]) != _version(version.split("+")[0]):
                return False
        elif not spec.contains(version.split("+")[0], prereleases=True):
            return False
    return True


def local_label(item: Item) -> str:
    """The local label an exact pin names (``cu121`` of ``torch==2.4.0+cu121``), else ""."""
    return (exact(item.req) or "").partition("+")[2]


def disagreement(items: Iterable[Item]) -> tuple[Item, Item] | None:
    """Two statements of one name that no version satisfies together: a pin the other refuses, two local labels,
    or two wheel URLs."""
    seen: dict[str, list[Item]] = {}
    for item in items:
        for other in seen.setdefault(item.name, []):
            pins = [(a, b) for a, b in ((other, item), (item, other)) if exact(a.req) is not None]
            if any(not admits(b, exact(a.req) or "") for a, b in pins):
                return other, item
            if local_label(other) and local_label(item) and local_label(other) != local_label(item):
                return other, item
            if other.req.url and item.req.url and other.req.url != item.req.url:
                return other, item
        seen[item.name].append(item)
    return None


def for_env(deps: ProjectDeps, python: str, platform: str = AMD64) -> list[Item]:
    """The declaration's requirements asked for in an image of ``python`` on ``platform``, markers evaluated."""
    env = image_marker_env(python, MACHINES[platform])
    out = []
    for d in deps.declared:
        req = d.parsed
        if applies(req, env, deps.extras):
            req.marker = None
            out.append(Item(req, d.where, d.constraint))
    return out


def python_fits(spec: str, python: str) -> bool:
    """Whether some release of Python ``python`` (X.Y.0 to X.Y.99) satisfies ``spec``: `>=3.10.9` admits 3.10."""
    s = SpecifierSet(spec)
    return any(s.contains(f"{python}.{z}", prereleases=True) for z in range(100))


# ---- every cell of a matrix whose file names a declaration -------------------------------------------------------
def apply(config: MatrixConfig, deps: ProjectDeps, data: CompatData | None = None) -> MatrixConfig:
    """Each cell with the declaration's packages added to its own (one requirement per name), after checking that
    the declaration allows the cell's torch, transformers and Python (and, with ``data``, the torch a torchvision or
    torchaudio pin requires). Every conflict at once: a ConfigError."""
    problems: list[str] = []
    cells = []
    for cell in config.cells:
        packages, conflicts = cell_packages(cell, deps, data)
        problems += [p for p in conflicts if p not in problems]
        cells.append(replace(cell, packages=packages))
    if problems:
        raise ConfigError([f"{config.origin}: {p}" for p in problems], ONE_LIST)
    return replace(config, cells=tuple(cells))


def with_build_requires(config: MatrixConfig, requires: tuple[str, ...], where: str) -> MatrixConfig:
    """`[image] install`: the project's build requirements (image.project_wheel.build_requires) added to each cell's
    packages (those whose markers hold in its image; one requirement per name), so the cell's lock holds the backend
    the project's wheel is built with, offline, from the lock's wheels. torch or transformers there must allow the
    cell's; every conflict at once: a ConfigError."""
    problems: list[str] = []
    cells = []
    for cell in config.cells:
        env = image_marker_env(cell.python, MACHINES[cell.platform])
        items = []
        for text in requires:
            req = Requirement(text)  # checked by project_wheel.build_system
            if req.marker is None or req.marker.evaluate(env):
                req.marker = None
                items.append(Item(req, where))
        own = [Item(Requirement(p), "matrix.packages") for p in cell.packages]
        clash = disagreement([*own, *items])
        found = [f"{clash[0].shown()} conflicts with {clash[1].shown()}"] if clash else []
        found += [p for p in (_axis_problem(cell, i) for i in items) if p]
        problems += [p for p in found if p not in problems]
        kept = [i for i in items if i.name not in AXIS_PACKAGES]
        cells.append(replace(cell, packages=merged([*own, *kept]) if kept else cell.packages))
    if problems:
        raise ConfigError(
            [f"{config.origin}: {p}" for p in problems],
            "the project's [build-system] requires joins each cell's packages (its wheel is built from the lock): "
            "make the two agree",
        )
    return replace(config, cells=tuple(cells))


def cell_packages(cell: Cell, deps: ProjectDeps, data: CompatData | None = None) -> tuple[tuple[str, ...], list[str]]:
    """(the cell's packages with the declaration's, the conflicts found)."""
    items = for_env(deps, cell.python, cell.platform)
    own = [Item(Requirement(p), "matrix.packages") for p in cell.packages]
    problems = []
    rp = deps.requires_python
    if rp is not None and rp[0] and not python_fits(rp[0], cell.python):
        problems.append(f"Python {cell.python} (matrix.python) conflicts with {rp[1]} {rp[0]}")
    clash = disagreement([*own, *items])
    if clash:
        problems.append(f"{clash[0].shown()} conflicts with {clash[1].shown()}")
    for item in [*items, *(_family_items(items, data) if data is not None else [])]:
        problem = _axis_problem(cell, item)
        if problem:
            problems.append(problem)
    kept = [i for i in items if i.name not in AXIS_PACKAGES or i.req.extras]
    for i, item in enumerate(kept):
        if item.name in AXIS_PACKAGES:  # `transformers[torch]`: its extras, at the cell's version
            pinned = Requirement(str(item.req))
            pinned.specifier = SpecifierSet(f"=={getattr(cell, item.name)}")
            kept[i] = Item(pinned, item.where)
    return merged([*own, *kept]), problems


def _axis_problem(cell: Cell, item: Item) -> str | None:
    if item.name not in AXIS_PACKAGES:
        return None
    have = getattr(cell, item.name)
    if item.req.url:
        return f"{item.shown()} names a wheel by URL: the matrix's {item.name} axis chooses {item.name}"
    local = local_label(item)
    if not admits(item, have) or (item.name == "torch" and local and local != cell.variant):
        shown = f"{have}+{cell.variant}" if local else have
        return f"{item.name} {shown} (matrix.{item.name}, cell {cell.id}) conflicts with {item.shown()}"
    return None


def merged(items: list[Item]) -> tuple[str, ...]:
    """One requirement per name, sorted: a name stated once keeps its text; several are joined (extras united,
    specifiers intersected, a wheel URL kept). A constraint adds nothing of its own: it narrows what is required."""
    by_name: dict[str, list[Item]] = {}
    for item in items:
        by_name.setdefault(item.name, []).append(item)
    out = []
    for group in by_name.values():
        required = [i for i in group if not i.constraint]
        if not required:
            continue
        if len(group) == 1:
            out.append(direct_wheels.requirement(str(group[0].req)))
            continue
        url = next((i for i in group if i.req.url), None)
        if url is not None:
            out.append(direct_wheels.requirement(str(url.req)))
            continue
        joined = Requirement(str(required[0].req))
        joined.extras = set().union(*(i.req.extras for i in group))
        joined.specifier = SpecifierSet(",".join(str(i.req.specifier) for i in group if str(i.req.specifier)))
        out.append(direct_wheels.requirement(str(joined)))
    return tuple(sorted(dict.fromkeys(out)))


# ---- `imagekit init --from`: the axes a declaration asks for ----------------------------------------------------
@dataclass(frozen=True)
class Axes:
    values: dict[str, tuple[str, ...]]
    notes: tuple[str, ...]


def derive(
    deps: ProjectDeps, given: dict[str, tuple[str, ...]], defaults: dict[str, tuple[str, ...]], data: CompatData
) -> Axes:
    """The four axes for a declaration: an axis given on the command line is checked against it (a conflict is a
    UsageError naming both); one not given is the default's values it allows, else the newest release it allows that
    the compatibility data knows (a pin: that release)."""
    notes: list[str] = []
    python = _python(deps, given.get("python"), defaults["python"], data, notes)
    items = [i for py in python for i in for_env(deps, py)]
    clash = disagreement([i for i in items if i.name in (*AXIS_PACKAGES, "torchvision", "torchaudio")])
    if clash:
        raise UsageError(f"{clash[0].shown()} conflicts with {clash[1].shown()}", "keep one pin of each package")
    torch_items = [i for i in items if i.name == "torch"] + _family_items(items, data)
    torch = _axis("torch", torch_items, given.get("torch"), defaults["torch"], data, notes)
    variants = sorted({local_label(i) for i in torch_items if local_label(i)})
    cuda = given.get("cuda")
    if cuda:
        for v in cuda:
            wrong = [i for i in torch_items if local_label(i) and local_label(i) != f"cu{v.replace('.', '')}"]
            if wrong:
                raise UsageError(f"--cuda {v} conflicts with {wrong[0].shown()}", "drop --cuda, or the pin's +cuXYZ")
    elif variants:
        cuda = tuple(validate.cuda(v) for v in variants)
        notes.append(f"cuda {', '.join(cuda)}: the CUDA variant torch's pin names")
    elif torch != defaults["torch"]:
        cuda = tuple(sorted({validate.cuda(data.torch_minor(t).pypi_default) for t in torch}, key=Version))
        notes.append(f"cuda {', '.join(cuda)}: PyPI's default CUDA build of torch {', '.join(torch)}")
    else:
        cuda = defaults["cuda"]
    tf_items = [i for i in items if i.name == "transformers"]
    transformers = _axis("transformers", tf_items, given.get("transformers"), defaults["transformers"], data, notes)
    return Axes({"cuda": cuda, "torch": torch, "transformers": transformers, "python": python}, tuple(notes))


def _python(
    deps: ProjectDeps, given: tuple[str, ...] | None, default: tuple[str, ...], data: CompatData, notes: list[str]
) -> tuple[str, ...]:
    rp = deps.requires_python
    if rp is None or not rp[0]:
        return given or default
    spec, where = rp
    if given:
        bad = [p for p in given if not python_fits(spec, p)]
        if bad:
            raise UsageError(f"--python {bad[0]} conflicts with {where} {spec}", "drop --python, or pick one it allows")
        return given
    fits = tuple(p for p in default if python_fits(spec, p))
    if fits:
        return fits
    known = sorted((p for p in data.bases if python_fits(spec, p)), key=Version)
    if not known:
        raise UsageError(
            f"{where} {spec} allows no Python imagekit has a base for ({', '.join(sorted(data.bases))})",
            'add a [bases."X.Y"] table to the matrix file by hand, with --python X.Y',
        )
    notes.append(f"python {known[-1]}: the newest with a base that {where} {spec} allows")
    return (known[-1],)


def _family_items(items: list[Item], data: CompatData) -> list[Item]:
    """A torchvision or torchaudio pin asks for the torch its release requires (the compatibility data's)."""
    out = []
    for item in items:
        pin = exact(item.req)
        if item.name in ("torchvision", "torchaudio") and pin:
            release = data.packages.get(item.name, {}).get(pin.split("+")[0])
            spec = release.requires.get("torch") if release is not None else None
            if spec:
                out.append(Item(Requirement(f"torch{spec}"), f"{item.shown()} (it requires torch{spec})"))
    return out


def _axis(
    name: str,
    items: list[Item],
    given: tuple[str, ...] | None,
    default: tuple[str, ...],
    data: CompatData,
    notes: list[str],
) -> tuple[str, ...]:
    if given:
        for value in given:
            bad = [i for i in items if not admits(i, value)]
            if bad:
                raise UsageError(
                    f"--{name} {value} conflicts with {bad[0].shown()}", f"drop --{name}, or change the pin in the file"
                )
        return given
    if not items:
        return default
    pins = [exact(i.req).split("+")[0] for i in items if exact(i.req)]
    if pins:
        notes.append(f"{name} {pins[0]}: pinned by {next(i.where for i in items if exact(i.req))}")
        return (pins[0],)
    fits = tuple(v for v in default if all(admits(i, v) for i in items))
    if fits:
        return fits
    usable = [r for r in data.releases(name) if _usable(name, r, data) and all(admits(i, r) for i in items)]
    if not usable:
        raise UsageError(
            f"no {name} release imagekit knows satisfies " + "; ".join(i.shown() for i in items),
            "check the requirement; a release newer than imagekit's data needs `imagekit compat refresh`",
        )
    notes.append(f"{name} {usable[-1]}: the newest known release " + "; ".join(i.shown() for i in items) + " allows")
    return (usable[-1],)


def _usable(name: str, release: str, data: CompatData) -> bool:
    v = _version(release)
    if v is None or v.is_prerelease:
        return False
    if name == "torch":
        return f"{v.major}.{v.minor}" in data.torch_minors
    rel = data.packages.get(name, {}).get(release)
    return rel is not None and not rel.yanked
