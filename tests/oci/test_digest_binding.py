"""Digests bind: whatever is fetched by digest (a manifest, a blob, a signature's payload) is checked against that
digest before anything reads it, and a tag's Docker-Content-Digest must be the digest of what the tag serves. A
registry that answers a digest with other bytes is refused (exit 3, both digests named), in `imagekit verify` and
`sign`, `release merge` (its records, its signatures, its alias indexes) and publishing (alias indexes, copied tags,
the SBOM attestation). Against tests/hostile_http.py's lying registry on loopback; the planted-bug guards of the
fast tier (the signature payload's own digest check, cosign's payload type) use the structural fake registry."""

from __future__ import annotations

import json

import pytest

from imagekit.effects.registry import RegistryClient, Remote
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.oci import media_types
from imagekit.oci.release_record import Published
from imagekit.services.publishing import release, release_index, signing, tag_indexes
from imagekit.supplychain import cosign
from tests import hostile_http
from tests.fakes import PASSED, RecordingRegistry

REPO = "team/train"
CELL = "cu124-torch2.5.1-py3.11-tf4.48.2"
BUILD = "0123456789ab"
USER, PASSWORD = "ci-bot", "Reg1stryPassw0rd"
DIGEST = "sha256:" + "4" * 64
FAKE_REMOTE = Remote.parse("registry.test/team/train")


def _key():  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _clean(output: str) -> None:
    """What every refusal looks like: `error:` + `hint:`, no traceback, no escape sequence."""
    assert "Traceback" not in output and "\x1b" not in output, output
    assert "error:" in output and "hint:" in output, output


def _lied(exc: pytest.ExceptionInfo, asked: str, served: str) -> None:
    """The refusal of a registry that served other bytes than ``asked``: exit 3, naming both digests."""
    assert isinstance(exc.value, EnvironmentFailure) and exc.value.exit_code == 3, exc.value
    assert f"served other bytes than {asked}" in exc.value.message and served in exc.value.message, exc.value.message
    assert exc.value.hint


def _signature_layer(payload: bytes, key) -> dict:  # type: ignore[no-untyped-def]
    return cosign.Layer(payload, cosign.sign(payload, key)).descriptor()


def _plant_signature(registry: RecordingRegistry, digest: str, payload: bytes, key) -> dict:  # type: ignore[no-untyped-def]
    """A signature manifest for ``digest`` in the fake registry whose one layer is ``payload``, signed by ``key``."""
    layer = _signature_layer(payload, key)
    registry.data[layer["digest"]] = payload
    registry.manifests[(FAKE_REMOTE.name, cosign.sig_tag(digest))] = {"layers": [layer]}
    return layer


# ---- planted bug (a): services/publishing/signing.py `verified` compares a served payload with its digest ------------
# Fast: the fake registry serves what it holds under a digest without checking it, as any Registry may; the check
# that refuses other bytes is signing's own, so removing it changes the reason (or lets the signature through).
def test_a_signature_payload_the_registry_swapped_is_refused_as_other_bytes():
    registry, key = RecordingRegistry([]), _key()
    signing.sign(registry, FAKE_REMOTE, DIGEST, key)
    [layer] = registry.manifests[(FAKE_REMOTE.name, cosign.sig_tag(DIGEST))]["layers"]
    # other bytes, the same length, vouching for the same image under another name: only the digest tells them apart
    honest = registry.data[layer["digest"]]
    swapped = honest.replace(b"registry.test/team/train", b"registry.test/team/tr4in")
    assert len(swapped) == len(honest) and cosign.signed_digest(swapped) == DIGEST
    registry.data[layer["digest"]] = swapped
    with pytest.raises(EnvironmentFailure) as exc:
        signing.verify(registry, FAKE_REMOTE, DIGEST, key.public_key())
    _lied(exc, layer["digest"], cosign.digest_of(swapped))
    assert "vouches for another image" not in exc.value.message and "does not verify" not in exc.value.message
    # the other bytes signed by the key too, listed under the honest payload's digest: still other bytes
    registry.data[layer["digest"]] = swapped
    layer["annotations"][media_types.COSIGN_SIGNATURE] = cosign.sign(swapped, key)
    with pytest.raises(EnvironmentFailure) as exc:
        signing.verify(registry, FAKE_REMOTE, DIGEST, key.public_key())
    _lied(exc, layer["digest"], cosign.digest_of(swapped))


