"""`imagekit doctor`: the same stdlib checks that ship in every image, run on any pod or host."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

import typer

from imagekit.errors import ImagekitError
from imagekit.in_image import imagekit_doctor
from imagekit.trust import validate

HELP = (
    "Report drift from the pinned manifest and block launches that would fail or silently train on the CPU. "
    "Exit 0 ok, 1 blocker (or warning with --strict), 2 bad usage (an --expect that cannot be read), 3 a check "
    "could not run."
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
        try:
            args = imagekit_doctor.parser().parse_args(argv)
        except SystemExit as exc:  # argparse printed its usage error or --help
            raise typer.Exit(int(exc.code or 0)) from None
        command = [c for c in args.command if c != "--"][:] if args.command else []
        options = argv[: len(argv) - len(args.command)] if args.command else argv
        with tempfile.TemporaryDirectory() as tmp:
            try:
                options = _resolve_image_expectation(options, args.expect, Path(tmp))
            except ImagekitError as exc:  # the image's manifest could not be read: nothing to check against
                sys.stderr.write(exc.render() + "\n")
                raise typer.Exit(exc.exit_code) from None
            raise typer.Exit(imagekit_doctor.main([*options, *(["--", *command] if command else [])]))


def _resolve_image_expectation(options: list[str], expect: str | None, tmp: Path) -> list[str]:
    """`--expect IMAGE_REF`: read the manifest out of the image (engine first, then the registry)."""
    if not expect or os.path.lexists(expect) or not re.search(r"[:@]", expect.split("/")[-1]):
        return options  # a missing file stays "cannot read"; an image needs a tag or digest (NAME:TAG, NAME@sha256:)
    try:
        validate.image_ref(expect)
    except Exception:
        return options
    from imagekit.services.builds.image_manifest import read_manifest

    path = tmp / "manifest.json"
    path.write_text(json.dumps(read_manifest(expect)))
    out = []
    for word in options:
        if word == expect:
            out.append(str(path))
        elif word == f"--expect={expect}":
            out.append(f"--expect={path}")
        else:
            out.append(word)
    return out
