"""`imagekit init`: a commented matrix for the user's project that loads, has compatible cells, and is found."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from imagekit.errors import ConfigError
from imagekit.matrix import matrix_file as matrix
from imagekit.matrix import schema
from imagekit.services import inputs
from imagekit.services.init_project import DEFAULT_AXES, DEFAULT_PACKAGES, document


def _init(app, runner, *args: str):
    res = runner.invoke(app, ["init", *args])
    assert "Traceback" not in res.output
    return res


@pytest.mark.seconds
def test_default_init_writes_a_matrix_that_is_found_and_has_compatible_cells(app, runner, data, in_tmp):
    res = _init(app, runner)
    assert res.exit_code == 0, res.output
    assert "wrote imagekit.toml: 4 cell(s), 2 compatible" in res.stderr
    for cmd in ("imagekit matrix --explain", "imagekit lock", "imagekit build --dry-run"):
        assert f"  {cmd} " in res.stderr  # found by default: no --matrix needed
    assert res.stdout == ""
    config = inputs.load_matrix(None, data)
    assert config.origin == "imagekit.toml"
    ok = [e for e in matrix.evaluate(config, data) if e.verdict.compatible]
    assert {e.cell.id for e in ok} == {"cu124-torch2.5.1-py3.11-tf4.48.2", "cu128-torch2.8.0-py3.11-tf4.48.2"}
    assert config.repository == matrix.DEFAULT_REPOSITORY
    assert all(c.packages == DEFAULT_PACKAGES for c in config.cells)
    listed = runner.invoke(app, ["matrix", "--format", "json"])
    assert listed.exit_code == 0 and {r["id"] for r in __import__("json").loads(listed.stdout)} == {
        e.cell.id for e in ok
    }


def test_defaults_come_from_the_shipped_matrix(data):
    """No invented compatibility facts: each default value, and each compatible default cell, is in the default."""
    shipped = matrix.parse(matrix.default_document(), "<default>", data)
    for axis, values in DEFAULT_AXES.items():
        assert set(values) <= {getattr(c, axis) for c in shipped.cells}, axis
    assert set(DEFAULT_PACKAGES) <= {p for c in shipped.cells for p in c.packages}
    mine = matrix.parse(tomllib.loads(document(DEFAULT_AXES, DEFAULT_PACKAGES, "r.example/x")), "init", data)
    ok = {e.cell.id for e in matrix.evaluate(mine, data) if e.verdict.compatible}
    shipped_ok = {e.cell.id for e in matrix.evaluate(shipped, data) if e.verdict.compatible}
    assert ok and ok <= shipped_ok


def test_own_packages_axes_and_registry(app, runner, data, in_tmp):
    res = _init(
        app,
        runner,
        *("--package", "peft", "--package", "bitsandbytes>=0.45", "--package", "accelerate"),
        *("--repository", "ghcr.io/acme/train", "--cuda", "cu124", "--torch", "2.5.1"),
        *("--python", "3.11", "--python", "3.12", "--python", "3.11"),
    )
    assert res.exit_code == 0, res.output
    config = inputs.load_matrix(Path("imagekit.toml"), data)
    assert config.repository == "ghcr.io/acme/train"
    assert {c.id for c in config.cells} == {"cu124-torch2.5.1-py3.11-tf4.48.2", "cu124-torch2.5.1-py3.12-tf4.48.2"}
    # the user's unpinned accelerate replaces the default pin; the others are added
    assert all(c.packages == ("accelerate", "bitsandbytes>=0.45", "peft") for c in config.cells)


@pytest.mark.seconds
def test_apt_packages_from_the_command_line(app, runner, data, in_tmp):
    res = _init(app, runner, "--apt", "git-lfs", "--apt", "ffmpeg", "--apt", "git-lfs")
    assert res.exit_code == 0, res.output
    config = inputs.load_matrix(Path("imagekit.toml"), data)
    assert 'apt = ["git-lfs", "ffmpeg"]' in Path("imagekit.toml").read_text()
    assert config.options.apt == ("ffmpeg", "git-lfs") and all(c.apt == ("ffmpeg", "git-lfs") for c in config.cells)
    Path("imagekit.toml").unlink()
    bad = _init(app, runner, "--apt", "ffmpeg; rm -rf /")
    assert bad.exit_code == 2 and "not a Debian package name" in bad.output and "git-lfs" in bad.output
    assert not Path("imagekit.toml").exists()


def test_every_commented_key_is_one_the_parser_accepts(data):
    """Uncommenting every example key of the written file still gives a valid matrix: the comments name real keys."""
    text = document(DEFAULT_AXES, DEFAULT_PACKAGES, matrix.DEFAULT_REPOSITORY)
    uncommented = []
    for line in text.splitlines():
        if re.match(r"# (\[|[a-z_]+ = )", line):
            line = line[2:]
        uncommented.append(line.replace("<64 hex digits>", "ab" * 32))
    doc = tomllib.loads("\n".join(uncommented))
    examples = {k.name: tomllib.loads(f"v = {k.example}")["v"] for k in schema.KEYS if k.section == "image"}
    assert doc["image"] == {**examples, "repository": matrix.DEFAULT_REPOSITORY}
    assert set(doc["lock"]) == {"index_url", "extra_index_urls"}
    assert set(doc["targets"]) == {"gpus", "archs", "min_driver"}
    assert set(doc["bases"]["3.11"]) == {"reference", "glibc", "python"}
    assert doc["matrix"]["exclude"] and doc["matrix"]["include"]
    config = matrix.parse(doc, "uncommented", data)
    assert "cu128-torch2.5.1-py3.11-tf4.48.2" not in {c.id for c in config.cells}  # the exclude example
    assert "cu129-torch2.8.0-py3.12-tf5.9.0" in {c.id for c in config.cells}  # the include example
    assert config.options.jupyter and "3.11" in config.bases
    assert config.options.apt == ("ffmpeg", "git-lfs") and all(c.apt == ("ffmpeg", "git-lfs") for c in config.cells)
    assert config.options.copy is not None and config.extra_index_urls == ("https://pkgs.example.com/simple",)
    assert config.options.install == "." and config.options.env == (("WANDB_PROJECT", "sft"),)
    assert config.options.smoke == ("python -c 'import mypkg'",)


def test_an_existing_file_is_kept_unless_forced(app, runner, in_tmp):
    (in_tmp / "imagekit.toml").write_text("# mine\n")
    res = _init(app, runner)
    assert res.exit_code == 2
    assert "error: imagekit.toml exists" in res.stderr and "hint: pass --force" in res.stderr
    assert (in_tmp / "imagekit.toml").read_text() == "# mine\n"
    res = _init(app, runner, "--force")
    assert res.exit_code == 0, res.output
    assert "[matrix]" in (in_tmp / "imagekit.toml").read_text()


def test_out_elsewhere_names_it_in_the_next_commands(app, runner, data, in_tmp):
    res = _init(app, runner, "--out", "conf/matrix.toml")
    assert res.exit_code == 0, res.output
    assert "imagekit lock --matrix conf/matrix.toml" in res.stderr
    assert inputs.load_matrix(Path("conf/matrix.toml"), data).origin == "conf/matrix.toml"
    assert list(in_tmp.iterdir()) == [in_tmp / "conf"]  # nothing else written (no temp file left)
    assert [p.name for p in (in_tmp / "conf").iterdir()] == ["matrix.toml"]


@pytest.mark.parametrize(
    "args",
    [
        ("--cuda", "cu1"),
        ("--torch", "2.5.1 "),
        ("--transformers", "v4"),
        ("--python", "2.7"),
        ("--package", "a @ file:///etc/passwd"),
        ("--package", "x\ny"),
        ("--repository", "UPPER/Case"),
        ("--torch", "9.9.9"),  # not in the compatibility data: never guessed
        ("--torch", "2.14.1"),  # no cu124/cu128 wheels: no compatible cell
        ("--python", "3.14"),  # no base image known for it
        ("--out", "."),
        ("--out", "adir"),
        ("--pyproject",),  # no pyproject.toml here
        ("--pyproject", "--out", "other.toml"),
    ],
)
def test_bad_values_are_refused_and_nothing_is_written(app, runner, in_tmp, args):
    (in_tmp / "adir").mkdir()
    res = _init(app, runner, *args)
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: ") and "\nhint: " in res.stderr
    assert sorted(p.name for p in in_tmp.iterdir()) == ["adir"]


def test_all_excluded_names_each_reason(app, runner, in_tmp):
    res = _init(app, runner, "--torch", "2.14.1")
    assert "imagekit.toml (not written): no cell of this matrix is compatible" in res.stderr
    assert "cu124-torch2.14.1-py3.11-tf4.48.2: torch 2.14.1 has no cu124 wheels" in res.stderr


def test_pyproject_section_is_appended_once(app, runner, data, in_tmp):
    original = '[project]\nname = "x"\n\n[tool.ruff]\nline-length = 100\n'
    (in_tmp / "pyproject.toml").write_text(original)
    res = _init(app, runner, "--pyproject", "--package", "peft")
    assert res.exit_code == 0, res.output
    assert "wrote pyproject.toml [tool.imagekit]: 4 cell(s), 2 compatible" in res.stderr
    text = (in_tmp / "pyproject.toml").read_text()
    assert text.startswith(original) and "[tool.imagekit.matrix]" in text and "\n# include = [" in text
    doc = tomllib.loads(text)
    assert doc["project"] == {"name": "x"} and doc["tool"]["ruff"] == {"line-length": 100}
    config = inputs.load_matrix(None, data)
    assert config.origin == "pyproject.toml [tool.imagekit]"
    assert any(e.verdict.compatible for e in matrix.evaluate(config, data))
    assert all("peft" in c.packages for c in config.cells)
    again = _init(app, runner, "--pyproject", "--force")
    assert again.exit_code == 2 and "already has a [tool.imagekit] section" in again.stderr
    assert (in_tmp / "pyproject.toml").read_text() == text


def test_pyproject_when_imagekit_toml_shadows_it(app, runner, in_tmp):
    (in_tmp / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (in_tmp / "imagekit.toml").write_text((in_tmp / "pyproject.toml").read_text().replace("project", "matrix"))
    res = _init(app, runner, "--pyproject")
    assert res.exit_code == 0, res.output
    assert "read ./imagekit.toml first" in res.stderr and "imagekit lock --matrix pyproject.toml" in res.stderr


def test_lookup_order_matrix_then_imagekit_toml_then_pyproject_then_default(data, in_tmp):
    include = 'include = [{{cuda = "12.4", torch = "2.5.1", transformers = "4.48.2", python = "{py}"}}]\n'
    assert inputs.load_matrix(None, data).origin == "<default matrix>"
    (in_tmp / "pyproject.toml").write_text("[tool.imagekit.matrix]\n" + include.format(py="3.10"))
    assert inputs.load_matrix(None, data).origin == "pyproject.toml [tool.imagekit]"
    (in_tmp / "imagekit.toml").write_text("[matrix]\n" + include.format(py="3.12"))
    assert [c.python for c in inputs.load_matrix(None, data).cells] == ["3.12"]
    (in_tmp / "m.toml").write_text("[matrix]\n" + include.format(py="3.13"))
    assert [c.python for c in inputs.load_matrix(in_tmp / "m.toml", data).cells] == ["3.13"]


def test_an_imagekit_toml_that_is_not_a_file_is_an_error(app, runner, in_tmp):
    (in_tmp / "imagekit.toml").mkdir()
    res = runner.invoke(app, ["matrix"])
    assert res.exit_code == 2 and "imagekit.toml is a folder" in res.output


ROOT = Path(__file__).resolve().parents[2]
#: The keys README's table must document: the schema's (a base's table written as bases."3.X").
TABLE_KEYS = {k.path.replace('"3.11"', '"3.X"') for k in schema.KEYS}


def _readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("## Your own matrix", 1)[1].split("\n## ", 1)[0]


def test_readme_documents_every_key_and_its_example_is_a_valid_matrix(data):
    section = _readme_section()
    rows = re.findall(r"^\| (`[^|]+) \|", section, re.M)
    documented = {k for row in rows for k in re.findall(r"`([^`]+)`", row)}
    assert documented == TABLE_KEYS
    example = section.split("```toml\n", 1)[1].split("```", 1)[0].replace("<64 hex digits>", "ab" * 32)
    doc = tomllib.loads(example)
    config = matrix.parse(doc, "README", data)
    assert config.repository == "ghcr.io/acme/train" and set(config.bases) == {"3.12"}
    ids = {c.id for c in config.cells}
    assert "cu128-torch2.5.1-py3.11-tf4.48.2" not in ids and "cu129-torch2.8.0-py3.12-tf5.9.0" in ids
    assert any(e.verdict.compatible for e in matrix.evaluate(config, data))
    # the documented keys are exactly the ones the parser takes: its "unknown key" errors list them
    bad = {
        "matrix": {"colour": 1},
        "targets": {"colour": 1},
        "image": {"colour": 1},
        "bases": {"3.12": {"colour": 1}},
        "lock": {"colour": 1},
    }
    with pytest.raises(ConfigError) as exc:
        matrix.parse(bad, "README", data)
    allowed = {}
    for problem in exc.value.problems:
        m = re.search(r"README: (\w+)(\.3\.12)?(\.colour)?: unknown keys? .*\(allowed: ([^)]*)\)", problem)
        if m:
            prefix = m[1] + ('."3.X"' if m[2] else "")
            allowed[m[1]] = {f"{prefix}.{k}" for k in m[4].split(", ")}
    assert set(allowed) == {"matrix", "targets", "image", "bases", "lock"}
    assert set().union(*allowed.values()) == TABLE_KEYS


def test_a_cuda_alone_picks_the_newest_torch_built_for_it(app, runner, data, in_tmp):
    """`init --cuda 13.2` is torch 2.15.0 (cu132 only), not the default pair that has no cu132 wheels."""
    from imagekit.services.init_project import torch_for

    _init(app, runner, "--cuda", "13.2")
    doc = tomllib.loads((in_tmp / "imagekit.toml").read_text())
    assert doc["matrix"]["torch"] == ["2.15.0"]
    assert torch_for(("11.8", "12.4"), data) == ("2.6.0", "2.7.1")  # each CUDA's own newest torch
    assert torch_for(("10.2",), data) == ()  # none: the check then names why no cell is compatible
