"""The GitHub Actions workflow `imagekit ci init` writes (pure: options in, YAML text out; never writes)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

import jinja2

from imagekit import validate
from imagekit.errors import UsageError
from imagekit.render import sources

DEFAULT_OUT = ".github/workflows/images.yml"
DEFAULT_INSTALL = "imagekit"
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", re.ASCII)
# A pip requirement or path as one shell word: `imagekit==0.4.0`, `.`, `git+https://host/org/imagekit@v1`.
_INSTALL = re.compile(r"[A-Za-z0-9._@:/+=<>~!,\[\]-]{1,300}", re.ASCII)


@dataclass(frozen=True)
class CiOptions:
    registry: str | None = None  # REG/REPO; None: ghcr.io/<owner>/<repo> of the repository the workflow runs in
    gpu_runner: tuple[str, ...] = ()  # runs-on labels of a GPU runner; empty: ubuntu-latest, GPU checks skipped
    install: str = DEFAULT_INSTALL  # what `pip install` gets imagekit from


def validated(registry: str | None, gpu_runner: list[str] | None, install: str) -> CiOptions:
    if registry is not None:
        try:
            validate.repository(registry)
        except UsageError as exc:
            raise UsageError(exc.message, "pass REGISTRY/REPO, for example ghcr.io/acme/train") from None
    for label in gpu_runner or ():
        if not _LABEL.fullmatch(label):
            raise UsageError(
                f"invalid --gpu-runner {label!r}",
                "a runner label: letters, digits, '.', '_' and '-' (for example gpu or self-hosted)",
            )
    if not _INSTALL.fullmatch(install) or install.startswith("-"):
        raise UsageError(
            f"invalid --install {install!r}",
            "a pip requirement or path without spaces or quotes: imagekit, imagekit==0.4.0, ., git+https://...",
        )
    return CiOptions(registry, tuple(gpu_runner or ()), install)


def command_line(opts: CiOptions) -> str:
    words = ["imagekit", "ci", "init"]
    if opts.install != DEFAULT_INSTALL:
        words += ["--install", opts.install]
    if opts.registry:
        words += ["--registry", opts.registry]
    for label in opts.gpu_runner:
        words += ["--gpu-runner", label]
    return shlex.join(words)


def _environment() -> jinja2.Environment:
    # [[ ]] and [% %]: the workflow is full of GitHub's own ${{ }} expressions, which stay as written.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(sources().root / "templates" / "ci")),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        variable_start_string="[[",
        variable_end_string="]]",
        block_start_string="[%",
        block_end_string="%]",
        comment_start_string="[#",
        comment_end_string="#]",
    )


def workflow(opts: CiOptions) -> str:
    """.github/workflows/images.yml: plan -> build (one runner per cell) -> release; compat on the schedule."""
    host = opts.registry.split("/", 1)[0] if opts.registry else "ghcr.io"
    if opts.registry and not ("." in host or ":" in host or host == "localhost"):
        host = "docker.io"
    ghcr = host == "ghcr.io"
    if len(opts.gpu_runner) > 1:
        runs_on = "[" + ", ".join(opts.gpu_runner) + "]"
    else:
        runs_on = opts.gpu_runner[0] if opts.gpu_runner else "ubuntu-latest"
    return (
        _environment()
        .get_template("images.yml.j2")
        .render(
            command=command_line(opts),
            install=opts.install,
            registry=opts.registry,
            registry_host=host,
            user="github.actor" if ghcr else "secrets.REGISTRY_USERNAME",
            password="secrets.GITHUB_TOKEN" if ghcr else "secrets.REGISTRY_PASSWORD",
            runs_on=runs_on,
            gpu_runner=bool(opts.gpu_runner),
            gpu_flags="--gpus on --require-gpu" if opts.gpu_runner else "--gpus off",
        )
    )
