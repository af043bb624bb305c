"""The wheel-build stage's pure part: which archive, what the build needs, how a lock records a built wheel and how a
build is keyed. What a lock records is read back as data: each field is checked."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from packaging.specifiers import SpecifierSet

from imagekit.errors import CheckFailed, ConfigError, UsageError
from imagekit.locking import source_builds as sb
from imagekit.locking.wheel_choice import Candidate
from imagekit.matrix import matrix_file
from imagekit.model import Cell
from imagekit.services import inputs

SHA_A, SHA_B = "a" * 64, "b" * 64
BUILT = sb.Built(
    "deepspeed", "0.19.8", "https://files.example/deepspeed-0.19.8.tar.gz", SHA_A,
    "deepspeed-0.19.8-py3-none-any.whl", SHA_B, (f"packaging==26.4 sha256:{SHA_A}",),
)  # fmt: skip


def _files(*names: str, sha: str = SHA_A) -> list[Candidate]:
    return [Candidate(n, f"https://files.example/{n}", sha) for n in names]


def test_the_newest_archive_the_requirements_allow_is_chosen():
    files = _files(
        "deepspeed-0.17.1.tar.gz", "deepspeed-0.19.8.tar.gz", "deepspeed-0.20.0rc1.tar.gz", "deepspeed-0.18.0.zip",
        "deepspeed-0.19.9-py3-none-any.whl", "deepspeed_extra-1.0.tar.gz",
    )  # fmt: skip
    assert sb.pick_sdist("deepspeed", SpecifierSet(">=0.17.2"), files, "PyPI").version == "0.19.8"
    assert sb.pick_sdist("deepspeed", SpecifierSet("<0.19"), files, "PyPI").filename == "deepspeed-0.18.0.zip"
    assert sb.pick_sdist("deepspeed", SpecifierSet("==0.20.0rc1"), files, "PyPI").version == "0.20.0rc1"


def test_no_archive_with_a_hash_that_fits_is_an_error_with_the_fix():
    with pytest.raises(CheckFailed) as caught:
        sb.pick_sdist("deepspeed", SpecifierSet(">=1"), _files("deepspeed-0.19.8.tar.gz"), "PyPI")
    assert "deepspeed >=1" in caught.value.message and "pip download" in caught.value.hint
    with pytest.raises(CheckFailed):  # listed without a sha256: never chosen
        sb.pick_sdist("deepspeed", SpecifierSet(), _files("deepspeed-0.19.8.tar.gz", sha=""), "PyPI")


def test_the_specifier_gathers_every_requirement_of_the_name_and_refuses_a_url():
    spec = sb.specifier_of("deepspeed", ("DeepSpeed>=0.17.2", "deepspeed<0.20; python_version>'3'", "numpy"))
    assert spec == SpecifierSet(">=0.17.2,<0.20")
    with pytest.raises(UsageError) as caught:
        sb.specifier_of("deepspeed", ("deepspeed @ https://h/deepspeed-1-py3-none-any.whl#sha256=" + SHA_A,))
    assert "either from a wheel URL or from its source archive" in caught.value.hint


def test_build_requirements_come_from_the_archives_pyproject_else_pep_517s_fallback():
    assert sb.build_requires(None) == (list(sb.DEFAULT_REQUIRES), "setuptools.build_meta:__legacy__")
    assert sb.build_requires("[project]\nname='x'\n")[0] == list(sb.DEFAULT_REQUIRES)
    text = '[build-system]\nrequires = ["setuptools>=70", "cython<4"]\nbuild-backend = "setuptools.build_meta"\n'
    assert sb.build_requires(text) == (["setuptools>=70", "cython<4"], "setuptools.build_meta")
    for bad in ("[build-system\n", '[build-system]\nrequires = "setuptools"\n', '[build-system]\nrequires = ["!!"]\n'):
        with pytest.raises(CheckFailed):
            sb.build_requires(bad)


def test_a_built_wheel_round_trips_through_the_lock_header():
    key, value = BUILT.meta()
    assert key == "built-deepspeed" and "\n" not in value
    assert sb.recorded({key: value, "cell": "x"}) == {"deepspeed": BUILT}


@pytest.mark.parametrize(
    "field, value",
    [
        ("wheel-sha256", "B" * 64),
        ("sdist-sha256", "a" * 63),
        ("sdist", "file:///etc/passwd"),
        ("wheel", "numpy-0.19.8-py3-none-any.whl"),  # another package's wheel
        ("wheel", "deepspeed-0.19.9-py3-none-any.whl"),  # another version
        ("wheel", "../deepspeed-0.19.8-py3-none-any.whl"),
        ("requires", ["packaging==26.4"]),  # no hash
        ("requires", "packaging==26.4 sha256:" + SHA_A),
        ("version", 1),
    ],
)
def test_a_tampered_record_is_refused(field, value):
    key, raw = BUILT.meta()
    doc = json.loads(raw)
    doc[field] = value
    with pytest.raises(CheckFailed, match="built from source is unreadable"):
        sb.recorded({key: json.dumps(doc)})
    with pytest.raises(CheckFailed):
        sb.recorded({"built-DeepSpeed": raw})  # a key that is not the canonical name
    with pytest.raises(CheckFailed):
        sb.recorded({key: "{not json"})


def test_the_build_key_changes_with_every_input():
    args = (SHA_A, "imagekit/base:x@sha256:1", "3.11", "x86_64-manylinux_2_28", ["torch==2.5.1 sha256:1"], {})
    key = sb.build_key(*args)
    assert key == sb.build_key(*args[:4], list(reversed(args[4])), {})  # order of the pins does not matter
    for i, other in enumerate((SHA_B, "imagekit/base:y@sha256:1", "3.12", "aarch64-manylinux_2_28", ["torch==2.5.0"])):
        changed = list(args)
        changed[i] = other
        assert sb.build_key(*changed) != key, i
    assert sb.build_key(*args[:5], {"DS_BUILD_OPS": "1"}) != key


def test_build_requirements_are_written_with_their_hashes_only_from_well_formed_pins():
    text = sb.requirements_text([f"wheel==0.48.0 sha256:{SHA_B}", f"packaging==26.4 sha256:{SHA_A}"])
    assert text == f"packaging==26.4 --hash=sha256:{SHA_A}\nwheel==0.48.0 --hash=sha256:{SHA_B}\n"
    with pytest.raises(CheckFailed):
        sb.requirements_text(["packaging==26.4 --index-url http://evil"])


def _parse(extra: str) -> matrix_file.MatrixConfig:
    text = f'[matrix]\ncuda = ["12.4"]\ntorch = ["2.5.1"]\ntransformers = ["4.48.2"]\npython = ["3.11"]\n{extra}'
    import tomllib

    return matrix_file.parse(tomllib.loads(text), "imagekit.toml", inputs.compat_data())


def test_the_matrix_names_the_packages_built_from_source_and_every_cell_carries_them():
    config = _parse('packages = ["DeepSpeed>=0.17"]\nfrom_source = ["DeepSpeed", "deepspeed"]\n')
    assert {c.from_source for c in config.cells} == {("deepspeed",)}
    for bad, said in (('"deepspeed"', "a list"), ('["torch"]', "axes"), ('["a b"]', "not a package name")):
        with pytest.raises(ConfigError) as caught:
            _parse(f"from_source = {bad}\n")
        assert said in caught.value.render()


def test_a_cell_without_packages_built_from_source_is_described_as_before():
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11")
    assert "from_source" not in cell.to_json()
    assert replace(cell, from_source=("deepspeed",)).to_json()["from_source"] == ("deepspeed",)
