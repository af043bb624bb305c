"""`imagekit init --from FILE`: the project's own dependency declaration is the source, and the matrix file refers to
it; what it cannot honour is refused with error:/hint:, exit 2, and nothing written."""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

import pytest

from imagekit.matrix import matrix_file as matrix
from imagekit.matrix.project_deps import DepsSource
from imagekit.services import inputs
from tests.conftest import FIXTURES

PROJECTS = FIXTURES / "projects"


def _init(app, runner, *args: str):
    res = runner.invoke(app, ["init", *args])
    assert "Traceback" not in res.output
    return res


def test_nanogpt_from_its_requirements_file(app, runner, data, in_tmp):
    shutil.copy(PROJECTS / "nanogpt" / "requirements.txt", in_tmp)
    res = _init(app, runner, "--from", "requirements.txt", "--repository", "ghcr.io/acme/nanogpt")
    assert res.exit_code == 0, res.output
    doc = tomllib.loads(Path("imagekit.toml").read_text())
    assert doc["matrix"]["requirements"] == "requirements.txt" and doc["matrix"]["packages"] == []  # one list
    assert "requirements: requirements.txt (7 distribution(s) for Python 3.11)" in res.stderr
    assert "note: no --repository" not in res.stderr
    config = inputs.load_matrix(None, data)
    assert config.requirements == DepsSource("requirements.txt")
    assert {c.packages for c in config.cells} == {("datasets", "numpy", "tiktoken", "tqdm", "wandb")}
    # the file is the list: a package added to it is in every cell the next time any command reads the matrix
    with open("requirements.txt", "a") as fh:
        fh.write("peft==0.14.0\n")
    assert {c.packages for c in inputs.load_matrix(None, data).cells} == {
        ("datasets", "numpy", "peft==0.14.0", "tiktoken", "tqdm", "wandb")
    }


def test_no_repository_is_said_and_the_demo_registry_named(app, runner, in_tmp):
    (in_tmp / "requirements.txt").write_text("numpy\n")
    res = _init(app, runner, "--from", "requirements.txt")
    assert res.exit_code == 0, res.output
    assert f"note: no --repository: `imagekit build --push` publishes to {matrix.DEFAULT_REPOSITORY}" in res.stderr
    assert "local demo registry" in res.stderr and "--repository REG/REPO" in res.stderr
    assert "local demo registry" in runner.invoke(app, ["init", "--help"]).output  # and --help says so


def test_includes_constraints_and_a_pin_choose_the_axes(app, runner, data, in_tmp):
    (in_tmp / "requirements").mkdir()
    (in_tmp / "requirements" / "train.txt").write_text("-r base.txt\n-c ../constraints.txt\ntorch==2.4.0\n")
    (in_tmp / "requirements" / "base.txt").write_text("transformers>=4.45\nnumpy\naccelerate>=1.0\n")
    (in_tmp / "constraints.txt").write_text("numpy<2\naccelerate==1.2.1\n")
    res = _init(app, runner, "--from", "requirements/train.txt", "--repository", "ghcr.io/acme/x")
    assert res.exit_code == 0, res.output
    assert "3 file(s) read" in res.stderr and "note: torch 2.4.0: pinned by requirements/train.txt:3" in res.stderr
    config = inputs.load_matrix(None, data)
    assert [c.id for c in config.cells] == ["cu121-torch2.4.0-py3.11-tf4.48.2"]
    assert config.cells[0].packages == ("accelerate==1.2.1,>=1.0", "numpy<2")


