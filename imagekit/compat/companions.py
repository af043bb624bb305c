"""torch's companion libraries: which release of each goes with which torch, and what torch imports undeclared. Pure.

The table is ``[[companion]]`` rows in compat.toml (each with its source) plus a row per release whose index
metadata pins torch (a wheel's ``Requires-Dist: torch==2.7.1``, recorded by `imagekit compat refresh`); triton is
what each torch release's own METADATA requires of it. `constraints` turns it into one requirement per name for a
cell's torch: what the lock hands the resolver as constraints (they bind only a name the resolution holds), what
`explain` names, what a pin of the user's is checked against, and what a lock read back is held to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

if TYPE_CHECKING:
    from imagekit.compat.catalog import CompatData

# Each companion and the module the self-test imports to check it (the import name its wheel installs).
MODULES = {
    "torchvision": "torchvision",
    "torchaudio": "torchaudio",
    "torchao": "torchao",
    "torchtext": "torchtext",
    "torchdata": "torchdata",
    "xformers": "xformers",
    "fbgemm-gpu": "fbgemm_gpu",
    "triton": "triton",
}
METADATA_SOURCE = "PYPI"  # a row read from a release's METADATA


@dataclass(frozen=True)
class CompanionRow:
    """Releases of ``name`` (a specifier: ``==0.13.0``, ``==0.29.*``) and the torch they were built for."""

    name: str
    releases: str
    torch: str
    source: str
    confidence: str


@dataclass(frozen=True)
class UndeclaredRow:
    """What torch imports without declaring it: ``name`` held to ``requires`` for the torch releases in ``torch``."""

    name: str
    requires: str
    torch: str
    why: str
    source: str
    confidence: str
    module: str | None = None  # what the self-test imports to check it


@dataclass(frozen=True)
class Constraint:
    """What the table asks of ``name`` for one torch: a requirement (``torchaudio==2.7.1``), why, and its source."""

    name: str
    spec: str
    why: str
    source: str
    kind: str  # "companion" | "undeclared"
    matched: tuple[str, ...] = ()  # the releases the table pairs with this torch (a companion's)

    @property
    def requirement(self) -> str:
        return f"{self.name}{self.spec}"

    @property
    def binding(self) -> bool:
        """Whether it asks anything of the resolver (a companion the table knows no release of for this torch is
        named, and left to its own metadata)."""
        return bool(self.spec)

    def to_json(self) -> dict[str, object]:
        return {"requires": self.spec, "why": self.why, "source": self.source}


def parse_rows(curated: Mapping) -> tuple[tuple[CompanionRow, ...], tuple[UndeclaredRow, ...]]:
    """The ``[[companion]]`` and ``[[undeclared]]`` tables of compat.toml."""
    companions = tuple(
        CompanionRow(canonicalize_name(c["name"]), c["releases"], c["torch"], c["source"], c["confidence"])
        for c in curated.get("companion", ())
    )
    undeclared = tuple(
        UndeclaredRow(
            canonicalize_name(u["name"]),
            u["requires"],
            u["torch"],
            u["why"],
            u["source"],
            u["confidence"],
            u.get("module"),
        )
        for u in curated.get("undeclared", ())
    )
    return companions, undeclared


def derived_rows(packages: Mapping[str, Mapping]) -> list[CompanionRow]:
    """Rows the index metadata gives: each release of a companion whose METADATA pins torch (``torch==2.7.1``: the
    torch it was built for). A floor (``torch>=2.11``) says only what it needs, not what it was built for: no row."""
    out = []
    for name in MODULES:
        for version, rel in packages.get(name, {}).items():
            spec = _requires(rel, "torch")
            if spec and _is_pin(spec) and not _yanked(rel):
                out.append(
                    CompanionRow(name, f"=={version}", spec, f"{METADATA_SOURCE} ({name} {version} METADATA)", "V")
                )
    return out


def triton_constraint(torch: str, torch_releases: Mapping[str, Mapping]) -> Constraint | None:
    """The triton torch ``torch`` was built with: its own METADATA's requirement (``triton==2.1.0``; 2.14:
    ``triton~=3.8.0``), as `imagekit compat refresh` records it. torch pulls it in itself; a cell that names triton
    is held to it as well."""
    spec = _requires(torch_releases.get(torch), "triton")
    if spec is None:
        return None
    source = f"{METADATA_SOURCE} (torch {torch} METADATA)"
    return Constraint("triton", spec, f"torch {torch} requires triton{spec}", source, "companion")


def _requires(rel: object, name: str) -> str | None:
    requires = rel.get("requires") if isinstance(rel, Mapping) else None
    spec = requires.get(name) if isinstance(requires, Mapping) else None
    return spec if isinstance(spec, str) and spec else None


def _is_pin(spec: str) -> bool:
    """One exact version: ``==2.7.1``."""
    try:
        parts = list(_specifier(spec))
    except InvalidSpecifier:
        return False
    return len(parts) == 1 and parts[0].operator == "==" and not parts[0].version.endswith(".*")


def _yanked(rel: object) -> bool:
    """A release marked yanked: a metadata document's object, or `catalog.PackageRelease`."""
    return (rel.get("yanked") if isinstance(rel, Mapping) else getattr(rel, "yanked", False)) is True


