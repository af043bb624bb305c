"""Templates and `pod create` from an image the local release index does not record (CI published it, its records
were merged elsewhere): its runtime contract and what a template needs read from the image's own labels in a real
loopback registry (Debian's docker-registry), holding images pushed with imagekit's own registry client (a config,
a layer and the manifests; no Docker), and pinned to the digest the labels were read from."""

from __future__ import annotations

import hashlib
import json

import pytest

from imagekit.effects.registry import RegistryClient, Remote
from imagekit.image import naming
from imagekit.image.buildplan import BaseRef, BuildPlan, manifest
from imagekit.model import Cell
from imagekit.oci import media_types
from imagekit.services.locks.lock_cells import read_lock
from imagekit.services.pods import remote_contract
from tests import hostile_http
from tests.conftest import ROOT
from tests.registry import Registry, free_port

pytestmark = pytest.mark.loopback

CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11")
REPO = "acme/train"
TAG = f"{CELL.id}-0123456789ab"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def labels_registry(tmp_path_factory):
    reg = Registry(tmp_path_factory.mktemp("labels-reg"), free_port()).start()
    yield reg
    reg.stop()


@pytest.fixture(autouse=True)
def no_docker_login(tmp_path, monkeypatch):
    """No credentials of this machine's user: the registry is read anonymously, as a laptop without a login would."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    for name in ("IMAGEKIT_REGISTRY_USER", "IMAGEKIT_REGISTRY_PASSWORD"):
        monkeypatch.delenv(name, raising=False)


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def real_labels(data) -> dict[str, str]:
    """The labels imagekit writes for a cell (its plan's manifest, as `imagekit build` labels the image)."""
    lock = read_lock(ROOT / "lockfiles" / f"{CELL.id}.txt")
    base = BaseRef("b", "r.example.com/py@sha256:" + "c" * 64, "sha256:" + "c" * 64, "3.11", "2.36", "/usr/bin/py")
    return naming.labels(manifest(BuildPlan.make(CELL, lock, base, f"r.example.com/{REPO}", data)))


def with_runtime(labels: dict[str, str], **changes: object) -> dict[str, str]:
    runtime: dict = dict(naming.parse_runtime_label(labels["imagekit.runtime"])) | changes
    return labels | {"imagekit.runtime": naming.runtime_label(runtime)}


def config_of(labels: dict[str, str] | None, arch: str = "amd64") -> dict:
    inner = {"Env": ["PATH=/usr/bin"], "Entrypoint": ["/opt/imagekit/bin/entrypoint"]}
    return {
        "architecture": arch,
        "os": "linux",
        "config": inner | ({"Labels": labels} if labels is not None else {}),
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "d" * 64]},
    }


def push_image(client: RegistryClient, remote: Remote, config: dict, ref: str | None = None) -> tuple[str, int]:
    """An image (a config and one layer) pushed with imagekit's own client: (its manifest's digest, its size)."""
    layer, body = b"a layer of an imagekit image", json.dumps(config).encode()
    for blob in (layer, body):
        client.upload_blob(remote, _sha(blob), len(blob), blob)
    doc = {
        "schemaVersion": 2,
        "mediaType": media_types.DOCKER_MANIFEST,
        "config": {"mediaType": media_types.DOCKER_CONFIG, "size": len(body), "digest": _sha(body)},
        "layers": [{"mediaType": media_types.DOCKER_LAYER_GZIP, "size": len(layer), "digest": _sha(layer)}],
    }
    raw = json.dumps(doc).encode()
    return client.put_manifest(remote, ref or _sha(raw), raw, media_types.DOCKER_MANIFEST), len(raw)


