"""Matrix files: product/exclude/include semantics, every error at once, pyproject's [tool.imagekit]."""

from __future__ import annotations

import pytest

from imagekit.errors import ConfigError
from imagekit.matrix import matrix_file as matrix
from imagekit.services import inputs


def test_product_exclude_include(data):
    doc = {
        "matrix": {
            "cuda": ["11.8", "12.4"],
            "torch": ["2.5.1"],
            "transformers": ["4.48.2"],
            "python": ["3.10", "3.11"],
            "exclude": [{"cuda": "11.8", "python": "3.10"}],
            "include": [
                {
                    "cuda": "12.6",
                    "torch": "2.7.1",
                    "transformers": "5.9.0",
                    "python": "3.12",
                    "packages": ["accelerate==1.10.1"],
                }
            ],
            "packages": ["accelerate==1.2.1"],
        }
    }
    config = matrix.parse(doc, "m.toml", data)
    ids = {c.id: c for c in config.cells}
    assert set(ids) == {
        "cu118-torch2.5.1-py3.11-tf4.48.2",
        "cu124-torch2.5.1-py3.10-tf4.48.2",
        "cu124-torch2.5.1-py3.11-tf4.48.2",
        "cu126-torch2.7.1-py3.12-tf5.9.0",
    }
    assert ids["cu124-torch2.5.1-py3.10-tf4.48.2"].packages == ("accelerate==1.2.1",)
    assert ids["cu126-torch2.7.1-py3.12-tf5.9.0"].packages == ("accelerate==1.10.1",)


def test_every_error_at_once_with_file_and_key(data):
    doc = {
        "matrix": {
            "cuda": ["12.4", "twelve"],
            "torch": ["2.5.1\nRUN x"],
            "transformers": "4.48.2",
            "python": ["3.11"],
            "colour": "blue",
            "include": [{"cuda": "12.4"}],
        },
        "targets": {"gpus": ["H100", "Z9000"], "min_driver": "new"},
        "image": {"repository": "Bad Repo"},
        "extra": {},
    }
    with pytest.raises(ConfigError) as exc:
        matrix.parse(doc, "team.toml", data)
    problems = exc.value.problems
    text = "\n".join(problems)
    for key in (
        "matrix.cuda[1]",
        "matrix.torch[0]",
        "matrix.transformers",
        "matrix.colour",
        "matrix.include[0]",
        "targets.gpus[1]",
        "targets.min_driver",
        "image.repository",
        "extra",
    ):
        assert f"team.toml: {key}" in text, key
    assert len(problems) >= 9


def test_default_matrix_is_curated_and_mostly_compatible(data):
    config = matrix.parse(matrix.default_document(), "<default>", data)
    cells = matrix.evaluate(config, data)
    ok = [c for c in cells if c.verdict.compatible]
    assert 10 <= len(ok) <= 40
    torches = {c.cell.torch.rsplit(".", 1)[0] for c in ok}
    assert {"2.1", "2.5", "2.8", "2.14"} <= torches
    assert {"3.10", "3.11", "3.12", "3.13"} == {c.cell.python for c in ok}
    assert any(c.cell.cuda == "11.8" for c in ok)
    assert {c.cell.transformers.split(".")[0] for c in ok} == {"4", "5"}
    assert len(ok) < len(cells)  # the defaults also show the rules at work


def test_pyproject_tool_imagekit(data, in_tmp):
    (in_tmp / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[tool.imagekit.matrix]\n'
        'include = [{cuda = "12.4", torch = "2.5.1", transformers = "4.48.2", python = "3.11"}]\n'
        '[tool.imagekit.targets]\narchs = ["sm_90"]\n'
    )
    config = inputs.load_matrix(None, data)
    assert [c.id for c in config.cells] == ["cu124-torch2.5.1-py3.11-tf4.48.2"]
    assert config.targets.archs == ("sm_90",)


