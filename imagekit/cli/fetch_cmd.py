"""`imagekit fetch`: every locked wheel, once, into the content-addressed wheel cache (and a BuildKit context)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import (
    err_console,
    folder_option,
    handles_errors,
    out_json,
    print_plan,
    selected_compatible,
)
from imagekit.cli.options import JsonOpt, LockDirOpt, QuietOpt, Selection, project_folder, with_groups
from imagekit.errors import UsageError
from imagekit.locking import resolution


def register(app: typer.Typer) -> None:
    @app.command("fetch", epilog="Example: imagekit fetch --cuda 12.4 --torch 2.5.1")
    @handles_errors
    @with_groups
    def fetch(
        *,
        selection: Selection,
        lock_dir: LockDirOpt = Path("lockfiles"),
        dry_run: Annotated[
            bool,
            typer.Option(
                "--dry-run", help="Print the wheels cached and to download (count, bytes), disk needed and free."
            ),
        ] = False,
        as_json: JsonOpt = False,
        quiet: QuietOpt = False,
        into: Annotated[
            Path | None,
            typer.Option(
                "--into",
                metavar="DIR",
                help="Also put each cell's wheels into DIR/<cell id>/wheels (hard links, swapped in whole; a "
                "symbolic link there is refused, never followed) for BuildKit builds of `imagekit render --out DIR`.",
            ),
        ] = None,
    ) -> None:
        """Download every locked wheel once into the wheel cache, verifying each sha256."""
        from imagekit.cli.progress_display import ConsoleProgress
        from imagekit.image.buildplan import base_for
        from imagekit.services.builds import forecast
        from imagekit.services.locks.lock_cells import lock_path, verified_lock
        from imagekit.services.wheels import fetch as fetch_service
        from imagekit.services.wheels import wheel_folders
        from imagekit.services.wheels.wheel_cache import wheel_cache

        folder_option(lock_dir, "--lock-dir")
        if into is not None:
            folder_option(into, "--into")
        data, config, cells = selected_compatible(selection)
        console = err_console()
        progress = ConsoleProgress(console, quiet=quiet)
        from imagekit.effects import index_auth

        settings = resolution.LockSettings(
            index_url=config.index_url or resolution.PYPI, extra_index_urls=config.extra_index_urls
        )  # the matrix file's indexes: where their credentials may go
        auth = index_auth.for_indexes([settings.index_url, *settings.extra_index_urls])
        if dry_run:
            plan = forecast.forecast(
                [c.cell for c in cells],
                config,
                data,
                lock_dir=lock_dir,
                settings=settings,
                build=False,
            )
            print_plan(plan, as_json, build=False)
            return
        contexts = {e.cell.slug: wheel_folders.context_wheels(into, e.cell.slug) for e in cells} if into else {}
        rows: list[dict] = []
        with _stops_cleanly():
            for e in cells:
                lock = verified_lock(lock_path(lock_dir, e.cell), e.cell, data, current=True)
                if lock is None:
                    raise UsageError(f"no lock for {e.cell.key}", "run `imagekit lock` first")
                base = base_for(e.cell.python, data, config.bases, config.options, platform=e.cell.platform)
                glibc = base.glibc  # the base `build` uses: same wheels
                got = fetch_service.fetch_for_build(
                    lock, e.cell.python, glibc, progress=progress, cell=e.cell.slug, auth=auth,
                    project=Path(project_folder(config)),
                )  # fmt: skip
                size = sum(w.path.stat().st_size for w in got)
                new = [w for w in got if w.downloaded]
                if e.cell.slug in contexts:
                    files = wheel_folders.requirements(lock, config.options.cuda_toolkit)
                    wheel_folders.link_wheels(got, contexts[e.cell.slug], files)
                new_bytes = sum(w.path.stat().st_size for w in new)
                summary = (
                    f"{len(got)} wheels, {size / 1e9:.2f} GB in {wheel_cache()} "
                    f"({len(new)} downloaded, {new_bytes / 1e9:.2f} GB)"
                )
                if quiet:  # progress is silenced; the result is not
                    console.print(f"{e.cell.slug}: {summary}", markup=False)
                else:
                    progress.line(e.cell.slug, summary)
                rows.append({"cell": e.cell.slug, "wheels": len(got), "bytes": size, "downloaded": len(new),
                             "downloaded_bytes": new_bytes})  # fmt: skip
        if as_json:
            out_json(rows)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C is: the same clean-up runs."""


@contextmanager
def _stops_cleanly() -> Iterator[None]:
    """SIGTERM is handled as SIGINT: the partial downloads are removed (`wheel_cache.discard_partials`), and the command
    ends with ``error:``/``hint:`` and 143 (SIGTERM) or 130 (SIGINT), not a traceback or a silent kill. Threads
    still blocked in a read do not hold the exit up: their files are gone already."""

    def terminate(_signum: int, _frame: object) -> None:
        raise Terminated

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminate) if main else None
    try:
        yield
    except KeyboardInterrupt as exc:
        from imagekit.services.wheels.wheel_cache import discard_partials

        discard_partials()
        name, code = ("SIGTERM", 143) if isinstance(exc, Terminated) else ("SIGINT", 130)
        sys.stderr.write(
            f"error: fetch was stopped ({name}): its partial downloads were removed; the wheels fetched and "
            "verified so far stay in the cache\nhint: run the same `imagekit fetch` again to fetch the rest\n"
        )
        sys.stderr.flush()
        sys.stdout.flush()
        if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.current_thread()):
            os._exit(code)  # a download thread blocked in a read would keep the process alive until its timeout
        raise typer.Exit(code) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
