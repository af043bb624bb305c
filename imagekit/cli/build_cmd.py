"""`imagekit build`: the product's main job, per cell: lock (if stale), fetch, render, build, self-test, publish."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from imagekit.cli.common import (
    err_console,
    folder_option,
    handles_errors,
    out_json,
    output_file_option,
    print_plan,
    selected_compatible,
)
from imagekit.cli.options import (
    JsonOpt,
    LockDirOpt,
    QuietOpt,
    ReleaseIndexOpt,
    ResolverOptions,
    Selection,
    VariantOpt,
    ZstdOpt,
    image_options,
    with_groups,
)
from imagekit.errors import EXIT_NO

if TYPE_CHECKING:
    from imagekit.services.builds.build import CellResult


@handles_errors
@with_groups
def build(
    *,
    selection: Selection,
    push: Annotated[bool, typer.Option("--push", help="Publish images whose self-test passed.")] = False,
    registry: Annotated[
        str | None,
        typer.Option(
            metavar="REG/REPO", help="REGISTRY/REPO to tag and push (default: the matrix's [image] repository)."
        ),
    ] = None,
    lock_dir: LockDirOpt = Path("lockfiles"),
    state_dir: Annotated[
        Path, typer.Option("--state-dir", metavar="DIR", help="Build contexts, wheelhouse links, reports.")
    ] = Path(".imagekit"),
    release_index: ReleaseIndexOpt = Path("releases/index.json"),
    release_records: Annotated[
        Path,
        typer.Option(
            "--release-records",
            metavar="DIR",
            help="Also write each published image's release record here (<cell id>-<build hash>.json), for "
            "`imagekit release merge` on CI.",
        ),
    ] = Path("releases/records"),
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Build every layer again.")] = False,
    gpus: Annotated[
        str,
        typer.Option(
            metavar="auto|on|off",
            help="Self-test with GPUs: auto (when the engine has the NVIDIA runtime), on, off.",
        ),
    ] = "auto",
    require_gpu: Annotated[
        bool, typer.Option("--require-gpu", help="Fail the self-test when no GPU is there.")
    ] = False,
    keep_going: Annotated[bool, typer.Option("--keep-going", help="Continue past a failing cell.")] = False,
    full_self_test: Annotated[
        bool,
        typer.Option(
            "--full-self-test",
            help="Run every self-test check. Default: when a published release of the cell passed on the same "
            "layers below the code layer (same config, GPU or not), reuse its results and run the code layer's.",
        ),
    ] = False,
    sign_key: Annotated[
        Path | None,
        typer.Option(
            "--sign-key",
            metavar="FILE",
            help="With --push: sign each tested image (cosign's format; cosign.key with COSIGN_PASSWORD) before "
            "its alias moves.",
        ),
    ] = None,
    zstd: ZstdOpt = False,
    variant: VariantOpt = None,
    audit_osv: Annotated[
        Path | None,
        typer.Option(
            "--audit-osv",
            metavar="DIR_OR_ZIP",
            help="Gate publishing on known vulnerabilities: each image's SBOM against this OSV export "
            "(imagekit audit).",
        ),
    ] = None,
    audit_fail_on: Annotated[
        str, typer.Option("--audit-fail-on", metavar="LEVEL", help="With --audit-osv: the level that fails.")
    ] = "high",
    audit_allowlist: Annotated[
        Path | None,
        typer.Option("--audit-allowlist", metavar="FILE", help="With --audit-osv: the allowlist (TOML [[ignore]])."),
    ] = None,
    audit_fail_on_unrated: Annotated[
        bool,
        typer.Option(
            "--audit-fail-on-unrated",
            help="With --audit-osv: an advisory with no rating (no CVSS, no distribution urgency) fails too.",
        ),
    ] = False,
    as_json: JsonOpt = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print what would happen per cell (lock, base, wheels cached and to download, image size, "
            "disk needed and free) and stop; exit 3 when the disk is short.",
        ),
    ] = False,
    quiet: QuietOpt = False,
    resolving: ResolverOptions,
) -> None:
    """For each selected cell: lock (if stale), fetch wheels, render, docker build, self-test, and publish."""
    from imagekit.services.builds import build_job

    request = build_job.BuildRequest(
        registry=registry,
        push=push,
        lock_dir=lock_dir,
        state_dir=state_dir,
        release_index=release_index,
        release_records=release_records,
        no_cache=no_cache,
        gpus=gpus,
        require_gpu=require_gpu,
        full_self_test=full_self_test,
        keep_going=keep_going,
        sign_key=sign_key,
        audit_osv=audit_osv,
        audit_fail_on=audit_fail_on,
        audit_allowlist=audit_allowlist,
        audit_fail_on_unrated=audit_fail_on_unrated,
    )
    folder_option(lock_dir, "--lock-dir")
    folder_option(state_dir, "--state-dir")
    output_file_option(release_index, "--release-index")
    folder_option(release_records, "--release-records")
    signer = build_job.check(request)
    data, config, evaluated = selected_compatible(selection)
    cells = [e.cell for e in evaluated]
    job = build_job.prepare(
        request, config, image_options(config, zstd=zstd, variants=variant), resolving.settings, signer
    )
    if dry_run:
        print_plan(build_job.dry_run(job, cells, config, data), as_json, build=True)
        return
    from imagekit.cli.progress_display import ConsoleProgress

    console = err_console()
    progress = ConsoleProgress(console, quiet=quiet)
    note = None if quiet else (lambda text: console.print(f"[dim]engine: {text}[/]"))
    results = build_job.run(job, cells, config, data, progress, note)
    _report(results, lock_dir)
    if as_json:
        out_json([r.to_json() for r in results])
    if any(r.status == "failed" for r in results) or len(results) < len(cells):
        raise typer.Exit(EXIT_NO)


def register(app: typer.Typer) -> None:
    """`imagekit build`, registered onto the top-level app."""
    app.command(
        "build",
        epilog="Examples: imagekit build --cuda 11.8; imagekit build --cell cu121-torch2.1.2-py3.11-tf4.48.2 --push "
        "--registry 127.0.0.1:5000/imagekit/train",
    )(build)


def _report(results: list[CellResult], lock_dir: Path) -> None:
    """The build's outcome on stderr: the locks it re-resolved, each error once, a table, the time by step."""
    console = err_console()
    relocked = [r.cell.id for r in results if r.lock == "re-resolved"]
    if relocked:
        console.print(f"re-resolved {len(relocked)} lock(s) in {lock_dir}: {', '.join(relocked)}", markup=False)
    shown: dict[str, str] = {}  # one environment failure (an index down) is printed once, not per cell
    for r in results:
        if r.error:
            text = r.error.render()
            if text in shown:
                console.print(f"[red]{r.cell.id}[/] failed at {r.step}: the same error as {shown[text]}")
                continue
            shown[text] = r.cell.id
            console.print(f"[red]{r.cell.id}[/] failed at {r.step}:")
            console.print(text, markup=False)
    table = Table(title="imagekit build")
    for col in ("cell", "result", "size", "digest", "time"):
        table.add_column(col, no_wrap=col == "cell")
    for r in results:
        style = {"published": "green", "passed": "green"}.get(r.status, "red")
        table.add_row(
            r.cell.id,
            f"[{style}]{r.status}[/]" + ("" if r.status != "failed" else f" ({r.step})"),
            f"{r.size / 1e9:.2f} GB" if r.size else "-",
            (r.digest or "-")[:19],
            f"{r.seconds:.0f} s",
        )
    Console(stderr=True).print(table)
    for r in results:  # where each build's time went, one line per cell
        Console(stderr=True).print(f"{r.cell.slug} time by step: {r.step_summary()}", markup=False, soft_wrap=True)
