"""`imagekit build`, `fetch`, `base bootstrap`, `runpod-template`: the product's main job and its helpers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from imagekit import resolution, runpod
from imagekit.cli.common import (
    CellOpt,
    CudaOpt,
    ExcludeNewerOpt,
    ExtraIndexOpt,
    IndexUrlOpt,
    MatrixOpt,
    PyOpt,
    ResolverOpt,
    SourceOpt,
    TfOpt,
    TorchIndexOpt,
    TorchOpt,
    err_console,
    folder_option,
    handles_errors,
    lock_settings,
    out,
    out_json,
    output_file_option,
    selected_compatible,
    selector,
)
from imagekit.errors import EXIT_NO, UsageError
from imagekit.validate import http_url as validate_http_url
from imagekit.validate import repository as validate_repository

ReleaseIndexOpt = Annotated[
    Path,
    typer.Option(
        "--release-index",
        metavar="FILE",
        help="Release index JSON (tag, digest, manifest, self-test report per published image).",
    ),
]


def _print_plan(plan, as_json: bool, *, build: bool) -> None:
    from imagekit.services import forecast

    if as_json:
        out_json(plan.to_json())
    else:
        out("\n".join(forecast.render_text(plan, build=build)))
        out(f"(planned in {plan.seconds:.1f} s; nothing was changed)")


def register(app: typer.Typer) -> None:
    @app.command(
        "build",
        epilog="Examples: imagekit build --cuda 11.8; imagekit build --cell cu121-torch2.1.2-py3.11-tf4.48.2 --push "
        "--registry 127.0.0.1:5000/imagekit/train",
    )
    @handles_errors
    def build(
        matrix_file: MatrixOpt = None,
        cuda: CudaOpt = None,
        torch: TorchOpt = None,
        transformers: TfOpt = None,
        python: PyOpt = None,
        cell: CellOpt = None,
        source: SourceOpt = "all",
        push: Annotated[bool, typer.Option("--push", help="Publish images whose self-test passed.")] = False,
        registry: Annotated[
            str | None,
            typer.Option(
                metavar="REG/REPO", help="REGISTRY/REPO to tag and push (default: the matrix's [image] repository)."
            ),
        ] = None,
        lock_dir: Annotated[Path, typer.Option("--lock-dir", metavar="DIR")] = Path("lockfiles"),
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
        as_json: Annotated[bool, typer.Option("--json", help="JSON summary (or plan) on stdout.")] = False,
        dry_run: Annotated[
            bool,
            typer.Option(
                "--dry-run",
                help="Print what would happen per cell (lock, base, wheels cached and to download, image size, "
                "disk needed and free) and stop; exit 3 when the disk is short.",
            ),
        ] = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr; only the summary.")] = False,
        index_url: IndexUrlOpt = resolution.PYPI,
        extra_index_url: ExtraIndexOpt = None,
        torch_index_url: TorchIndexOpt = resolution.PYTORCH_INDEX,
        exclude_newer: ExcludeNewerOpt = None,
        resolver: ResolverOpt = "uv",
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
        data, config, cells = selected_compatible(
            matrix_file, selector(cuda, torch, transformers, python, cell), source
        )
        repo = validate_repository(registry) if registry else config.repository
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
            settings=lock_settings(index_url, extra_index_url, torch_index_url, exclude_newer, resolver),
            bases=config.bases,
            options=config.options,
            username=os.environ.get("IMAGEKIT_REGISTRY_USER"),
            password=os.environ.get("IMAGEKIT_REGISTRY_PASSWORD"),
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
            _print_plan(plan, as_json, build=True)
            if not plan.disk_ok:
                raise plan.disk_error()
            return
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
        if as_json:
            out_json([r.to_json() for r in results])
        if any(r.status == "failed" for r in results) or len(results) < len(cells):
            raise typer.Exit(EXIT_NO)

    @app.command("fetch", epilog="Example: imagekit fetch --cuda 12.4 --torch 2.5.1")
    @handles_errors
    def fetch(
        matrix_file: MatrixOpt = None,
        cuda: CudaOpt = None,
        torch: TorchOpt = None,
        transformers: TfOpt = None,
        python: PyOpt = None,
        cell: CellOpt = None,
        source: SourceOpt = "all",
        lock_dir: Annotated[Path, typer.Option("--lock-dir", metavar="DIR")] = Path("lockfiles"),
        dry_run: Annotated[
            bool,
            typer.Option(
                "--dry-run", help="Print the wheels cached and to download (count, bytes), disk needed and free."
            ),
        ] = False,
        as_json: Annotated[bool, typer.Option("--json", help="The --dry-run plan as JSON on stdout.")] = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")] = False,
        into: Annotated[
            Path | None,
            typer.Option(
                "--into",
                metavar="DIR",
                help="Also put each cell's wheels into DIR/<cell id>/wheels (hard links) for BuildKit builds of "
                "`imagekit render --out DIR`.",
            ),
        ] = None,
    ) -> None:
        """Download every locked wheel once into the wheel cache, verifying each sha256."""
        from imagekit.cli.progress_display import ConsoleProgress
        from imagekit.services import fetch as fetch_service
        from imagekit.services import forecast
        from imagekit.services.cell_plans import base_for
        from imagekit.services.lock_cells import lock_path, verified_lock

        folder_option(lock_dir, "--lock-dir")
        if into is not None:
            folder_option(into, "--into")
        data, config, cells = selected_compatible(
            matrix_file, selector(cuda, torch, transformers, python, cell), source
        )
        console = err_console()
        progress = ConsoleProgress(console, quiet=quiet)
        if dry_run:
            plan = forecast.forecast(
                [c.cell for c in cells],
                config,
                data,
                lock_dir=lock_dir,
                settings=resolution.LockSettings(),
                build=False,
            )
            _print_plan(plan, as_json, build=False)
            if not plan.disk_ok:
                raise plan.disk_error()
            return
        for e in cells:
            lock = verified_lock(lock_path(lock_dir, e.cell), e.cell, data, current=True)
            if lock is None:
                raise UsageError(f"no lock for {e.cell.id}", "run `imagekit lock` first")
            glibc = base_for(e.cell, data, config=config).glibc  # the base `build` uses: same wheels
            got = fetch_service.fetch_for_build(lock, e.cell.python, glibc, progress=progress, cell=e.cell.id)
            size = sum(w.path.stat().st_size for w in got)
            new = [w for w in got if w.downloaded]
            if into is not None:
                fetch_service.link_wheels(got, into / e.cell.id / "wheels")
                fetch_service.write_requirements(lock, into / e.cell.id / "wheels")
            progress.line(
                e.cell.id,
                f"{len(got)} wheels, {size / 1e9:.2f} GB in {fetch_service.wheel_cache()} "
                f"({len(new)} downloaded, {sum(w.path.stat().st_size for w in new) / 1e9:.2f} GB)",
            )

    base_app = typer.Typer(
        help="Base images: bootstrap from Debian/Ubuntu packages (no registry needed).", no_args_is_help=True
    )

    @base_app.command(
        "bootstrap",
        epilog="Examples: imagekit base bootstrap --python 3.11; "
        "imagekit base bootstrap --python 3.11 --push ghcr.io/acme/base >> imagekit.toml",
    )
    @handles_errors
    def bootstrap(
        python: Annotated[
            list[str] | None,
            typer.Option(
                "--python",
                metavar="VERSION",
                help="Which base (by its Python), repeatable; default: all bootstrappable bases.",
            ),
        ] = None,
        push: Annotated[
            str | None,
            typer.Option(
                "--push",
                metavar="REG/REPO",
                help="Also push it to REG/REPO and print its [bases] entry (by digest) for imagekit.toml, so CI "
                "runners and `docker buildx bake` pull the very same base.",
            ),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """Build the base with mmdebstrap (SOURCE_DATE_EPOCH: identical inputs, identical tarball) and import it."""
        from imagekit import compat
        from imagekit.effects.docker import Engine
        from imagekit.services.base_images import ensure_base

        data = compat.load()
        wanted = python or sorted(data.bases)
        unknown = [p for p in wanted if p not in data.bases]
        if unknown:
            raise UsageError(f"no base for Python {', '.join(unknown)}", f"known: {', '.join(sorted(data.bases))}")
        repository = validate_repository(push) if push is not None else None
        engine, console, done = Engine(), err_console(), []
        for py in wanted:
            ref = ensure_base(data.bases[py], engine, log=console.print)
            console.print(f"{ref.reference} ({ref.digest})")
            row = {"python": py, "reference": ref.reference, "digest": ref.digest, "glibc": ref.glibc}
            if repository:
                from imagekit.services.base_images import push_base

                pushed = push_base(
                    engine,
                    ref,
                    repository,
                    os.environ.get("IMAGEKIT_REGISTRY_USER"),
                    os.environ.get("IMAGEKIT_REGISTRY_PASSWORD"),
                )
                console.print(f"pushed {pushed}")
                row["pushed"] = pushed
                if not as_json:
                    out(f'[bases."{py}"]\nreference = "{pushed}"\nglibc = "{ref.glibc}"\n')
            done.append(row)
        if as_json:
            out_json(done)

    app.add_typer(base_app, name="base")

    @app.command(
        "runpod-template",
        epilog="Examples: imagekit runpod-template cu121-torch2.1.2-py3.11-tf4.48.2; "
        "RUNPOD_API_KEY=... imagekit runpod-template CELL --create",
    )
    @handles_errors
    def runpod_template(
        ref: Annotated[
            str, typer.Argument(metavar="CELL_OR_TAG", help="A cell id, or a published tag from the release index.")
        ],
        release_index: ReleaseIndexOpt = Path("releases/index.json"),
        digest: Annotated[bool, typer.Option("--digest", help="Pin imageName with @sha256 as well.")] = False,
        volume_gb: Annotated[
            int, typer.Option(min=1, max=10_000, metavar="GB", help="Volume size (GB) mounted at /workspace.")
        ] = 50,
        create: Annotated[bool, typer.Option("--create", help="Call RunPod's API (needs RUNPOD_API_KEY).")] = False,
        api_url: Annotated[
            str, typer.Option(metavar="URL", help="RunPod GraphQL endpoint.")
        ] = "https://api.runpod.io/graphql",
        allow_private_registry: Annotated[
            bool,
            typer.Option(
                "--allow-private-registry", help="Create it even though the image is on a loopback/private registry."
            ),
        ] = False,
    ) -> None:
        """Print the RunPod template (saveTemplate input) for a published image; --create saves it on RunPod."""
        from imagekit.effects import runpod_api
        from imagekit.services.publish import read_index

        validate_http_url(api_url, "--api-url")
        images = read_index(release_index).get("images", {})
        matches = [
            e
            for tag, e in sorted(images.items())
            if tag == ref or e.get("alias") == ref or e["manifest"]["cell"].get("id") == ref
        ]
        if not matches:
            raise UsageError(f"{ref} is not in {release_index}", "publish it with `imagekit build --push` first")
        entry = max(matches, key=lambda e: e.get("published_at", ""))
        body = runpod.mutation(runpod.template(entry, with_digest=digest, volume_gb=volume_gb))
        unreachable = runpod.unreachable_registry(entry["tag"])
        hint = (
            "publish to a registry pods can pull from (`imagekit build --push --registry ghcr.io/ORG/REPO`), "
            "or pass --allow-private-registry if your pods reach it"
        )
        if not create:
            if unreachable:
                err_console().print(f"warning: no pod can pull {entry['tag']}: {unreachable}\nhint: {hint}")
            out_json(body)
            return
        if unreachable and not allow_private_registry:
            raise UsageError(f"no pod can pull {entry['tag']}: {unreachable}", hint)
        key = os.environ.get("RUNPOD_API_KEY")
        if not key:
            raise UsageError("--create needs RUNPOD_API_KEY in the environment", "export RUNPOD_API_KEY=...")
        doc = runpod_api.post(body, key, api_url)
        out_json(doc.get("data", {}))
        err_console().print(f"created RunPod template for {entry['tag']}")
