"""`imagekit audit`: read an OSV export and what an image holds, then judge (imagekit.supplychain.audit)."""

from __future__ import annotations

import datetime as dt
import os
import stat
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from imagekit.effects.files import read_input
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.locking import lockfile
from imagekit.services.ports import ContainerEngine
from imagekit.supplychain import audit, dpkg_status, sbom
from imagekit.trust.untrusted import UntrustedData, load_json, printable

try:
    import lzma

    _LZMA: tuple[type[Exception], ...] = (lzma.LZMAError,)
except ImportError:  # pragma: no cover - Python built without lzma: zipfile cannot read such members either
    _LZMA = ()

MAX_MEMBERS = 2_000_000  # records in one export (osv.dev's largest ecosystems hold a few hundred thousand)
HINT = (
    "pass osv.dev's all.zip of an ecosystem (PyPI, Debian, Ubuntu), or a folder of them or of OSV records (one record "
    'per .json file, a JSON list of records, or osv.dev\'s query answer {"vulns": [...]})'
)
# what a damaged member raises while it is read: a bad CRC or header (BadZipFile), a broken deflate, bzip2 or LZMA
# stream (zlib.error, OSError, LZMAError), a stream that ends early (EOFError), a bad size (ValueError)
_DAMAGED = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, *_LZMA)


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except (OSError, ValueError):
        return False


def read_records(path: Path) -> Iterator[bytes | audit.Unreadable]:
    """Every JSON text under ``path`` (each one OSV record, a list of them or an osv.dev query answer: see
    supplychain.audit): a folder of .json files and .zip exports (recursively, in name order), an export's ``all.zip``,
    or one .json file. What cannot be read (a damaged or encrypted member, a file that will not open) comes as an
    ``audit.Unreadable``, counted and never trusted. A member larger than a JSON text may be is not read at all, and
    no read goes past that size: a zip bomb costs nothing."""
    shown = printable(str(path), 200)
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read --osv-db {shown}: {getattr(exc, 'strerror', None) or exc}", HINT) from None
    if not exists:
        raise UsageError(f"--osv-db {shown} does not exist", HINT)
    candidates = sorted(path.rglob("*")) if is_dir else [path]
    files = [p for p in candidates if _regular(p)]  # a FIFO or a device would block the read
    if not is_dir and not files:
        raise UsageError(f"--osv-db {shown} is not a regular file or a folder", HINT)
    members = [0]
    for file in files:
        if file.suffix == ".json":
            yield _read_json_file(file)
        elif file.suffix == ".zip":
            yield from _read_zip(file, shown, members)


def _read_json_file(file: Path) -> bytes | audit.Unreadable:
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)  # replaced by a FIFO since it was listed: no wait
    except OSError as exc:
        return audit.Unreadable(f"a file that cannot be opened ({exc.strerror or 'error'})")
    with os.fdopen(fd, "rb") as fh:
        try:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return audit.Unreadable("not a regular file")
            return fh.read(audit.MAX_FILE + 1)
        except OSError as exc:
            return audit.Unreadable(f"a file that cannot be read ({exc.strerror or 'error'})")


def _read_zip(file: Path, shown: str, members: list[int]) -> Iterator[bytes | audit.Unreadable]:
    where = printable(str(file), 200)
    try:
        archive = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
        raise UsageError(f"--osv-db {where} is not a zip file: {printable(str(exc), 120)}", HINT) from None
    with archive:
        for info in archive.infolist():
            members[0] += 1
            if members[0] > MAX_MEMBERS:
                raise CheckFailed(f"--osv-db {shown} holds more than {MAX_MEMBERS} records", HINT)
            if info.is_dir() or not info.filename.endswith(".json"):
                continue
            yield _read_member(archive, info)


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes | audit.Unreadable:
    if info.flag_bits & 0x1:
        return audit.Unreadable("an encrypted zip member")
    if info.file_size > audit.MAX_FILE:
        return audit.Unreadable(f"a zip member larger than {audit.MAX_FILE >> 20} MiB")
    try:
        with archive.open(info) as member:
            return member.read(audit.MAX_FILE + 1)
    except RuntimeError:  # zipfile's "is encrypted, password required" (a flag set in the local header only)
        return audit.Unreadable("an encrypted zip member")
    except NotImplementedError:
        return audit.Unreadable("a zip member compressed in a way Python cannot read")
    except _DAMAGED:
        return audit.Unreadable("a damaged zip member")


@dataclass(frozen=True)
class Target:
    """What is audited, and how its packages were learned."""

    name: str
    packages: list[audit.Package]
    source: str  # where they came from, for the report
    note: str = ""  # what is not covered