def push_index(client: RegistryClient, remote: Remote, tag: str, images: dict[str, tuple[str, int]]) -> str:
    """An image index as publish writes a tag's: each platform's image, then an SBOM attestation (unknown/unknown),
    which is not an image."""
    statement, att_config = b'{"_type": "https://in-toto.io/Statement/v0.1"}', b"{}"
    for blob in (statement, att_config):
        client.upload_blob(remote, _sha(blob), len(blob), blob)
    att = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": media_types.OCI_MANIFEST,
            "config": {"mediaType": media_types.OCI_CONFIG, "size": 2, "digest": _sha(att_config)},
            "layers": [{"mediaType": media_types.IN_TOTO, "size": len(statement), "digest": _sha(statement)}],
        }
    ).encode()
    first = next(iter(images.values()))[0]
    att_digest = client.put_manifest(remote, _sha(att), att, media_types.OCI_MANIFEST)
    entries = [
        {
            "mediaType": media_types.DOCKER_MANIFEST,
            "digest": d,
            "size": n,
            "platform": {"architecture": a, "os": "linux"},
        }
        for a, (d, n) in images.items()
    ]
    entries.append(
        {
            "mediaType": media_types.OCI_MANIFEST,
            "digest": att_digest,
            "size": len(att),
            "annotations": {
                media_types.REFERENCE_DIGEST: first,
                media_types.REFERENCE_TYPE: media_types.ATTESTATION_MANIFEST,
            },
            "platform": {"architecture": "unknown", "os": "unknown"},
        }
    )
    index = json.dumps({"schemaVersion": 2, "mediaType": media_types.OCI_INDEX, "manifests": entries}).encode()
    return client.put_manifest(remote, tag, index, media_types.OCI_INDEX)


@pytest.fixture(scope="module")
def published(labels_registry, data):
    """CI's publish of one cell, as the registry holds it: the immutable tag names an index of the linux/amd64 image,
    a linux/arm64 image and the SBOM attestation; images that are not imagekit's, or whose labels lie, beside it."""
    client, labels = RegistryClient(), real_labels(data)
    remote = Remote(labels_registry.address, REPO)
    amd = push_image(client, remote, config_of(labels))
    arm_labels = with_runtime(labels, platform="linux/arm64", sass=["sm_90"], ptx=None)
    arm = push_image(client, remote, config_of(arm_labels, "arm64"))
    index = push_index(client, remote, TAG, {"amd64": amd, "arm64": arm})
    return {"registry": labels_registry.address, "amd64": amd[0], "arm64": arm[0], "index": index, "labels": labels}


def ref(published: dict, tag: str = TAG) -> str:
    return f"{published['registry']}/{REPO}:{tag}"


def _run(app, runner, tmp_path, *args: str):
    """The command with a release index that does not record the image (CI's records were merged elsewhere)."""
    res = runner.invoke(app, [*args, "--release-index", str(tmp_path / "releases" / "index.json")])
    assert "Traceback" not in res.output
    return res


def test_a_runpod_template_from_the_images_own_labels_pinned_to_its_digest(app, runner, tmp_path, published):
    res = _run(app, runner, tmp_path, "runpod-template", ref(published))
    assert res.exit_code == 0, res.output
    tpl = json.loads(res.stdout)["variables"]["input"]
    # the tag names an index: the linux/amd64 image in it (not the index, not the attestation), by digest
    assert tpl["imageName"] == f"{ref(published)}@{published['amd64']}"
    assert f"from the image's labels at {published['registry']}/{REPO}@{published['amd64']}" in res.stderr
    # the contract is the label's: CUDA 12.4's host filter, its driver floor, its architectures
    assert "Rent: CUDA version filter: 12.4, 12.5," in tpl["readme"] and ">= 525.60.13" in tpl["readme"]
    assert "sm_90" in tpl["readme"] and "GPUs it runs on: " in tpl["readme"]
    assert f"Read from the image's labels at {published['registry']}/{REPO}@{published['amd64']}" in tpl["readme"]
    assert tpl["ports"] == "22/tcp" and "labels do not say whether JupyterLab" in tpl["readme"]
    assert tpl["name"] == f"imagekit {CELL.id}"
    assert "no pod can pull" in res.stderr  # a loopback registry: said, the template printed anyway


