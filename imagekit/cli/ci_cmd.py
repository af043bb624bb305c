"""`imagekit ci init`: write the GitHub Actions workflow that builds the matrix on CI runners."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import err_console, folder_option, handles_errors, output_file_option
from imagekit.clouds import providers

EPILOG = """Examples: imagekit ci init; imagekit ci init --registry ghcr.io/acme/train --gpu-runner gpu

The workflow: plan (stale or missing locks resolved on the runner, which reaches the PyTorch index: the plan fails
with the diff, or with --locks commit they are committed on the default branch; every cell renders; the matrix of
cells with a current lock), build (one runner per cell: build, self-test inside the image, push, upload its release
record), release (verify the records against the registry, merge them into releases/index.json, commit it on the
default branch); with --pages, pages (the release page, `imagekit release page`, published with GitHub Pages' own
actions after each release on the default branch). It runs on pushes that touch lockfiles/, imagekit.toml,
pyproject.toml, templates/ or the committed wheel, weekly, and by hand.

Every job installs the imagekit that wrote the workflow: a wheel of it is written to --wheel-dir (commit it)
and checked against its sha256 before `pip install`; --install SPEC installs SPEC instead (a path, a URL,
git+https://..., or a name an index serves: a name is looked up on PIP_INDEX_URL, else PyPI, and refused when the
index does not have it); a SPEC holding a credential (a password or token in a URL) is refused, since the workflow
is committed: keep it in a repository secret and give it to pip through the job's env. The registry is
--registry, else the matrix file's [image] repository, else ghcr.io/<owner>/<repo> (logged in with GITHUB_TOKEN);
another registry takes the secrets REGISTRY_USERNAME and REGISTRY_PASSWORD; a loopback, private or single-label
registry (127.0.0.1:5000, 10.0.0.7, registry.internal, kind-registry:5000), which GitHub's hosted runners cannot
reach, is refused (exit 2, nothing written). Without --gpu-runner the runners have no
GPU: the self-test's GPU checks are skipped, and the job summary says so. A self-hosted runner's labels go in
.github/actionlint.yaml for actionlint."""


_POD_KEY = providers.pod_provider().account_key  # the secret the reaper's workflow reads
_REAPS = providers.reapers()


def _reap_providers(reap: bool, names: list[str] | None) -> tuple[tuple[str, str], ...]:
    """(provider, its account key variable) for each --reap-provider."""
    from imagekit.errors import UsageError

    if names and not reap:
        raise UsageError("--reap-provider needs --reap", "pass --reap too")
    chosen = list(dict.fromkeys(names or []))  # none: `pod create`'s provider, as `pod reap` takes it by default
    for name in chosen:
        if name not in _REAPS:
            shown = f"--reap-provider {name[:40]!r}: {' or '.join(_REAPS)}"
            raise UsageError(shown, "for example --reap-provider vast")
    return tuple((name, providers.named(name).account_key) for name in chosen)


@handles_errors
def init(
    out: Annotated[Path, typer.Option("--out", metavar="PATH", help="Where to write the workflow.")] = Path(
        ".github/workflows/images.yml"
    ),
    registry: Annotated[
        str | None,
        typer.Option(metavar="REG/REPO", help="Where the build jobs push (default: ghcr.io/<owner>/<repo>)."),
    ] = None,
    gpu_runner: Annotated[
        list[str] | None,
        typer.Option(
            "--gpu-runner",
            metavar="LABEL",
            help="runs-on label of a GPU runner (repeatable); the build then self-tests with --require-gpu.",
        ),
    ] = None,
    arm64_runner: Annotated[
        list[str] | None,
        typer.Option(
            "--arm64-runner",
            metavar="LABEL",
            help="runs-on label of a linux/arm64 runner (repeatable; e.g. ubuntu-24.04-arm): the matrix's arm64 "
            "cells build and self-test there natively. Without it they build emulated on an amd64 runner "
            "(qemu: the CPU checks only, and their records say so).",
        ),
    ] = None,
    install: Annotated[
        str | None,
        typer.Option(
            metavar="SPEC",
            help="What `pip install` gets imagekit from (., a wheel URL, git+https://...; no credentials: the "
            "workflow is committed). Default: a wheel of this imagekit, written to .github/imagekit/ (commit it).",
        ),
    ] = None,
    locks: Annotated[
        str,
        typer.Option(
            metavar="fail|commit",
            help="Locks the runner finds stale or missing: fail the plan with the diff, or commit them on the "
            "default branch.",
        ),
    ] = "fail",
    wheel_dir: Annotated[
        str,
        typer.Option(
            metavar="PATH",
            help="Where the wheel the jobs install is written, relative to the repository's root (without --install).",
        ),
    ] = ".github/imagekit",
    reap: Annotated[
        bool,
        typer.Option(
            "--reap",
            help="Also write reap.yml beside it: `imagekit pod reap` every half hour, stopping the account's "
            f"imagekit pods past their deadline (secret {_POD_KEY}; other providers: --reap-provider).",
        ),
    ] = False,
    reap_older_than: Annotated[
        str | None,
        typer.Option("--reap-older-than", metavar="DURATION", help="The reaper's --older-than (12h)."),
    ] = None,
    reap_provider: Annotated[
        list[str] | None,
        typer.Option(
            "--reap-provider",
            metavar="|".join(_REAPS),
            help=f"Whose pods the reaper ends, a step each (repeatable; default {providers.pod_provider().name}),"
            " each reading the provider's account key from the repository secret of that name.",
        ),
    ] = None,
    pages: Annotated[
        bool,
        typer.Option(
            "--pages",
            help="Also publish the release page (`imagekit release page`) with GitHub Pages after each release "
            "on the default branch (Settings > Pages > Source: GitHub Actions).",
        ),
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
) -> None:
    """Write .github/workflows/images.yml: plan, build and self-test each cell on its own runner, release."""
    import dataclasses

    from imagekit.clouds.pull import unreachable_registry
    from imagekit.errors import UsageError
    from imagekit.matrix import ci_workflow as ci
    from imagekit.services import ci_setup

    output_file_option(out, "--out")
    opts = ci.validated(registry, gpu_runner, install, locks, wheel_dir, arm64_runner)
    opts = dataclasses.replace(
        opts, reap=reap, reap_older_than=ci.reap_option(reap, reap_older_than),
        reap_providers=_reap_providers(reap, reap_provider), pages=pages,
    )  # fmt: skip
    if opts.registry is None:  # the matrix file's (its local default: none, so ghcr.io/<owner>/<repo>)
        opts = dataclasses.replace(opts, registry=ci_setup._matrix_registry())
    why = unreachable_registry(opts.registry) if opts.registry else None
    if opts.registry and why:
        raise ci.unreachable_refusal(opts.registry, why, given=registry is not None)
    if install is None:
        folder_option(Path(opts.wheel_dir), "--wheel-dir")
    if (out.exists() or out.is_symlink()) and not force:
        raise UsageError(f"{out} exists", "pass --force to replace it, or --out PATH to write elsewhere")
    reaper = out.parent / Path(ci.REAP_OUT).name
    if reap and str(out) == "-":
        raise UsageError(
            "--reap writes reap.yml, a workflow of its own, beside the build's: it has no place on stdout",
            "give --out PATH (the default .github/workflows/imagekit.yml puts reap.yml beside it)",
        )
    if reap and (reaper.exists() or reaper.is_symlink()) and not force:
        raise UsageError(f"{reaper} exists", "pass --force to replace it")
    written = ci_setup.write(opts, out)
    console = err_console()
    for line in written.lines:
        console.print(line, markup=False)


def build() -> typer.Typer:
    """The `ci` group: its subcommand a function of this module."""
    app = typer.Typer(
        help="Continuous integration: a workflow that builds the matrix on CI runners.", no_args_is_help=True
    )
    app.command("init", epilog=EPILOG)(init)
    return app