def test_broken_toml_names_the_file(data, in_tmp):
    (in_tmp / "bad.toml").write_text("[matrix\n")
    with pytest.raises(ConfigError) as exc:
        inputs.load_matrix(in_tmp / "bad.toml", data)
    assert "bad.toml" in exc.value.message


def test_selector_prefix_matching(data):
    config = matrix.parse(matrix.default_document(), "<default>", data)
    cells = matrix.select(matrix.evaluate(config, data), matrix.Selector(cuda=("11.8",), torch=("2.5",)))
    assert [c.cell.id for c in cells] == ["cu118-torch2.5.1-py3.11-tf4.48.2"]


def test_registry_bases_by_digest(data, app, runner, in_tmp):
    digest = "sha256:" + "ab" * 32
    (in_tmp / "m.toml").write_text(
        '[matrix]\ninclude = [{cuda = "12.4", torch = "2.5.1", transformers = "4.48.2", python = "3.12"}]\n'
        f'[bases."3.12"]\nreference = "registry.example.com/base/python@{digest}"\nglibc = "2.36"\n'
        'python = "/usr/local/bin/python3.12"\n'
    )
    config = inputs.load_matrix(in_tmp / "m.toml", data)
    base = config.bases["3.12"]
    assert base.digest == digest and base.registry and base.python_bin == "/usr/local/bin/python3.12"
    from tests.conftest import ROOT

    res = runner.invoke(app, ["render", "--matrix", "m.toml", "--lock-dir", str(ROOT / "lockfiles"), "--out", "o"])
    assert res.exit_code == 2 and "no lock for cu124-torch2.5.1-py3.12-tf4.48.2" in res.output


def test_registry_base_without_digest_is_refused(data):
    doc = {
        "matrix": {"include": [{"cuda": "12.4", "torch": "2.5.1", "transformers": "4.48.2", "python": "3.12"}]},
        "bases": {"3.12": {"reference": "python:3.12-slim", "glibc": "2.36"}},
    }
    with pytest.raises(ConfigError) as exc:
        matrix.parse(doc, "m.toml", data)
    assert "by digest" in exc.value.message


def test_registry_base_glibc_feeds_the_rules(data):
    doc = {
        "matrix": {"include": [{"cuda": "12.6", "torch": "2.7.1", "transformers": "5.9.0", "python": "3.12"}]},
        "bases": {"3.12": {"reference": "old/base@sha256:" + "0" * 64, "glibc": "2.17"}},
    }
    cells = matrix.evaluate(matrix.parse(doc, "m.toml", data), data)
    assert [v.rule for v in cells[0].verdict.violations] == ["glibc"]


def test_image_options_jupyter_and_compiler(data):
    from imagekit.image.buildplan import base_for, bootstrap_base

    axes = {"cuda": ["12.4"], "torch": ["2.5.1"], "transformers": ["4.48.2"], "python": ["3.11"]}
    plain = matrix.parse({"matrix": axes}, "m.toml", data)
    assert plain.options.jupyter is False and plain.options.compiler is True
    config = matrix.parse({"matrix": axes, "image": {"jupyter": True, "compiler": False}}, "m.toml", data)
    (cell,) = config.cells
    assert "jupyterlab" in cell.packages  # locked and hashed like any other package
    base = base_for(cell.python, data, config.bases, config.options, platform=cell.platform)
    assert base.compiler is False and base.name.endswith("-nocc")
    assert base.reference != bootstrap_base(data.bases["3.11"]).reference  # a different bootstrap, never mixed up
    pinned = matrix.parse(
        {"matrix": {**axes, "packages": ["jupyterlab==4.2.5"]}, "image": {"jupyter": True}}, "m.toml", data
    )
    assert pinned.cells[0].packages == ("jupyterlab==4.2.5",)  # the user's own pin wins


