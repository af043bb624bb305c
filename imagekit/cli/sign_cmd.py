"""`imagekit sign IMAGE --key cosign.key` and `imagekit verify IMAGE --key cosign.pub`: cosign's signature format."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import handles_errors, out, out_json
from imagekit.cli.options import JsonOpt
from imagekit.errors import UsageError

PASSWORD_VARIABLE = "COSIGN_PASSWORD"  # cosign's own: the same key opens with the same variable in both tools


def _target(image: str):  # type: ignore[no-untyped-def]
    """The registry, repository and digest IMAGE names: the digest it gives (what the registry serves for it must hash
    to it, else exit 3), or what its tag names now (the digest of the bytes served, which a Docker-Content-Digest
    must agree with). IMAGE carrying credentials is refused without being shown."""
    from imagekit.effects import credentials
    from imagekit.effects.registry import RegistryClient, Remote, refuse_user_info, served_as, without_user_info
    from imagekit.image import naming
    from imagekit.trust import validate

    refuse_user_info(image, "IMAGE")
    try:
        validate.image_ref(image, "IMAGE")
    except UsageError as exc:
        raise UsageError(without_user_info(exc.message), exc.hint) from None
    repo, tag, digest = naming.split_reference(image)
    if not tag and not digest:
        raise UsageError(f"{image} names no tag or digest", "pass REGISTRY/REPOSITORY:TAG or @sha256:...")
    remote = Remote.parse(repo)
    credential = credentials.for_registry(remote.registry)
    client = RegistryClient(credential.username, credential.password, registries=[remote.registry])
    found = client.manifest_raw(remote, digest or tag)
    if found is None:
        raise UsageError(f"{image} is not in its registry", "publish it first (`imagekit build --push`)")
    if digest:  # the digest asked, never the one of what was served (manifest_raw binds them too)
        served_as(remote.registry, "manifest", digest, found[1])
    return client, remote, digest or found[2]


def _read(path: Path, what: str) -> bytes:
    """A key file: a regular text file (a FIFO or a device is refused before it is opened)."""
    from imagekit.effects.files import read_input

    return (read_input(path, what, "pass the key file (PEM)") or "").encode()


def register(app: typer.Typer) -> None:
    @app.command(
        "sign",
        epilog="Example: COSIGN_PASSWORD=... imagekit sign 127.0.0.1:5000/imagekit/train:CELL-LOCK --key cosign.key",
    )
    @handles_errors
    def sign_command(
        image: Annotated[str, typer.Argument(metavar="IMAGE", help="REGISTRY/REPOSITORY:TAG or @sha256:... to sign.")],
        key: Annotated[
            Path,
            typer.Option("--key", metavar="FILE", help="cosign.key (its password from COSIGN_PASSWORD), or a PEM key."),
        ],
        as_json: JsonOpt = False,
    ) -> None:
        """Sign what IMAGE names now (an image, or the index of an image and its SBOM) in cosign's format:
        `cosign verify --key cosign.pub --insecure-ignore-tlog IMAGE` accepts it. No transparency log."""
        from imagekit.services.publishing import signing
        from imagekit.supplychain import cosign

        try:
            private = cosign.load_private_key(_read(key, "--key"), os.environ.get(PASSWORD_VARIABLE, "").encode())
        except cosign.KeyError_ as exc:
            raise UsageError(
                f"--key {key}: {exc}", f"set {PASSWORD_VARIABLE} to the key's password, or pass another key"
            ) from None
        client, remote, digest = _target(image)
        recorded = signing.sign(client, remote, digest, private, log=out if not as_json else lambda _: None)
        if as_json:
            out_json({"image": f"{remote.registry}/{remote.name}@{digest}", **recorded})

    @app.command("verify", epilog="Example: imagekit verify 127.0.0.1:5000/imagekit/train:CELL-LOCK --key cosign.pub")
    @handles_errors
    def verify_command(
        image: Annotated[str, typer.Argument(metavar="IMAGE", help="REGISTRY/REPOSITORY:TAG or @sha256:... to check.")],
        key: Annotated[Path, typer.Option("--key", metavar="FILE", help="cosign.pub: the signer's public key (PEM).")],
        as_json: JsonOpt = False,
    ) -> None:
        """Check that IMAGE (the digest it gives, or what its tag names now) carries a cosign signature by KEY's
        private half.

        Exit 0 when one verifies, 1 when none does (naming why), 3 when the registry cannot be read or serves other
        bytes than a digest names (a digest asked for, a signature's payload, its Docker-Content-Digest).
        """
        from imagekit.services.publishing import signing
        from imagekit.supplychain import cosign

        try:
            public = cosign.load_public_key(_read(key, "--key"))
        except cosign.KeyError_ as exc:
            raise UsageError(f"--key {key}: {exc}", "pass the signer's cosign.pub") from None
        client, remote, digest = _target(image)
        good = signing.verify(client, remote, digest, public)
        if as_json:
            out_json(
                {
                    "image": f"{remote.registry}/{remote.name}@{digest}",
                    "verified": good,
                    "key": cosign.fingerprint(public),
                }
            )
        else:
            out(
                f"verified: {remote.registry}/{remote.name}@{digest} is signed by {cosign.fingerprint(public)[:19]}… "
                f"({len(good)} signature{'s' if len(good) != 1 else ''}, {cosign.sig_tag(digest)})"
            )