# ---- planted bug (b): a simple-signing payload of another type than cosign's image signature is refused ---------
@pytest.mark.parametrize(
    "kind",
    ["atomic container signature", "Cosign Container Image Signature", "cosign container image signature ", None, 7],
    ids=["atomic", "capitals", "trailing-space", "missing", "number"],
)
def test_a_payload_of_another_type_is_refused_naming_its_type(kind):
    doc = json.loads(cosign.payload("registry.test/team/train", DIGEST))
    if kind is None:
        del doc["critical"]["type"]
    else:
        doc["critical"]["type"] = kind
    payload = json.dumps(doc, separators=(",", ":")).encode()
    assert cosign.signed_digest(payload) is None
    assert "critical.type" in (cosign.payload_problem(payload, DIGEST) or "")
    registry, key = RecordingRegistry([]), _key()
    _plant_signature(registry, DIGEST, payload, key)  # signed by the key, naming this very image: only its type is off
    with pytest.raises(CheckFailed, match=r"critical\.type") as exc:
        signing.verify(registry, FAKE_REMOTE, DIGEST, key.public_key())
    assert "cosign container image signature" in exc.value.message


def test_cosigns_own_payload_passes_and_the_other_reasons_are_named():
    good = cosign.payload("registry.test/team/train", DIGEST)
    assert cosign.payload_problem(good, DIGEST) is None and cosign.signed_digest(good) == DIGEST
    assert "vouches for another image" in cosign.payload_problem(good, "sha256:" + "5" * 64)
    assert "not a simple-signing payload" in cosign.payload_problem(b"not json", DIGEST)
    assert "not a simple-signing payload" in cosign.payload_problem(b'{"critical": []}', DIGEST)
    # a key twice: parsers differ on which one counts (Go's last, others the first), so neither does
    twice = good.replace(b'"type":', b'"image":{"docker-manifest-digest":"sha256:' + b"5" * 64 + b'"},"type":')
    assert cosign.signed_digest(twice) is None and "twice" in cosign.payload_problem(twice, DIGEST)


# ---- the registry client: every fetch by digest is bound to it ---------------------------------------------------
def _fetch_manifest(client: RegistryClient, remote: Remote, name: str, digest: str) -> object:
    return {
        "manifest_raw": lambda: client.manifest_raw(remote, digest),
        "oci_manifest": lambda: client.oci_manifest(remote, digest),
        "oci_manifest_json": lambda: client.oci_manifest_json(remote, digest),
        "copy_tag": lambda: client.copy_tag(remote, digest, "moved"),
    }[name]()


@pytest.mark.loopback
@pytest.mark.parametrize("header", ["asked", "served", None], ids=["header-asked", "header-served", "no-header"])
@pytest.mark.parametrize("fetch", ["manifest_raw", "oci_manifest", "oci_manifest_json", "copy_tag"])
def test_a_manifest_fetched_by_digest_must_hash_to_it(fetch, header):
    with hostile_http.registry() as reg:
        real, asked = reg.add_image(REPO, "v1", "real"), reg.add_image(REPO, "v2", "asked")
        reg.serve_manifest_as(REPO, asked.digest, real.manifest, header)
        with pytest.raises(EnvironmentFailure) as exc:
            _fetch_manifest(RegistryClient(), Remote(reg.address, REPO), fetch, asked.digest)
        _lied(exc, asked.digest, real.digest)
        assert not [s for s in reg.seen if s.method == "PUT"]  # copy_tag tagged nothing


@pytest.mark.loopback
@pytest.mark.parametrize("fetch", ["blob", "blob_json"])
def test_a_blob_fetched_by_digest_must_hash_to_it(fetch):
    with hostile_http.registry() as reg:
        real, asked = reg.add_image(REPO, "v1", "real"), reg.add_image(REPO, "v2", "asked")
        reg.serve_blob_as(REPO, asked.config_digest, real.config)
        client, remote = RegistryClient(), Remote(reg.address, REPO)
        with pytest.raises(EnvironmentFailure) as exc:
            if fetch == "blob":
                client.blob(remote, asked.config_digest, 1 << 20)
            else:
                client.blob_json(remote, asked.config_digest)
        _lied(exc, asked.config_digest, real.config_digest)