def from_sbom_file(path: Path) -> Target:
    """Another tool's SBOM is hostile data: bounded (size, nesting, numbers), shaped as SPDX, with packages."""
    hint = "pass the .spdx.json a build wrote (or an SPDX 2.x JSON document whose packages carry purls)"
    text = read_input(path, "SBOM", hint) or ""
    try:
        doc = load_json(text, "the SBOM")
        packages = audit.packages_from_sbom(doc)
    except (UntrustedData, audit.BadInput) as exc:
        raise UsageError(f"{path} is not an SPDX JSON document we can read: {exc}", hint) from None
    if not packages:
        raise UsageError(f"{path} lists no package with a pkg:pypi or pkg:deb purl: nothing to audit", hint)
    return Target(str(path), packages, f"SBOM {path}")


def from_cell(cell_id: str, lock_dir: Path, state_dir: Path) -> Target:
    """A cell: its lock's pins, and the Debian packages its last build's SBOM lists (the base's dpkg database)."""
    lock_path = lock_dir / f"{cell_id}.txt"
    built = state_dir / "sbom" / f"{cell_id}.spdx.json"
    if built.is_file():
        target = from_sbom_file(built)
        return Target(cell_id, target.packages, f"its last build's SBOM ({built})")
    if not lock_path.is_file():
        raise UsageError(
            f"no lock for {cell_id} in {lock_dir} and no SBOM in {state_dir / 'sbom'}",
            "pass a cell id (`imagekit matrix`), an image, or an .spdx.json; `imagekit lock` writes the lock",
        )
    lock = lockfile.parse(read_input(lock_path, "lock", "run `imagekit lock`") or "", str(lock_path))
    packages = [audit.Package("PyPI", audit.pypi_name(e.name), e.version) for e in lock.entries]
    return Target(
        cell_id,
        sorted(packages),
        f"its lock ({lock_path})",
        "Debian packages: not known until the cell is built (`imagekit build` writes its SBOM); audit the image",
    )


_READ = (
    "cat /etc/os-release; echo; echo @@imagekit@@; cat /var/lib/dpkg/status; echo @@imagekit@@; "
    "cat /etc/imagekit/manifest.json"
)


def from_image(engine: ContainerEngine, image: str) -> Target:
    """An image in the engine: the distributions its manifest pins and what its dpkg database lists."""
    if engine.image(image) is None:
        raise UsageError(f"no image {image} in the engine", "build or pull it first, or pass a cell id")
    code, out, err = engine.run(image, [_READ], entrypoint=["/bin/sh", "-c"], timeout=300)
    parts = out.split("\n@@imagekit@@\n")
    if code != 0 or len(parts) != 3:
        raise CheckFailed(
            f"{image} holds no imagekit manifest or dpkg database (exit {code}: {err.strip()[-300:]})",
            "audit an image imagekit built, or its .spdx.json",
        )
    os_release, status, manifest_text = parts
    try:
        manifest = load_json(manifest_text, "the manifest")
    except UntrustedData:
        manifest = None
    pins = manifest.get("distributions") if isinstance(manifest, dict) else None
    if not isinstance(pins, dict):
        raise CheckFailed(f"{image}'s /etc/imagekit/manifest.json is unreadable", "rebuild the image")
    entries = tuple(lockfile.LockEntry(str(name), str(version), ()) for name, version in sorted(pins.items()))
    cell = manifest.get("cell") if isinstance(manifest.get("cell"), dict) else {}
    facts = sbom.ImageFacts(str(cell.get("id", "image")), image, "audit", "sha256:" + "0" * 64,
                            "linux/amd64", "", sbom.distro(os_release), 0, "imagekit")  # fmt: skip
    doc = sbom.document(facts, lockfile.Lock((), entries), dpkg_status.parse(status.encode()))
    return Target(image, audit.packages_from_sbom(doc), f"image {image} (its manifest and dpkg database)")


def run(
    target: Target,
    osv_db: Path,
    allowlist: Path | None,
    fail_on: str | None,
    today: dt.date,
    *,
    fail_unrated: bool = False,
) -> tuple[audit.Scan, audit.Verdict]:
    """Read the allowlist and the export, match, judge. An export of no record is bad usage (exit 2); one whose
    records were all unreadable or withdrawn is refused too (exit 3): a gate that used no record would pass all."""
    allow = []
    if allowlist is not None:
        text = read_input(allowlist, "--allowlist", "pass the allowlist's TOML file") or ""
        try:
            allow = audit.read_allowlist(text, str(allowlist))
        except audit.BadInput as exc:
            raise UsageError(str(exc), "each [[ignore]] needs id, reason and review_by = YYYY-MM-DD") from None
    scan = audit.match(read_records(osv_db), target.packages)
    shown = printable(str(osv_db), 200)
    if scan.records == 0:  # a gate that read nothing would pass everything
        raise UsageError(f"--osv-db {shown} holds no OSV records (no .json file or .zip export in it)", HINT)
    if scan.used == 0:
        raise EnvironmentFailure(
            f"--osv-db {shown}: read {scan.records} OSV records, used none: {scan.not_used()} "
            "(a gate that used no record would pass everything)",
            HINT + "; download a damaged export again",
        )
    return scan, audit.judge(scan.findings, allow, fail_on, today, fail_unrated=fail_unrated)
