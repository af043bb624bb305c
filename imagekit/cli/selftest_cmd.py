"""`imagekit selftest IMAGE`: run an image's own self-test, e.g. after `docker buildx bake`, before pushing it."""

from __future__ import annotations

from typing import Annotated

import typer

from imagekit.cli.common import err_console, handles_errors, out_json
from imagekit.cli.options import JsonOpt, QuietOpt
from imagekit.errors import EXIT_NO, UsageError


def _runtime(engine, image: str):  # type: ignore[no-untyped-def]
    """The runtime config an imagekit build gives IMAGE, from the manifest inside it (labels, ENV, WORKDIR,
    ENTRYPOINT; its CMD is the image's own, which the manifest does not name): what `labels-match-contents` checks
    the image's config and labels against. None for an image without an imagekit manifest."""
    from imagekit.image import imageconfig, naming
    from imagekit.services.builds import image_manifest

    manifest = image_manifest.from_engine(image)
    if not isinstance(manifest, dict):
        return None
    try:
        labels = naming.labels(manifest)
    except (KeyError, TypeError):
        return None
    cmd = (engine.image(image) or {}).get("Config", {}).get("Cmd") or ()
    return imageconfig.runtime(labels, tuple(cmd), cuda_home=imageconfig.cuda_home(manifest))


def register(app: typer.Typer) -> None:
    @app.command(
        "selftest",
        epilog="Example: docker buildx bake --load && imagekit selftest 127.0.0.1:5000/imagekit/train:CELL --json",
    )
    @handles_errors
    def selftest_command(
        image: Annotated[str, typer.Argument(metavar="IMAGE", help="A local image built from an imagekit context.")],
        gpus: Annotated[
            str, typer.Option(metavar="auto|on|off", help="With GPUs: auto (when the engine has the NVIDIA runtime).")
        ] = "auto",
        require_gpu: Annotated[bool, typer.Option("--require-gpu", help="Fail when no GPU is there.")] = False,
        as_json: JsonOpt = False,
        quiet: QuietOpt = False,
    ) -> None:
        """Run the self-test inside IMAGE (never a silent CPU pass: GPU checks are skipped or run, and say which).

        Exit 0 when it passes, 1 when a check fails.
        """
        from imagekit.cli.progress_display import ConsoleProgress
        from imagekit.effects.docker import Engine
        from imagekit.services.builds import selftest_runner
        from imagekit.trust import validate

        if gpus not in ("auto", "on", "off"):
            raise UsageError(f"invalid --gpus {gpus!r}", "use auto, on or off")
        validate.image_ref(image, "IMAGE")
        engine = Engine()
        if engine.image(image) is None:
            raise UsageError(f"no image {image} in the engine", "build it first (or `docker pull` it)")
        with_gpus = gpus == "on" or (gpus == "auto" and engine.capabilities().gpu_runtime)
        progress = ConsoleProgress(err_console(), quiet=quiet)
        report = selftest_runner.run(
            engine,
            image,
            gpus=with_gpus,
            require_gpu=require_gpu,
            progress=progress,
            cell=image,
            runtime=_runtime(engine, image),
        )
        if as_json:
            out_json(report.report)
        if not report.passed:
            raise typer.Exit(EXIT_NO)
