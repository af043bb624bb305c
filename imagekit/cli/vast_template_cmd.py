"""`imagekit vast-template`: a published image as a Vast.ai template (printed, or created through Vast's API)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import err_console, handles_errors, out_json
from imagekit.cli.options import ReleaseIndexOpt, ReleasePlatformOpt
from imagekit.clouds import providers, runpod, vast
from imagekit.errors import UsageError
from imagekit.trust import validate
from imagekit.trust.validate import http_url as validate_http_url

VAST = providers.named("vast")


def register(app: typer.Typer) -> None:
    @app.command(
        VAST.template_command,
        epilog=f"Examples: imagekit {VAST.template_command} cu121-torch2.1.2-py3.11-tf4.48.2; imagekit "
        f"{VAST.template_command} CELL --launch entrypoint; {VAST.account_key}=... imagekit {VAST.template_command} "
        "CELL --login --create",
    )
    @handles_errors
    def vast_template(
        ref: Annotated[
            str, typer.Argument(metavar="CELL_OR_TAG", help="A cell id, or a published tag from the release index.")
        ],
        release_index: ReleaseIndexOpt = Path("releases/index.json"),
        platform: ReleasePlatformOpt = None,
        launch: Annotated[
            str,
            typer.Option(
                metavar="ssh|jupyter|entrypoint",
                help="Vast's launch mode: ssh and jupyter replace the image's entrypoint (the start check runs from "
                "onstart); entrypoint keeps it.",
            ),
        ] = "ssh",
        login: Annotated[
            bool, typer.Option("--login", help="The image is private: Vast asks for the registry's credentials.")
        ] = False,
        create: Annotated[bool, typer.Option("--create", help=f"Call Vast's API (needs {VAST.account_key}).")] = False,
        api_url: Annotated[str, typer.Option(metavar="URL", help="Vast's template endpoint.")] = VAST.template_url,
        allow_private_registry: Annotated[
            bool,
            typer.Option(
                "--allow-private-registry", help="Create it even though the image is on a loopback/private registry."
            ),
        ] = False,
    ) -> None:
        """Print the Vast.ai template for a published image; --create makes it on Vast (its hash_id is printed)."""
        from imagekit.compat import contract
        from imagekit.effects import vast_api
        from imagekit.services import inputs
        from imagekit.services.publish import newest_release

        validate_http_url(api_url, "--api-url")
        if launch not in vast.LAUNCH_MODES:
            raise UsageError(f"invalid --launch {launch[:40]!r}", f"pass one of {', '.join(vast.LAUNCH_MODES)}")
        entry = newest_release(release_index, ref, validate.platform(platform) if platform is not None else None)
        data = inputs.compat_data()
        body = vast.template(entry, launch=launch, login=login, runtime=contract.of_record(entry, data), data=data)
        if not body["extra_filters"]:
            err_console().print(
                f"warning: the release entry of {entry['tag']} names no CUDA version: the template has no offer "
                "filter, so instances may land on hosts whose driver cannot run the image\n"
                "hint: publish it again with this imagekit (its manifest records the cell's CUDA)",
                markup=False,
            )
        unreachable = runpod.unreachable_registry(entry["tag"])
        hint = (
            "publish to a registry instances can pull from (`imagekit build --push --registry ghcr.io/ORG/REPO`), "
            "or pass --allow-private-registry if your instances reach it"
        )
        if not create:
            if unreachable:
                err_console().print(
                    f"warning: no instance can pull {entry['tag']}: {unreachable}\nhint: {hint}", markup=False
                )
            out_json(body)
            return
        if unreachable and not allow_private_registry:
            raise UsageError(f"no instance can pull {entry['tag']}: {unreachable}", hint)
        key = os.environ.get(VAST.account_key)
        if not key:
            raise UsageError(f"--create needs {VAST.account_key} in the environment", f"export {VAST.account_key}=...")
        made = vast_api.create_template(body, key, api_url)
        out_json({"template": made})
        err_console().print(
            f"created Vast template {made['hash_id']} for {entry['tag']} (launch mode {launch})", markup=False
        )