def test_the_platforms_image_of_the_index_and_a_digest_reference(app, runner, tmp_path, published):
    res = _run(app, runner, tmp_path, "runpod-template", ref(published), "--platform", "linux/arm64")
    assert res.exit_code == 0, res.output
    tpl = json.loads(res.stdout)["variables"]["input"]
    assert tpl["imageName"].endswith(f"@{published['arm64']}") and "linux/arm64 hosts" in tpl["readme"]
    assert "GPU architectures sm_90." in tpl["readme"]  # the arm64 image's own label, not the amd64 one's
    by_digest = f"{published['registry']}/{REPO}@{published['index']}"
    res = _run(app, runner, tmp_path, "vast-template", by_digest)
    assert res.exit_code == 0, res.output
    body = json.loads(res.stdout)
    # by digest alone: the cell's alias names it, pinned to the image's digest (Docker's NAME:TAG@DIGEST)
    assert (body["image"], body["tag"]) == (f"{published['registry']}/{REPO}", f"{CELL.id}@{published['amd64']}")
    assert (
        body["extra_filters"]["cuda_max_good"] == {"gte": 12.4} and body["extra_filters"]["cpu_arch"]["eq"] == "amd64"
    )


def test_pod_create_reads_the_contract_from_the_labels(app, runner, tmp_path, published, labels_registry, monkeypatch):
    res = _run(app, runner, tmp_path, "pod", "create", ref(published), "--gpu", H100, "--dry-run")
    assert res.exit_code == 0, res.output
    body = json.loads(res.stdout)
    assert body["image"] == f"{ref(published)}@{published['amd64']}" and body["gpu"]["allowedCudaVersions"][0] == "12.4"
    assert "pod create: from the image's labels at" in res.stderr
    # not a dry run: the image is on a loopback registry no pod reaches, so nothing goes to RunPod
    with hostile_http.runpod(hostile_http.json_answer({"id": "xedezhzb9la3ye"}, 201)) as api:
        monkeypatch.setenv("RUNPOD_API_KEY", "rp_key_0123")
        res = _run(app, runner, tmp_path, "pod", "create", ref(published), "--gpu", H100, "--api-url", f"{api.url}/v1")
        assert res.exit_code == 2 and "no pod can pull" in res.output and api.seen == [], res.output
    # an image whose label says its torch has kernels for sm_90 only: an RTX 3090 (sm_86) is refused by that label,
    # whatever imagekit's facts say of the cell
    client, remote = RegistryClient(), Remote(labels_registry.address, REPO)
    hopper = with_runtime(published["labels"], sass=["sm_90"], ptx=None)
    push_image(client, remote, config_of(hopper), "hopper-only")
    res = _run(app, runner, tmp_path, "pod", "create", ref(published, "hopper-only"), "--gpu", "RTX 3090", "--dry-run")
    assert res.exit_code == 2 and "no kernels for RTX 3090 (sm_86; it has sm_90)" in res.output, res.output


def test_a_private_registry_is_read_with_the_users_credentials_and_a_pod_without_them_is_refused(
    app, runner, tmp_path, monkeypatch, data
):
    """The labels are read with the registry steps' credentials; `--create` without --registry-auth then asks, without
    them, for the digest the template names, and refuses a template whose pods could never pull it."""
    reg = Registry(tmp_path / "private-reg", free_port(), auth=("acme-ci", "s3cret")).start()
    try:
        monkeypatch.setenv("IMAGEKIT_REGISTRY_USER", "acme-ci")
        monkeypatch.setenv("IMAGEKIT_REGISTRY_PASSWORD", "s3cret")
        client, remote = RegistryClient("acme-ci", "s3cret", [reg.address]), Remote(reg.address, REPO)
        digest, _ = push_image(client, remote, config_of(real_labels(data)), TAG)
        image = f"{reg.address}/{REPO}:{TAG}"
        res = _run(app, runner, tmp_path, "runpod-template", image)
        assert res.exit_code == 0 and json.loads(res.stdout)["variables"]["input"]["imageName"] == f"{image}@{digest}"
        monkeypatch.setenv("RUNPOD_API_KEY", "rp_key_0123")
        with hostile_http.runpod(hostile_http.json_answer({"data": {"saveTemplate": {"id": "t1"}}})) as api:
            args = ["--create", "--allow-private-registry", "--api-url", f"{api.url}/graphql"]
            res = _run(app, runner, tmp_path, "runpod-template", image, *args)
            assert res.exit_code == 2 and "without registry credentials cannot pull" in res.output, res.output
            assert "--registry-auth ID" in res.output and api.seen == [] and "s3cret" not in res.output
    finally:
        reg.stop()


