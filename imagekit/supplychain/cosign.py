"""cosign's published signature format (sigstore/cosign specs/SIGNATURE_SPEC.md), key-based, without a transparency
log: the signature of image ``sha256:<hex>`` is the manifest tagged ``sha256-<hex>.sig`` in the image's repository,
whose layers are simple-signing payloads (``media_types.SIMPLESIGNING``) naming the digest, each with its ECDSA
P-256 / SHA-256 signature, base64, in an annotation (``media_types.COSIGN_SIGNATURE``).
So `cosign verify --key cosign.pub --insecure-ignore-tlog IMAGE` accepts what `imagekit sign` makes, and `imagekit
verify` accepts what `cosign sign --key` makes. Keys are cosign's: an encrypted ``cosign.key`` (scrypt + NaCl
secretbox around a PKCS#8 key; its password from ``COSIGN_PASSWORD``), or a plain PKCS#8/SEC1 PEM. Pure: bytes in,
bytes out; the registry is the caller's (imagekit.services.publishing.signing).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass

from imagekit.oci.media_types import COSIGN_SIGNATURE, OCI_CONFIG, OCI_MANIFEST, SIMPLESIGNING
from imagekit.trust import untrusted

PAYLOAD_TYPE = "cosign container image signature"
MAX_PAYLOAD = 1 << 16  # a simple-signing payload is a few hundred bytes
_ENCRYPTED = re.compile(
    rb"-----BEGIN ENCRYPTED (SIGSTORE|COSIGN) PRIVATE KEY-----\s*(.*?)\s*-----END ENCRYPTED \1 PRIVATE KEY-----", re.S
)


class KeyError_(ValueError):
    """A key that cannot be used: the message says why (never the key or its password)."""


def sig_tag(digest: str) -> str:
    """The tag cosign stores ``digest``'s signatures under."""
    algorithm, _, hexdigest = digest.partition(":")
    return f"{algorithm}-{hexdigest}.sig"


def payload(repository: str, digest: str) -> bytes:
    """The simple-signing payload for ``repository@digest``, byte for byte as cosign writes it (Go's encoding of
    its struct: these keys in this order, no spaces, ``"optional":null``)."""
    doc = {
        "critical": {
            "identity": {"docker-reference": repository},
            "image": {"docker-manifest-digest": digest},
            "type": PAYLOAD_TYPE,
        },
        "optional": None,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _p256(key: object, what: str) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    curve = getattr(key, "curve", None)
    if not isinstance(curve, ec.SECP256R1):
        raise KeyError_(f"{what} is not an ECDSA P-256 key (cosign's default; the only kind imagekit signs with)")


def load_private_key(pem: bytes, password: bytes):  # type: ignore[no-untyped-def]
    """An ECDSA P-256 private key from cosign's encrypted PEM (with ``password``) or a plain PEM."""
    from cryptography.hazmat.primitives import serialization

    match = _ENCRYPTED.search(pem)
    if match:
        der = _decrypt(base64.b64decode(b"".join(match[2].split())), password)
        try:
            key = serialization.load_der_private_key(der, None)
        except ValueError:
            raise KeyError_("the decrypted key is not PKCS#8 (cosign refuses it too)") from None
    else:
        try:
            key = serialization.load_pem_private_key(pem, password or None)
        except (ValueError, TypeError):
            raise KeyError_("not a private key in PEM (cosign.key, or PKCS#8 / SEC1 EC PRIVATE KEY)") from None
    _p256(key, "the signing key")
    return key


def _decrypt(envelope: bytes, password: bytes) -> bytes:
    """cosign's envelope: ``{"kdf": {"name": "scrypt", "params": {N, r, p}, "salt"}, "cipher": {"name":
    "nacl/secretbox", "nonce"}, "ciphertext"}`` (sigstore's pkg/encrypted)."""
    import nacl.exceptions
    import nacl.secret

    try:
        doc = json.loads(envelope)
        kdf, cipher = doc["kdf"], doc["cipher"]
        params = kdf["params"]
        n, r, p = int(params["N"]), int(params["r"]), int(params["p"])
        salt, nonce = base64.b64decode(kdf["salt"]), base64.b64decode(cipher["nonce"])
        ciphertext = base64.b64decode(doc["ciphertext"])
    except (ValueError, KeyError, TypeError):
        raise KeyError_("the encrypted key's envelope is not cosign's") from None
    if kdf.get("name") != "scrypt" or cipher.get("name") != "nacl/secretbox":
        raise KeyError_("the encrypted key uses another KDF or cipher than cosign's scrypt + nacl/secretbox")
    if not (2 <= n <= 1 << 20 and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16):
        raise KeyError_("the encrypted key's scrypt parameters are out of range")
    secret = hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=32, maxmem=256 * n * r + (1 << 24))
    try:
        return nacl.secret.SecretBox(secret).decrypt(ciphertext, nonce)
    except (nacl.exceptions.CryptoError, ValueError):
        raise KeyError_("the password does not open the key (COSIGN_PASSWORD)") from None


def load_public_key(pem: bytes):  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError:
        raise KeyError_("not a public key in PEM (cosign.pub)") from None
    _p256(key, "the public key")
    return key


