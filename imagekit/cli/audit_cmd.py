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
                help="Exit 1 on a finding at or above LEVEL (low, medium, high, critical) not on the allowlist. The "
                "highest rating a record gives counts (its own, its CVSS v3 score, the distribution's).",
            ),
        ] = None,
        fail_on_unrated: Annotated[
            bool,
            typer.Option(
                "--fail-on-unrated",
                help="Also exit 1 on a finding whose record gives no rating at all (a Debian DSA often gives none), "
                "unless it is on the allowlist. Without it they are listed and counted, never gated.",
            ),
        ] = False,
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
        --fail-on (and --fail-on-unrated), exits 1 unless every such finding is on the allowlist with a review date
        not passed. Exits 2 on bad usage (an export holding no .json or .zip, an SBOM it cannot read), 3 when no
        record it read was usable (all unreadable or withdrawn: a gate that used nothing would pass everything).
        """
        import datetime as dt

        from imagekit.services.publishing import audit_run
        from imagekit.supplychain import audit

        if fail_on is not None and fail_on not in audit.LEVELS[1:]:
            raise UsageError(f"invalid --fail-on {fail_on!r}", "use low, medium, high or critical")
        path = Path(target)
        if target.endswith(".json") and path.is_file():
            subject = audit_run.from_sbom_file(path)
        elif (lock_dir / f"{target}.txt").is_file() or (state_dir / "sbom" / f"{target}.spdx.json").is_file():
            subject = audit_run.from_cell(target, lock_dir, state_dir)
        else:
            from imagekit.effects.docker import Engine
            from imagekit.trust import validate

            validate.image_ref(target, "CELL_OR_IMAGE")
            subject = audit_run.from_image(Engine(), target)
        scan, verdict = audit_run.run(
            subject, osv_db, allowlist, fail_on, dt.date.today(), fail_unrated=fail_on_unrated
        )
        if as_json:
            out_json(_json(subject, scan, verdict, fail_on, fail_on_unrated))
        else:
            for line in _text(subject, scan, verdict, fail_on, fail_on_unrated):
                out(line)
        if not verdict.passed:
            raise typer.Exit(EXIT_NO)


def _json(subject, scan, verdict, fail_on, fail_unrated) -> dict:  # type: ignore[no-untyped-def]
    return {
        "target": subject.name,
        "source": subject.source,
        "packages": len(subject.packages),
        "records": scan.records,
        "records_used": scan.used,
        "unreadable_records": scan.unreadable,
        "unreadable_reasons": dict(scan.reasons),
        "withdrawn_records": scan.withdrawn,
        "fail_on": fail_on,
        "fail_on_unrated": fail_unrated,
        "unrated": verdict.unrated,
        "passed": verdict.passed,
        "findings": [
            {
                "id": _shown(f.id),
                "aliases": [_shown(a) for a in f.aliases],
                "package": _shown(f.package.name),
                "source_package": _shown(f.package.source) or None,
                "version": _shown(f.package.version),
                "severity": f.severity,
                "fixed": _shown(f.fixed) or None,
                "summary": _shown(f.summary),
                "allowed": f.allowed_by or None,
                "blocking": f in verdict.blocking,
            }
            for f in verdict.findings
        ],
        "expired_allowlist": [{"id": e.id, "review_by": e.review_by.isoformat()} for e, _ in verdict.expired],
        "unused_allowlist": [e.id for e in verdict.unused],
    }


def _shown(text: str) -> str:
    """What a record or an SBOM says, as it may reach the terminal (supplychain.audit made it so already)."""
    from imagekit.trust.untrusted import printable

    return printable(text, 300)


def _label(severity: str) -> str:
    return "unrated" if severity == "unknown" else severity


def _text(subject, scan, verdict, fail_on, fail_unrated) -> list[str]:  # type: ignore[no-untyped-def]
    from imagekit.supplychain import audit

    counts = {_label(level): 0 for level in reversed(audit.LEVELS)}
    for f in verdict.findings:
        counts[_label(f.severity)] += 1
    lines = [
        f"{subject.name}: {len(subject.packages)} packages from {subject.source}",
        f"OSV records: {scan.counts()}",
    ]
    if subject.note:
        lines.append(f"note: {subject.note}")
    lines.append(
        f"{len(verdict.findings)} findings: " + ", ".join(f"{n} {level}" for level, n in counts.items() if n)
        if verdict.findings
        else "no known vulnerabilities"
    )
    for f in verdict.findings:
        name = _shown(f.package.name) + (
            f" (source {_shown(f.package.source)})" if f.package.source not in ("", f.package.name) else ""
        )
        also = f" ({', '.join(_shown(a) for a in f.aliases[:3])})" if f.aliases else ""
        fix = f", fixed in {_shown(f.fixed)}" if f.fixed else ", no fix named"
        mark = "BLOCKS " if f in verdict.blocking else "allowed " if f.allowed_by else ""
        lines.append(
            f"  {mark}{_label(f.severity).upper():<8} {name} {_shown(f.package.version)}: {_shown(f.id)}{also}{fix}: "
            f"{_shown(f.summary)}"
        )
        if f.allowed_by:
            lines.append(f"      allowlisted: {_shown(f.allowed_by)}")
    for entry, f in verdict.expired:
        lines.append(
            f"error: allowlist entry {entry.id} expired on {entry.review_by} (it covered {_shown(f.package.name)} "
            f"{_shown(f.package.version)}); hint: review it and set a new review_by, or fix the package"
        )
    for entry in verdict.unused:
        lines.append(f"note: allowlist entry {entry.id} covers nothing found: remove it when it is no longer needed")
    unrated = f"{verdict.unrated} unrated finding(s)" + (
        ", gated" if fail_unrated else ", not gated (--fail-on-unrated gates them)" if verdict.unrated else ""
    )
    if fail_on is not None or fail_unrated:
        what = ", nothing ".join(
            x for x in (f"at or above {fail_on}" if fail_on else "", "unrated" if fail_unrated else "") if x
        )
        if verdict.passed:
            lines.append(f"passed: nothing {what} outside the allowlist; {unrated}")
        else:
            gated = " or ".join(
                x for x in (f"at or above {fail_on}" if fail_on else "", "unrated" if fail_unrated else "") if x
            )
            lines.append(
                f"error: {len(verdict.blocking)} finding(s) {gated} not on the allowlist"
                + (f", {len(verdict.expired)} expired allowlist entr(y/ies)" if verdict.expired else "")
                + f" ({unrated}); hint: move to a fixed version (a new cell), or allowlist each with its reason and "
                "review_by"
            )
    elif verdict.unrated:
        lines.append(f"note: {unrated}")
    return lines
