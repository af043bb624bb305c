"""The offline vulnerability gate (supplychain/audit.py, debversion.py, `imagekit audit`): OSV records in their
real format (osv.dev's exports), a known case per ecosystem, hostile records, the allowlist's reasons and dates."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from imagekit.supplychain import audit, debversion
from imagekit.supplychain.audit import Package
from tests.services.test_build_steps import setup  # noqa: F401 (the fake engine and registry of a build)

ROOT = Path(__file__).resolve().parents[2]
TODAY = dt.date(2026, 12, 3)

# Known cases, one per ecosystem, as the OSV exports carry them:
# PyPI: GitHub's advisory GHSA-53q9-r3pm-6pq6 (github/advisory-database; CVE-2025-32434): torch < 2.6.0, CRITICAL.
TORCH_LOAD = {
    "schema_version": "1.4.0",
    "id": "GHSA-53q9-r3pm-6pq6",
    "aliases": ["CVE-2025-32434"],
    "summary": "PyTorch: `torch.load` with `weights_only=True` leads to remote code execution",
    "severity": [{"type": "CVSS_V4", "score": "CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:H/VI:H/VA:H/SC:N/SI:N/SA:N"}],
    "affected": [
        {
            "package": {"ecosystem": "PyPI", "name": "torch"},
            "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "2.6.0"}]}],
        }
    ],
    "database_specific": {"cwe_ids": ["CWE-502"], "severity": "CRITICAL", "github_reviewed": True},
}
# Debian: DSA-5514-1 (glibc, CVE-2023-4911), fixed in bookworm by 2.36-9+deb12u3; records name the source package.
GLIBC = {
    "id": "DSA-5514-1",
    "upstream": ["CVE-2023-4911", "DEBIAN-CVE-2023-4911"],
    "summary": "glibc - security update",
    "affected": [
        {
            "package": {"ecosystem": "Debian:11", "name": "glibc", "purl": "pkg:deb/debian/glibc?arch=source"},
            "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "2.31-13+deb11u7"}]}],
        },
        {
            "package": {"ecosystem": "Debian:12", "name": "glibc", "purl": "pkg:deb/debian/glibc?arch=source"},
            "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "2.36-9+deb12u3"}]}],
        },
    ],
}
# Ubuntu: CVE-2024-6387 in openssh, fixed in 24.04 by 1:9.6p1-3ubuntu13.3 (a CVSS v3.1 vector of 8.1: high).
OPENSSH = {
    "id": "UBUNTU-CVE-2024-6387",
    "upstream": ["CVE-2024-6387"],
    "severity": [{"type": "CVSS_V3", "score": "CVSS:3.1/AV:N/AC:H/PR:N/UI:N/S:U/C:H/I:H/A:H"}],
    "affected": [
        {
            "package": {"ecosystem": "Ubuntu:22.04:LTS", "name": "openssh"},
            "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "1:8.9p1-3ubuntu0.10"}]}],
        },
        {
            "package": {"ecosystem": "Ubuntu:24.04:LTS", "name": "openssh"},
            "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "1:9.6p1-3ubuntu13.3"}]}],
        },
        {
            "package": {"ecosystem": "Ubuntu:Pro:24.04:LTS", "name": "openssh"},
            "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "1:9.9"}]}],
        },
    ],
}


def _deb(name, version, source="", source_version="", distro="debian-12") -> Package:
    return Package("deb", name, version, source or name, source_version or version, distro)


def _scan(records: list[dict], packages: list[Package]) -> audit.Scan:
    return audit.match([json.dumps(r).encode() for r in records], packages)


@pytest.mark.parametrize(
    ("a", "b", "sign"),
    [
        ("1.0~rc1", "1.0", -1),  # ~ sorts before everything, even the end
        ("1.0", "1.0+b1", -1),
        ("2:1.0", "1:9.9", 1),  # the epoch first
        ("1.2.3", "1.10", -1),  # numbers as numbers
        ("1.0a", "1.0", 1),
        ("1.0-1", "1.0-1+deb12u1", -1),
        ("2.36-9+deb12u3", "2.36-9+deb12u10", -1),
        ("1:9.6p1-3ubuntu13.2", "1:9.6p1-3ubuntu13.3", -1),
        ("1.0-0", "1.0", 0),
        ("0:1.0", "1.0", 0),
        ("1.0+dfsg-1", "1.0-1", 1),  # "+" after the end: later
        ("7.88.1-10+deb12u8", "7.88.1-10+deb12u12", -1),
    ],
)
def test_debian_versions_compare_as_dpkg_compares_them(a, b, sign):
    got = debversion.compare(a, b)
    assert (got > 0) - (got < 0) == sign
    back = debversion.compare(b, a)
    assert (back > 0) - (back < 0) == -sign


def test_a_string_that_is_no_debian_version_is_refused():
    for bad in ("", "abc", "1.0 rm", "-1"):
        with pytest.raises(ValueError):
            debversion.split(bad)


@pytest.mark.parametrize(
    ("vector", "score"),
    [
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H", 9.8),
        ("CVSS:3.1/AV:N/AC:H/PR:N/UI:N/S:U/C:H/I:H/A:H", 8.1),
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:R/S:C/C:L/I:L/A:N", 6.1),
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:R/S:U/C:L/I:L/A:N", 5.4),
        ("CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:H", 7.8),
        ("CVSS:3.0/AV:N/AC:H/PR:N/UI:N/S:U/C:H/I:N/A:N", 5.9),
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:N/I:N/A:N", 0.0),
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:X/C:H/I:H/A:H", None),
        ("CVSS:2.0/AV:N/AC:L/Au:N/C:P/I:P/A:P", None),
    ],
)
def test_cvss_v3_base_scores_follow_the_specification(vector, score):
    assert audit.cvss3_score(vector) == score


def test_the_known_pypi_advisory_finds_the_demo_cells_torch_and_names_the_fix():
    scan = _scan([TORCH_LOAD], [Package("PyPI", "torch", "2.1.2"), Package("PyPI", "transformers", "4.48.2")])
    [finding] = scan.findings
    assert (finding.id, finding.package.name, finding.severity, finding.fixed) == (
        "GHSA-53q9-r3pm-6pq6",
        "torch",
        "critical",
        "2.6.0",
    )
    assert finding.aliases == ("CVE-2025-32434",)
    assert not _scan([TORCH_LOAD], [Package("PyPI", "torch", "2.6.0")]).findings  # the fixed version is not
    assert _scan([TORCH_LOAD], [Package("PyPI", "torch", "2.5.1+cu124")]).findings  # a local version compares


def test_the_known_debian_advisory_matches_by_source_package_and_release():
    old = _deb("libc6", "2.36-9+deb12u2", "glibc")
    new = _deb("libc-bin", "2.36-9+deb12u10", "glibc")
    bullseye = _deb("libc6", "2.31-13+deb11u8", "glibc", distro="debian-11")
    scan = _scan([GLIBC], [old, new, bullseye])
    assert [(f.package.name, f.fixed) for f in scan.findings] == [("libc6", "2.36-9+deb12u3")]
    assert scan.findings[0].severity == "unknown"  # a DSA without a rating claims none


def test_the_known_ubuntu_advisory_matches_its_release_not_pro_and_scores_its_vector():
    affected = _deb("openssh-server", "1:9.6p1-3ubuntu13.2", "openssh", distro="ubuntu-24.04")
    fixed = _deb("openssh-client", "1:9.6p1-3ubuntu13.3", "openssh", distro="ubuntu-24.04")
    scan = _scan([OPENSSH], [affected, fixed])
    [finding] = scan.findings
    assert finding.package == affected and finding.severity == "high" and finding.fixed == "1:9.6p1-3ubuntu13.3"


def test_versions_lists_last_affected_and_several_ranges():
    records = [
        {
            "id": "LIST-1",
            "affected": [{"package": {"ecosystem": "PyPI", "name": "Foo_Bar"}, "versions": ["1.0", "1.1"]}],
        },
        {
            "id": "LAST-1",
            "affected": [
                {
                    "package": {"ecosystem": "PyPI", "name": "foo-bar"},
                    "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "1.0"}, {"last_affected": "1.0.5"}]}],
                }
            ],
        },
        {
            "id": "TWO-1",
            "affected": [
                {
                    "package": {"ecosystem": "PyPI", "name": "foo.bar"},
                    "ranges": [
                        {
                            "type": "ECOSYSTEM",
                            "events": [
                                {"introduced": "2.0"},
                                {"fixed": "2.5"},
                                {"introduced": "0"},
                                {"fixed": "1.0.1"},
                            ],
                        }
                    ],
                }
            ],
        },
        {
            "id": "GIT-1",
            "affected": [
                {
                    "package": {"ecosystem": "PyPI", "name": "foo-bar"},
                    "ranges": [{"type": "GIT", "events": [{"introduced": "0"}]}],
                }
            ],
        },
    ]

    def ids(version: str) -> list[str]:
        return sorted(f.id for f in _scan(records, [Package("PyPI", "foo-bar", version)]).findings)

    assert ids("1.0") == ["LAST-1", "LIST-1", "TWO-1"]
    assert ids("1.0.5") == ["LAST-1"]
    assert ids("1.0.6") == []
    assert ids("2.1") == ["TWO-1"]
    assert ids("2.5") == []


def test_hostile_and_withdrawn_records_are_counted_not_trusted():
    raw = [
        b"not json",
        b"[]",
        json.dumps({"id": "x" * 500, "affected": []}).encode(),
        b"{" * 100_000,  # deeply nested: no recursion crash
        b" " * (audit.MAX_FILE + 1),
        json.dumps({**TORCH_LOAD, "withdrawn": "2025-05-01T00:00:00Z"}).encode(),
        json.dumps(
            {
                "id": "BAD-1",
                "affected": [
                    {
                        "package": {"ecosystem": "PyPI", "name": "torch"},
                        "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "not a version"}]}],
                    }
                ],
            }
        ).encode(),
        json.dumps({"id": "BAD-2", "affected": [None, {"package": "torch"}, {"package": {"name": 1}}]}).encode(),
    ]
    scan = audit.match(raw, [Package("PyPI", "torch", "2.1.2")])
    assert (scan.records, scan.used, scan.unreadable, scan.withdrawn) == (8, 1, 6, 1) and scan.findings == []
    assert scan.reasons == {
        "not JSON": 1,
        "an empty list": 1,
        "not an OSV record (no id)": 1,
        f"nested deeper than {audit.MAX_DEPTH}": 1,
        "larger than 64 MiB": 1,
        "names no affected package": 1,  # BAD-2: none of its entries names a package
    }


def _finding(severity="high", ident="GHSA-x", name="torch") -> audit.Finding:
    return audit.Finding(ident, ("CVE-2099-1",), Package("PyPI", name, "1.0"), severity, "s", "2.0")


def test_the_gate_blocks_at_its_level_and_an_allowlisted_finding_passes_until_its_review_date():
    high, low = _finding("high"), _finding("low", "GHSA-low")
    assert not audit.judge([high, low], [], "high", TODAY).passed
    assert audit.judge([high, low], [], "critical", TODAY).passed
    assert audit.judge([high, low], [], None, TODAY).passed  # report only
    entry = audit.AllowEntry("CVE-2099-1", "we never call it", dt.date(2027, 1, 1))  # an alias covers it
    verdict = audit.judge([high, low], [entry], "high", TODAY)
    assert verdict.passed and verdict.findings[0].allowed_by == "we never call it"
    expired = audit.AllowEntry("GHSA-x", "we never call it", dt.date(2026, 12, 2))
    verdict = audit.judge([high], [expired], "high", TODAY)
    assert not verdict.passed and verdict.expired == [(expired, high)] and verdict.blocking == [high]
    other = audit.AllowEntry("GHSA-x", "only for numpy", dt.date(2027, 1, 1), package="numpy")
    assert not audit.judge([high], [other], "high", TODAY).passed
    assert audit.judge([high], [other], "high", TODAY).unused == [other]
    assert audit.judge([_finding("unknown")], [], "low", TODAY).passed  # unknown severity is listed, never gated


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[ignore]]\nid = "GHSA-x"\nreview_by = 2027-01-01\n', "reason"),
        ('[[ignore]]\nid = "GHSA-x"\nreason = "because we say so"\n', "review_by"),
        ('[[ignore]]\nid = "GHSA-x"\nreason = "because we say so"\nreview_by = "soon"\n', "review_by"),
        ('[[ignore]]\nid = "../../x y"\nreason = "because we say so"\nreview_by = 2027-01-01\n', "advisory id"),
        ('[[ignore]]\nid = "GHSA-x"\nreason = "because we say so"\nreview_by = 2027-01-01\nwhy = 1\n', "'why'"),
        ("[allow]\n", "'allow'"),
        ("[[ignore]\n", "not TOML"),
        ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deep"),  # tomllib recursed: a RecursionError
        ("x = " + "{a = " * 5_000 + "1" + "}" * 5_000 + "\n", "nested too deep"),
    ],
)
def test_an_allowlist_entry_without_a_reason_or_a_review_date_is_refused(text, message):
    with pytest.raises(audit.BadInput, match=message):
        audit.read_allowlist(text, "allow.toml")


# ---- the command, on an export as osv.dev ships it (all.zip) -----------------------------------------------------
CELL = "cu121-torch2.1.2-py3.11-tf4.48.2"


@pytest.fixture
def osv(tmp_path) -> Path:
    path = tmp_path / "PyPI" / "all.zip"
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w") as zf:
        for record in (TORCH_LOAD, GLIBC, OPENSSH):
            zf.writestr(f"{record['id']}.json", json.dumps(record))
        zf.writestr("README.txt", "not a record")
    return tmp_path


def _audit(runner, app, tmp_path, osv, *args):
    locks = tmp_path / "locks"
    locks.mkdir(exist_ok=True)
    shutil.copy(ROOT / "lockfiles" / f"{CELL}.txt", locks)
    return runner.invoke(app, ["audit", CELL, "--osv-db", str(osv), "--lock-dir", str(locks),
                               "--state-dir", str(tmp_path / "state"), *args])  # fmt: skip


def test_audit_of_a_cell_reports_its_locks_findings_and_says_what_it_could_not_see(runner, app, tmp_path, osv):
    res = _audit(runner, app, tmp_path, osv)
    assert res.exit_code == 0, res.output  # no --fail-on: a report
    assert "OSV records: 3 read, 3 used, 0 unreadable" in res.output and "1 findings: 1 critical" in res.output
    assert "CRITICAL torch 2.1.2: GHSA-53q9-r3pm-6pq6 (CVE-2025-32434), fixed in 2.6.0" in res.output
    assert "note: Debian packages: not known until the cell is built" in res.output


@pytest.mark.seconds
def test_the_gate_fails_the_cell_until_the_finding_is_allowlisted_with_a_live_review_date(runner, app, tmp_path, osv):
    res = _audit(runner, app, tmp_path, osv, "--fail-on", "high")
    assert res.exit_code == 1 and "BLOCKS CRITICAL torch" in res.output
    assert "error: 1 finding(s) at or above high" in res.output and "hint:" in res.output
    allow = tmp_path / "allow.toml"
    allow.write_text(
        '[[ignore]]\nid = "CVE-2025-32434"\npackage = "torch"\n'
        'reason = "we load only our own checkpoints, never a downloaded one"\nreview_by = 2099-01-01\n'
    )
    res = _audit(runner, app, tmp_path, osv, "--fail-on", "high", "--allowlist", str(allow), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["passed"] and doc["findings"][0]["allowed"].startswith("we load only")
    allow.write_text(allow.read_text().replace("2099-01-01", "2020-01-01"))
    res = _audit(runner, app, tmp_path, osv, "--fail-on", "high", "--allowlist", str(allow))
    assert res.exit_code == 1 and "allowlist entry CVE-2025-32434 expired on 2020-01-01" in res.output


def test_the_cells_built_sbom_brings_its_debian_packages(runner, app, tmp_path, osv):
    from imagekit.locking import lockfile
    from imagekit.supplychain import dpkg_status, sbom

    lock = lockfile.parse((ROOT / "lockfiles" / f"{CELL}.txt").read_text())
    status = (
        "Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nSource: glibc\nVersion: 2.36-9+deb12u2\n"
    )
    facts = sbom.ImageFacts(CELL, "r/x", "t", "sha256:" + "0" * 64, "linux/amd64", "b", "debian-12", 0, "imagekit")
    doc = sbom.document(facts, lock, dpkg_status.parse(status.encode()))
    (tmp_path / "state" / "sbom").mkdir(parents=True)
    (tmp_path / "state" / "sbom" / f"{CELL}.spdx.json").write_text(json.dumps(doc))
    res = _audit(runner, app, tmp_path, osv, "--json")
    found = {(f["id"], f["package"], f["source_package"]) for f in json.loads(res.output)["findings"]}
    assert found == {("GHSA-53q9-r3pm-6pq6", "torch", None), ("DSA-5514-1", "libc6", "glibc")}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fail-on", "severe"], "invalid --fail-on"),
        (["--allowlist", "/nonexistent/allow.toml"], "--allowlist"),
    ],
)
def test_bad_options_say_what_and_how_to_fix_it(runner, app, tmp_path, osv, args, message):
    res = _audit(runner, app, tmp_path, osv, *args)
    assert res.exit_code == 2 and message in res.output and "hint:" in res.output


def test_an_export_that_is_not_a_zip_is_refused(runner, app, tmp_path):
    bad = tmp_path / "all.zip"
    bad.write_text("not a zip")
    res = _audit(runner, app, tmp_path, bad)
    assert res.exit_code == 2 and "is not a zip file" in res.output


# ---- the gate in a build (fake engine and registry) ---------------------------------------------------------------
@pytest.mark.resolver  # the cell's lock is a real uv resolution against a loopback index
@pytest.mark.loopback
def test_a_build_with_the_gate_publishes_nothing_until_the_finding_is_allowlisted(setup, tmp_path):  # noqa: F811
    import dataclasses

    from tests.services.test_build_steps import _build

    engine, registry, opts = setup
    osv = tmp_path / "osv"
    osv.mkdir()
    torch_version = "2.5.1"  # the fake index's torch for this cell
    record = {**TORCH_LOAD, "id": "GHSA-test-torch"}
    (osv / "torch.json").write_text(json.dumps(record))

    def build(allowlist: Path | None):
        res, _ = _build(engine, registry, dataclasses.replace(opts, audit_osv=osv, audit_allowlist=allowlist))
        return res, registry

    res, registry = build(None)
    assert (res.status, res.step) == ("failed", "audit"), res.error and res.error.render()
    assert f"GHSA-test-torch torch {torch_version} (critical)" in res.error.message
    assert "nothing was pushed" in res.error.hint and not registry.manifests
    allow = tmp_path / "allow.toml"
    allow.write_text(
        '[[ignore]]\nid = "GHSA-test-torch"\nreason = "no untrusted checkpoints here"\nreview_by = 2099-01-01\n'
    )
    res, registry = build(allow)
    assert res.status == "published" and res.audit["findings"] == 1 and res.audit["blocking"] == []


@pytest.mark.resolver
@pytest.mark.loopback
def test_a_build_gates_an_unrated_advisory_only_when_asked_and_always_counts_it(setup, tmp_path):  # noqa: F811
    import dataclasses

    from tests.services.test_build_steps import _build

    engine, registry, opts = setup
    osv = tmp_path / "osv"
    osv.mkdir()
    unrated = {k: v for k, v in TORCH_LOAD.items() if k not in ("severity", "database_specific")}
    (osv / "torch.json").write_text(json.dumps({**unrated, "id": "DSA-test-unrated"}))
    res, _ = _build(engine, registry, dataclasses.replace(opts, audit_osv=osv))
    assert res.status == "published" and res.audit["unrated"] == 1 and res.audit["blocking"] == []
    res, _ = _build(engine, registry, dataclasses.replace(opts, audit_osv=osv, audit_fail_on_unrated=True))
    assert (res.status, res.step) == ("failed", "audit"), res.error and res.error.render()
    assert "DSA-test-unrated torch" in res.error.message


def test_an_export_with_no_records_is_refused_not_passed(runner, app, tmp_path):
    """`--osv-db ""` is the current folder, and an empty folder holds nothing: a gate that read nothing passes all."""
    (tmp_path / "empty").mkdir()
    res = _audit(runner, app, tmp_path, tmp_path / "empty", "--fail-on", "high")
    assert res.exit_code == 2 and "holds no OSV records" in res.output and "hint:" in res.output


# ---- the rules a planted bug would break -----------------------------------------------------------------------
CVSS_98 = "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H"  # 9.8, critical


def _rated(own: str | None = None, vectors: tuple[str, ...] = (), distro: str | None = None) -> dict:
    record: dict = {"id": "TEST-RATED-1", "affected": [{"package": {"ecosystem": "Debian:12", "name": "glibc"}}]}
    if own is not None:
        record["database_specific"] = {"severity": own}
    if vectors:
        record["severity"] = [{"type": "CVSS_V3", "score": v} for v in vectors]
    if distro is not None:
        record["affected"][0]["ecosystem_specific"] = {"urgency": distro}
    record["affected"][0]["versions"] = ["2.36-9"]
    return record


@pytest.mark.parametrize(
    ("own", "vectors", "distro", "level"),
    [
        (None, (CVSS_98,), "low", "critical"),  # the distribution's "low" does not lower a 9.8
        ("LOW", (CVSS_98,), None, "critical"),  # nor does the record's own "low"
        ("LOW", (), "high", "high"),
        ("MODERATE", ("CVSS:3.1/AV:L/AC:L/PR:L/UI:R/S:U/C:L/I:L/A:N",), "unimportant", "medium"),
        ("CRITICAL", ("CVSS:3.1/AV:L/AC:L/PR:L/UI:R/S:U/C:L/I:L/A:N",), "low", "critical"),
        (None, ("CVSS:3.1/AV:L/AC:L/PR:L/UI:R/S:U/C:L/I:L/A:N", CVSS_98), None, "critical"),  # several vectors
        (None, (), "medium", "medium"),
        ("bogus", ("CVSS:9.9/nonsense",), "not yet assigned", "unknown"),
        (None, (), None, "unknown"),
    ],
)
def test_the_highest_rating_a_record_gives_wins(own, vectors, distro, level):
    record = _rated(own, vectors, distro)
    assert audit.severity(record, record["affected"][0]) == level


def test_a_critical_vector_with_a_low_distribution_rating_gates_fail_on_high():
    [finding] = _scan([_rated(None, (CVSS_98,), "low")], [_deb("libc6", "2.36-9", "glibc")]).findings
    assert finding.severity == "critical"
    verdict = audit.judge([finding], [], "high", TODAY)
    assert not verdict.passed and verdict.blocking == [finding]


# Each vector computes to exactly its score by the CVSS v3.1 formula (checked by hand, specification section 7.1):
#   9.0: ISS 0.914816, changed impact 6.0478, exploitability 8.22*0.85*0.77*0.68*0.62 = 2.2682; 1.08*8.3160 = 8.981
#   8.9: ISS 0.848992, changed impact 5.9713, exploitability 2.2212;                           1.08*8.1925 = 8.848
#   7.0: ISS 0.732304, impact 6.42*ISS = 4.7014, exploitability 2.2212;                               6.9226
#   6.9: ISS 0.848992, impact 5.4505, exploitability 8.22*0.55*0.44*0.85*0.85 = 1.4372;               6.8878
#   4.0: ISS 0.22, impact 1.4124, exploitability 8.22*0.55*0.77*0.85*0.85 = 2.5152;                   3.9276
#   3.9: ISS 0.3916, impact 2.5141, exploitability 8.22*0.55*0.77*0.62*0.62 = 1.3382;                 3.8522
#   0.0: no impact on C, I or A: 0 whatever the rest.
# Each total rounds up to one decimal (Roundup, Appendix A).
@pytest.mark.parametrize(
    ("vector", "score", "level"),
    [
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:C/C:H/I:H/A:H", 10.0, "critical"),
        ("CVSS:3.1/AV:N/AC:L/PR:L/UI:R/S:C/C:H/I:H/A:H", 9.0, "critical"),
        ("CVSS:3.1/AV:N/AC:H/PR:N/UI:N/S:C/C:H/I:H/A:L", 8.9, "high"),
        ("CVSS:3.1/AV:N/AC:H/PR:N/UI:N/S:U/C:H/I:L/A:L", 7.0, "high"),
        ("CVSS:3.1/AV:L/AC:H/PR:N/UI:N/S:U/C:H/I:H/A:L", 6.9, "medium"),
        ("CVSS:3.1/AV:L/AC:L/PR:N/UI:N/S:U/C:L/I:N/A:N", 4.0, "medium"),
        ("CVSS:3.1/AV:L/AC:L/PR:L/UI:R/S:U/C:L/I:L/A:N", 3.9, "low"),
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:N/I:N/A:N", 0.0, "unknown"),
    ],
)
def test_cvss_v3_base_score_boundaries_give_their_levels(vector, score, level):
    assert audit.cvss3_score(vector) == score
    assert audit.level_of_score(score) == level
    record = _rated(None, (vector,))
    assert audit.severity(record, record["affected"][0]) == level


def test_a_binnmu_binary_is_matched_by_its_source_version():
    """dpkg's `Source: name (version)`: a binNMU (1.2-3+b1) is built from source 1.2-3, which the advisories name."""
    from imagekit.locking import lockfile
    from imagekit.supplychain import dpkg_status, sbom

    status = (
        "Package: libfoo1\nStatus: install ok installed\nArchitecture: amd64\nSource: foo (1.2-3)\n"
        "Version: 1.2-3+b1\n\n"
        "Package: cpp\nStatus: install ok installed\nArchitecture: amd64\nSource: gcc-defaults (1.203)\n"
        "Version: 4:12.2.0-3\n"
    )
    facts = sbom.ImageFacts("c", "r/x", "t", "sha256:" + "0" * 64, "linux/amd64", "b", "debian-12", 0, "imagekit")
    packages = audit.packages_from_sbom(sbom.document(facts, lockfile.Lock((), ()), dpkg_status.parse(status.encode())))
    libfoo = next(p for p in packages if p.name == "libfoo1")
    assert (libfoo.version, libfoo.source, libfoo.source_version) == ("1.2-3+b1", "foo", "1.2-3")

    def hit(name: str, **affected) -> bool:
        record = {"id": "DSA-T", "affected": [{"package": {"ecosystem": "Debian:12", "name": name}, **affected}]}
        return bool(_scan([record], packages).findings)

    def fixed(version: str) -> dict:
        return {"ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": version}]}]}

    assert hit("foo", **fixed("1.2-4"))
    assert not hit("foo", **fixed("1.2-3"))
    assert hit("foo", versions=["1.2-3"])  # the binary's own version is in no source list
    assert hit("foo", ranges=[{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"last_affected": "1.2-3"}]}])
    assert hit("gcc-defaults", **fixed("1.204"))  # cpp 4:12.2.0-3 is source 1.203: the epoch is the binary's
    assert not hit("gcc-defaults", **fixed("1.203"))
