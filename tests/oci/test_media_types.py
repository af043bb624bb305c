"""One table of media types and annotation keys: every module names them from imagekit.oci.media_types."""

from __future__ import annotations

import re

from imagekit.oci import media_types
from tests.conftest import ROOT

# What an OCI or Docker media type, or one of the annotation keys imagekit writes, looks like in source.
_NAMED = re.compile(
    r"application/vnd\.(oci|docker|in-toto|dev\.cosign)|vnd\.docker\.reference\.|in-toto\.io/predicate-type"
    r"|dev\.cosignproject\.cosign/signature|attestation-manifest"
)


def test_no_module_but_the_table_spells_a_media_type_or_annotation_key():
    table = ROOT / "imagekit" / "oci" / "media_types.py"
    spelled = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "imagekit").rglob("*.py"))
        if path != table
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if _NAMED.search(line)
    ]
    assert not spelled, f"import these from imagekit.oci.media_types: {spelled}"


def test_the_groups_hold_what_their_names_say():
    assert media_types.IMAGE_MANIFESTS == (media_types.DOCKER_MANIFEST, media_types.OCI_MANIFEST)
    assert media_types.INDEXES == (media_types.DOCKER_MANIFEST_LIST, media_types.OCI_INDEX)
    assert set(media_types.ACCEPTED) == {*media_types.IMAGE_MANIFESTS, *media_types.INDEXES}
    values = [v for k, v in vars(media_types).items() if k.isupper() and isinstance(v, str)]
    assert len(values) == len(set(values))  # one name per type or key
