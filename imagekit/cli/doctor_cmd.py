"""`imagekit doctor`: the same stdlib checks that ship in every image, run on any pod or host."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import typer

from imagekit import validate
from imagekit.doctor import imagekit_doctor

HELP = (
    "Report drift from the pinned manifest and block launches that would fail or silently train on the CPU. "
    "Exit 0 ok, 1 blocker (or warning with --strict), 3 a check could not run."
)


def register(app: typer.Typer) -> None:
    @app.command(
        "doctor",
        help=HELP,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
        epilog="Examples: imagekit doctor && python train.py; imagekit doctor --expect lockfiles/CELL.txt --python "
        ".venv/bin/python --json; imagekit doctor --expect 127.0.0.1:5000/imagekit/train:CELL --deep "
        "--hf-repo meta-llama/Llama-3.2-1B",
    )
    def doctor(ctx: typer.Context) -> None:
        argv = list(ctx.args)
        if "--help" in argv or "-h" in argv:
            imagekit_doctor.parser().print_help()
            raise typer.Exit(0)
        with tempfile.TemporaryDirectory() as tmp:
            argv = _resolve_image_expectation(argv, Path(tmp))
            raise typer.Exit(imagekit_doctor.main(argv))


def _resolve_image_expectation(argv: list[str], tmp: Path) -> list[str]:
    """`--expect IMAGE_REF`: read the manifest out of the image (engine first, then the registry)."""
    if "--expect" not in argv:
        return argv
    i = argv.index("--expect")
    value = argv[i + 1] if i + 1 < len(argv) else ""
    if not value or Path(value).exists():
        return argv
    try:
        validate.image_ref(value)
    except Exception:
        return argv
    from imagekit.services.image_manifest import read_manifest

    manifest = read_manifest(value)
    path = tmp / "manifest.json"
    path.write_text(json.dumps(manifest))
    return [*argv[:i], "--expect", str(path), *argv[i + 2 :]]