def public_pem(private_key) -> bytes:  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives import serialization

    return private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def fingerprint(public_key) -> str:  # type: ignore[no-untyped-def]
    """sha256 of the key's SubjectPublicKeyInfo: what a record names a key by (never the key itself)."""
    from cryptography.hazmat.primitives import serialization

    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def sign(data: bytes, private_key) -> str:  # type: ignore[no-untyped-def]
    """ECDSA P-256 over SHA-256 of ``data``, DER, base64: cosign's signature annotation."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    return base64.b64encode(private_key.sign(data, ec.ECDSA(hashes.SHA256()))).decode()


def verify_digest(sha256_digest: bytes, signature_b64: str, public_key) -> bool:  # type: ignore[no-untyped-def]
    """Does ``signature_b64`` sign the data whose SHA-256 is ``sha256_digest``?"""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, utils

    try:
        signature = base64.b64decode(signature_b64, validate=True)
        public_key.verify(signature, sha256_digest, ec.ECDSA(utils.Prehashed(hashes.SHA256())))
    except (InvalidSignature, ValueError):
        return False
    return True


def verify(data: bytes, signature_b64: str, public_key) -> bool:  # type: ignore[no-untyped-def]
    return verify_digest(hashlib.sha256(data).digest(), signature_b64, public_key)


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Layer:
    payload: bytes
    signature: str

    def descriptor(self) -> dict:
        return {
            "mediaType": SIMPLESIGNING,
            "size": len(self.payload),
            "digest": digest_of(self.payload),
            "annotations": {COSIGN_SIGNATURE: self.signature},
        }


def signature_image(descriptors: list[dict]) -> tuple[bytes, bytes]:
    """The config and manifest of a signature image whose layers are ``descriptors`` (cosign's shape: an OCI manifest
    whose config names each payload as a layer)."""
    config = json.dumps(
        {
            "architecture": "",
            "created": "0001-01-01T00:00:00Z",
            "history": [{"created": "0001-01-01T00:00:00Z"}],
            "os": "",
            "rootfs": {"type": "layers", "diff_ids": [x.get("digest") for x in descriptors]},
            "config": {},
        },
        separators=(",", ":"),
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "size": len(config), "digest": digest_of(config)},
            "layers": descriptors,
        },
        separators=(",", ":"),
    ).encode()
    return config, manifest


class _Twice(ValueError):
    """A JSON object naming a key twice."""


def _unique(pairs: list[tuple[str, object]]) -> dict:
    doc: dict = {}
    for key, value in pairs:
        if key in doc:
            raise _Twice(key)
        doc[key] = value
    return doc


def _vouched(data: bytes) -> tuple[str | None, str | None]:
    """(the image digest a simple-signing payload vouches for, None) or (None, why it vouches for none). Only
    cosign's own kind counts: ``critical.type`` must be ``cosign container image signature`` exactly (another
    simple-signing type, e.g. atomic's, signs something else); a key named twice is refused (parsers differ on which
    one counts: Go's the last, others the first)."""
    try:
        doc = json.loads(data, object_pairs_hook=_unique)
    except _Twice as exc:
        return None, f"its payload names {untrusted.printable(str(exc), 40)!r} twice (parsers differ on which counts)"
    except (ValueError, RecursionError):
        return None, "its payload is not a simple-signing payload (not JSON)"
    critical = doc.get("critical") if isinstance(doc, dict) else None
    if not isinstance(critical, dict):
        return None, "its payload is not a simple-signing payload (no critical section)"
    kind = critical.get("type")
    if kind != PAYLOAD_TYPE:
        shown = "missing" if kind is None else repr(untrusted.printable(kind, 80))
        return None, f"its payload's critical.type is {shown}, not cosign's {PAYLOAD_TYPE!r}"
    image = critical.get("image")
    found = image.get("docker-manifest-digest") if isinstance(image, dict) else None
    if not isinstance(found, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", found):
        return None, "its payload names no image digest (critical.image.docker-manifest-digest)"
    return found, None


def signed_digest(data: bytes) -> str | None:
    """The image digest a simple-signing payload vouches for, or None when it is not such a payload (of cosign's
    type, ``_vouched``)."""
    return _vouched(data)[0]


def payload_problem(data: bytes, digest: str) -> str | None:
    """Why the payload ``data`` does not vouch for the image ``digest`` (its type, its shape, another image), or
    None when it does."""
    found, why = _vouched(data)
    if why is not None:
        return why
    return None if found == digest else f"its payload vouches for another image ({found})"


def layers_of(manifest: object) -> list[tuple[str, int, str]]:
    """(payload digest, size, signature) of each simple-signing layer a signature manifest lists; others skipped."""
    out = []
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    for item in layers if isinstance(layers, list) else []:
        if not isinstance(item, dict) or item.get("mediaType") != SIMPLESIGNING:
            continue
        digest, size = item.get("digest"), item.get("size")
        sig = (
            (item.get("annotations") or {}).get(COSIGN_SIGNATURE) if isinstance(item.get("annotations"), dict) else None
        )
        if (
            isinstance(digest, str)
            and re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
            and isinstance(size, int)
            and not isinstance(size, bool)
            and 0 < size <= MAX_PAYLOAD
            and isinstance(sig, str)
            and len(sig) < 4096
        ):
            out.append((digest, size, sig))
    return out
