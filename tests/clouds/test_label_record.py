"""`clouds.label_record`: a release entry from an image config's imagekit labels (pure), as the templates and `pod
create` read it for an image the release index does not record. The registry side is tests/services/
test_remote_contract.py; here the labels alone, as a hostile registry could send them."""

from __future__ import annotations

import dataclasses

import pytest

from imagekit.clouds import label_record, runpod, vast
from imagekit.compat import contract
from imagekit.errors import UsageError
from imagekit.services.pods import remote_contract
from tests.services.test_remote_contract import CELL, config_of, real_labels, with_runtime

REPO = "ghcr.io/acme/train"
DIGEST = "sha256:" + "e" * 64


def test_the_entry_carries_the_labels_contract_and_is_pinned(data):
    made = label_record.entry(REPO, f"{CELL.id}-0123456789ab", DIGEST, config_of(real_labels(data)), 3_000_000_000)
    assert made["tag"] == f"{REPO}:{CELL.id}-0123456789ab" and made["alias"] == f"{REPO}:{CELL.id}"
    assert made["pinned"] is True and made["source"] == f"the image's labels at {REPO}@{DIGEST}"
    assert made["size_bytes"] == 6_000_000_000 and made["compressed_bytes"] == 3_000_000_000
    runtime = contract.from_record(made, data)
    assert runtime == dataclasses.replace(contract.of_cell(CELL, data), driver_full=None)  # the label, read back
    assert runtime.cuda == "12.4" and "sm_90" in runtime.sass and runtime.platform == "linux/amd64"
    tpl = runpod.template(made, runtime=runtime, data=data)
    assert tpl["imageName"] == f"{REPO}:{CELL.id}-0123456789ab@{DIGEST}"  # pinned without --digest
    assert tpl["containerDiskInGb"] == 19 + 1  # 6 GB estimated: 6 x 1.5 + 10 = 19, at least 20
    body = vast.template(made, runtime=runtime, data=data)
    assert (body["image"], body["tag"]) == (REPO, f"{CELL.id}-0123456789ab@{DIGEST}")


def test_the_runtime_label_decides_not_the_cells_facts(data):
    """An image whose label says sm_90 only: that is the contract, whatever the facts say of its cell."""
    labels = with_runtime(real_labels(data), sass=["sm_90"], ptx=None, driver_min="550.54.14")
    runtime = contract.from_record(label_record.entry(REPO, "t", DIGEST, config_of(labels), 1), data)
    assert runtime.sass == ("sm_90",) and runtime.ptx is None and runtime.driver_min == "550.54.14"


def test_an_image_built_before_the_contract_gets_it_from_its_cells_facts(data):
    labels = {k: v for k, v in real_labels(data).items() if k != "imagekit.runtime"}
    made = label_record.entry(REPO, None, DIGEST, config_of(labels), 1)
    assert "runtime" not in made["manifest"] and made["tag"] == f"{REPO}:{CELL.id}"  # by digest: the alias, pinned
    assert contract.from_record(made, data) == contract.of_cell(CELL, data)


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ([], "no imagekit.* labels"),
        ({"config": {"Labels": ["imagekit.cell"]}}, "Labels is not an object"),
        ({"config": None}, "no imagekit.* labels"),
        ({"os": "linux", "architecture": "amd64", "config": {"Labels": {"imagekit.cell": 7}}}, "no imagekit.cuda"),
        ({"os": "windows", "architecture": "amd64", "config": {"Labels": "real"}}, "not an object"),
    ],
)
def test_configs_of_another_shape_are_refused(config, says):
    with pytest.raises(UsageError, match=says.replace("*", r"\*")) as info:
        label_record.entry(REPO, "t", DIGEST, config, 1)
    assert info.value.hint and info.value.exit_code == 2


def test_a_config_of_another_platform_or_lying_labels_is_refused(data):
    labels = real_labels(data)
    for config, says in (
        (config_of(labels, "s390x"), "platform 'linux/s390x'"),
        (config_of(labels | {"imagekit.archs": "sm_90,../x"}), "imagekit.archs"),
        (config_of(labels | {"imagekit.runtime": "x" * 2000}), "not a short single-line text"),
        (config_of(with_runtime(labels, sass=[])), "imagekit.runtime sass"),
        (config_of(labels | {"imagekit.python": 3.11}), "label imagekit.python '3.11' is not a short single-line text"),
    ):
        with pytest.raises(UsageError, match=says):
            label_record.entry(REPO, "t", DIGEST, config, 1)


@pytest.mark.parametrize(
    ("ref", "is_image"),
    [
        (CELL.id, False),
        (f"{CELL.id}-0123456789ab", False),
        (f"{REPO}:{CELL.id}", True),
        (f"{REPO}@{DIGEST}", True),
        ("acme/train:v1", True),  # Docker Hub
        (REPO, False),  # no tag, no digest
        ("ghcr.io/Acme/train:v1", False),  # not of the grammar
    ],
)
def test_what_counts_as_an_image_reference(ref, is_image):
    assert remote_contract.is_image_reference(ref) is is_image
