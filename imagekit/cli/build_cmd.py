"""`imagekit build`: the product's main job, per cell: lock (if stale), fetch, render, build, self-test, publish."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

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
    with_groups,
)
from imagekit.errors import EXIT_NO, UsageError
from imagekit.trust.validate import repository as validate_repository


def _push_note(repo: str, credential) -> str:  # type: ignore[no-untyped-def]
    """Where --push would publish, and with which credentials (their source, never their values)."""
    if credential.found:
        return f"push to {repo}: credentials from {credential.source}"
    host = repo.split("/", 1)[0]
    return (
        f"push to {repo}: no credentials found (a registry that needs them refuses the push; set "
        f"IMAGEKIT_REGISTRY_USER and IMAGEKIT_REGISTRY_PASSWORD, or run `docker login {host}`)"
    )


def _published_notes(repo: str, credential, cells: list) -> list[str]:  # type: ignore[no-untyped-def]
    """What the registry holds under each cell's alias tag now: a dry run says what --push would replace. The
    registry's refusal or silence is a note too, never the plan's failure."""
    from imagekit.effects import http
    from imagekit.effects.registry import RegistryClient, Remote
    from imagekit.errors import ImagekitError

    remote = Remote.parse(repo)
    down = http.unreachable(remote.base.split("/v2/", 1)[0] + "/v2/", timeout=5)  # one try: a plan does not wait
    if down is not None:
        return [f"{repo}: cannot tell what is published (registry {remote.registry} is unreachable: {down})"]
    client = RegistryClient(credential.username, credential.password, registries=[remote.registry])
    notes = []
    for cell in cells:
        try:
            found = client.oci_manifest(remote, cell.id)
        except ImagekitError as exc:
            return [*notes, f"{repo}: cannot tell what is published ({exc.message.splitlines()[0][:200]})"]
        notes.append(
            f"{repo}:{cell.id} is published now ({found.digest[:19]}…): --push moves this alias to the new build "
            "(its immutable tag is new)"
            if found is not None
            else f"{repo}:{cell.id} is not published yet"
        )
    return notes


def register(app: typer.Typer) -> None:
    @app.command(
        "build",
        epilog="Examples: imagekit build --cuda 11.8; imagekit build --cell cu121-torch2.1.2-py3.11-tf4.48.2 --push "
        "--registry 127.0.0.1:5000/imagekit/train",
    )
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
        sign_key: Annotated[
            Path | None,
            typer.Option(
                "--sign-key",
                metavar="FILE",
                help="With --push: sign each tested image (cosign's format; cosign.key with COSIGN_PASSWORD) before "
                "its alias moves.",
            ),
        ] = None,
        zstd: Annotated[
            bool,
            typer.Option(
                "--zstd",
                help="With --push: also publish each image with zstd layers as <tag>-zstd and <cell>-zstd (smaller, "
                "faster to unpack; Docker >= 23 and containerd pull it, Docker 20.10 cannot).",
            ),
        ] = False,
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
            typer.Option(
                "--audit-allowlist", metavar="FILE", help="With --audit-osv: the allowlist (TOML [[ignore]])."
            ),
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
        from imagekit.services.build import BuildOptions, build_cells

        if gpus not in ("auto", "on", "off"):
            raise UsageError(f"invalid --gpus {gpus!r}", "use auto, on or off")
        from imagekit.services.publish import read_index

        folder_option(lock_dir, "--lock-dir")
        folder_option(state_dir, "--state-dir")
        output_file_option(release_index, "--release-index")
        folder_option(release_records, "--release-records")
        read_index(release_index)  # a broken index is refused now, not after the build
        if audit_fail_on not in ("low", "medium", "high", "critical"):
            raise UsageError(f"invalid --audit-fail-on {audit_fail_on!r}", "use low, medium, high or critical")
        if audit_osv is not None and not audit_osv.exists():
            raise UsageError(f"--audit-osv {audit_osv} does not exist", "pass osv.dev's all.zip or a folder of them")
        signer = None
        if sign_key is not None:
            if not push:
                raise UsageError("--sign-key signs what --push publishes", "add --push, or sign later: imagekit sign")
            import os

            from imagekit.effects.files import read_input
            from imagekit.supplychain import cosign

            key_bytes = (read_input(sign_key, "--sign-key", "pass the cosign.key file") or "").encode()
            try:  # opened now: a wrong password is refused before the build, not after it
                signer = cosign.load_private_key(key_bytes, os.environ.get("COSIGN_PASSWORD", "").encode())
            except cosign.KeyError_ as exc:
                raise UsageError(f"--sign-key {sign_key}: {exc}", "set COSIGN_PASSWORD to the key's password") from None
        data, config, cells = selected_compatible(selection)
        repo = validate_repository(registry) if registry else config.repository
        from imagekit.effects import credentials
        from imagekit.effects.registry import RegistryClient, Remote

        remote = Remote.parse(repo)
        credential = credentials.for_registry(remote.registry) if push else credentials.NONE
        opts = BuildOptions(
            repository=repo,
            lock_dir=lock_dir,
            state_dir=state_dir,
            release_index=release_index,
            release_records=release_records,
            push=push,
            nocache=no_cache,
            gpus=gpus,
            require_gpu=require_gpu,
            settings=resolving.settings(config),
            bases=config.bases,
            options=config.options,
            username=credential.username,
            password=credential.password,
            sign_key=signer,
            zstd=zstd,
            audit_osv=audit_osv,
            audit_fail_on=audit_fail_on,
            audit_allowlist=audit_allowlist,
            audit_fail_on_unrated=audit_fail_on_unrated,
        )
        console = err_console()
        from imagekit.cli.progress_display import ConsoleProgress
        from imagekit.services import forecast

        progress = ConsoleProgress(console, quiet=quiet)
        if dry_run:
            plan = forecast.forecast(
                [c.cell for c in cells],
                config,
                data,
                lock_dir=lock_dir,
                settings=opts.settings,
                engine=forecast.engine_or_none(),
            )
            if push:
                published = _published_notes(repo, credential, [c.cell for c in cells])
                plan = dataclasses.replace(plan, notes=(*plan.notes, _push_note(repo, credential), *published))
            print_plan(plan, as_json, build=True)
            return
        if push:  # before the build: a refused login would otherwise surface after it, at the push
            RegistryClient(credential.username, credential.password, registries=[remote.registry]).check_access(remote)
        from imagekit.effects.docker import Engine

        engine = Engine()
        if not quiet:
            for note in engine.capabilities().notes:
                console.print(f"[dim]engine: {note}[/]")
        plan = forecast.forecast(
            [c.cell for c in cells], config, data, lock_dir=lock_dir, settings=opts.settings, engine=engine
        )
        for line in forecast.render_text(plan):
            progress.line("", "plan: " + line)
        if plan.blockers:
            raise plan.blocked_error()
        if not plan.disk_ok:
            raise plan.disk_error()
        results = build_cells(
            [c.cell for c in cells],
            opts,
            data,
            progress.line,
            keep_going=keep_going,
            engine=engine,
            progress=progress,
        )
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
        if as_json:
            out_json([r.to_json() for r in results])
        if any(r.status == "failed" for r in results) or len(results) < len(cells):
            raise typer.Exit(EXIT_NO)
