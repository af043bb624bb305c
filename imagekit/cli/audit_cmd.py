"""`imagekit audit CELL_OR_IMAGE --osv-db DIR_OR_ZIP`: known vulnerabilities, offline, as a gate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import handles_errors, out, out_json
from imagekit.cli.options import JsonOpt, LockDirOpt
from imagekit.errors import EXIT_NO, UsageError


def register(app: typer.Typer) -> None:
    @app.command(
        "audit",
        epilog="Examples: imagekit audit cu121-torch2.1.2-py3.11-tf4.48.2 --osv-db osv/ --fail-on high "
        "--allowlist audit-allow.toml; imagekit audit 127.0.0.1:5000/imagekit/train:CELL --osv-db PyPI-all.zip",
    )
    @handles_errors
    def audit_command(
        target: Annotated[
            str,
            typer.Argument(
                metavar="CELL_OR_IMAGE",
                help="A cell id (its last build's SBOM, else its lock), an image in the engine, or an .spdx.json.",
            ),
        ],
        osv_db: Annotated[
            Path,
            typer.Option(
                "--osv-db",
                metavar="DIR_OR_ZIP",
                help="osv.dev's all.zip of an ecosystem (PyPI, Debian, Ubuntu), or a folder of them or of records.",
            ),
        ],
        fail_on: Annotated[
            str | None,
            typer.Option(
                "--fail-on",
                metavar="LEVEL",
                help="Exit 1 on a finding at or above LEVEL (low, medium, high, critical) not on the allowlist.",
            ),
        ] = None,
        allowlist: Annotated[
            Path | None,
            typer.Option(
                "--allowlist",
                metavar="FILE",
                help="TOML [[ignore]] entries: id, reason, review_by = YYYY-MM-DD (expired: covers nothing), package.",
            ),
        ] = None,
        lock_dir: LockDirOpt = Path("lockfiles"),
        state_dir: Annotated[
            Path, typer.Option("--state-dir", metavar="DIR", help="Where builds wrote their SBOMs.")
        ] = Path(".imagekit"),
        as_json: JsonOpt = False,
    ) -> None:
        """Match what an image holds against an OSV export, offline: the lock's pins (PyPI) and the Debian/Ubuntu
        packages of its dpkg database (by source package, dpkg's version order). Reports by severity; with
        --fail-on, exits 1 unless every finding at or above it is on the allowlist with a review date not passed.
        """
        import datetime as dt

        from imagekit import audit
        from imagekit.services import audit_run

        if fail_on is not None and fail_on not in audit.LEVELS[1:]:
            raise UsageError(f"invalid --fail-on {fail_on!r}", "use low, medium, high or critical")
        path = Path(target)
        if target.endswith(".json") and path.is_file():
            subject = audit_run.from_sbom_file(path)
        elif (lock_dir / f"{target}.txt").is_file() or (state_dir / "sbom" / f"{target}.spdx.json").is_file():
            subject = audit_run.from_cell(target, lock_dir, state_dir)
        else:
            from imagekit import validate
            from imagekit.effects.docker import Engine

            validate.image_ref(target, "CELL_OR_IMAGE")
            subject = audit_run.from_image(Engine(), target)
        scan, verdict = audit_run.run(subject, osv_db, allowlist, fail_on, dt.date.today())
        if as_json:
            out_json(_json(subject, scan, verdict, fail_on))
        else:
            for line in _text(subject, scan, verdict, fail_on):
                out(line)
        if not verdict.passed:
            raise typer.Exit(EXIT_NO)


def _json(subject, scan, verdict, fail_on) -> dict:  # type: ignore[no-untyped-def]
    return {
        "target": subject.name,
        "source": subject.source,
        "packages": len(subject.packages),
        "records": scan.records,
        "unreadable_records": scan.unreadable,
        "fail_on": fail_on,
        "passed": verdict.passed,
        "findings": [
            {
                "id": f.id,
                "aliases": list(f.aliases),
                "package": f.package.name,
                "source_package": f.package.source or None,
                "version": f.package.version,
                "severity": f.severity,
                "fixed": f.fixed or None,
                "summary": f.summary,
                "allowed": f.allowed_by or None,
                "blocking": f in verdict.blocking,
            }
            for f in verdict.findings
        ],
        "expired_allowlist": [{"id": e.id, "review_by": e.review_by.isoformat()} for e, _ in verdict.expired],
        "unused_allowlist": [e.id for e in verdict.unused],
    }


def _text(subject, scan, verdict, fail_on) -> list[str]:  # type: ignore[no-untyped-def]
    from imagekit import audit

    counts = {level: 0 for level in reversed(audit.LEVELS)}
    for f in verdict.findings:
        counts[f.severity] += 1
    lines = [
        f"{subject.name}: {len(subject.packages)} packages from {subject.source}, against {scan.records} OSV records"
        + (f" ({scan.unreadable} unreadable, skipped)" if scan.unreadable else ""),
    ]
    if subject.note:
        lines.append(f"note: {subject.note}")
    lines.append(
        f"{len(verdict.findings)} findings: " + ", ".join(f"{n} {level}" for level, n in counts.items() if n)
        if verdict.findings
        else "no known vulnerabilities"
    )
    for f in verdict.findings:
        name = f.package.name + (
            f" (source {f.package.source})" if f.package.source not in ("", f.package.name) else ""
        )
        also = f" ({', '.join(f.aliases[:3])})" if f.aliases else ""
        fix = f", fixed in {f.fixed}" if f.fixed else ", no fix named"
        mark = "BLOCKS " if f in verdict.blocking else "allowed " if f.allowed_by else ""
        lines.append(f"  {mark}{f.severity.upper():<8} {name} {f.package.version}: {f.id}{also}{fix}: {f.summary}")
        if f.allowed_by:
            lines.append(f"      allowlisted: {f.allowed_by}")
    for entry, f in verdict.expired:
        lines.append(
            f"error: allowlist entry {entry.id} expired on {entry.review_by} (it covered {f.package.name} "
            f"{f.package.version}); hint: review it and set a new review_by, or fix the package"
        )
    for entry in verdict.unused:
        lines.append(f"note: allowlist entry {entry.id} covers nothing found: remove it when it is no longer needed")
    if fail_on is not None:
        if verdict.passed:
            lines.append(f"passed: nothing at or above {fail_on} outside the allowlist")
        else:
            lines.append(
                f"error: {len(verdict.blocking)} finding(s) at or above {fail_on} not on the allowlist"
                + (f", {len(verdict.expired)} expired allowlist entr(y/ies)" if verdict.expired else "")
                + "; hint: move to a fixed version (a new cell), or allowlist each with its reason and review_by"
            )
    return lines
