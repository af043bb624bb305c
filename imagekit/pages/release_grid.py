"""The release page's content: every cell of the release index and of the matrix on its Python's torch × CUDA grid,
each marked with its state, the rules that excluded cells as numbered notes citing their sources, and a card per
published or failed cell. Pure: the checked index, the evaluated matrix and failed self-test reports in, a Page out.

States: a published cell is *passed* when its self-test's GPU checks ran and passed, *gpu-skipped* when it passed
without them, *failed* when the record's report or the latest build's report (``FailedRun``) says it failed; a
matrix cell that is not published is *excluded* (a rule dropped it) or *unpublished*.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from imagekit import __version__
from imagekit.compat.catalog import CompatData
from imagekit.errors import UsageError
from imagekit.matrix.matrix_file import EvaluatedCell
from imagekit.matrix.outputs import short_reason
from imagekit.model import AMD64, DEBIAN_ARCH, Violation
from imagekit.oci.release_record import CELL_ID
from imagekit.pages import cell_facts as facts
from imagekit.pages.cell_facts import EXCLUDED, FAILED, STATES, UNPUBLISHED, Card, Fact, shown

# A cell id: cu124-torch2.5.1-py3.11-tf4.48.2 (model.Cell.id), read back when a record's cell names no axes.
_CELL_ID = re.compile(r"(?P<variant>[a-z]+[0-9.]*)-torch(?P<torch>[^-]+)-py(?P<python>[0-9.]+)-tf(?P<tf>.+)", re.ASCII)
_ANCHOR_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+", re.ASCII)


@dataclass(frozen=True)
class FailedRun:
    """The self-test report of a build that failed, so published nothing (`build` leaves it in its state folder,
    ``reports/<cell slug>.json``; the CI workflow uploads it)."""

    cell: str  # the cell id
    platform: str
    report: dict
    source: str  # the file it was read from, as the page names it


@dataclass(frozen=True)
class Place:
    python: str
    torch: str
    variant: str
    transformers: str
    platform: str


@dataclass(frozen=True)
class Chip:
    """One mark in a grid's slot: a cell, or every excluded cell of the slot together."""

    state: str
    label: str
    title: str  # the hover text: each cell with its state, an exclusion with its rule's message and source
    anchor: str = ""  # its card (published and failed cells)
    cells: tuple[str, ...] = ()  # the cell keys it stands for
    notes: tuple[int, ...] = ()  # the numbers of the notes citing the rules that excluded them

    @property
    def mark(self) -> str:
        return STATES[self.state][0]


@dataclass(frozen=True)
class Row:
    torch: str
    slots: tuple[tuple[Chip, ...], ...]  # one per CUDA variant of the grid


@dataclass(frozen=True)
class Grid:
    python: str
    variants: tuple[str, ...]
    rows: tuple[Row, ...]

    @property
    def anchor(self) -> str:
        return "py-" + _ANCHOR_UNSAFE.sub("-", self.python)


@dataclass(frozen=True)
class Note:
    number: int
    rule: str
    source: str


@dataclass(frozen=True)
class Page:
    grids: tuple[Grid, ...]
    cards: tuple[Card, ...]
    notes: tuple[Note, ...]
    unplaced: tuple[Chip, ...]  # published cells whose record names no torch, CUDA variant or Python
    counts: tuple[tuple[str, int], ...]  # (state, how many cells) for every state
    images: int  # releases in the index
    index_digest: str
    matrix: str  # where the matrix came from (its file, or the default)
    version: str = __version__


@dataclass
class _Item:
    key: str
    place: Place | None
    state: str
    anchor: str = ""
    title: str = ""
    violations: tuple[Violation, ...] = field(default_factory=tuple)