@pytest.mark.loopback
def test_honest_fetches_by_digest_and_by_tag_pass():
    with hostile_http.registry() as reg:
        image = reg.add_image(REPO, "v1", "real")
        client, remote = RegistryClient(), Remote(reg.address, REPO)
        assert client.manifest_raw(remote, image.digest)[2] == image.digest
        assert client.manifest_raw(remote, "v1")[2] == image.digest
        assert client.oci_manifest(remote, image.digest).digest == image.digest
        assert client.oci_manifest(remote, "v1").config_digest == image.config_digest
        assert client.blob(remote, image.config_digest, 1 << 20) == image.config
        assert client.blob_json(remote, image.config_digest)["os"] == "linux"
        reg.serve_manifest_as(REPO, "v2", image.manifest, header=None)  # no header by tag: the bytes' digest
        assert client.oci_manifest(remote, "v2").digest == image.digest


@pytest.mark.loopback
@pytest.mark.parametrize("fetch", ["manifest_raw", "oci_manifest", "oci_manifest_json"])
def test_a_tag_whose_digest_header_is_not_what_it_serves_is_refused(fetch):
    """By tag, the served digest is what the tag names: a Docker-Content-Digest must be the bytes' digest."""
    with hostile_http.registry() as reg:
        real, claimed = reg.add_image(REPO, "v1", "real"), reg.add_image(REPO, "v2", "claimed")
        reg.serve_manifest_as(REPO, "v1", real.manifest, header=claimed.digest)
        with pytest.raises(EnvironmentFailure) as exc:
            _fetch_manifest(RegistryClient(), Remote(reg.address, REPO), fetch, "v1")
    assert claimed.digest in exc.value.message and real.digest in exc.value.message, exc.value.message
    assert exc.value.exit_code == 3 and exc.value.hint


# ---- `imagekit verify` and `imagekit sign` ------------------------------------------------------------------------
@pytest.fixture
def signed_registry(tmp_path, no_internet):  # type: ignore[no-untyped-def]
    """A registry holding a signed image and one the key never signed; the key's public half in cosign.pub."""
    key = _key()
    (tmp_path / "cosign.pub").write_bytes(cosign.public_pem(key))
    with hostile_http.registry() as reg:
        signed, unsigned = reg.add_image(REPO, "v1", "signed"), reg.add_image(REPO, "v2", "never signed")
        signing.sign(RegistryClient(), Remote(reg.address, REPO), signed.digest, key)
        yield reg, signed, unsigned, key, tmp_path / "cosign.pub"


@pytest.mark.loopback
def test_verify_refuses_a_digest_the_registry_answers_with_a_signed_images_manifest(app, runner, signed_registry):
    """HIGH: the signature was checked against the digest of what was served, never the digest asked for."""
    reg, signed, unsigned, _, pub = signed_registry
    honest = runner.invoke(app, ["verify", f"{reg.address}/{REPO}@{signed.digest}", "--key", str(pub)])
    assert honest.exit_code == 0, honest.output
    reg.serve_manifest_as(REPO, unsigned.digest, signed.manifest)
    res = runner.invoke(app, ["verify", f"{reg.address}/{REPO}@{unsigned.digest}", "--key", str(pub)])
    assert res.exit_code == 3, res.output
    assert f"served other bytes than {unsigned.digest}" in res.output and signed.digest in res.output
    _clean(res.output)


@pytest.mark.loopback
def test_verify_by_tag_refuses_a_digest_header_naming_the_signed_image(app, runner, signed_registry):
    reg, signed, unsigned, _, pub = signed_registry
    reg.serve_manifest_as(REPO, "v2", unsigned.manifest, header=signed.digest)
    res = runner.invoke(app, ["verify", f"{reg.address}/{REPO}:v2", "--key", str(pub)])
    assert res.exit_code == 3 and signed.digest in res.output and unsigned.digest in res.output, res.output
    _clean(res.output)


@pytest.mark.loopback
def test_sign_signs_no_other_image_than_the_digest_asked(app, runner, signed_registry, tmp_path, monkeypatch):
    from cryptography.hazmat.primitives import serialization

    reg, signed, unsigned, _, _ = signed_registry
    other = _key().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())  # fmt: skip
    (tmp_path / "other.key").write_bytes(other)
    monkeypatch.setenv("COSIGN_PASSWORD", "")
    reg.serve_manifest_as(REPO, unsigned.digest, signed.manifest)
    puts = len([s for s in reg.seen if s.method == "PUT"])
    res = runner.invoke(app, ["sign", f"{reg.address}/{REPO}@{unsigned.digest}", "--key", str(tmp_path / "other.key")])
    assert res.exit_code == 3 and f"served other bytes than {unsigned.digest}" in res.output, res.output
    assert len([s for s in reg.seen if s.method == "PUT"]) == puts  # nothing signed
    _clean(res.output)


