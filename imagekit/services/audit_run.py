"""`imagekit audit`: read an OSV export and what an image holds, then judge (imagekit.audit)."""

from __future__ import annotations

import datetime as dt
import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from imagekit import audit, dpkg_status, lockfile, sbom
from imagekit.effects.files import read_input
from imagekit.errors import CheckFailed, UsageError
from imagekit.services.ports import ContainerEngine

MAX_MEMBERS = 2_000_000  # records in one export (osv.dev's largest ecosystems hold a few hundred thousand)


def _regular(path: Path) -> bool:
    import stat

    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def read_records(path: Path) -> Iterator[bytes]:
    """Every OSV record under ``path``: a folder of .json files and .zip exports (recursively, in name order), an
    export's ``all.zip``, or one .json file. A member larger than a record can be is read only that far (and then
    counted unreadable): a zip bomb costs nothing."""
    hint = "pass osv.dev's all.zip of an ecosystem (PyPI, Debian, Ubuntu), or a folder of such files or records"
    if not path.exists():
        raise UsageError(f"--osv-db {path} does not exist", hint)
    candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
    files = [p for p in candidates if _regular(p)]  # a FIFO or a device would block the read
    if not path.is_dir() and not files:
        raise UsageError(f"--osv-db {path} is not a regular file or a folder", hint)
    members = 0
    for file in files:
        if file.suffix == ".json":
            with open(file, "rb") as fh:
                yield fh.read(audit.MAX_RECORD + 1)
        elif file.suffix == ".zip":
            try:
                archive = zipfile.ZipFile(file)
            except (zipfile.BadZipFile, OSError) as exc:
                raise UsageError(f"--osv-db {file} is not a zip file: {exc}", hint) from None
            with archive:
                for info in archive.infolist():
                    members += 1
                    if members > MAX_MEMBERS:
                        raise CheckFailed(f"--osv-db {path} holds more than {MAX_MEMBERS} records", hint)
                    if info.is_dir() or not info.filename.endswith(".json"):
                        continue
                    with archive.open(info) as member:
                        yield member.read(audit.MAX_RECORD + 1)


@dataclass(frozen=True)
class Target:
    """What is audited, and how its packages were learned."""

    name: str
    packages: list[audit.Package]
    source: str  # where they came from, for the report
    note: str = ""  # what is not covered


def from_sbom_file(path: Path) -> Target:
    text = read_input(path, "SBOM", "pass the .spdx.json a build wrote") or ""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{path} is not an SPDX JSON document: {exc}", "pass the .spdx.json a build wrote") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path} is not an SPDX JSON document", "pass the .spdx.json a build wrote")
    return Target(str(path), audit.packages_from_sbom(doc), f"SBOM {path}")


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
        manifest = json.loads(manifest_text)
        pins = manifest["distributions"]
        assert isinstance(pins, dict)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise CheckFailed(f"{image}'s /etc/imagekit/manifest.json is unreadable", "rebuild the image") from None
    entries = tuple(lockfile.LockEntry(str(name), str(version), ()) for name, version in sorted(pins.items()))
    facts = sbom.ImageFacts(str(manifest.get("cell", {}).get("id", "image")), image, "audit", "sha256:" + "0" * 64,
                            "linux/amd64", "", sbom.distro(os_release), 0, "imagekit")  # fmt: skip
    doc = sbom.document(facts, lockfile.Lock((), entries), dpkg_status.parse(status.encode()))
    return Target(image, audit.packages_from_sbom(doc), f"image {image} (its manifest and dpkg database)")


def run(
    target: Target, osv_db: Path, allowlist: Path | None, fail_on: str | None, today: dt.date
) -> tuple[audit.Scan, audit.Verdict]:
    allow = []
    if allowlist is not None:
        text = read_input(allowlist, "--allowlist", "pass the allowlist's TOML file") or ""
        try:
            allow = audit.read_allowlist(text, str(allowlist))
        except audit.BadInput as exc:
            raise UsageError(str(exc), "each [[ignore]] needs id, reason and review_by = YYYY-MM-DD") from None
    scan = audit.match(read_records(osv_db), target.packages)
    if scan.records == 0:  # a gate that read nothing would pass everything
        raise UsageError(
            f"--osv-db {osv_db} holds no OSV records (no .json file or .zip export in it)",
            "pass osv.dev's all.zip of an ecosystem (PyPI, Debian, Ubuntu), or a folder of them or of records",
        )
    return scan, audit.judge(scan.findings, allow, fail_on, today)