def test_pyproject_with_extras(app, runner, data, in_tmp):
    (in_tmp / "pyproject.toml").write_text(
        '[project]\nname = "trainer"\nversion = "0"\nrequires-python = ">=3.10"\n'
        'dependencies = ["transformers>=4.45", "accelerate>=1.0"]\n'
        '[project.optional-dependencies]\ntrain = ["peft>=0.14", "torch>=2.5,<2.7"]\ntest = ["pytest"]\n'
        'dev = ["trainer[test]", "ruff"]\n'
    )
    res = _init(app, runner, "--from", "pyproject.toml", "--extra", "train", "--extra", "dev")
    assert res.exit_code == 0, res.output
    doc = tomllib.loads(Path("imagekit.toml").read_text())
    assert doc["matrix"]["requirements"] == {"file": "pyproject.toml", "extras": ["train", "dev"]}
    assert doc["matrix"]["torch"] == ["2.5.1"]  # of the default axes, the one the group allows
    config = inputs.load_matrix(None, data)
    assert {c.packages for c in config.cells} == {("accelerate>=1.0", "peft>=0.14", "pytest", "ruff")}
    appended = _init(app, runner, "--from", "pyproject.toml", "--pyproject", "--repository", "ghcr.io/a/b")
    assert appended.exit_code == 0, appended.output
    assert inputs.load_matrix(Path("pyproject.toml"), data).requirements == DepsSource("pyproject.toml")


