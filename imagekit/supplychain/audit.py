"""An offline vulnerability gate: an image's packages (its SBOM: the lock's Python distributions, its Debian or Ubuntu
packages) against an OSV data export (osv.dev's per-ecosystem `all.zip`, or a folder of OSV JSON), by the OSV
schema's rules: `versions` lists and `ECOSYSTEM` ranges (introduced / fixed / last_affected events), PEP 440 order for
PyPI, dpkg's order for Debian and Ubuntu, whose records name source packages (a binary is matched by the source
version dpkg names, so a binNMU `1.2-3+b1` is source `1.2-3`).

What is read: each JSON text (a file, a zip member) is one OSV record, a JSON list of records, or osv.dev's query
answer ``{"vulns": [records]}``; nothing else. Every record is counted as used, unreadable (with the reason) or
withdrawn; a record is used when it has an id and names at least one affected package. The caller refuses a scan that
used none (a gate that read nothing usable would pass everything).

Severity: the HIGHEST of every rating the record gives for the package: its own (GitHub's
`database_specific.severity`), each CVSS v3 vector's base score (computed per the specification: 9.0 and up
critical, 7.0 high, 4.0 medium, above 0 low), the distribution's (Ubuntu's priority, Debian's urgency). A record with
none of these (or only a 0.0 score) is ``unknown``, "unrated": listed and counted always, gated only on request
(``fail_unrated``). An allowlist entry carries a reason and a review-by date; an expired one no longer covers anything.
Pure: records and packages in, findings out; the files are read by the caller
(`imagekit.services.publishing.audit_run`).
Everything a record or an SBOM says is hostile data: checked, bounded, never executed, and every string of it that
can be shown passes through :func:`imagekit.trust.untrusted.printable`.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote

from packaging.version import InvalidVersion, Version

from imagekit.supplychain import debversion
from imagekit.trust.untrusted import UntrustedData, load_json, printable

LEVELS = ("unknown", "low", "medium", "high", "critical")
MAX_FILE = 64 << 20  # bytes of one JSON text: a record (the largest real ones are a few MB) or a dump of them
MAX_DEPTH = 32  # an OSV record nests about 6 deep; a list or a query answer adds 2
_NAME = re.compile(r"[-_.]+")


def rank(level: str) -> int:
    return LEVELS.index(level)


@dataclass(frozen=True, order=True)
class Package:
    """One package an image holds, as vulnerability data names it."""

    ecosystem: str  # PyPI | deb
    name: str  # PEP 503 name for PyPI; the binary package for deb
    version: str
    source: str = ""  # deb: the source package (what Debian's and Ubuntu's records name)
    source_version: str = ""
    distro: str = ""  # deb: debian-12, ubuntu-24.04


@dataclass(frozen=True)
class Finding:
    id: str
    aliases: tuple[str, ...]
    package: Package
    severity: str
    summary: str
    fixed: str  # the first fixed version the record names for this package, or ""
    allowed_by: str = ""  # the allowlist entry's reason, when one covers it


@dataclass(frozen=True)
class AllowEntry:
    id: str
    reason: str
    review_by: dt.date
    package: str = ""  # only this package (PyPI name or Debian/Ubuntu package), when set

    def covers(self, finding: Finding) -> bool:
        names = {finding.package.name, finding.package.source}
        return self.id in (finding.id, *finding.aliases) and (not self.package or self.package in names)


class BadInput(ValueError):
    """An allowlist or record that cannot be read: the message says what and where."""


def pypi_name(name: str) -> str:
    return _NAME.sub("-", name).lower()


# ---- packages from an SBOM --------------------------------------------------------------------------------------
_PURL = re.compile(
    r"pkg:(?P<type>pypi|deb)/(?:(?P<ns>[a-z]+)/)?(?P<name>[^@?#/]+)@(?P<version>[^?#]+)(?:\?(?P<q>[^#]*))?"
)


def packages_from_sbom(doc: object) -> list[Package]:
    """The packages an SPDX document lists, by their purls (imagekit's SBOM, or another tool's with purls). A document
    of the wrong shape (``packages`` or an ``externalRefs`` that is not a list) raises BadInput: a gate never skips
    what it cannot read. Names and versions are made printable (they are shown), at most 256 characters."""
    if not isinstance(doc, dict):
        raise BadInput("not an SPDX JSON document (a JSON object)")
    packages = doc.get("packages", [])
    if not isinstance(packages, list):
        raise BadInput("its `packages` is not a list")
    out = []
    for n, pkg in enumerate(packages):
        if not isinstance(pkg, dict):
            raise BadInput(f"packages[{n}] is not an object")
        refs = pkg.get("externalRefs", [])
        if not isinstance(refs, list):
            raise BadInput(f"packages[{n}].externalRefs is not a list")
        for ref in refs:
            locator = ref.get("referenceLocator") if isinstance(ref, dict) else None
            match = _PURL.fullmatch(locator) if isinstance(locator, str) and len(locator) < 1024 else None
            if not match:
                continue
            name, version = _shown(unquote(match["name"])), _shown(unquote(match["version"]))
            if not name or not version:
                continue
            if match["type"] == "pypi":
                out.append(Package("PyPI", pypi_name(name), version))
                continue
            query = dict(part.partition("=")[::2] for part in (match["q"] or "").split("&") if part)
            source = _shown(unquote(query.get("upstream", ""))) or name
            info = pkg.get("sourceInfo") if isinstance(pkg.get("sourceInfo"), str) else ""
            source_version = _shown(info.rsplit(" ", 1)[-1]) if info.startswith("built package from: ") else version
            distro = _shown(unquote(query.get("distro", ""))) or (match["ns"] or "")
            out.append(Package("deb", name, version, source, source_version or version, distro))
    return sorted(set(out))


def _shown(text: str) -> str:
    """A name or version from hostile data as it may be matched and shown: printable, one line, 256 characters."""
    return printable(text, 256)


# ---- records ------------------------------------------------------------------------------------------------------
def _deb_ecosystems(distro: str) -> tuple[str, ...]:
    vendor, _, release = distro.partition("-")
    if vendor == "debian" and release:
        return (f"Debian:{release}",)
    if vendor == "ubuntu" and release:
        return (f"Ubuntu:{release}", f"Ubuntu:{release}:LTS")
    return ()


def _key(ecosystem: str, name: str) -> tuple[str, str]:
    return ecosystem, pypi_name(name) if ecosystem == "PyPI" else name


class _Order:
    """One ecosystem's version order: ``parse`` raises ValueError on a version it cannot compare."""

    def __init__(self, ecosystem: str) -> None:
        self.pypi = ecosystem == "PyPI"

    def cmp(self, a: str, b: str) -> int:
        if self.pypi:
            va, vb = Version(a), Version(b)
            return (va > vb) - (va < vb)
        return debversion.compare(a, b)


