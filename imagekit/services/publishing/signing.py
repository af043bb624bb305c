"""Sign and verify published images in cosign's format (supplychain.cosign), against the registry that holds them.

Exit codes: a signature that does not verify, or vouches for another image or kind, is "the check said no" (1,
CheckFailed); a registry serving other bytes than a digest names (here: a signature's payload) is refused like every
registry answer that is not the API's (3, EnvironmentFailure, imagekit.effects.registry.served_as), whichever
Registry was given: the check is made here too, not left to the client."""

from __future__ import annotations

from collections.abc import Callable

from imagekit.effects.registry import Remote, served_as
from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.services.ports import Registry
from imagekit.supplychain import cosign
from imagekit.trust import untrusted


def _existing(registry: Registry, remote: Remote, tag: str) -> list[dict]:
    """The layer descriptors of the signature manifest ``tag`` names (none when there is none)."""
    raw = registry.manifest_raw(remote, tag)
    if raw is None:
        return []
    try:
        doc = untrusted.load_json(raw[1], "the signature manifest")
    except untrusted.UntrustedData as exc:
        raise EnvironmentFailure(
            f"{remote.registry}/{remote.name}:{tag} is not a signature manifest: {exc}",
            "delete that tag by hand (it holds no signature imagekit or cosign can read) and sign again",
        ) from None
    layers = doc.get("layers") if isinstance(doc, dict) else None
    return [x for x in layers if isinstance(x, dict)] if isinstance(layers, list) else []


def verified(registry: Registry, remote: Remote, digest: str, public_key) -> tuple[list[str], list[str]]:  # type: ignore[no-untyped-def]
    """The signatures of ``digest`` that ``public_key`` verifies (their payloads' digests), and why the others did
    not: a payload is read only as far as a payload can be, must be the bytes its digest names (else the registry is
    refused, EnvironmentFailure), and must be cosign's kind of payload naming ``digest`` itself."""
    tag = cosign.sig_tag(digest)
    good, bad = [], []
    layers = cosign.layers_of({"layers": _existing(registry, remote, tag)})
    for n, (payload_digest, size, signature) in enumerate(layers, 1):
        which = f"signature {n} of {len(layers)}"
        served = registry.blob(remote, payload_digest, cosign.MAX_PAYLOAD)
        data = served_as(remote.registry, f"payload of {which}", payload_digest, served)  # whichever Registry served it
        if len(data) != size:
            bad.append(f"{which}: its payload is {len(data)} bytes, its descriptor says {size}")
        elif why := cosign.payload_problem(data, digest):
            bad.append(f"{which}: {why}")
        elif not cosign.verify(data, signature, public_key):
            bad.append(f"{which}: does not verify with this key")
        else:
            good.append(payload_digest)
    return good, bad


def sign(
    registry: Registry,
    remote: Remote,
    digest: str,
    private_key,  # type: ignore[no-untyped-def]
    log: Callable[[str], None] = lambda _: None,
) -> dict:
    """Sign ``digest`` (an image or an index) with ``private_key``: a layer added to its ``sha256-<hex>.sig`` manifest
    unless a signature by this key is already there. Returns what a release records: the tag and the key's
    fingerprint (never the key)."""
    public = private_key.public_key()
    tag = cosign.sig_tag(digest)
    recorded = {"tag": tag, "key": cosign.fingerprint(public)}
    good, _ = verified(registry, remote, digest, public)
    if good:
        log(f"{remote.registry}/{remote.name}@{digest} is signed by this key already ({tag})")
        return recorded
    payload = cosign.payload(f"{remote.registry}/{remote.name}", digest)
    layer = cosign.Layer(payload, cosign.sign(payload, private_key))
    kept = [x for x in _existing(registry, remote, tag) if x.get("mediaType") == cosign.SIMPLESIGNING]
    descriptors = [*kept, layer.descriptor()]
    config, manifest = cosign.signature_image(descriptors)
    for blob in (payload, config):
        if registry.blob_size(remote, cosign.digest_of(blob)) != len(blob):
            registry.upload_blob(remote, cosign.digest_of(blob), len(blob), blob)
    registry.put_manifest(remote, tag, manifest, cosign.OCI_MANIFEST)
    log(f"signed {remote.registry}/{remote.name}@{digest} ({tag}, key {recorded['key'][:19]}…)")
    return recorded


def verify(registry: Registry, remote: Remote, digest: str, public_key) -> list[str]:  # type: ignore[no-untyped-def]
    """The verified signatures of ``digest``; none raises, naming why."""
    good, bad = verified(registry, remote, digest, public_key)
    if not good:
        why = "; ".join(bad[:5]) if bad else f"no signature ({cosign.sig_tag(digest)} is not in the registry)"
        raise CheckFailed(
            f"{remote.registry}/{remote.name}@{digest} has no signature this key verifies: {why}",
            "sign it with `imagekit sign IMAGE --key cosign.key` (or cosign), or pass the key that signed it",
        )
    return good
