"""The SBOM from what is known (supplychain/sbom.py, dpkg_status.py): the lock and the image's dpkg database as
SPDX 2.3 (checked by spdx-tools), and the attestation pieces as BuildKit stores them; then a build that publishes the
image and its SBOM under one tag (fake engine and registry: the publishing logic, in seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from spdx_tools.spdx.parser.parse_anything import parse_file
from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

from imagekit.errors import CheckFailed
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.supplychain import dpkg_status, sbom
from tests.fakes import DPKG_STATUS
from tests.services.test_build_steps import setup  # noqa: F401 (the fake engine and registry of a build)

H = "sha256:" + "1" * 64
LOCK = Lock(
    (LockEntry("nvidia-nccl-cu12", "2.18.1", (H,)), LockEntry("torch", "2.5.1+cu124", (H, "sha256:" + "2" * 64))),
    (LockEntry("transformers", "4.48.2", (H,)), LockEntry("acme-kernels", "1.0", (H,), url="https://x.test/a.whl")),
    meta={"index": "https://pypi.org/simple"},
)
FACTS = sbom.ImageFacts(
    cell="cu124-torch2.5.1-py3.11-tf4.48.2",
    repository="registry.test/team/train",
    tag="cu124-torch2.5.1-py3.11-tf4.48.2-abc",
    image_id="sha256:" + "c" * 64,
    platform="linux/amd64",
    base="imagekit/base:debian-bookworm-x",
    distro="debian-12",
    created=1735689600,
    tool="imagekit-0.1.0",
)


def test_dpkg_status_lists_installed_packages_with_their_source():
    pkgs = dpkg_status.parse(DPKG_STATUS.encode())
    assert [p.name for p in pkgs] == ["base-files", "bsdutils"]  # "config-files" only: not installed
    bsd = pkgs[1]
    assert (bsd.version, bsd.source, bsd.source_version) == ("1:2.38.1-5+deb12u3", "util-linux", "2.38.1-5+deb12u3")
    assert (pkgs[0].source, pkgs[0].source_version) == ("base-files", "12.4+deb12u15")  # no Source: itself


@pytest.mark.parametrize(
    "stanza",
    [
        "Package: ../../etc\nStatus: install ok installed\nVersion: 1\nArchitecture: amd64\n",
        "Package: a\nStatus: install ok installed\nVersion: 1 && rm -rf /\nArchitecture: amd64\n",
        "Package: a\nStatus: install ok installed\nVersion: 1\nArchitecture: amd64\nSource: b (1) extra\n",
        "Package: a\nStatus: install ok installed\nVersion: \nArchitecture: amd64\n",
    ],
)
def test_a_hostile_status_file_is_refused_naming_the_file(stanza):
    with pytest.raises(CheckFailed, match="dpkg/status"):
        dpkg_status.parse(stanza.encode())


def test_a_status_file_too_large_is_refused_before_it_is_read():
    with pytest.raises(CheckFailed, match="larger than"):
        dpkg_status.parse(b"x" * (dpkg_status.MAX_BYTES + 1))


def _doc() -> dict:
    return sbom.document(FACTS, LOCK, dpkg_status.parse(DPKG_STATUS.encode()))


def test_the_document_is_valid_spdx_2_3_by_spdx_tools(tmp_path):
    path = tmp_path / "image.spdx.json"
    path.write_text(json.dumps(_doc()))
    problems = validate_full_spdx_document(parse_file(str(path)))
    assert problems == [], [p.validation_message for p in problems]


def test_every_lock_entry_and_debian_package_is_listed_with_its_purl_layer_and_hashes():
    doc = _doc()
    assert sbom.counts(doc) == {"python": 4, "dpkg": 2}
    by_id = {p["SPDXID"]: p for p in doc["packages"]}
    torch = by_id["SPDXRef-Python-torch"]
    assert torch["externalRefs"][0]["referenceLocator"] == "pkg:pypi/torch@2.5.1%2Bcu124"
    assert "layer torch (/opt/venv)" in torch["comment"] and "2222" in torch["comment"]
    assert "checksums" not in torch  # two files in the lock: which one the image holds is not claimed
    assert by_id["SPDXRef-Python-transformers"]["checksums"] == [{"algorithm": "SHA256", "checksumValue": "1" * 64}]
    assert by_id["SPDXRef-Python-transformers"]["downloadLocation"] == "https://pypi.org/simple/transformers/"
    assert by_id["SPDXRef-Python-acme-kernels"]["downloadLocation"] == "https://x.test/a.whl"
    assert "layer cuda-" in by_id["SPDXRef-Python-nvidia-nccl-cu12"]["comment"]
    bsd = by_id["SPDXRef-Deb-bsdutils-amd64"]
    assert bsd["externalRefs"][0]["referenceLocator"] == (
        "pkg:deb/debian/bsdutils@1:2.38.1-5%2Bdeb12u3?arch=amd64&upstream=util-linux&distro=debian-12"
    )
    assert bsd["sourceInfo"] == "built package from: util-linux 2.38.1-5+deb12u3"
    image = by_id["SPDXRef-Image"]
    assert image["checksums"][0]["checksumValue"] == "c" * 64 and image["primaryPackagePurpose"] == "CONTAINER"
    contained = {r["relatedSpdxElement"] for r in doc["relationships"] if r["relationshipType"] == "CONTAINS"}
    assert contained == set(by_id) - {"SPDXRef-Image"}


def test_the_same_inputs_give_the_same_bytes():
    assert sbom.canonical(_doc()) == sbom.canonical(_doc())
    assert _doc()["creationInfo"]["created"] == "2025-01-01T00:00:00Z"  # SOURCE_DATE_EPOCH, not the clock


def test_the_attestation_is_stored_as_buildkit_stores_it():
    image_digest = "sha256:" + "d" * 64
    statement = sbom.statement(_doc(), "pkg:docker/registry.test/team/train@t?platform=linux%2Famd64", image_digest)
    body = json.loads(statement)
    assert body["_type"] == "https://in-toto.io/Statement/v0.1" and body["predicateType"] == "https://spdx.dev/Document"
    assert body["subject"][0]["digest"] == {"sha256": "d" * 64} and body["predicate"]["spdxVersion"] == "SPDX-2.3"
    att = sbom.attestation(statement)
    manifest = json.loads(att.manifest)
    layer = manifest["layers"][0]
    assert layer["mediaType"] == "application/vnd.in-toto+json" and layer["digest"] == sbom.digest(statement)
    assert layer["annotations"] == {"in-toto.io/predicate-type": "https://spdx.dev/Document"}
    config = json.loads(att.config)
    assert config["rootfs"]["diff_ids"] == [sbom.digest(statement)] and config["os"] == "unknown"
    index = json.loads(sbom.index("application/vnd.docker.distribution.manifest.v2+json", image_digest, 1234,
                                  "linux/amd64", att))  # fmt: skip
    image, attestation = index["manifests"]  # the runnable image first, its attestation after
    assert image["platform"] == {"architecture": "amd64", "os": "linux"} and image["digest"] == image_digest
    assert attestation["platform"] == {"architecture": "unknown", "os": "unknown"}
    assert attestation["annotations"] == {
        "vnd.docker.reference.digest": image_digest,
        "vnd.docker.reference.type": "attestation-manifest",
    }
    assert attestation["digest"] == att.manifest_digest and attestation["size"] == len(att.manifest)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n', "debian-12"),
        ('ID=ubuntu\nVERSION_ID="24.04"\n', "ubuntu-24.04"),
        ("ID=debian\n", "debian"),
        ("ID=$(reboot)\n", "unknown"),
        ("", "unknown"),
    ],
)
def test_the_distro_comes_from_os_release_checked(text, want):
    assert sbom.distro(text) == want


# ---- a build publishing the image and its SBOM (fake engine and registry) ------------------------------------------
@pytest.mark.resolver  # its lock is a real uv resolution against a loopback index
@pytest.mark.loopback
def test_a_published_tag_names_the_image_and_its_sbom_and_the_record_says_so(setup):  # noqa: F811
    from imagekit.effects.registry import Remote
    from imagekit.oci import image_index, media_types
    from tests.services.test_build_steps import CELL, REPO, _build

    engine, registry, opts = setup
    res, _ = _build(engine, registry, opts)
    assert res.status == "published", res.error and res.error.render()
    written = json.loads(Path(res.sbom["path"]).read_text())
    assert res.sbom["dpkg"] == 2 and res.sbom["python"] == sbom.counts(written)["python"] >= 2
    remote = Remote.parse(REPO)
    tag = res.tag.rsplit(":", 1)[1]
    _, body, _ = registry.manifest_raw(remote, tag)
    index = json.loads(body)
    assert index["mediaType"] == media_types.OCI_INDEX and len(index["manifests"]) == 2
    assert image_index.entries_of(index)[0].digest == res.digest  # a puller gets the image, by its digest
    att = registry.manifests[(remote.name, index["manifests"][1]["digest"])]
    statement = json.loads(registry.data[att["layers"][0]["digest"]])
    assert statement["subject"][0]["digest"]["sha256"] == res.digest.removeprefix("sha256:")
    assert statement["predicate"] == written
    entry = json.loads(opts.release_index.read_text())["images"][res.tag]
    assert entry["digest"] == res.digest and entry["tag_digest"] != res.digest
    assert entry["sbom"]["python"] == res.sbom["python"] and entry["sbom"]["dpkg"] == 2
    assert entry["sbom"]["document"] == sbom.digest(sbom.canonical(written))
    assert registry.manifest_raw(remote, CELL.id)[1] == body  # the alias names the same index
    # a rebuild finds the image in the index: published once, the tag untouched
    engine.calls.clear()
    again, _ = _build(engine, registry, opts)
    assert again.status == "published" and again.digest == res.digest
    assert ("registry.put_manifest", tag) not in engine.calls and "push" not in [c[0] for c in engine.calls]


def test_the_layers_named_are_the_plans_the_cuda_compiler_its_own():
    """The build hands its plan's layering: with `[image] cuda_toolkit`, the compiler's wheels are a layer of their own
    (`image.layering.split`), and the SBOM says so rather than splitting the lock again its default way."""
    from imagekit.image import layering

    lock = Lock(
        (LockEntry("nvidia-cuda-nvcc", "13.0.88", (H,)), LockEntry("torch", "2.14.1", (H,))),
        (LockEntry("ninja", "1.13.0", (H,)),),
        meta={"index": "https://pypi.org/simple"},
    )

    def layer_of(doc: dict, name: str) -> str:
        (pkg,) = [p for p in doc["packages"] if p.get("name") == name]
        return pkg["comment"].split()[1]

    plan = layering.split(lock, cuda_toolkit=True)
    (compiler,) = [layer.name for layer in plan.layers if any(e.name == "nvidia-cuda-nvcc" for e in layer.entries)]
    planned = sbom.document(FACTS, lock, [], plan)
    assert layer_of(planned, "nvidia-cuda-nvcc") == compiler != layer_of(sbom.document(FACTS, lock, []),
                                                                        "nvidia-cuda-nvcc")  # fmt: skip