def _affected(version: str, entry: dict, order: _Order) -> tuple[bool, str]:
    """Is ``version`` affected by one `affected` entry? And the first fixed version it names (for the report)."""
    fixed_versions: list[str] = []
    versions = entry.get("versions")
    hit = False
    if isinstance(versions, list):
        for v in versions[:100_000]:
            if isinstance(v, str) and len(v) < 256:
                try:
                    if v == version or order.cmp(v, version) == 0:
                        hit = True
                        break
                except (ValueError, InvalidVersion):
                    continue
    ranges = entry.get("ranges")
    for rng in ranges if isinstance(ranges, list) else []:
        if not isinstance(rng, dict) or rng.get("type") not in ("ECOSYSTEM", "SEMVER"):
            continue  # GIT ranges name commits, not versions
        events = rng.get("events")
        events = [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []
        fixed_versions += [e["fixed"] for e in events if isinstance(e.get("fixed"), str) and len(e["fixed"]) < 256]
        if hit:
            continue
        state = False
        try:
            for event in _sorted_events(events, order):
                kind, value = next(iter(event.items()))
                if kind == "introduced" and (value == "0" or order.cmp(version, value) >= 0):
                    state = True
                elif kind == "fixed" and order.cmp(version, value) >= 0:
                    state = False
                elif kind == "last_affected" and order.cmp(version, value) > 0:
                    state = False
        except (ValueError, InvalidVersion):
            continue  # a range this order cannot read: not evidence either way
        hit = hit or state
    first_fixed = ""
    for candidate in fixed_versions:
        try:
            if order.cmp(candidate, version) > 0 and (not first_fixed or order.cmp(candidate, first_fixed) < 0):
                first_fixed = candidate
        except (ValueError, InvalidVersion):
            continue
    return hit, first_fixed


def _sorted_events(events: list[dict], order: _Order) -> list[dict]:
    """The events in version order ("introduced 0" first), each reduced to its one known key."""
    kept = []
    for event in events:
        for kind in ("introduced", "fixed", "last_affected"):
            value = event.get(kind)
            if isinstance(value, str) and len(value) < 256:
                kept.append({kind: value})
                break
    zero = [e for e in kept if e.get("introduced") == "0"]
    rest = [e for e in kept if e.get("introduced") != "0"]

    def cmp(x: dict, y: dict) -> int:
        return order.cmp(next(iter(x.values())), next(iter(y.values())))

    return zero + sorted(rest, key=functools.cmp_to_key(cmp))


# ---- severity -----------------------------------------------------------------------------------------------------
_CVSS3 = re.compile(r"CVSS:3\.[01]/((?:[A-Z]{1,3}:[A-Z]/?){8,})")
_W = {
    "AV": {"N": 0.85, "A": 0.62, "L": 0.55, "P": 0.2},
    "AC": {"L": 0.77, "H": 0.44},
    "UI": {"N": 0.85, "R": 0.62},
    "CIA": {"H": 0.56, "L": 0.22, "N": 0.0},
}


def _roundup(x: float) -> float:
    """CVSS v3.1's Roundup: the smallest number of one decimal place at or above ``x`` (spec, Appendix A)."""
    scaled = round(x * 100_000)
    return scaled / 100_000 if scaled % 10_000 == 0 else (math.floor(scaled / 10_000) + 1) / 10


def cvss3_score(vector: str) -> float | None:
    """The CVSS v3.0/v3.1 base score of ``vector`` (first.org's specification), or None when it is not one."""
    match = _CVSS3.fullmatch(vector.strip().rstrip("/"))
    if not match:
        return None
    metrics = dict(part.split(":", 1) for part in match[1].strip("/").split("/"))
    try:
        scope = metrics["S"]
        pr = {"N": 0.85, "L": 0.68 if scope == "C" else 0.62, "H": 0.5 if scope == "C" else 0.27}[metrics["PR"]]
        av, ac, ui = _W["AV"][metrics["AV"]], _W["AC"][metrics["AC"]], _W["UI"][metrics["UI"]]
        c, i, a = (_W["CIA"][metrics[k]] for k in ("C", "I", "A"))
    except KeyError:
        return None
    if scope not in ("U", "C"):
        return None
    iss = 1 - (1 - c) * (1 - i) * (1 - a)
    impact = 6.42 * iss if scope == "U" else 7.52 * (iss - 0.029) - 3.25 * (iss - 0.02) ** 15
    exploitability = 8.22 * av * ac * pr * ui
    if impact <= 0:
        return 0.0
    total = impact + exploitability if scope == "U" else 1.08 * (impact + exploitability)
    return _roundup(min(total, 10))


def level_of_score(score: float) -> str:
    if score >= 9.0:
        return "critical"
    if score >= 7.0:
        return "high"
    if score >= 4.0:
        return "medium"
    return "low" if score > 0 else "unknown"


_NAMED = {
    "critical": "critical",
    "high": "high",
    "moderate": "medium",
    "medium": "medium",
    "low": "low",
    "negligible": "low",
    "unimportant": "low",
}


def _named(value: object) -> str:
    """A rating by name (GitHub's, Ubuntu's priority, Debian's urgency, ``low*`` included), or ""."""
    if isinstance(value, str) and len(value) < 64:
        return _NAMED.get(value.strip().lower().rstrip("*"), "")
    return ""


def severity(record: dict, entry: dict) -> str:
    """The record's severity for one affected entry: the HIGHEST of every rating it gives (its own, each CVSS v3
    vector's base score, the distribution's), so no low rating hides a critical score; ``unknown`` when none."""
    levels = []
    db = record.get("database_specific")
    if isinstance(db, dict):
        levels.append(_named(db.get("severity")))
    scored = [record.get("severity"), entry.get("severity")]  # OSV allows a severity list per affected entry too
    for item in (i for items in scored if isinstance(items, list) for i in items):
        if not isinstance(item, dict) or not isinstance(item.get("score"), str) or len(item["score"]) > 256:
            continue
        if item.get("type") == "CVSS_V3":
            score = cvss3_score(item["score"])
            if score is not None:
                levels.append(level_of_score(score))
        elif item.get("type") == "Ubuntu":
            levels.append(_named(item["score"]))
    specific = entry.get("ecosystem_specific")
    if isinstance(specific, dict):
        levels += [_named(specific.get(key)) for key in ("severity", "urgency")]
    return max((level for level in levels if level), key=rank, default="unknown")


# ---- matching -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Unreadable:
    """A JSON text its reader could not get (a damaged or encrypted zip member, a file it may not open): counted as
    one unreadable record, with the reason."""

    why: str


@dataclass
class Scan:
    """What one audit read and found. ``records`` = ``used`` + ``unreadable`` + ``withdrawn``."""

    findings: list[Finding] = field(default_factory=list)
    records: int = 0  # read: each record of each JSON text, and each JSON text that held no record readable
    used: int = 0  # OSV records with an id that name an affected package (matched against the packages)
    unreadable: int = 0  # not JSON, not a record, damaged: never trusted, counted by reason
    withdrawn: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # why, for the unreadable ones

    def skip(self, why: str) -> None:
        self.records += 1
        self.unreadable += 1
        self.reasons[why] = self.reasons.get(why, 0) + 1

    @property
    def unrated(self) -> int:
        return sum(f.severity == "unknown" for f in self.findings)

    def counts(self) -> str:
        """``4 read, 1 used, 2 unreadable (not JSON: 1, names no affected package: 1), 1 withdrawn``."""
        return f"{self.records} read, {self.used} used, {self.not_used()}"

    def not_used(self) -> str:
        """``2 unreadable (not JSON: 1, ...), 1 withdrawn``: the records not used, and why."""
        why = ", ".join(f"{reason}: {n}" for reason, n in sorted(self.reasons.items(), key=lambda kv: -kv[1]))
        return (
            f"{self.unreadable} unreadable"
            + (f" ({why})" if why else "")
            + (f", {self.withdrawn} withdrawn" if self.withdrawn else "")
        )


_TEXT = "the text"  # how load_json names what it refuses; the reason keeps what follows


def _unreadable_why(message: str) -> str:
    rest = message.removeprefix(_TEXT + " ")
    for start, why in (
        ("is not JSON", "not JSON"),
        ("is larger", f"larger than {MAX_FILE >> 20} MiB"),
        ("is not UTF-8", "not UTF-8"),
        ("is nested", f"nested deeper than {MAX_DEPTH}"),
        ("has a number", "a number too long"),
    ):
        if rest.startswith(start):
            return why
    return "NaN or Infinity, which JSON does not allow"


def _records_in(raw: bytes | Unreadable, scan: Scan) -> list:
    """The records one JSON text holds: a record, a list of them, or osv.dev's query answer ``{"vulns": [...]}``."""
    if isinstance(raw, Unreadable):
        scan.skip(raw.why)
        return []
    try:
        doc = load_json(raw, _TEXT, max_bytes=MAX_FILE, max_depth=MAX_DEPTH)
    except UntrustedData as exc:
        scan.skip(_unreadable_why(str(exc)))
        return []
    if isinstance(doc, dict) and "id" not in doc and isinstance(doc.get("vulns"), list):
        doc = doc["vulns"]
    if isinstance(doc, list):
        if not doc:
            scan.skip("an empty list")
        return doc
    return [doc]


def _package_of(entry: object) -> tuple[str, str] | None:
    package = entry.get("package") if isinstance(entry, dict) else None
    if not isinstance(package, dict):
        return None
    ecosystem, name = package.get("ecosystem"), package.get("name")
    if not isinstance(ecosystem, str) or not isinstance(name, str) or len(ecosystem) > 128 or len(name) > 256:
        return None
    return ecosystem, _shown(name)


def _unusable(record: object) -> str:
    """Why a record cannot be used, or "" (withdrawn ones are usable in shape: the caller counts them apart)."""
    if not isinstance(record, dict):
        return "not an OSV record (a JSON object)"
    ident = record.get("id")
    if not isinstance(ident, str) or not 0 < len(ident) <= 128 or not _shown(ident):
        return "not an OSV record (no id)"
    affected = record.get("affected")
    if not isinstance(affected, list) or not any(_package_of(entry) for entry in affected):
        return "names no affected package"
    return ""


def match(records: Iterable[bytes | Unreadable], packages: list[Package]) -> Scan:
    """Every (record, package) pair where the package's version is affected, once per record and package. Each item
    of ``records`` is one JSON text (see the module's docstring for the shapes read) or an :class:`Unreadable`."""
    wanted: dict[tuple[str, str], list[Package]] = {}
    for pkg in packages:
        if pkg.ecosystem == "PyPI":
            wanted.setdefault(_key("PyPI", pkg.name), []).append(pkg)
        else:
            for ecosystem in _deb_ecosystems(pkg.distro):
                wanted.setdefault((ecosystem, pkg.source or pkg.name), []).append(pkg)
    scan = Scan()
    seen: set[tuple[str, Package]] = set()
    for raw in records:
        for record in _records_in(raw, scan):
            why = _unusable(record)
            if why:
                scan.skip(why)
                continue
            scan.records += 1
            if record.get("withdrawn"):
                scan.withdrawn += 1
                continue
            scan.used += 1
            _match_record(record, wanted, seen, scan)
    scan.findings.sort(key=lambda f: (-rank(f.severity), f.package.name, f.id))
    return scan


def _match_record(
    record: dict, wanted: dict[tuple[str, str], list[Package]], seen: set[tuple[str, Package]], scan: Scan
) -> None:
    ident = _shown(record["id"])
    for entry in record["affected"]:
        named = _package_of(entry)
        if named is None:
            continue
        for pkg in wanted.get(_key(*named), ()):
            if (ident, pkg) in seen:
                continue
            order = _Order("PyPI" if pkg.ecosystem == "PyPI" else "deb")
            version = pkg.version if pkg.ecosystem == "PyPI" else (pkg.source_version or pkg.version)
            hit, fixed = _affected(version, entry, order)
            if not hit:
                continue
            seen.add((ident, pkg))
            upstream = [record.get("aliases"), record.get("upstream")]
            aliases = [_shown(a) for items in upstream if isinstance(items, list) for a in items[:1000]
                       if isinstance(a, str) and len(a) < 128]  # fmt: skip
            summary = record.get("summary") if isinstance(record.get("summary"), str) else ""
            scan.findings.append(
                Finding(
                    ident,
                    tuple(a for a in dict.fromkeys(aliases) if a),
                    pkg,
                    severity(record, entry),
                    printable(summary[:2000], 200),
                    _shown(fixed),
                )
            )


# ---- the allowlist and the verdict ------------------------------------------------------------------------------
def read_allowlist(text: str, where: str) -> list[AllowEntry]:
    """``[[ignore]]`` tables: ``id``, ``reason``, ``review_by`` (a date), optionally ``package``."""
    import tomllib

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{where}: not TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise BadInput(f"{where}: not an allowlist: nested too deep") from None
    unknown = set(doc) - {"ignore"}
    if unknown:
        raise BadInput(f"{where}: unknown key {sorted(unknown)[0]!r} (the allowlist is [[ignore]] tables)")
    entries = []
    for n, item in enumerate(doc.get("ignore") or [], 1):
        at = f"{where}: [[ignore]] #{n}"
        if not isinstance(item, dict):
            raise BadInput(f"{at}: expected a table")
        extra = set(item) - {"id", "reason", "review_by", "package"}
        if extra:
            raise BadInput(f"{at}: unknown key {sorted(extra)[0]!r}")
        ident, reason, review = item.get("id"), item.get("reason"), item.get("review_by")
        if not isinstance(ident, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:-]{1,127}", ident):
            raise BadInput(f"{at}: id must be an advisory id (GHSA-..., CVE-..., PYSEC-..., DSA-...)")
        if not isinstance(reason, str) or len(reason.strip()) < 10:
            raise BadInput(f"{at} ({ident}): reason must say why it does not apply (10 characters at least)")
        if isinstance(review, str):
            try:
                review = dt.date.fromisoformat(review)
            except ValueError:
                raise BadInput(f"{at} ({ident}): review_by must be a date (YYYY-MM-DD)") from None
        if not isinstance(review, dt.date) or isinstance(review, dt.datetime):
            raise BadInput(f"{at} ({ident}): review_by must be a date (YYYY-MM-DD)")
        package = item.get("package", "")
        if not isinstance(package, str):
            raise BadInput(f"{at} ({ident}): package must be a name")
        entries.append(AllowEntry(ident, reason.strip(), review, package))
    return entries


@dataclass(frozen=True)
class Verdict:
    findings: list[Finding]  # with ``allowed_by`` set where an entry covers one
    blocking: list[Finding]  # at or above the threshold (or unrated, when those gate) and not covered
    expired: list[tuple[AllowEntry, Finding]]  # an expired entry that would have covered a finding
    unused: list[AllowEntry]  # entries covering nothing found

    @property
    def passed(self) -> bool:
        return not self.blocking and not self.expired

    @property
    def unrated(self) -> int:
        return sum(f.severity == "unknown" for f in self.findings)


def judge(
    findings: list[Finding],
    allow: list[AllowEntry],
    fail_on: str | None,
    today: dt.date,
    *,
    fail_unrated: bool = False,
) -> Verdict:
    """Apply the allowlist (expired entries cover nothing) and the threshold (``None``: rated findings never gate);
    ``fail_unrated``: a finding whose record gives no rating gates too (else it is listed and counted only)."""
    out, blocking, expired = [], [], []
    used: set[AllowEntry] = set()
    for finding in findings:
        covering = [e for e in allow if e.covers(finding)]
        live = [e for e in covering if e.review_by >= today]
        used.update(covering)
        expired += [(e, finding) for e in covering if e.review_by < today]
        finding = Finding(**{**finding.__dict__, "allowed_by": live[0].reason if live else ""})
        out.append(finding)
        if finding.severity == "unknown":
            gates = fail_unrated
        else:
            gates = fail_on is not None and rank(finding.severity) >= rank(fail_on)
        if gates and not live:
            blocking.append(finding)
    if fail_on is None and not fail_unrated:
        expired = []
    return Verdict(out, blocking, expired, [e for e in allow if e not in used])