def natural(text: str) -> tuple:
    """A sort key that puts 2.10 after 2.9 and cu118 before cu124, for any string (a record's may be odd)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"([0-9]+)", text) if p)


def key_of(cell_id: str, platform: str) -> str:
    """The cell on its platform, as model.Cell.key names it."""
    return cell_id if platform == AMD64 else f"{cell_id}@{platform}"


def failed_run(doc: object, file_name: str) -> FailedRun | None:
    """The failed run a self-test report file (``<cell slug>.json``) records; None for a report that passed (its
    release record says what it found). Another party's file (a CI artifact): a report of another shape, or named for
    another cell, raises UsageError naming what is wrong."""
    if not isinstance(doc, dict):
        raise UsageError("expected an object (a self-test report)")
    cell = doc.get("cell")
    if not isinstance(cell, str) or not CELL_ID.fullmatch(cell):
        raise UsageError("cell: expected a cell id (such as cu121-torch2.1.2-py3.11-tf4.48.2)")
    if not isinstance(doc.get("passed"), bool) or not isinstance(doc.get("checks"), list):
        raise UsageError("expected 'passed' (true or false) and 'checks' (a list)")
    slugs = {f"{cell}.json" if p == AMD64 else f"{cell}-{arch}.json": p for p, arch in DEBIAN_ARCH.items()}
    if file_name not in slugs:
        raise UsageError(f"its name is not its cell's ({cell}.json, or {cell}-arm64.json for linux/arm64)")
    if facts.state_of(doc) != FAILED:
        return None
    return FailedRun(cell, slugs[file_name], doc, shown(file_name, 160))


def place_of(cell: dict) -> Place | None:
    """Where a record's cell sits: its axes as the manifest states them, else read from its id; None when neither
    says (an odd id, from another party)."""
    platform = cell.get("platform") if isinstance(cell.get("platform"), str) else AMD64
    axes = [cell.get(k) for k in ("python", "torch", "variant", "transformers")]
    if all(isinstance(a, str) and a for a in axes):
        return Place(*(shown(a, 64) for a in axes), shown(platform, 32))  # type: ignore[arg-type]
    m = _CELL_ID.fullmatch(str(cell.get("id", "")))
    if m is None:
        return None
    return Place(m["python"], m["torch"], m["variant"], m["tf"], shown(platform, 32))


def _releases(images: dict) -> dict[str, list[dict]]:
    """Each cell's releases, newest first (by publish time, then tag)."""
    found: dict[str, list[dict]] = {}
    for entry in images.values():
        cell = entry["manifest"]["cell"]
        platform = shown(cell["platform"], 32) if isinstance(cell.get("platform"), str) else AMD64
        found.setdefault(key_of(cell["id"], platform), []).append(entry)
    for entries in found.values():
        entries.sort(key=lambda e: (str(e.get("published_at") or ""), e["tag"]), reverse=True)
    return found


class _Anchors:
    """Card anchors: ``cell-`` and the key with anything but letters, digits, '.', '_' and '-' made '-', each once."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, key: str) -> str:
        base = "cell-" + _ANCHOR_UNSAFE.sub("-", key)[:140]
        anchor, n = base, 1
        while anchor in self.used:
            n += 1
            anchor = f"{base}-{n}"
        self.used.add(anchor)
        return anchor


def _violations_text(violations: Iterable[Violation]) -> str:
    return "; ".join(f"{v.rule}: {v.message} (source: {v.source})" for v in violations)


def _published(
    images: dict, evaluated: dict[str, EvaluatedCell], failed: dict[str, FailedRun], data: CompatData, anchors: _Anchors
) -> tuple[list[_Item], list[Card]]:
    items, cards, gpu_lines = [], [], {}
    for key, entries in sorted(_releases(images).items()):
        newest, anchor = entries[0], anchors(key)
        now = evaluated.get(key)
        note = None
        if now is not None and now.verdict.violations:
            note = Fact("The matrix now excludes it", _violations_text(now.verdict.violations), missing=True)
        made = facts.card(shown(key, 160), anchor, newest, data, entries[1:], note, gpu_lines)
        run = failed.get(key)
        if run is not None:  # the latest build failed: what is published is an older build
            made = _with_failed_run(made, run)
        cards.append(made)
        title = f"{made.title}: {STATES[made.state][2]}; {newest['tag']}"
        items.append(_Item(key, place_of(newest["manifest"]["cell"]), made.state, anchor, title))
    return items, cards


def _with_failed_run(made: Card, run: FailedRun) -> Card:
    return replace(made, state=FAILED, failed_run=facts.selftest(run.report, run.platform), failed_source=run.source)


def _failed_only(
    failed: dict[str, FailedRun], published: set[str], anchors: _Anchors
) -> tuple[list[_Item], list[Card]]:
    items, cards = [], []
    for key, run in sorted(failed.items()):
        if key in published:
            continue
        anchor = anchors(key)
        cards.append(
            Card(
                shown(key, 160),
                anchor,
                shown(key, 160),
                FAILED,
                (Fact("Published", "nothing: its build's self-test failed, so nothing was pushed", missing=True),),
                failed_run=facts.selftest(run.report, run.platform),
                failed_source=run.source,
            )
        )
        place = place_of({"id": run.cell, "platform": run.platform})
        items.append(_Item(key, place, FAILED, anchor, f"{shown(key, 160)}: {STATES[FAILED][2]} ({run.source})"))
    return items, cards


def _matrix_items(evaluated: dict[str, EvaluatedCell], taken: set[str]) -> list[_Item]:
    items = []
    for key, e in sorted(evaluated.items()):
        if key in taken:
            continue
        c = e.cell
        place = Place(c.python, c.torch, c.variant, c.transformers, c.platform)
        if e.verdict.compatible:
            items.append(_Item(key, place, UNPUBLISHED, title=f"{key}: {STATES[UNPUBLISHED][2]}"))
        else:
            items.append(
                _Item(
                    key,
                    place,
                    EXCLUDED,
                    title=f"{key}: {_violations_text(e.verdict.violations)}",
                    violations=e.verdict.violations,
                )
            )
    return items


def _label(place: Place) -> str:
    return f"tf {place.transformers}" + ("" if place.platform == AMD64 else f" · {place.platform.split('/')[-1]}")


class _Notes:
    """The notes citing the rules behind exclusions, numbered as the grids first meet them."""

    def __init__(self) -> None:
        self.numbers: dict[tuple[str, str], int] = {}

    def __call__(self, violations: Iterable[Violation]) -> tuple[int, ...]:
        found = []
        for v in violations:
            found.append(self.numbers.setdefault((v.rule, v.source), len(self.numbers) + 1))
        return tuple(sorted(set(found)))

    def notes(self) -> tuple[Note, ...]:
        return tuple(Note(n, shown(rule, 80), shown(source, 400)) for (rule, source), n in self.numbers.items())


def _slot(items: list[_Item], notes: _Notes) -> tuple[Chip, ...]:
    """A slot's chips: each published, failed or unpublished cell, then one for all its excluded cells."""
    chips = []
    for it in sorted((i for i in items if i.state != EXCLUDED), key=lambda i: (natural(_label(i.place)), i.key)):
        chips.append(Chip(it.state, shown(_label(it.place), 60), it.title, it.anchor, (it.key,)))  # type: ignore[arg-type]
    excluded = sorted((i for i in items if i.state == EXCLUDED), key=lambda i: natural(i.key))
    if excluded:
        reasons = sorted({short_reason(v.rule, v.message) for i in excluded for v in i.violations})
        numbers = notes([v for i in excluded for v in i.violations])
        chips.append(
            Chip(
                EXCLUDED,
                shown("; ".join(reasons), 80),
                "\n".join(i.title for i in excluded),
                cells=tuple(i.key for i in excluded),
                notes=numbers,
            )
        )
    return tuple(chips)