def _write(in_tmp: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (in_tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (in_tmp / name).write_text(text)


BAD = {
    "self-include": (
        {"requirements.txt": "numpy\n-r requirements.txt\n"},
        ["--from", "requirements.txt"],
        "error: requirements.txt:2: -r requirements.txt includes itself",
    ),
    "loop": (
        {"requirements.txt": "-r dev.txt\n", "dev.txt": "-c requirements.txt\n"},
        ["--from", "requirements.txt"],
        "error: dev.txt:1: -c requirements.txt makes a loop (requirements.txt -> dev.txt -> requirements.txt)",
    ),
    "-r outside the project": (
        {"proj/requirements.txt": "-r ../shared/base.txt\n", "shared/base.txt": "numpy\n"},
        ["--from", "proj/requirements.txt", "--out", "proj/imagekit.toml"],
        "error: requirements.txt:1: -r ../shared/base.txt is outside the project",
    ),
    "two torch pins": (
        {"requirements.txt": "torch==2.4.0\n-r gpu.txt\n", "gpu.txt": "torch==2.5.1\n"},
        ["--from", "requirements.txt"],
        "error: requirements.txt:1: torch==2.4.0 conflicts with gpu.txt:1: torch==2.5.1",
    ),
    "axis conflict": (
        {"requirements.txt": "torch==2.4.0\nnumpy\n"},
        ["--from", "requirements.txt", "--torch", "2.5.1"],
        "error: --torch 2.5.1 conflicts with requirements.txt:1: torch==2.4.0",
    ),
    "python conflict": (
        {"pyproject.toml": '[project]\nname = "x"\nversion = "0"\nrequires-python = ">=3.12"\n'},
        ["--from", "pyproject.toml", "--python", "3.11"],
        "error: --python 3.11 conflicts with pyproject.toml [project] requires-python >=3.12",
    ),
    "unknown group": (
        {"pyproject.toml": '[project]\nname = "x"\nversion = "0"\n[project.optional-dependencies]\ntrain = []\n'},
        ["--from", "pyproject.toml", "--extra", "tests"],
        "error: pyproject.toml has no optional-dependency group tests",
    ),
    "group of a requirements file": (
        {"requirements.txt": "numpy\n"},
        ["--from", "requirements.txt", "--extra", "dev"],
        "is a requirements file, which has no optional groups",
    ),
    "--extra alone": ({}, ["--extra", "dev"], "error: --extra chooses from the file --from names"),
    "--from outside": (
        {"other/requirements.txt": "numpy\n", "proj/.keep": ""},
        ["--from", "other/requirements.txt", "--out", "proj/imagekit.toml"],
        "error: --from other/requirements.txt is outside the project",
    ),
    "missing": ({}, ["--from", "requirements.txt"], "error: requirements.txt: no such file in the project"),
    "an editable line out of the project": (
        {"requirements.txt": "-e ../x\n"},
        ["--from", "requirements.txt"],
        "requirements.txt:1: ../x is outside the project",
    ),
    "the project with no package in it": (
        {"requirements.txt": "-e .\n"},
        ["--from", "requirements.txt"],
        "requirements.txt:1: . holds no pyproject.toml or setup.py",
    ),
    "a dynamic list": (
        {
            "pyproject.toml": '[build-system]\nbuild-backend = "hatchling.build"\n[project]\nname = "x"\n'
            'version = "0"\ndynamic = ["dependencies"]\n'
        },
        ["--from", "pyproject.toml"],
        "its build backend hatchling.build is not in the base image",
    ),
}


@pytest.mark.seconds
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_declarations_are_refused_and_nothing_is_written(app, runner, in_tmp, case):
    files, args, needle = BAD[case]
    _write(in_tmp, files)
    before = {p: p.read_bytes() for p in in_tmp.rglob("*") if p.is_file()}
    res = _init(app, runner, *args)
    assert res.exit_code == 2, (case, res.output)
    assert needle in res.stderr and "\nhint: " in res.stderr, (case, res.stderr)
    assert {p: p.read_bytes() for p in in_tmp.rglob("*") if p.is_file()} == before  # nothing written


def test_a_link_out_of_the_project_is_refused(app, runner, in_tmp, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere") / "base.txt"
    outside.write_text("numpy\n")
    (in_tmp / "base.txt").symlink_to(outside)
    (in_tmp / "requirements.txt").write_text("-r base.txt\n")
    res = _init(app, runner, "--from", "requirements.txt")
    assert res.exit_code == 2 and "error: requirements.txt:1: -r base.txt: base.txt leads out of the project" in (
        res.stderr
    )
    assert not (in_tmp / "imagekit.toml").exists()


@pytest.mark.seconds
def test_an_edit_that_conflicts_later_is_named_by_every_command(app, runner, data, in_tmp):
    (in_tmp / "requirements.txt").write_text("torch==2.5.1\nnumpy\n")
    assert _init(app, runner, "--from", "requirements.txt", "--repository", "ghcr.io/a/b").exit_code == 0
    (in_tmp / "requirements.txt").write_text("torch==2.4.0\nnumpy\n")  # the project moved; the axes did not
    for argv in (["matrix"], ["lock", "--check"], ["render", "--out", "out"]):
        res = runner.invoke(app, argv)
        assert res.exit_code == 2, (argv, res.output)
        assert (
            "imagekit.toml: torch 2.5.1 (matrix.torch, cell cu124-torch2.5.1-py3.11-tf4.48.2) conflicts with "
            "requirements.txt:1: torch==2.4.0" in res.stderr
        )
        assert "hint: keep one list" in res.stderr
    assert not (in_tmp / "out").exists()
    os.remove(in_tmp / "requirements.txt")
    gone = runner.invoke(app, ["matrix"])
    assert gone.exit_code == 2 and "matrix.requirements: requirements.txt: no such file in the project" in gone.stderr


@pytest.mark.seconds
def test_a_requirement_with_no_wheel_is_left_out_by_name_and_the_file_stays_as_it_is(app, runner, data, in_tmp):
    """deepspeed has no wheel: `--without deepspeed` writes `without`, every command leaves it out (saying so), and the
    project's file is not edited; a name the file does not state, or an axis, is refused with nothing written."""
    Path("requirements.txt").write_text("numpy\ndeepspeed>=0.16\nwandb\n")
    for args, needle in (
        (["--without", "deep-speed"], "error: without: deep-speed is not among what requirements.txt states"),
        (["--without", "torch"], "error: --from requirements.txt: without: torch is an axis of the matrix"),
    ):
        res = _init(app, runner, "--from", "requirements.txt", "--repository", "ghcr.io/acme/x", *args)
        assert res.exit_code == 2 and needle in res.stderr and not Path("imagekit.toml").exists(), res.output
    res = _init(app, runner, "--from", "requirements.txt", "--without", "DeepSpeed", "--repository", "ghcr.io/acme/x")
    assert res.exit_code == 0, res.output
    doc = tomllib.loads(Path("imagekit.toml").read_text())
    assert doc["matrix"]["requirements"] == {"file": "requirements.txt", "without": ["deepspeed"]}
    config = inputs.load_matrix(None, data)
    assert config.requirements == DepsSource("requirements.txt", (), ("deepspeed",))
    assert {c.packages for c in config.cells} == {("numpy", "wandb")}
    assert Path("requirements.txt").read_text() == "numpy\ndeepspeed>=0.16\nwandb\n"
    # the file no longer states it: every command says so, rather than leaving nothing out silently
    Path("requirements.txt").write_text("numpy\nwandb\n")
    res = runner.invoke(app, ["matrix"])
    assert res.exit_code == 2 and "without: deepspeed is not among what requirements.txt states" in res.stderr
    res = _init(app, runner, "--without", "deepspeed", "--repository", "ghcr.io/acme/y", "--out", "other.toml")
    assert res.exit_code == 2 and "--without chooses from the file --from names" in res.stderr


@pytest.mark.parametrize("name", ["requirements.txt", "base.txt"])
def test_the_matrix_is_never_written_over_the_projects_own_list(app, runner, in_tmp, name):
    Path("requirements.txt").write_text("numpy\n-r base.txt\n")
    Path("base.txt").write_text("wandb\n")
    res = _init(app, runner, "--from", "requirements.txt", "--out", name, "--force", "--repository", "ghcr.io/a/b")
    assert res.exit_code == 2 and f"error: --out {name} is a file of the project's own dependency list" in res.stderr
    assert Path("requirements.txt").read_text() == "numpy\n-r base.txt\n" and Path("base.txt").read_text() == "wandb\n"


def test_the_projects_own_line_is_copied_and_installed(app, runner, data, in_tmp):
    Path("requirements.txt").write_text("numpy\n-e .\n")
    Path("pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n\n[project]\nname = "app"\n')
    res = _init(app, runner, "--from", "requirements.txt", "--repository", "ghcr.io/acme/x")
    assert res.exit_code == 0, res.output
    doc = tomllib.loads(Path("imagekit.toml").read_text())
    assert doc["image"]["copy"] == "." and doc["image"]["install"] == "."
    config = inputs.load_matrix(None, data)
    # the project's [build-system] requires join every cell (setuptools; wheel with a setuptools that may be < 70.1)
    assert config.options.install == "." and {c.packages for c in config.cells} == {("numpy", "setuptools", "wheel")}


def test_a_range_that_allows_the_defaults_keeps_them_and_asks_no_resolver(data):
    from imagekit.matrix import project_deps
    from imagekit.services.locks import init_axes

    deps = project_deps.read_requirements("r.txt", lambda _: "transformers>=4.40\nhuggingface-hub<1.0\n")
    assert not init_axes.leaves_transformers_open(deps, "3.11", False, ("4.48.2",))
    deps = project_deps.read_requirements("r.txt", lambda _: "transformers>=4.49\n")
    assert init_axes.leaves_transformers_open(deps, "3.11", False, ("4.48.2",))
    assert not init_axes.leaves_transformers_open(deps, "3.11", True, ("4.48.2",))  # --transformers given


def test_init_says_which_index_serves_each_torch(app, runner, in_tmp):
    Path("requirements.txt").write_text("torch==2.5.1\nnumpy\n")
    res = _init(app, runner, "--from", "requirements.txt", "--cuda", "12.1", "--repository", "ghcr.io/acme/x")
    assert res.exit_code == 0, res.output
    said = " ".join(res.stderr.split())
    assert (
        "torch 2.5.1 (CUDA 12.1): the PyTorch index (https://download.pytorch.org/whl/cu121); PyPI serves torch 2.5.1 "
        "built for cu124 only" in said
    ), said
    res = _init(app, runner, "--from", "requirements.txt", "--force", "--repository", "ghcr.io/acme/x")
    assert "torch 2.5.1 (CUDA 12.4): PyPI's default build (cu124), from PyPI" in " ".join(res.stderr.split())