@pytest.mark.loopback
def test_a_signature_payload_swapped_in_the_registry_is_refused_for_the_same_reason(signed_registry):
    """The real client refuses the other bytes itself; the reason is the one signing gives (the test above)."""
    reg, signed, _, key, _ = signed_registry
    remote = Remote(reg.address, REPO)
    [layer] = json.loads(reg.manifests[(REPO, cosign.sig_tag(signed.digest))].manifest)["layers"]
    swapped = cosign.payload(f"{reg.address}/team/tr4in", signed.digest)
    reg.serve_blob_as(REPO, layer["digest"], swapped)
    with pytest.raises(EnvironmentFailure) as exc:
        signing.verify(RegistryClient(), remote, signed.digest, key.public_key())
    _lied(exc, layer["digest"], cosign.digest_of(swapped))


# ---- `imagekit release merge`: records, signatures, the alias index ----------------------------------------------
def _record(folder, reg: hostile_http.RegistryState, digest: str, config: str | None) -> None:  # type: ignore[no-untyped-def]
    repo = f"{reg.address}/{REPO}"
    published = Published(f"{repo}:{CELL}-{BUILD}", f"{repo}:{CELL}", digest, False, config)
    entry = release_index.release_entry(
        published, lock_hash="l" * 64, manifest={"cell": {"id": CELL}}, report=PASSED, size=1
    )
    release_index.write_record(folder, entry)


@pytest.mark.loopback
@pytest.mark.parametrize("where", ["digest", "tag", "both"])
def test_merge_refuses_a_record_the_registry_vouches_for_with_other_bytes(app, runner, in_tmp, no_internet, where):
    """digest: a record of a digest the registry never held (a ghost), answered with a real image's manifest (the
    recorded config); tag: an honest record whose tag serves another image under the recorded digest's header;
    both: the ghost answered by digest, and by the tag as its header."""
    with hostile_http.registry() as reg:
        real, other = reg.add_image(REPO, f"{CELL}-{BUILD}", "real"), reg.add_image(REPO, "other", "other")
        ghost = "sha256:" + "6" * 64
        recorded, served = (real.digest, other.digest) if where == "tag" else (ghost, real.digest)
        if where in ("digest", "both"):
            reg.serve_manifest_as(REPO, ghost, real.manifest, header="asked")
        if where == "both":
            reg.serve_manifest_as(REPO, f"{CELL}-{BUILD}", real.manifest, header=ghost)
        if where == "tag":
            reg.serve_manifest_as(REPO, f"{CELL}-{BUILD}", other.manifest, header=real.digest)
        _record(in_tmp / "records", reg, recorded, real.config_digest)
        res = runner.invoke(app, ["release", "merge", "records", "--index", "index.json", "--registry", reg.address])
    assert res.exit_code == 3, res.output
    assert recorded in res.output and served in res.output, res.output
    _clean(res.output)
    assert not (in_tmp / "index.json").exists()


@pytest.mark.loopback
def test_merge_require_signature_refuses_a_tag_that_names_another_image_than_its_header(
    app, runner, in_tmp, signed_registry
):
    """The tag serves an image the key never signed, with the signed image's digest as its header."""
    reg, signed, unsigned, _, pub = signed_registry
    reg.serve_manifest_as(REPO, f"{CELL}-{BUILD}", unsigned.manifest, header=signed.digest)
    _record(in_tmp / "records", reg, signed.digest, signed.config_digest)
    res = runner.invoke(
        app, ["release", "merge", "records", "--index", "index.json", "--registry", reg.address,
              "--require-signature", str(pub)],
    )  # fmt: skip
    assert res.exit_code == 3 and signed.digest in res.output and unsigned.digest in res.output, res.output
    _clean(res.output)
    assert not (in_tmp / "index.json").exists()