@lru_cache(maxsize=4096)
def _specifier(spec: str) -> SpecifierSet:
    return SpecifierSet(spec)


def allows(spec: str, version: str) -> bool:
    """Whether ``version`` meets ``spec`` (a local label such as ``+cu118`` is ignored, as PEP 440 says)."""
    try:
        return _specifier(spec).contains(Version(version).public, prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False


# ---- intervals: enough of a specifier to tell "below", "above" and "disjoint" ------------------------------------
Bound = tuple[Version, bool] | None  # (version, inclusive); None: unbounded


def interval(spec: str) -> tuple[Bound, Bound]:
    """The smallest [low, high] a specifier set allows, ``!=`` left out (``==2.9.*`` -> [2.9, 2.10))."""
    low: Bound = None
    high: Bound = None
    for s in _specifier(spec):
        lo, hi = _one(s)
        low = _tighter(low, lo, lower=True)
        high = _tighter(high, hi, lower=False)
    return low, high


def _one(s: Specifier) -> tuple[Bound, Bound]:
    op, text = s.operator, s.version
    if op in ("==", "===") and text.endswith(".*"):
        base = Version(text[:-2])
        parts = list(base.release)
        parts[-1] += 1
        return (base, True), (Version(".".join(map(str, parts))), False)
    v = Version(text.removesuffix(".*")) if op != "===" else _version_or_none(text)
    if v is None:
        return None, None
    if op in ("==", "==="):
        return (v, True), (v, True)
    if op == ">=":
        return (v, True), None
    if op == ">":
        return (v, False), None
    if op == "<=":
        return None, (v, True)
    if op == "<":
        return None, (v, False)
    if op == "~=":
        parts = list(v.release[:-1]) or [v.release[0]]
        parts[-1] += 1
        return (v, True), (Version(".".join(map(str, parts))), False)
    return None, None  # != excludes points only


def _version_or_none(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _tighter(have: Bound, new: Bound, *, lower: bool) -> Bound:
    if new is None:
        return have
    if have is None:
        return new
    if new[0] != have[0]:
        return new if (new[0] > have[0]) == lower else have
    return (have[0], have[1] and new[1])


def disjoint(a: str, b: str) -> bool:
    """Whether no version can meet both specifier sets (``!=`` aside; pins compared exactly)."""
    (alo, ahi), (blo, bhi) = interval(a), interval(b)
    low = _tighter(alo, blo, lower=True)
    high = _tighter(ahi, bhi, lower=False)
    if low is None or high is None:
        return False
    if low[0] != high[0]:
        return low[0] > high[0]
    return not (low[1] and high[1])


def side_of(spec: str, version: str) -> str:
    """Where ``version`` lies against what ``spec`` allows: "in", "below" (older than all of it), "above", "out"."""
    if allows(spec, version):
        return "in"
    v = Version(Version(version).public)
    low, high = interval(spec)
    if low is not None and (v < low[0] or (v == low[0] and not low[1])):
        return "below"
    if high is not None and (v > high[0] or (v == high[0] and not high[1])):
        return "above"
    return "out"


# ---- the table for one torch -------------------------------------------------------------------------------------
def _known(name: str, rows: Iterable[CompanionRow], packages: Mapping[str, Mapping]) -> list[Version]:
    """The releases of ``name`` the table can speak of: the index metadata's (not yanked, no pre-releases) and each
    exact release a row names."""
    found = {
        Version(v) for v, rel in packages.get(name, {}).items() if not _yanked(rel) and not Version(v).is_prerelease
    }
    for row in rows:
        if row.name != name:
            continue
        for s in _specifier(row.releases):
            if s.operator == "==" and not s.version.endswith(".*"):
                found.add(Version(s.version))
    return sorted(found)


def _rows_of(release: Version, curated: list[CompanionRow], derived: list[CompanionRow]) -> list[CompanionRow]:
    """The rows that say which torch ``release`` goes with: the curated ones where any names it, else the index
    metadata's (a triton release can go with several torch releases)."""
    mine = [row for row in curated if allows(row.releases, str(release))]
    return mine or [row for row in derived if allows(row.releases, str(release))]


def _spec_of(allowed: list[Version], forbidden: list[Version]) -> str:
    """One specifier for exactly the ``allowed`` releases among those known (a gap's forbidden releases excluded)."""
    low, high = allowed[0], allowed[-1]
    if low == high:
        return f"=={low}"
    inside = [f for f in forbidden if low < f < high]
    return f">={low},<={high}" + "".join(f",!={f}" for f in inside)


def companion_constraint(name: str, torch: str, curated: list[CompanionRow], derived: list[CompanionRow],
                         packages: Mapping[str, Mapping]) -> Constraint | None:  # fmt: skip
    """What the table asks of companion ``name`` in a cell of ``torch``; None where it knows no release of it."""
    known = _known(name, [*curated, *derived], packages)
    rows = {r: _rows_of(r, curated, derived) for r in known}
    allowed = [r for r, rs in rows.items() if any(allows(row.torch, torch) for row in rs)]
    forbidden = [r for r, rs in rows.items() if rs and r not in allowed]
    if allowed:
        sources = _sources(row for r in allowed for row in rows[r] if allows(row.torch, torch))
        shown = ", ".join(str(r) for r in allowed)
        return Constraint(name, _spec_of(allowed, forbidden), f"torch {torch} goes with {name} {shown}", sources,
                          "companion", tuple(str(r) for r in allowed))  # fmt: skip
    if not forbidden:
        return None
    # No release in the table goes with this torch. Those it gives to newer torch releases are kept out (a companion
    # built for a newer torch fails on an older one: torchao's NF4Tensor, torchaudio 2.11.0's libcudart.so.13);
    # beyond that nothing is known, so the companion's own metadata decides.
    newer = [r for r in forbidden if {side_of(row.torch, torch) for row in rows[r]} == {"below"}]
    sources = _sources(row for r in forbidden for row in rows[r])
    if not newer:
        why = (f"the table knows no release of {name} for torch {torch} (the releases it names, {forbidden[0]} ... "
               f"{forbidden[-1]}, go with older torch releases): its own metadata decides")  # fmt: skip
        return Constraint(name, "", why, sources, "companion")
    later = [r for r in known if r >= newer[0]]
    spec = f"<{newer[0]}" if later == newer else ",".join(f"!={r}" for r in newer)
    why = (f"the table knows no release of {name} for torch {torch}; {newer[0]} and later ones go with newer torch "
           "releases")  # fmt: skip
    return Constraint(name, spec, why, sources, "companion")


def _sources(rows: Iterable[CompanionRow | None]) -> str:
    """The rows' sources, each once; past three, the first two and how many more (the METADATA of many releases is
    one mention)."""
    keys: list[str] = []
    for row in rows:
        if row is not None and row.source not in keys:
            keys.append(row.source)
    metadata = [k for k in keys if k.startswith(METADATA_SOURCE + " (")]
    if len(keys) > 3 and len(metadata) > 1:
        keys = [k for k in keys if k not in metadata] + [f"{METADATA_SOURCE} (each release's METADATA)"]
    return "; ".join(keys) if len(keys) <= 3 else "; ".join(keys[:2]) + f"; and {len(keys) - 2} more rows"


def undeclared_constraints(torch: str, rows: Iterable[UndeclaredRow]) -> list[Constraint]:
    """What torch ``torch`` imports without declaring it, held where the table says."""
    out: dict[str, Constraint] = {}
    for row in rows:
        if not allows(row.torch, torch):
            continue
        have = out.get(row.name)
        spec = row.requires if have is None else f"{have.spec},{row.requires}"
        why = row.why if have is None else f"{have.why}; {row.why}"
        source = row.source if have is None else f"{have.source}; {row.source}"
        out[row.name] = Constraint(row.name, spec, why, source, "undeclared")
    return list(out.values())


def modules_of(name: str, rows: Iterable[UndeclaredRow]) -> list[str]:
    """What the self-test imports to check a name of the table."""
    if name in MODULES:
        return [MODULES[name]]
    return [r.module for r in rows if r.name == name and r.module]


def conflicts(
    requirements: Iterable[str], constraints: Iterable[Constraint], env: Mapping[str, str] | None = None
) -> list[tuple[str, Constraint]]:
    """Each of ``requirements`` (the cell's packages) that no release can meet together with the table's constraint
    on its name: a pin outside it, or a range disjoint from it. ``env``: the image's marker environment (a
    requirement whose marker it does not meet is not the image's)."""
    by_name = {c.name: c for c in constraints}
    out = []
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        c = by_name.get(canonicalize_name(req.name))
        if c is None or not c.binding or req.url or not str(req.specifier):
            continue
        if req.marker is not None and env is not None and not req.marker.evaluate(dict(env)):
            continue
        pins = [s.version for s in req.specifier if s.operator in ("==", "===") and not s.version.endswith(".*")]
        if (pins and not allows(c.spec, pins[0])) or (not pins and disjoint(str(req.specifier), c.spec)):
            out.append((text, c))
    return out


def drift(pins: Mapping[str, str], constraints: Iterable[Constraint]) -> list[tuple[str, str, Constraint]]:
    """Each pinned (name, version) the table's constraint for the cell's torch does not allow."""
    return [
        (c.name, pins[c.name], c)
        for c in constraints
        if c.binding and c.name in pins and not allows(c.spec, pins[c.name])
    ]


def constraints(data: CompatData, torch: str) -> tuple[Constraint, ...]:
    """Every constraint the table puts on a cell of ``torch``: one per companion it knows releases of, then what
    torch imports undeclared (cached on ``data``: a matrix asks for the same torch many times)."""
    key = ("companions", torch)
    if key not in data.cache:
        out: list[Constraint] = []
        for name in MODULES:
            if name == "triton":
                triton = triton_constraint(torch, data.torch_releases)
                out += [triton] if triton is not None else []
                continue
            curated = [r for r in data.companions if r.name == name]
            derived = [r for r in data.companions_derived if r.name == name]
            found = companion_constraint(name, torch, curated, derived, data.packages)
            if found is not None:
                out.append(found)
        data.cache[key] = (*out, *undeclared_constraints(torch, data.undeclared))
    return data.cache[key]
