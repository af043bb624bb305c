"""`imagekit runpod-template`: a published image as a RunPod template (printed, or saved through RunPod's API)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import err_console, handles_errors, out_json
from imagekit.cli.options import ReleaseIndexOpt, ReleasePlatformOpt
from imagekit.clouds import providers, runpod
from imagekit.errors import UsageError
from imagekit.trust import validate
from imagekit.trust.untrusted import printable
from imagekit.trust.validate import http_url as validate_http_url

RUNPOD = providers.named("runpod")


def _refuse_a_private_image(tag: str) -> None:
    """A template without registry auth for an image only credentials can pull gives pods that never start."""
    from imagekit.effects import registry
    from imagekit.errors import EnvironmentFailure

    repository, name = tag.rsplit(":", 1)
    try:
        why = registry.anonymous_refusal(registry.Remote.parse(repository), name)
    except EnvironmentFailure as exc:
        err_console().print(f"warning: could not check that pods can pull {tag}: {exc.message}", markup=False)
        return
    if why:
        raise UsageError(
            f"a pod without registry credentials cannot pull {tag}: {why}",
            "save the registry's credentials in RunPod (Settings > Container Registry Auth) and pass their id: "
            "--registry-auth ID",
        )


def register(app: typer.Typer) -> None:
    @app.command(
        RUNPOD.template_command,
        epilog=f"Examples: imagekit {RUNPOD.template_command} cu121-torch2.1.2-py3.11-tf4.48.2; "
        f"{RUNPOD.account_key}=... imagekit {RUNPOD.template_command} CELL --create",
    )
    @handles_errors
    def runpod_template(
        ref: Annotated[
            str, typer.Argument(metavar="CELL_OR_TAG", help="A cell id, or a published tag from the release index.")
        ],
        release_index: ReleaseIndexOpt = Path("releases/index.json"),
        platform: ReleasePlatformOpt = None,
        digest: Annotated[bool, typer.Option("--digest", help="Pin imageName with @sha256 as well.")] = False,
        volume_gb: Annotated[
            int, typer.Option(min=1, max=10_000, metavar="GB", help="Volume size (GB) mounted at /workspace.")
        ] = 50,
        create: Annotated[
            bool, typer.Option("--create", help=f"Call RunPod's API (needs {RUNPOD.account_key}).")
        ] = False,
        api_url: Annotated[str, typer.Option(metavar="URL", help="RunPod GraphQL endpoint.")] = RUNPOD.template_url,
        registry_auth: Annotated[
            str | None,
            typer.Option(
                "--registry-auth",
                metavar="ID",
                help="RunPod's id of the registry credentials pods pull a private image with "
                "(containerRegistryAuthId).",
            ),
        ] = None,
        allow_private_registry: Annotated[
            bool,
            typer.Option(
                "--allow-private-registry", help="Create it even though the image is on a loopback/private registry."
            ),
        ] = False,
    ) -> None:
        """Print the RunPod template (saveTemplate input) for a published image; --create saves it on RunPod."""
        from imagekit.compat import contract
        from imagekit.effects import runpod_api
        from imagekit.services import inputs
        from imagekit.services.publish import newest_release

        validate_http_url(api_url, "--api-url")
        entry = newest_release(release_index, ref, validate.platform(platform) if platform is not None else None)
        if registry_auth is not None:
            try:
                runpod.registry_auth_id(registry_auth)
            except ValueError as exc:
                raise UsageError(
                    f"invalid --registry-auth {printable(registry_auth)[:80]!r}: {exc}",
                    "pass the id RunPod shows under Settings > Container Registry Auth",
                ) from None
        data = inputs.compat_data()
        template = runpod.template(
            entry, with_digest=digest, volume_gb=volume_gb, registry_auth=registry_auth,
            runtime=contract.of_record(entry, data), data=data,
        )  # fmt: skip
        body = runpod.mutation(template)
        unreachable = runpod.unreachable_registry(entry["tag"])
        hint = (
            "publish to a registry pods can pull from (`imagekit build --push --registry ghcr.io/ORG/REPO`), "
            "or pass --allow-private-registry if your pods reach it"
        )
        if not create:
            if unreachable:
                err_console().print(
                    f"warning: no pod can pull {entry['tag']}: {unreachable}\nhint: {hint}", markup=False
                )
            out_json(body)
            return
        if unreachable and not allow_private_registry:
            raise UsageError(f"no pod can pull {entry['tag']}: {unreachable}", hint)
        if registry_auth is None:
            _refuse_a_private_image(entry["tag"])
        key = os.environ.get(RUNPOD.account_key)
        if not key:
            raise UsageError(
                f"--create needs {RUNPOD.account_key} in the environment", f"export {RUNPOD.account_key}=..."
            )
        saved = runpod_api.save_template(body, key, api_url)
        out_json({"saveTemplate": saved})
        err_console().print(f"created RunPod template {saved['id']} for {entry['tag']}", markup=False)