@pytest.mark.loopback
def test_merges_alias_index_lists_no_image_the_registry_served_other_bytes_for(no_internet):
    with hostile_http.registry() as reg:
        amd, arm = reg.add_image(REPO, "amd", "amd64 image"), reg.add_image(REPO, "arm", "arm64 image")
        reg.serve_manifest_as(REPO, arm.digest, amd.manifest)
        client = RegistryClient()
        with pytest.raises(EnvironmentFailure) as exc:
            release.point_index(client, f"{reg.address}/{REPO}:{CELL}", {"linux/amd64": amd.digest,
                                                                       "linux/arm64": arm.digest})  # fmt: skip
        _lied(exc, arm.digest, amd.digest)
        assert (REPO, CELL) not in reg.manifests


# ---- publishing: the alias, its index, the SBOM attestation -------------------------------------------------------
@pytest.mark.loopback
def test_publish_alias_reads_no_platform_from_a_config_the_registry_swapped(no_internet):
    """The alias names an amd64 image; the registry answers its config's digest with an arm64 config."""
    with hostile_http.registry() as reg:
        before, new = reg.add_image(REPO, CELL, "earlier amd64"), reg.add_image(REPO, "new", "new amd64")
        arm_config = json.dumps({"architecture": "arm64", "os": "linux", "rootfs": {"diff_ids": []}}).encode()
        reg.serve_blob_as(REPO, before.config_digest, arm_config)
        with pytest.raises(EnvironmentFailure) as exc:
            tag_indexes.point_alias(RegistryClient(), Remote(reg.address, REPO), CELL, new.digest, "linux/amd64")
        _lied(exc, before.config_digest, cosign.digest_of(arm_config))
        assert reg.manifests[(REPO, CELL)] is before


@pytest.mark.loopback
@pytest.mark.parametrize("platform", ["linux/amd64", "linux/arm64"])
def test_publish_alias_never_names_other_bytes_than_the_published_digest(no_internet, platform):
    """amd64 alone: the alias is a copy of the tag (copy_tag); another platform: an index entry (its size, type)."""
    with hostile_http.registry() as reg:
        published, other = reg.add_image(REPO, "published", "published"), reg.add_image(REPO, "other", "other")
        reg.serve_manifest_as(REPO, published.digest, other.manifest)
        with pytest.raises(EnvironmentFailure) as exc:
            tag_indexes.point_alias(RegistryClient(), Remote(reg.address, REPO), CELL, published.digest, platform)
        _lied(exc, published.digest, other.digest)
        assert (REPO, CELL) not in reg.manifests


@pytest.mark.loopback
def test_the_sbom_attestation_indexes_no_other_bytes_than_the_images(no_internet):
    with hostile_http.registry() as reg:
        image, other = reg.add_image(REPO, "image", "image"), reg.add_image(REPO, "other", "other")
        reg.serve_manifest_as(REPO, image.digest, other.manifest)
        with pytest.raises(EnvironmentFailure) as exc:
            tag_indexes.attach_sbom(
                RegistryClient(), Remote(reg.address, REPO), "tag", image.digest, "linux/amd64", {"packages": []}
            )
        _lied(exc, image.digest, other.digest)
        assert (REPO, "tag") not in reg.manifests


# ---- secrets: no user-info, no registry password, in any message --------------------------------------------------
@pytest.mark.parametrize(
    "image",
    [
        f"{USER}:{PASSWORD}@127.0.0.1:9/team/app:v1",
        f"{USER}:{PASSWORD}@127.0.0.1:9/team/app@{DIGEST}",
        f"http://{USER}:{PASSWORD}@127.0.0.1:9/team/app:v1",
        f"{PASSWORD}@registry.test/team/app:v1",
        f"{USER}:{PASSWORD[:4]}/{PASSWORD}@registry.test/team/app:v1",
    ],
    ids=["user-password", "user-password-digest", "url", "token", "password-with-slash"],
)
@pytest.mark.parametrize("command", ["verify", "sign"])
def test_user_info_in_an_image_reference_is_never_printed(app, runner, tmp_path, monkeypatch, no_internet, command,
                                                          image):  # fmt: skip
    from cryptography.hazmat.primitives import serialization

    key = _key()
    (tmp_path / "k.pub").write_bytes(cosign.public_pem(key))
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())  # fmt: skip
    (tmp_path / "k.key").write_bytes(private)
    monkeypatch.setenv("COSIGN_PASSWORD", "")
    res = runner.invoke(app, [command, image, "--key", str(tmp_path / ("k.pub" if command == "verify" else "k.key"))])
    assert res.exit_code == 2, res.output
    assert PASSWORD not in res.output and PASSWORD[:4] not in res.output, res.output
    _clean(res.output)


