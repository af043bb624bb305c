"""imagekit.toml's schema agrees with everything that names its keys: the parser, ImageOptions, the `matrix --help`
reference, init's file and docs/cli.md (through gen-docs' own test)."""

from __future__ import annotations

import tomllib
from dataclasses import fields

import pytest

from imagekit.cli.matrix_cmd import EPILOG
from imagekit.errors import ConfigError
from imagekit.image.image_options import ImageOptions
from imagekit.matrix import init_document, matrix_file, schema
from imagekit.services import inputs

_CELL = {"cuda": ["12.4"], "torch": ["2.5.1"], "transformers": ["4.48.2"], "python": ["3.11"]}
_EXAMPLE_FILLS = {"<64 hex digits>": "ab" * 32}


@pytest.fixture(scope="module")
def data():
    return inputs.compat_data()


def _value(k: schema.Key) -> object:
    text = k.example
    for old, new in _EXAMPLE_FILLS.items():
        text = text.replace(old, new)
    return tomllib.loads(f"v = {text}")["v"]


def _doc_with(k: schema.Key) -> dict:
    """A small valid matrix with ``k`` set to its example (and the keys it needs)."""
    doc: dict = {"matrix": dict(_CELL)}
    for other in (*k.needs, k.name):
        row = schema.key(f"{k.section}.{other}")
        table = doc
        for part in ("bases", "3.11") if row.section.startswith("bases") else (row.section,):
            table = table.setdefault(part, {})
        table[row.name] = _value(row)
    if k.section.startswith("bases"):  # a base's table needs its reference and glibc
        doc["bases"]["3.11"].update({n: _value(schema.key(f'bases."3.11".{n}')) for n in ("reference", "glibc")})
    return doc


@pytest.mark.parametrize("k", schema.KEYS, ids=lambda k: k.path)
def test_each_key_with_its_example_is_a_valid_matrix(k: schema.Key, data) -> None:
    """Every row is a key the parser takes, and its example is a value it takes."""
    matrix_file.parse(_doc_with(k), "schema", data)


@pytest.mark.parametrize("section", schema.SECTIONS)
def test_a_key_the_schema_does_not_name_is_refused_with_the_ones_it_does(section: str, data) -> None:
    doc: dict = {"matrix": dict(_CELL)}
    table = doc.setdefault(section, {})
    if section == "bases":
        table = table.setdefault("3.11", {"reference": "r@sha256:" + "ab" * 32, "glibc": "2.36"})
    table["colour"] = "blue"
    with pytest.raises(ConfigError) as exc:
        matrix_file.parse(doc, "schema", data)
    assert any("colour" in p and ", ".join(schema.names(section)) in p for p in exc.value.problems)


def test_image_options_are_the_image_rows() -> None:
    """A field of ImageOptions the file sets is a row of the schema, and each row of [image] but the repository is a
    field: adding one without the other fails here."""
    fields_of_file = {f.name for f in fields(ImageOptions) if f.metadata.get("image_key")}
    assert fields_of_file == set(schema.names("image")) - {"repository"}
    switches = {k.name for k in schema.KEYS if k.section == "image" and k.type == "true or false"}
    assert set(ImageOptions.switches()) == switches
    for f in fields(ImageOptions):
        if f.name in switches:
            assert schema.key(f"image.{f.name}").default == str(f.default).lower()


def test_the_help_reference_and_init_file_show_every_key() -> None:
    written = init_document.document({a: tuple(v) for a, v in _CELL.items()}, (), "ghcr.io/acme/train")
    for k in schema.KEYS:
        assert f"\n{k.name} = {k.example}" in EPILOG, k.path
        assert f"{k.name} = " in written, k.path


def test_the_reference_lists_the_sections_in_the_files_order() -> None:
    headings = [line for line in schema.reference().splitlines() if line.startswith("[")]
    assert headings == [f"[{s}]" for s in ("matrix", "targets", "image", "lock", 'bases."3.11"')]
