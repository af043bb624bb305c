"""The vulnerability gate against what another party wrote: OSV dumps of every common shape (a record, a list of
records, osv.dev's query answer), exports whose members are damaged or encrypted, SBOMs nested or shaped to crash a
reader, records whose text would drive the terminal, and advisories that carry no rating. Real files in tmp_path."""

from __future__ import annotations

import json
import shutil
import struct
import zipfile
from pathlib import Path

import pytest

from imagekit.supplychain import audit
from tests.supplychain.test_audit import GLIBC, TORCH_LOAD

ROOT = Path(__file__).resolve().parents[2]
CELL = "cu121-torch2.1.2-py3.11-tf4.48.2"  # its lock pins torch 2.1.2: TORCH_LOAD (critical) finds it


def _audit(runner, app, tmp_path: Path, osv: Path, *args: str, target: str = CELL):
    locks = tmp_path / "locks"
    locks.mkdir(exist_ok=True)
    shutil.copy(ROOT / "lockfiles" / f"{CELL}.txt", locks)
    return runner.invoke(app, ["audit", target, "--osv-db", str(osv), "--lock-dir", str(locks),
                               "--state-dir", str(tmp_path / "state"), *args])  # fmt: skip


def _clean(res) -> None:
    """No uncaught exception (the runner turns one into exit 1, the user would see its traceback)."""
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)


