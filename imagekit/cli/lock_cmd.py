"""`imagekit lock`: one hash-pinned lockfile per cell, resolved for the image's platform."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import err_console, folder_option, handles_errors, out_json, selected_compatible
from imagekit.cli.options import JsonOpt, LockDirOpt, OldLockDirOpt, ResolverOptions, Selection, renamed, with_groups
from imagekit.effects.resolver import IndexUnreachable
from imagekit.errors import EXIT_ENV, EXIT_NO, EXIT_OK
from imagekit.services.locks import lock_cells as lock_service
from imagekit.trust import validate


def register(app: typer.Typer) -> None:
    @app.command(
        "lock",
        epilog="Examples: imagekit lock --cuda 12.4 --torch 2.5.1; imagekit lock --check --source pypi; "
        "imagekit lock --cell cu124-torch2.5.1-py3.11-tf4.48.2 --upgrade-package transformers",
    )
    @handles_errors
    @with_groups
    def lock(
        *,
        selection: Selection,
        lock_folder: LockDirOpt = Path("lockfiles"),
        old_lock_folder: OldLockDirOpt = None,
        check: Annotated[
            bool, typer.Option("--check", help="Write nothing; exit 1 naming each stale or missing lock.")
        ] = False,
        upgrade_package: Annotated[
            list[str] | None,
            typer.Option(
                "--upgrade-package",
                "-P",
                metavar="NAME",
                help="Let NAME move to its newest allowed version (repeatable).",
            ),
        ] = None,
        upgrade: Annotated[bool, typer.Option("--upgrade", "-U", help="Re-resolve everything from scratch.")] = False,
        resolving: ResolverOptions,
        jobs: Annotated[int, typer.Option(min=1, max=64, metavar="N", help="Cells resolved at once.")] = 4,
        as_json: JsonOpt = False,
    ) -> None:
        """Resolve each selected compatible cell into lockfiles/<cell id>.txt (torch layer + app layer)."""
        directory, flag = renamed(lock_folder, Path("lockfiles"), old_lock_folder, "--lock-dir", "--dir")
        folder_option(directory, flag)
        data, config, cells = selected_compatible(selection)
        settings = resolving.settings(config)
        plain = [c.cell for c in cells]
        console = err_console()
        if check:
            results = lock_service.check_cells(plain, directory, settings, data)
        else:
            names = tuple(validate.package_name(n) for n in upgrade_package or ())

            def show(r: lock_service.LockResult) -> None:
                style = {"locked": "green", "up-to-date": "dim", "failed": "red"}.get(r.status, "yellow")
                console.print(
                    f"[{style}]{r.status:>10}[/] {r.cell.key}"
                    + (f" ({r.lock.short_hash})" if r.lock and r.status != "failed" else "")
                )
                if r.error and not isinstance(r.error, IndexUnreachable):  # those: once, at the end
                    console.print("  " + r.error.render().replace("\n", "\n  "), markup=False)

            apt, build = _in_bases(plain, data, config, console)
            results = lock_service.lock_cells(
                plain,
                directory,
                settings,
                data,
                matrix=str(selection.matrix_file) if selection.matrix_file else None,
                upgrade=names,
                upgrade_all=upgrade,
                jobs=jobs,
                on_result=show,
                apt=apt,
                build=build,
            )
        if as_json:
            out_json(
                [
                    {
                        "cell": r.cell.id,
                        "platform": r.cell.platform,
                        "status": r.status,
                        "path": str(r.path),
                        "lock_hash": r.lock.content_hash if r.lock and r.status != "failed" else None,
                        "error": r.error.render() if r.error else None,
                    }
                    for r in results
                ]
            )
        if check:
            bad = [r for r in results if r.status != "up-to-date"]
            for r in bad:
                console.print(f"[red]{r.status}[/]: {r.path}")
                if r.error:
                    console.print("  " + r.error.render().replace("\n", "\n  "), markup=False)
            if not bad:
                console.print(f"{len(results)} lock(s) up to date")
            elif any(r.status in ("stale", "missing") for r in bad):  # the matrix, or a file it reads, changed
                console.print("hint: `imagekit lock` locks them again (their inputs changed since, or none exists)")
            raise typer.Exit(EXIT_NO if bad else EXIT_OK)
        failed = [r for r in results if r.status == "failed"]
        # An unreachable index fails every cell that needs it with one shared error: said once, as the command's.
        for error in {id(r.error): r.error for r in failed if isinstance(r.error, IndexUnreachable)}.values():
            sys.stderr.write(error.render() + "\n")
        if failed:
            codes = {r.error.exit_code for r in failed if r.error}
            raise typer.Exit(EXIT_ENV if EXIT_ENV in codes else max(codes))


def _in_bases(plain: list, data, config, console) -> tuple:
    """What the lock step runs in each cell's base, with Docker: apt's resolution of `[image] apt` and the builds of
    `from_source` packages and git requirements; (None, None) when no cell needs either."""
    from imagekit.locking.source_builds import built_names

    if not any(c.apt or built_names(c) for c in plain):
        return None, None
    from imagekit.effects.docker import Engine
    from imagekit.image.buildplan import base_for
    from imagekit.services.builds.base_images import present
    from imagekit.services.locks.apt_resolve import resolver_for
    from imagekit.services.wheels.wheel_builds import builder_for

    engine = Engine()

    def say(line: str) -> None:
        console.print(line, markup=False)

    def base_of(python: str):
        return present(base_for(python, data, config.bases, config.options), engine, data.bases, log=say)

    apt = resolver_for(engine, base_of) if any(c.apt for c in plain) else None
    build = builder_for(engine, base_of, log=say) if any(built_names(c) for c in plain) else None
    return apt, build