def test_a_release_the_index_records_is_read_from_its_record_not_the_registry(app, runner, tmp_path):
    """The record says more (the self-test, the size, JupyterLab): a reference it records asks no registry."""
    with hostile_http.registry() as reg:
        tag = f"{reg.address}/{REPO}:{TAG}"
        entry = {
            "tag": tag, "alias": f"{reg.address}/{REPO}:{CELL.id}", "digest": "sha256:" + "a" * 64,
            "size_bytes": 5_000_000_000, "lock_hash": "b" * 64, "selftest": {"passed": True},
            "manifest": {"cell": {"id": CELL.id, "cuda": "12.4", "torch": "2.5.1"}},
        }  # fmt: skip
        index = tmp_path / "index.json"
        index.write_text(json.dumps({"schema": 1, "images": {tag: entry}}))
        res = runner.invoke(app, ["runpod-template", tag, "--release-index", str(index)])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["variables"]["input"]["imageName"] == tag and reg.seen == []
        assert "from the image's labels" not in res.output


@pytest.mark.parametrize(
    ("labels", "says"),
    [
        (None, "is not an imagekit image: its config has no imagekit.* labels"),
        ({"org.opencontainers.image.title": "nginx"}, "is not an imagekit image"),
        ({"imagekit.cell": CELL.id}, "its config has no imagekit.cuda, imagekit.torch label"),
        ("runtime driver", "imagekit.runtime driver_min"),
        ("runtime cuda", "imagekit.runtime cuda"),
        ("runtime platform", "imagekit.runtime names linux/arm64, the image is linux/amd64"),
        ("escapes", "is not a short single-line text"),
        ("bad cuda", "imagekit.cuda"),
        ("bad cell", "manifest.cell.id"),
    ],
)
def test_an_image_that_is_not_imagekits_or_whose_labels_lie_is_refused(
    app, runner, tmp_path, published, labels_registry, labels, says
):
    real = published["labels"]
    mutations = {
        "runtime driver": with_runtime(real, driver_min="525.60.13; rm -rf /"),
        "runtime cuda": with_runtime(real, cuda="11.8"),
        "runtime platform": with_runtime(real, platform="linux/arm64"),
        "escapes": real | {"imagekit.torch": "2.5.1\x1b[2J\nerror: spoofed"},
        "bad cuda": real | {"imagekit.cuda": "cu124"},
        "bad cell": real | {"imagekit.cell": "../../etc"},
    }
    made = mutations.get(labels, labels) if isinstance(labels, str) else labels
    push_image(RegistryClient(), Remote(labels_registry.address, REPO), config_of(made), "not-ours")
    for command in (["runpod-template"], ["vast-template"], ["pod", "create", "--gpu", H100, "--dry-run"]):
        res = _run(app, runner, tmp_path, *command, ref(published, "not-ours"))
        assert res.exit_code == 2, res.output
        assert "error:" in res.output and "hint:" in res.output and says in res.output, res.output
        assert "\x1b" not in res.output and not any(
            line.startswith("error: spoofed") for line in res.output.splitlines()
        )


def test_a_reference_the_registry_lacks_or_that_names_no_image(app, runner, tmp_path, published):
    res = _run(app, runner, tmp_path, "runpod-template", ref(published, "never-pushed"))
    assert res.exit_code == 2 and "the registry has no such image" in res.output and "hint:" in res.output
    res = _run(app, runner, tmp_path, "runpod-template", CELL.id)
    assert res.exit_code == 2 and "REGISTRY/REPO:TAG" in res.output  # a cell id the index lacks: how to name the image
    res = _run(app, runner, tmp_path, "runpod-template", "127.0.0.1:9/acme/train:x")  # nothing listens
    assert res.exit_code == 3 and "unreachable" in res.output and "hint:" in res.output