def _write(path: Path, doc: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


# ---- finding 1: the common dump shapes are read; a gate that used nothing fails -----------------------------------
@pytest.mark.parametrize(
    ("shape", "doc"),
    [
        ("a JSON list of records", [GLIBC, TORCH_LOAD]),
        ("osv.dev's /v1/query answer", {"vulns": [GLIBC, TORCH_LOAD]}),
        ("a single record", TORCH_LOAD),
    ],
)
def test_every_common_dump_shape_is_read_and_gates(runner, app, tmp_path, shape, doc):
    """Before: a list or a {"vulns": [...]} file was "1 unreadable, skipped ... passed" (exit 0) with a CRITICAL
    advisory inside."""
    osv = _write(tmp_path / "dump" / "osv.json", doc)
    res = _audit(runner, app, tmp_path, osv, "--fail-on", "high")
    assert res.exit_code == 1, (shape, res.output)
    assert "BLOCKS CRITICAL torch 2.1.2: GHSA-53q9-r3pm-6pq6" in res.output
    read = 2 if isinstance(doc, list) or "vulns" in doc else 1
    assert f"OSV records: {read} read, {read} used, 0 unreadable" in res.output


def test_a_gate_that_read_only_unreadable_records_fails_with_exit_3_and_says_why(runner, app, tmp_path):
    """Before: "against 4 OSV records (4 unreadable, skipped)" and "passed" (exit 0): a gate that used nothing."""
    osv = tmp_path / "osv"
    (osv / "notjson.json").parent.mkdir()
    (osv / "notjson.json").write_text("<html>rate limited</html>")
    _write(osv / "results.json", {"results": [{"vulns": [{"id": "GHSA-53q9-r3pm-6pq6", "modified": "x"}]}]})
    _write(osv / "ids.json", [{"id": "GHSA-53q9-r3pm-6pq6", "modified": "2025-04-18T00:00:00Z"}])  # no `affected`
    _write(osv / "empty.json", [])
    for args in (["--fail-on", "high"], []):  # a report that used nothing is no report either
        res = _audit(runner, app, tmp_path, osv, *args)
        _clean(res)
        assert res.exit_code == 3, res.output
        assert "error: --osv-db" in res.output and "read 4 OSV records, used none" in res.output
        assert "4 unreadable" in res.output and "not JSON" in res.output and "hint:" in res.output
        assert "passed" not in res.output


def test_the_counts_say_how_many_were_read_used_unreadable_and_withdrawn(runner, app, tmp_path):
    osv = tmp_path / "osv"
    _write(osv / "list.json", [TORCH_LOAD, {"id": "NOPE"}, 7, {**GLIBC, "withdrawn": "2024-01-01T00:00:00Z"}])
    res = _audit(runner, app, tmp_path, osv, "--json")
    doc = json.loads(res.stdout)
    assert (doc["records"], doc["records_used"], doc["unreadable_records"], doc["withdrawn_records"]) == (4, 1, 2, 1)
    assert sum(doc["unreadable_reasons"].values()) == 2
    res = _audit(runner, app, tmp_path, osv)
    assert "OSV records: 4 read, 1 used, 2 unreadable" in res.output and "1 withdrawn" in res.output


# ---- finding 2: damaged or encrypted zip members --------------------------------------------------------------------
def _zip(path: Path, members: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _damage(path: Path, name: str, how: str) -> None:
    """Change one member of a written zip the way a bad download or a hostile export would."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name)
        central = zf.start_dir
    data = bytearray(path.read_bytes())
    local = info.header_offset
    name_len, extra_len = struct.unpack("<HH", data[local + 26 : local + 30])
    body = local + 30 + name_len + extra_len
    entry = data.find(b"PK\x01\x02", central)
    while data[entry + 46 : entry + 46 + len(name)] != name.encode():
        entry = data.find(b"PK\x01\x02", entry + 4)
    if how == "crc":  # a flipped byte: Bad CRC-32 at the end of the read
        data[body + 3] ^= 0x20
    elif how == "deflate":  # garbage where the compressed stream is: zlib.error
        data[body : body + 8] = b"\xff" * 8
    elif how == "encrypted":  # the traditional-encryption flag in both headers
        data[local + 6] |= 1
        data[entry + 8] |= 1
    elif how == "method":  # a compression method zipfile does not know (99: WinZip AES)
        data[local + 8 : local + 10] = struct.pack("<H", 99)
        data[entry + 10 : entry + 12] = struct.pack("<H", 99)
    elif how == "header":  # the local header is not one
        data[local : local + 4] = b"XXXX"
    elif how == "size":  # the directory claims a member larger than any record
        data[entry + 24 : entry + 28] = struct.pack("<I", 0xFFFFFFF0)
    path.write_bytes(bytes(data))


HOW = ["crc", "deflate", "encrypted", "method", "header", "size"]


@pytest.mark.parametrize("how", HOW)
def test_a_damaged_or_encrypted_member_is_counted_unreadable_beside_the_good_ones(runner, app, tmp_path, how):
    """Before: a traceback (zipfile.BadZipFile, zlib.error, RuntimeError "is encrypted", NotImplementedError)."""
    method = zipfile.ZIP_DEFLATED if how == "deflate" else zipfile.ZIP_STORED
    blob = json.dumps({**GLIBC, "id": "DSA-0000-1", "details": "x" * 500}).encode()
    members = {"DSA-0000-1.json": blob, "GHSA-53q9-r3pm-6pq6.json": json.dumps(TORCH_LOAD).encode()}
    osv = _zip(tmp_path / "all.zip", members, method)
    _damage(osv, "DSA-0000-1.json", how)
    res = _audit(runner, app, tmp_path, osv, "--fail-on", "high")
    _clean(res)
    assert res.exit_code == 1, res.output  # the good member still gates
    assert "BLOCKS CRITICAL torch" in res.output
    assert "OSV records: 2 read, 1 used, 1 unreadable" in res.output


@pytest.mark.parametrize("how", HOW)
def test_an_export_whose_only_member_is_damaged_or_encrypted_fails_with_exit_3(runner, app, tmp_path, how):
    method = zipfile.ZIP_DEFLATED if how == "deflate" else zipfile.ZIP_STORED
    blob = json.dumps({**TORCH_LOAD, "details": "x" * 500}).encode()
    osv = _zip(tmp_path / "all.zip", {"GHSA-53q9-r3pm-6pq6.json": blob}, method)
    _damage(osv, "GHSA-53q9-r3pm-6pq6.json", how)
    res = _audit(runner, app, tmp_path, osv, "--fail-on", "high")
    _clean(res)
    assert res.exit_code == 3, res.output
    assert "used none" in res.output and "hint:" in res.output


# ---- finding 3: an SBOM shaped to crash the reader ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested"),
        ('{"packages": ' + "[" * 50_000 + "]" * 50_000 + "}", "nested"),
        ('{"packages": 5}', "packages"),
        ('{"packages": [{"externalRefs": 7}]}', "externalRefs"),
        (
            '{"packages": [{"externalRefs": [{"referenceLocator": "pkg:pypi/torch@2.1.2"}], "sourceInfo": 1}], "x": '
            + "1" * 5000
            + "}",
            "digits",
        ),
        ('{"spdxVersion": "SPDX-2.3", "packages": []}', "no package"),
    ],
)
def test_an_sbom_shaped_to_crash_the_reader_is_refused_with_exit_2(runner, app, tmp_path, text, message):
    """Before: RecursionError / TypeError tracebacks (exit 1), or an SBOM with no package audited as clean."""
    sbom = tmp_path / "hostile.spdx.json"
    sbom.write_text(text)
    osv = _write(tmp_path / "osv" / "r.json", TORCH_LOAD)
    res = _audit(runner, app, tmp_path, osv, "--fail-on", "high", target=str(sbom))
    _clean(res)
    assert res.exit_code == 2, res.output
    assert "error:" in res.output and "hint:" in res.output
    assert message in res.output


# ---- finding 4: what a record says never drives the terminal --------------------------------------------------------
ESCAPES = ["\x1b[2J", "\x1b]0;pwned\x07", "\x9b31m", "\u202e", "\x85", "\x1b[1A\x1b[2K", "\r", "\x08", "\u2066"]


def test_escape_sequences_and_bidi_controls_in_a_record_never_reach_the_terminal(runner, app, tmp_path):
    """Before: ESC [ 2 J, OSC titles, C1 CSI and RLO went to the terminal as they were."""
    hostile = "".join(ESCAPES)
    record = {
        **TORCH_LOAD,
        "id": f"GHSA-{hostile}evil",
        "aliases": [f"CVE-{hostile}1", "CVE-2025-1"],
        "summary": f"looks fine{hostile}\nerror: 0 finding(s); passed",
        "details": hostile * 100,
        "affected": [
            {
                "package": {"ecosystem": "PyPI", "name": "torch"},
                "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "2.6.0"}]}],
            }
        ],
    }
    osv = _write(tmp_path / "osv" / "r.json", record)
    for args in ([], ["--fail-on", "high"], ["--json"]):
        res = _audit(runner, app, tmp_path, osv, *args)
        _clean(res)
        assert res.exit_code in (0, 1), res.output
        for bad in ("\x1b", "\x9b", "\u202e", "\x85", "\x07", "\r", "\x08", "\u2066"):
            assert bad not in res.output, (args, repr(res.output))
        lines = res.output.splitlines()
        assert not any(line.startswith("error: 0 finding") for line in lines)  # no spoofed line
        if "--json" not in args:
            assert "GHSA-" in res.output and "looks fine" in res.output


def test_escape_sequences_in_an_sboms_names_and_versions_never_reach_the_terminal(runner, app, tmp_path):
    """Another tool's SBOM is hostile too: a purl's name and version are percent-decoded before they are shown."""
    from urllib.parse import quote

    hostile = "".join(ESCAPES)
    doc = {
        "spdxVersion": "SPDX-2.3",
        "packages": [
            {
                "name": "x",
                "externalRefs": [{"referenceLocator": f"pkg:pypi/ev{quote(hostile, safe='')}il@1.0{quote(hostile)}"}],
            }
        ],
    }
    sbom = _write(tmp_path / "other.spdx.json", doc)
    record = {
        "id": "PYSEC-1",
        "affected": [{"package": {"ecosystem": "PyPI", "name": f"ev{hostile}il"}, "versions": ["1.0"]}],
    }
    osv = _write(tmp_path / "osv" / "r.json", record)
    res = _audit(runner, app, tmp_path, osv, target=str(sbom))
    _clean(res)
    assert res.exit_code == 0 and "PYSEC-1" in res.output, res.output
    for bad in ("\x1b", "\x9b", "\u202e", "\x85", "\x07", "\r", "\x08", "\u2066"):
        assert bad not in res.output, repr(res.output)


# ---- finding 6: advisories without a rating -------------------------------------------------------------------------
@pytest.fixture
def dsa_sbom(tmp_path) -> Path:
    """An image's SBOM whose glibc DSA-5514-1 (no rating in the record) finds libc6."""
    from imagekit.locking import lockfile
    from imagekit.supplychain import dpkg_status, sbom

    status = (
        "Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nSource: glibc\nVersion: 2.36-9+deb12u2\n"
    )
    facts = sbom.ImageFacts("c", "r/x", "t", "sha256:" + "0" * 64, "linux/amd64", "b", "debian-12", 0, "imagekit")
    doc = sbom.document(facts, lockfile.Lock((), ()), dpkg_status.parse(status.encode()))
    return _write(tmp_path / "image.spdx.json", doc)


@pytest.mark.seconds
def test_an_unrated_advisory_gates_only_with_fail_on_unrated_and_is_always_counted(runner, app, tmp_path, dsa_sbom):
    """Before: no such option (exit 2), and an unrated local-root DSA could never gate."""
    osv = _write(tmp_path / "osv" / "dsa.json", GLIBC)
    res = _audit(runner, app, tmp_path, osv, "--fail-on", "low", target=str(dsa_sbom))
    assert res.exit_code == 0, res.output
    assert "1 unrated" in res.output and "--fail-on-unrated" in res.output
    res = _audit(runner, app, tmp_path, osv, "--fail-on", "critical", "--fail-on-unrated", target=str(dsa_sbom))
    assert res.exit_code == 1, res.output
    assert "BLOCKS UNRATED  libc6 (source glibc) 2.36-9+deb12u2: DSA-5514-1" in res.output, res.output
    assert "1 unrated" in res.output
    res = _audit(runner, app, tmp_path, osv, "--fail-on-unrated", "--json", target=str(dsa_sbom))
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and doc["unrated"] == 1 and doc["fail_on_unrated"] and doc["findings"][0]["blocking"]
    allow = tmp_path / "allow.toml"
    allow.write_text(
        '[[ignore]]\nid = "CVE-2023-4911"\nreason = "no setuid binaries run in this image"\nreview_by = 2099-01-01\n'
    )
    res = _audit(runner, app, tmp_path, osv, "--fail-on-unrated", "--allowlist", str(allow), target=str(dsa_sbom))
    assert res.exit_code == 0 and "allowlisted: no setuid" in res.output, res.output


def test_the_judge_gates_unrated_findings_on_request_only():
    finding = audit.Finding(
        "DSA-1", (), audit.Package("deb", "libc6", "1", "glibc", "1", "debian-12"), "unknown", "", ""
    )
    today = audit.dt.date(2026, 1, 1)
    assert audit.judge([finding], [], "low", today).passed
    assert not audit.judge([finding], [], "low", today, fail_unrated=True).passed
    assert not audit.judge([finding], [], None, today, fail_unrated=True).passed