def test_image_options_errors_are_reported(data):
    axes = {"cuda": ["12.4"], "torch": ["2.5.1"], "transformers": ["4.48.2"], "python": ["3.11"]}
    with pytest.raises(ConfigError) as exc:
        matrix.parse({"matrix": axes, "image": {"jupyter": "yes", "ssh": False}}, "m.toml", data)
    text = exc.value.render()
    assert "image.jupyter: expected true or false" in text and "image.ssh: unknown key" in text


def test_two_includes_naming_one_cell_are_an_error(data):
    entry = {"cuda": "12.4", "torch": "2.5.1", "transformers": "4.48.2", "python": "3.11"}
    with pytest.raises(ConfigError) as exc:
        matrix.parse({"matrix": {"include": [entry, {**entry, "packages": ["accelerate==1.2.1"]}]}}, "m.toml", data)
    assert "matrix.include[1]: names the same cell as matrix.include[0]" in exc.value.render()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"[matrix]\ncuda = ['12.4'\xff]\n", "not UTF-8"),
        (b"[tool]\nimagekit = 3\n", "tool.imagekit: expected a table"),
    ],
)
def test_unreadable_matrix_files_are_exit_2(app, runner, in_tmp, content, needle):
    name = "pyproject.toml" if b"[tool]" in content else "m.toml"
    (in_tmp / name).write_bytes(content)
    res = runner.invoke(app, ["matrix", "--matrix", name])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output


def test_every_problem_of_every_section_is_reported_in_the_files_order(data):
    doc = {
        "matrx": {},
        "matrix": {"cuda": ["12.4"], "torch": "2.5.1", "colour": 1, "include": [{"cuda": "12.4"}]},
        "targets": {"gpus": ["Z9"], "speed": 1},
        "image": {"repository": "Bad Repo", "jupyter": "yes"},
        "bases": {"3.12": "x"},
        "lock": {"index_url": "ftp://x"},
    }
    with pytest.raises(ConfigError) as exc:
        matrix.parse(doc, "m.toml", data)
    keys = [problem.split(": ")[1] for problem in exc.value.problems]
    assert keys == [
        "matrx",
        "matrix.colour",
        "matrix.torch",
        "matrix.include[0]",
        "targets.speed",
        "targets.gpus[0]",
        "image.repository",
        "image.jupyter",
        "bases.3.12",
        "lock.index_url",
    ]


def test_the_image_table_takes_the_keys_of_image_options_and_no_flag(data):
    """ImageOptions' keys in the schema's order, and a command's flag refused; read off the schema, so a new key
    needs no line here (its own test says what it does)."""
    from imagekit.image.image_options import ImageOptions
    from imagekit.matrix import schema

    axes = {"cuda": ["12.4"], "torch": ["2.5.1"], "transformers": ["4.48.2"], "python": ["3.11"]}
    keys = schema.names("image")[1:]  # the repository first, then the options
    assert keys[:3] == ("jupyter", "compiler", "cuda_toolkit") and "repository" not in keys
    assert ImageOptions.keys() == keys
    allowed = f"allowed: repository, {', '.join(keys)}"
    for flag in ("builder", "zstd"):  # a command's flags (`render --builder`, `build --zstd`), never the file's
        with pytest.raises(ConfigError) as exc:
            matrix.parse({"matrix": axes, "image": {flag: True}}, "m.toml", data)
        assert exc.value.problems == [f"m.toml: image.{flag}: unknown key ({allowed})"]
    assert ImageOptions.switches() == tuple(k for k in keys if schema.key(f"image.{k}").type == "true or false")
    assert ImageOptions.switches()[:3] == ("jupyter", "compiler", "cuda_toolkit")
    for switch in ImageOptions.switches():  # each true/false key is checked by one loop
        with pytest.raises(ConfigError) as exc:
            matrix.parse({"matrix": axes, "image": {switch: "yes"}}, "m.toml", data)
        assert exc.value.problems == [f"m.toml: image.{switch}: expected true or false, got 'yes'"]
