"""cosign's signature format (supplychain/cosign.py, services/publishing/signing.py, `imagekit sign` / `imagekit
verify`):
checked against cosign's own test vectors (tests/fixtures/cosign), then round-tripped through a fake registry and a
real one."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from imagekit.effects.registry import Remote
from imagekit.errors import CheckFailed
from imagekit.services.publishing import signing
from imagekit.supplychain import cosign
from tests.fakes import RecordingRegistry
from tests.services.test_build_steps import setup  # noqa: F401 (the fake engine and registry of a build)

VECTORS = Path(__file__).resolve().parents[1] / "fixtures" / "cosign"
DIGEST = "sha256:" + "4" * 64
REMOTE = Remote.parse("registry.test/team/train")


def _key():
    return cosign.load_private_key((VECTORS / "sigstore-hello.key").read_bytes(), b"hello")


def _other_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


# ---- cosign's vectors -----------------------------------------------------------------------------------------
@pytest.mark.seconds
def test_cosigns_encrypted_key_opens_with_its_password_and_only_with_it():
    key = _key()
    assert key.curve.name == "secp256r1"
    with pytest.raises(cosign.KeyError_, match="COSIGN_PASSWORD"):
        cosign.load_private_key((VECTORS / "sigstore-hello.key").read_bytes(), b"wrong")


def test_the_payload_is_byte_for_byte_the_one_cosign_writes():
    got = cosign.payload(
        "index.docker.io/namespace/image", "sha256:4aa3054270f7a70b4528f2064ee90961788e1e1518703592ae4463de3b889dec"
    )
    assert got == (
        b'{"critical":{"identity":{"docker-reference":"index.docker.io/namespace/image"},"image":{"docker-manifest-'
        b'digest":"sha256:4aa3054270f7a70b4528f2064ee90961788e1e1518703592ae4463de3b889dec"},"type":"cosign container'
        b' image signature"},"optional":null}'
    )


def test_cosigns_ecdsa_signature_vector_verifies_and_a_changed_one_does_not():
    spec = json.loads((VECTORS / "hashedrekord.json").read_text())["spec"]
    public = cosign.load_public_key(base64.b64decode(spec["signature"]["publicKey"]["content"]))
    digest = bytes.fromhex(spec["data"]["hash"]["value"])
    signature = spec["signature"]["content"]
    assert cosign.verify_digest(digest, signature, public)
    assert not cosign.verify_digest(bytes(32), signature, public)
    flipped = base64.b64encode(bytes([base64.b64decode(signature)[0]]) + base64.b64decode(signature)[1:-1] + b"\0")
    assert not cosign.verify_digest(digest, flipped.decode(), public)
    assert not cosign.verify_digest(digest, "not base64!", public)


@pytest.mark.seconds
def test_a_signature_made_here_verifies_with_the_public_key_alone():
    key = _key()
    data = cosign.payload("registry.test/team/train", DIGEST)
    signature = cosign.sign(data, key)
    public = cosign.load_public_key(cosign.public_pem(key))
    assert cosign.verify(data, signature, public)
    assert not cosign.verify(data + b" ", signature, public)
    assert not cosign.verify(data, signature, _other_key().public_key())


@pytest.mark.parametrize(
    ("pem", "message"),
    [
        (b"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nbm90IGEga2V5\n"
         b"-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n", "envelope"),
        (b"just text", "not a private key"),
    ],
)  # fmt: skip
def test_a_key_that_is_not_cosigns_is_refused_without_echoing_it(pem, message):
    with pytest.raises(cosign.KeyError_, match=message) as info:
        cosign.load_private_key(pem, b"pw")
    assert "bm90IGEga2V5" not in str(info.value)


def test_a_key_on_another_curve_is_refused():
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    p384 = ec.generate_private_key(ec.SECP384R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(cosign.KeyError_, match="P-256"):
        cosign.load_private_key(p384, b"")


# ---- signing against a registry (fake) ----------------------------------------------------------------------------
def _registry() -> RecordingRegistry:
    return RecordingRegistry([])


def test_sign_writes_cosigns_signature_manifest_and_verify_reads_it():
    registry, key = _registry(), _key()
    recorded = signing.sign(registry, REMOTE, DIGEST, key)
    assert recorded == {"tag": "sha256-" + "4" * 64 + ".sig", "key": cosign.fingerprint(key.public_key())}
    manifest = registry.manifests[(REMOTE.name, recorded["tag"])]
    [layer] = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    payload = registry.data[layer["digest"]]
    assert cosign.signed_digest(payload) == DIGEST
    assert json.loads(payload)["critical"]["identity"]["docker-reference"] == "registry.test/team/train"
    assert cosign.verify(payload, layer["annotations"]["dev.cosignproject.cosign/signature"], key.public_key())
    assert signing.verify(registry, REMOTE, DIGEST, key.public_key()) == [layer["digest"]]


@pytest.mark.seconds
def test_signing_again_adds_nothing_and_another_key_adds_its_own_signature():
    registry, key, other = _registry(), _key(), _other_key()
    signing.sign(registry, REMOTE, DIGEST, key)
    before = dict(registry.manifests)
    signing.sign(registry, REMOTE, DIGEST, key)
    assert registry.manifests == before
    signing.sign(registry, REMOTE, DIGEST, other)
    assert len(registry.manifests[(REMOTE.name, cosign.sig_tag(DIGEST))]["layers"]) == 2
    assert len(signing.verify(registry, REMOTE, DIGEST, key.public_key())) == 1
    assert len(signing.verify(registry, REMOTE, DIGEST, other.public_key())) == 1


@pytest.mark.seconds
def test_verify_refuses_a_missing_signature_a_wrong_key_and_a_payload_for_another_image():
    registry, key = _registry(), _key()
    with pytest.raises(CheckFailed, match="is not in the registry"):
        signing.verify(registry, REMOTE, DIGEST, key.public_key())
    signing.sign(registry, REMOTE, DIGEST, key)
    with pytest.raises(CheckFailed, match="does not verify with this key"):
        signing.verify(registry, REMOTE, DIGEST, _other_key().public_key())
    # a valid signature of another image, copied under this image's signature tag: refused for what it names
    elsewhere = "sha256:" + "5" * 64
    signing.sign(registry, REMOTE, elsewhere, key)
    registry.manifests[(REMOTE.name, cosign.sig_tag(DIGEST))] = registry.manifests[
        (REMOTE.name, cosign.sig_tag(elsewhere))
    ]
    with pytest.raises(CheckFailed, match="vouches for another image"):
        signing.verify(registry, REMOTE, DIGEST, key.public_key())


# ---- the commands, against a real registry on loopback ------------------------------------------------------------
@pytest.fixture
def real_registry(tmp_path_factory):
    from tests.registry import Registry, free_port

    registry = Registry(tmp_path_factory.mktemp("sigreg"), free_port()).start()
    yield registry
    registry.stop()


@pytest.mark.loopback
def test_sign_and_verify_an_image_in_a_real_registry(runner, app, real_registry, tmp_path, monkeypatch):
    from imagekit.effects.registry import RegistryClient

    client, remote = RegistryClient(), Remote.parse(f"{real_registry.address}/team/train")
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    client.upload_blob(remote, config_digest, len(config), config)
    oci = "application/vnd.oci.image"
    described = {"mediaType": f"{oci}.config.v1+json", "digest": config_digest, "size": len(config)}
    manifest = json.dumps({"schemaVersion": 2, "mediaType": f"{oci}.manifest.v1+json", "config": described,
                           "layers": []}).encode()  # fmt: skip
    digest = client.put_manifest(remote, "v1", manifest, "application/vnd.oci.image.manifest.v1+json")
    image = f"{real_registry.address}/team/train:v1"
    (tmp_path / "cosign.pub").write_bytes(cosign.public_pem(_key()))
    monkeypatch.setenv("COSIGN_PASSWORD", "hello")
    signed = runner.invoke(app, ["sign", image, "--key", str(VECTORS / "sigstore-hello.key"), "--json"])
    assert signed.exit_code == 0, signed.output
    assert json.loads(signed.stdout)["image"].endswith(digest) and "hello" not in signed.output
    checked = runner.invoke(app, ["verify", image, "--key", str(tmp_path / "cosign.pub")])
    assert checked.exit_code == 0 and f"verified: {real_registry.address}/team/train@{digest}" in checked.output
    (tmp_path / "other.pub").write_bytes(cosign.public_pem(_other_key()))
    refused = runner.invoke(app, ["verify", image, "--key", str(tmp_path / "other.pub")])
    assert refused.exit_code == 1 and "does not verify with this key" in refused.output and "hint:" in refused.output
    monkeypatch.setenv("COSIGN_PASSWORD", "wrong")
    wrong = runner.invoke(app, ["sign", image, "--key", str(VECTORS / "sigstore-hello.key")])
    assert wrong.exit_code == 2 and "COSIGN_PASSWORD" in wrong.output and "wrong" not in wrong.output


# ---- build --push --sign-key, and release merge --require-signature (fake engine and registry) --------------------
@pytest.mark.resolver  # the cell's lock is a real uv resolution against a loopback index
@pytest.mark.loopback
def test_a_build_signs_after_the_self_test_and_before_the_alias_and_merge_can_require_it(setup, tmp_path):  # noqa: F811
    import dataclasses

    from imagekit.services.publishing import release
    from tests.services.test_build_steps import CELL, REPO, _build

    engine, registry, opts = setup
    key = _key()
    opts = dataclasses.replace(opts, sign_key=key)
    res, lines = _build(engine, registry, opts)
    assert res.status == "published", res.error and res.error.render()
    entry = json.loads(opts.release_index.read_text())["images"][res.tag]
    tags = entry["signature"]["tags"]
    assert tags == [cosign.sig_tag(entry["tag_digest"]), cosign.sig_tag(res.digest)]  # the tag's index, the image
    assert entry["signature"]["key"] == cosign.fingerprint(key.public_key())
    calls = engine.calls
    signed_at = max(calls.index(("registry.put_manifest", t)) for t in tags)
    assert calls.index(("registry.put_manifest", res.tag.rsplit(":", 1)[1])) < signed_at
    assert signed_at < calls.index(("registry.copy_tag", CELL.id))  # the alias moves after the signatures
    remote = Remote.parse(REPO)
    for digest in (entry["tag_digest"], res.digest):
        assert signing.verify(registry, remote, digest, key.public_key())
    # the key is in no record, log or repr
    from cryptography.hazmat.primitives import serialization

    secret = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    written = opts.release_index.read_text() + "".join(p.read_text() for p in opts.release_records.iterdir())
    body = secret.splitlines()[1]
    assert body not in written and body not in "\n".join(lines) and body not in repr(opts)
    # release merge --require-signature: this key's signature passes; another key's refuses, writing nothing
    allowed = release.allowed_registries([REPO], {})
    merged = release.merge(
        [opts.release_records], tmp_path / "merged.json", registry, allowed=allowed, signed_by=key.public_key()
    )
    assert merged.added == [res.tag]
    with pytest.raises(CheckFailed, match="no signature this key verifies"):
        release.merge(
            [opts.release_records],
            tmp_path / "other.json",
            registry,
            allowed=allowed,
            signed_by=_other_key().public_key(),
        )
    assert not (tmp_path / "other.json").exists()
    # on another machine (a state folder of its own): only a merge that verified the signature vouches for the
    # record's self-test, so a later build there may reuse its results (oci.selftest_reuse)
    from imagekit.services.publishing import release_index

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMAGEKIT_STATE", str(tmp_path / "another-machine"))
        assert release_index.vouched(entry) is None
        release.merge([opts.release_records], tmp_path / "unsigned.json", registry, allowed=allowed)
        assert release_index.vouched(entry) is None
        signed = tmp_path / "signed.json"
        release.merge([opts.release_records], signed, registry, allowed=allowed, signed_by=key.public_key())
        assert "its signature verified" in str(release_index.vouched(entry))