def _grids(items: list[_Item], notes: _Notes) -> tuple[Grid, ...]:
    by_python: dict[str, list[_Item]] = {}
    for it in items:
        by_python.setdefault(it.place.python, []).append(it)  # type: ignore[union-attr]
    grids = []
    for python in sorted(by_python, key=natural):
        mine = by_python[python]
        variants = tuple(sorted({i.place.variant for i in mine}, key=natural))  # type: ignore[union-attr]
        torches = sorted({i.place.torch for i in mine}, key=natural)  # type: ignore[union-attr]
        rows = []
        for torch in torches:
            slots = []
            for variant in variants:
                here = [i for i in mine if i.place.torch == torch and i.place.variant == variant]  # type: ignore[union-attr]
                slots.append(_slot(here, notes))
            rows.append(Row(torch, tuple(slots)))
        grids.append(Grid(python, variants, tuple(rows)))
    return tuple(grids)


def build(
    images: dict,
    evaluated: list[EvaluatedCell],
    failed: list[FailedRun],
    data: CompatData,
    *,
    index_digest: str,
    matrix: str,
) -> Page:
    """The page for a checked index's ``images``, the matrix's ``evaluated`` cells and ``failed`` self-test reports;
    the same inputs give the same page."""
    anchors = _Anchors()
    by_key = {e.cell.key: e for e in evaluated}
    failures = {key_of(r.cell, r.platform): r for r in sorted(failed, key=lambda r: r.source)}
    items, cards = _published(images, by_key, failures, data, anchors)
    more, failed_cards = _failed_only(failures, {i.key for i in items}, anchors)
    items += more
    items += _matrix_items(by_key, {i.key for i in items})
    notes = _Notes()
    grids = _grids([i for i in items if i.place is not None], notes)
    unplaced = tuple(Chip(i.state, shown(i.key, 160), i.title, i.anchor, (i.key,)) for i in items if i.place is None)
    counts = tuple((state, sum(1 for i in items if i.state == state)) for state in STATES)
    cards = sorted(cards + failed_cards, key=lambda c: (natural(c.key), c.anchor))
    return Page(grids, tuple(cards), notes.notes(), unplaced, counts, len(images), index_digest, matrix)