@pytest.mark.parametrize(
    "value",
    [
        f"{USER}:{PASSWORD}@127.0.0.1:9",
        f"{USER}:{PASSWORD}@127.0.0.1:9/team/app",
        f"https://{USER}:{PASSWORD}@ghcr.io",
        f"ghcr.io/{USER}:{PASSWORD}@acme/train",
    ],
)
def test_user_info_in_merges_registry_is_never_printed(app, runner, in_tmp, value):
    (in_tmp / "records").mkdir()
    res = runner.invoke(app, ["release", "merge", "records", "--index", "index.json", "--registry", value])
    assert res.exit_code == 2 and PASSWORD not in res.output, res.output
    _clean(res.output)


def test_user_info_in_a_records_tag_is_never_printed(app, runner, in_tmp):
    """A record is a CI artifact: its tag may carry credentials; the refusal names the record, not them."""
    repo = f"{USER}:{PASSWORD}@127.0.0.1:9/{REPO}"
    published = Published(f"{repo}:{CELL}-{BUILD}", f"{repo}:{CELL}", DIGEST, False, None)
    entry = release_index.release_entry(
        published, lock_hash="l" * 64, manifest={"cell": {"id": CELL}}, report={}, size=1
    )
    (in_tmp / "records").mkdir()
    (in_tmp / "records" / "r.json").write_text(json.dumps(entry))
    res = runner.invoke(app, ["release", "merge", "records", "--index", "index.json", "--registry", "127.0.0.1:9"])
    assert res.exit_code == 2 and "r.json" in res.output and PASSWORD not in res.output, res.output
    _clean(res.output)


def test_user_info_in_a_remote_is_never_printed():
    for repository in (f"{USER}:{PASSWORD}@registry.test/team/app", f"{PASSWORD}@registry.test/team/app"):
        with pytest.raises(UsageError) as exc:
            Remote.parse(repository)
        assert PASSWORD not in exc.value.message + (exc.value.hint or "")


@pytest.mark.loopback
def test_a_registry_echoing_the_credentials_gets_them_into_no_message(monkeypatch, no_internet):
    """A registry (or a proxy before it) answering a refused push with the request's headers, or the password."""
    import base64

    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    def echo(req: hostile_http.Seen) -> hostile_http.Answer | None:
        if req.method in ("PUT", "POST"):
            echoed = f"{req.headers.get('Authorization')} {PASSWORD} {token.lower()} {PASSWORD.upper()}"
            return 400, {}, f"bad request: {echoed} {req.headers}".encode()
        return None

    with hostile_http.registry() as reg:
        image = reg.add_image(REPO, "v1")
        reg.override = echo
        client, remote = RegistryClient(USER, PASSWORD, registries=[reg.address]), Remote(reg.address, REPO)
        for attempt in (
            lambda: client.put_manifest(remote, "v2", image.manifest, hostile_http.MANIFEST_V2),
            lambda: client.copy_tag(remote, image.digest, "v2"),
            lambda: client.upload_blob(remote, image.config_digest, len(image.config), image.config),
        ):
            with pytest.raises(EnvironmentFailure) as exc:
                attempt()
            text = exc.value.message + (exc.value.hint or "")
            assert PASSWORD not in text and token not in text and "HTTP 400" in text, text
        assert any(s.headers.get("Authorization") == f"Basic {token}" for s in reg.seen)  # they were sent there


@pytest.mark.loopback
def test_a_lying_registry_given_credentials_names_none_in_its_refusal(app, runner, signed_registry, monkeypatch):
    reg, signed, unsigned, _, pub = signed_registry
    monkeypatch.setenv("IMAGEKIT_REGISTRY_USER", USER)
    monkeypatch.setenv("IMAGEKIT_REGISTRY_PASSWORD", PASSWORD)
    reg.serve_manifest_as(REPO, unsigned.digest, signed.manifest)
    res = runner.invoke(app, ["verify", f"{reg.address}/{REPO}@{unsigned.digest}", "--key", str(pub)])
    assert res.exit_code == 3 and PASSWORD not in res.output, res.output
