"""The image's options from a command's flags: `--variant FORMAT` (and `--zstd`, its shorthand) name the publish
formats beside gzip from the one table (oci.publish_formats); an unknown one is refused naming the known ones."""

from __future__ import annotations

import pytest

from imagekit.cli.options import image_options
from imagekit.errors import UsageError
from imagekit.matrix import matrix_file
from imagekit.oci import publish_formats
from imagekit.services import inputs


def _config():  # type: ignore[no-untyped-def]
    return matrix_file.parse(matrix_file.default_document(), "<default>", inputs.compat_data())


def test_zstd_is_the_zstd_variant_and_variants_come_from_the_formats_table(monkeypatch):
    config = _config()
    assert image_options(config).variants == ()
    assert image_options(config, zstd=True).variants == ("zstd",)
    assert image_options(config, zstd=True, variants=["zstd"]).variants == ("zstd",)
    monkeypatch.setitem(publish_formats.FORMATS, "estargz", publish_formats.FORMATS["zstd"])  # a third format: a line
    assert image_options(config, variants=["estargz", "zstd"]).variants == ("estargz", "zstd")


@pytest.mark.parametrize("name", ["gzip", "nope", ""])
def test_an_unknown_variant_or_the_default_format_is_refused(name):
    with pytest.raises(UsageError) as exc:
        image_options(_config(), variants=[name])
    assert "zstd" in exc.value.hint