def test_a_registry_that_serves_other_bytes_than_a_digest_names_is_refused(app, runner, tmp_path, data):
    """The config is fetched by digest: a registry serving other labels under it is refused before they are read."""
    with hostile_http.registry() as reg:
        honest = json.dumps(config_of(real_labels(data))).encode()
        lying = json.dumps(config_of(with_runtime(real_labels(data), sass=["sm_50"], ptx=None))).encode()
        layer = reg.add_blob(b"layer")
        doc = {
            "schemaVersion": 2,
            "mediaType": media_types.DOCKER_MANIFEST,
            "config": {"mediaType": media_types.DOCKER_CONFIG, "size": len(honest), "digest": _sha(honest)},
            "layers": [{"mediaType": media_types.DOCKER_LAYER_GZIP, "size": 5, "digest": layer}],
        }
        reg.add_manifest(REPO, "lying", json.dumps(doc).encode())
        reg.serve_blob_as(REPO, _sha(honest), lying)
        res = _run(app, runner, tmp_path, "runpod-template", f"{reg.address}/{REPO}:lying")
    assert res.exit_code == 3 and "served other bytes than" in res.output and "hint:" in res.output, res.output


def test_the_service_reads_what_the_cli_shows(published):
    """`remote_contract.from_registry` alone: the entry the templates read, checked as a record is."""
    made = remote_contract.from_registry(ref(published))
    assert made["pinned"] is True and made["digest"] == published["amd64"]
    assert made["manifest"]["runtime"]["cuda"] == "12.4" and made["manifest"]["cell"]["id"] == CELL.id
    assert made["size_bytes"] == 2 * made["compressed_bytes"] > 0
    assert not remote_contract.is_image_reference(CELL.id) and remote_contract.is_image_reference(ref(published))


@pytest.mark.docker
def test_an_image_imagekit_built_and_published_makes_its_template_without_a_record(
    engine, registry, fake_index, app, runner, tmp_path, data
):
    """The whole way, for real: `imagekit build` (a fast cell from stub wheels; its self-test fails by design, so the
    image is published through the publish service, as tests/matrix/test_ci_docker.py does) pushes an image whose
    labels imagekit wrote, under an index with its SBOM attestation; with no release record on this machine, its
    RunPod template carries the contract imagekit derives for the cell, pinned to the image's digest."""
    import os
    import subprocess
    import sys

    from imagekit.clouds import runpod
    from imagekit.compat import contract
    from imagekit.effects.docker import Engine
    from imagekit.services.builds.selftest_runner import SelfTestReport
    from imagekit.services.publishing import publish

    home, repo = tmp_path / "ci-runner", f"{registry.address}/imagekit-test/labels"
    (home / "locks").mkdir(parents=True)
    (home / "imagekit.toml").write_text(
        '[matrix]\ninclude = [{cuda = "12.4", torch = "2.5.1", transformers = "4.48.2", python = "3.11"}]\n'
    )
    argv = [sys.executable, "-m", "imagekit", "build", "--cell", CELL.id, "--registry", repo, "--push", "--json"]
    argv += ["--quiet", "--lock-dir", str(home / "locks"), "--state-dir", str(home / "state"), "--gpus", "off"]
    argv += ["--release-index", str(home / "index.json"), "--index-url", fake_index]
    env = {**os.environ, "UV_CACHE_DIR": str(home / "uv-cache")}
    built = subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True, timeout=1500)
    (result,) = json.loads(built.stdout)
    assert result["step"] == "self-test" and result["image_id"], built.stderr[-3000:]  # the stub torch: by design
    report = SelfTestReport(result["image_id"], True, {"passed": True, "checks": []})
    tag = result["tag"].rsplit(":", 1)[1]
    published = publish.publish(
        Engine(), RegistryClient(), image_id=result["image_id"], repository=repo, immutable_tag=tag,
        alias_tag=CELL.id, report=report, sbom_doc={"spdxVersion": "SPDX-2.3", "packages": []},
    )  # fmt: skip
    try:
        res = _run(app, runner, tmp_path, "runpod-template", f"{repo}:{tag}")
        assert res.exit_code == 0, res.output
        tpl = json.loads(res.stdout)["variables"]["input"]
        assert tpl["imageName"] == f"{repo}:{tag}@{published.digest}" and published.tag_digest != published.digest
        for line in runpod.rent_lines(contract.of_cell(CELL, data), data):  # what a record of the cell would say
            assert line in tpl["readme"]
    finally:
        engine.remove(f"{repo}:{tag}")
