"""An offline vulnerability gate: an image's packages (its SBOM: the lock's Python distributions, its Debian or Ubuntu
packages) against an OSV data export (osv.dev's per-ecosystem `all.zip`, or a folder of OSV JSON records), by the
OSV schema's rules: `versions` lists and `ECOSYSTEM` ranges (introduced / fixed / last_affected events), PEP 440
order for PyPI, dpkg's order for Debian and Ubuntu, whose records name source packages. Severity from the record's
own rating (GitHub's `database_specific.severity`), else its CVSS v3 vector's base score, else the distribution's
rating (Debian's urgency, Ubuntu's priority), else unknown. An allowlist entry carries a reason and a review-by date;
an expired one no longer covers anything. Pure: records and packages in, findings out; the files are read by the
caller (`imagekit.services.audit_run`). Everything a record says is hostile data: checked, bounded, never executed.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote

from packaging.version import InvalidVersion, Version

from imagekit import debversion

LEVELS = ("unknown", "low", "medium", "high", "critical")
MAX_RECORD = 8 << 20  # bytes of one OSV record (the largest real ones list thousands of versions: a few MB)
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


def packages_from_sbom(doc: dict) -> list[Package]:
    """The packages an SPDX document lists, by their purls (imagekit's SBOM, or another tool's with purls)."""
    out = []
    for pkg in doc.get("packages") or []:
        if not isinstance(pkg, dict):
            continue
        for ref in pkg.get("externalRefs") or []:
            locator = ref.get("referenceLocator") if isinstance(ref, dict) else None
            match = _PURL.fullmatch(locator) if isinstance(locator, str) and len(locator) < 1024 else None
            if not match:
                continue
            name, version = unquote(match["name"]), unquote(match["version"])
            if match["type"] == "pypi":
                out.append(Package("PyPI", pypi_name(name), version))
                continue
            query = dict(part.partition("=")[::2] for part in (match["q"] or "").split("&") if part)
            source = unquote(query.get("upstream", "")) or name
            info = pkg.get("sourceInfo") if isinstance(pkg.get("sourceInfo"), str) else ""
            source_version = info.rsplit(" ", 1)[-1] if info.startswith("built package from: ") else version
            distro = unquote(query.get("distro", "")) or (match["ns"] or "")
            out.append(Package("deb", name, version, source, source_version, distro))
    return sorted(set(out))


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
            if isinstance(v, str):
                try:
                    if v == version or order.cmp(v, version) == 0:
                        hit = True
                        break
                except (ValueError, InvalidVersion):
                    continue
    for rng in entry.get("ranges") or []:
        if not isinstance(rng, dict) or rng.get("type") not in ("ECOSYSTEM", "SEMVER"):
            continue  # GIT ranges name commits, not versions
        events = [e for e in rng.get("events") or [] if isinstance(e, dict)]
        fixed_versions += [e["fixed"] for e in events if isinstance(e.get("fixed"), str)]
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


def severity(record: dict, entry: dict) -> str:
    """The record's severity for one affected entry: its own rating, its CVSS v3 score, the distribution's."""
    db = record.get("database_specific")
    named = db.get("severity") if isinstance(db, dict) else None
    if isinstance(named, str) and named.lower() in _NAMED:
        return _NAMED[named.lower()]
    scores = []
    for item in record.get("severity") or []:
        if isinstance(item, dict) and isinstance(item.get("score"), str):
            if item.get("type") == "CVSS_V3":
                score = cvss3_score(item["score"])
                if score is not None:
                    scores.append(level_of_score(score))
            elif item.get("type") == "Ubuntu" and item["score"].lower() in _NAMED:
                scores.append(_NAMED[item["score"].lower()])
    if scores:
        return max(scores, key=rank)
    specific = entry.get("ecosystem_specific")
    if isinstance(specific, dict):
        for key in ("severity", "urgency"):
            value = specific.get(key)
            if isinstance(value, str) and value.lower().rstrip("*") in _NAMED:
                return _NAMED[value.lower().rstrip("*")]
    return "unknown"


# ---- matching -----------------------------------------------------------------------------------------------------
@dataclass
class Scan:
    """What one audit read and found."""

    findings: list[Finding] = field(default_factory=list)
    records: int = 0
    unreadable: int = 0  # records that were not JSON objects of the OSV schema
    withdrawn: int = 0


def match(records: Iterable[bytes], packages: list[Package]) -> Scan:
    """Every (record, package) pair where the package's version is affected, once per record and package."""
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
        scan.records += 1
        try:
            record = json.loads(raw) if len(raw) <= MAX_RECORD else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("id"), str) or len(record["id"]) > 128:
            scan.unreadable += 1
            continue
        if record.get("withdrawn"):
            scan.withdrawn += 1
            continue
        for entry in record.get("affected") or []:
            package = entry.get("package") if isinstance(entry, dict) else None
            if not isinstance(package, dict):
                continue
            ecosystem, name = package.get("ecosystem"), package.get("name")
            if not isinstance(ecosystem, str) or not isinstance(name, str):
                continue
            for pkg in wanted.get(_key(ecosystem, name), ()):
                if (record["id"], pkg) in seen:
                    continue
                order = _Order("PyPI" if pkg.ecosystem == "PyPI" else "deb")
                version = pkg.version if pkg.ecosystem == "PyPI" else (pkg.source_version or pkg.version)
                hit, fixed = _affected(version, entry, order)
                if hit:
                    seen.add((record["id"], pkg))
                    aliases = tuple(
                        a for a in [*(record.get("aliases") or []), *(record.get("upstream") or [])]
                        if isinstance(a, str) and len(a) < 128
                    )  # fmt: skip
                    summary = record.get("summary") if isinstance(record.get("summary"), str) else ""
                    scan.findings.append(
                        Finding(
                            record["id"],
                            tuple(dict.fromkeys(aliases)),
                            pkg,
                            severity(record, entry),
                            summary[:200],
                            fixed,
                        )
                    )
    scan.findings.sort(key=lambda f: (-rank(f.severity), f.package.name, f.id))
    return scan


# ---- the allowlist and the verdict ------------------------------------------------------------------------------
def read_allowlist(text: str, where: str) -> list[AllowEntry]:
    """``[[ignore]]`` tables: ``id``, ``reason``, ``review_by`` (a date), optionally ``package``."""
    import tomllib

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{where}: not TOML: {exc}") from None
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
    blocking: list[Finding]  # at or above the threshold and not covered
    expired: list[tuple[AllowEntry, Finding]]  # an expired entry that would have covered a finding
    unused: list[AllowEntry]  # entries covering nothing found

    @property
    def passed(self) -> bool:
        return not self.blocking and not self.expired


def judge(findings: list[Finding], allow: list[AllowEntry], fail_on: str | None, today: dt.date) -> Verdict:
    """Apply the allowlist (expired entries cover nothing) and the threshold (``None``: report only)."""
    out, blocking, expired = [], [], []
    used: set[AllowEntry] = set()
    for finding in findings:
        covering = [e for e in allow if e.covers(finding)]
        live = [e for e in covering if e.review_by >= today]
        used.update(covering)
        expired += [(e, finding) for e in covering if e.review_by < today]
        finding = Finding(**{**finding.__dict__, "allowed_by": live[0].reason if live else ""})
        out.append(finding)
        if (
            not live
            and fail_on is not None
            and finding.severity != "unknown"
            and rank(finding.severity) >= rank(fail_on)
        ):
            blocking.append(finding)
    if fail_on is None:
        expired = []
    return Verdict(out, blocking, expired, [e for e in allow if e not in used])
