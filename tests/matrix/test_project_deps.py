"""A project's own dependency declaration (`[matrix] requirements`): requirements files with their includes,
pyproject.toml's tables, a build backend's metadata; what its torch/transformers/Python constraints make of the axes,
and what the rest makes of each cell's packages."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from imagekit.errors import ConfigError, UsageError
from imagekit.matrix import backend_metadata, project_axes, project_deps
from imagekit.matrix import matrix_file as matrix
from imagekit.matrix.project_deps import DepsSource
from imagekit.model import Cell
from tests.conftest import FIXTURES

DEFAULTS = {"cuda": ("12.4", "12.8"), "torch": ("2.5.1", "2.8.0"), "transformers": ("4.48.2",), "python": ("3.11",)}
CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11")


def _files(files: dict[str, str]):
    def read(path: str) -> str:
        if path not in files:
            raise UsageError(f"{path}: no such file in the project", "name a file of the project")
        return files[path]

    return read


def _reqs(files: dict[str, str], start: str = "requirements.txt") -> project_deps.ProjectDeps:
    return project_deps.read_requirements(start, _files(files))


def _config(text: str, data, origin: str = "imagekit.toml") -> matrix.MatrixConfig:
    return matrix.parse(tomllib.loads(text), origin, data)


# ---- requirements files ------------------------------------------------------------------------------------------
def test_nanogpt_requirements_become_packages_and_leave_the_axes_alone(data):
    text = (FIXTURES / "projects" / "nanogpt" / "requirements.txt").read_text()
    deps = _reqs({"requirements.txt": text})
    axes = project_axes.derive(deps, {}, DEFAULTS, data)
    assert axes.values == DEFAULTS  # torch and transformers unpinned: the default axes
    packages, problems = project_axes.cell_packages(CELL, deps)
    assert problems == []
    assert packages == ("datasets", "numpy", "tiktoken", "tqdm", "wandb")  # torch and transformers are axes


def test_includes_constraints_continuations_and_comments(data):
    files = {
        "requirements.txt": (
            "# the project's list\n-r requirements/base.txt\n--constraint constraints.txt\n"
            "numpy  # any\npeft>=0.14 \\\n    --hash=sha256:" + "a" * 64 + "\n"
            "--extra-index-url https://download.pytorch.org/whl/cu124\n"
        ),
        "requirements/base.txt": "-r ../shared.txt\ntransformers>=4.45\n",
        "shared.txt": "accelerate>=1.0\nnumpy>=1.20\n",
        "constraints.txt": "numpy<2\naccelerate==1.2.1\ntorch==2.5.1\n",
    }
    deps = _reqs(files)
    assert deps.files == ("requirements.txt", "requirements/base.txt", "shared.txt", "constraints.txt")
    numpy = [(d.where, d.constraint) for d in deps.declared if d.name == "numpy"]
    assert numpy == [("shared.txt:2", False), ("constraints.txt:1", True), ("requirements.txt:4", False)]  # as read
    assert any("download.pytorch.org" in n and "ignored" in n for n in deps.notes)
    packages, problems = project_axes.cell_packages(CELL, deps)
    assert problems == []
    # constraints narrow what is required and add nothing; the hash option is imagekit's job
    assert packages == ("accelerate==1.2.1,>=1.0", "numpy<2,>=1.20", "peft>=0.14")
    assert project_axes.derive(deps, {}, DEFAULTS, data).values["torch"] == ("2.5.1",)  # a constraint on an axis


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ({"requirements.txt": "-r requirements.txt\n"}, "requirements.txt:1: -r requirements.txt includes itself"),
        (
            {"requirements.txt": "-r a.txt\n", "a.txt": "numpy\n-c b.txt\n", "b.txt": "-r a.txt\n"},
            "b.txt:1: -r a.txt makes a loop (requirements.txt -> a.txt -> b.txt -> a.txt)",
        ),
        (
            {"requirements.txt": "-r ../other/requirements.txt\n"},
            "requirements.txt:1: -r ../other/requirements.txt is outside the project",
        ),
        ({"requirements.txt": "-r /etc/passwd\n"}, "-r /etc/passwd is outside the project"),
        ({"requirements.txt": "-r sub/../../x.txt\n"}, "is outside the project"),
        ({"requirements.txt": "-r https://example.com/r.txt\n"}, "names a URL"),
        (
            {"requirements.txt": "numpy\n-r missing.txt\n"},
            "requirements.txt:2: -r missing.txt: missing.txt: no such file",
        ),
        ({"requirements.txt": "-e ../other\n"}, "requirements.txt:1: ../other is outside the project"),
        ({"requirements.txt": "-e /opt/pkg\n"}, "requirements.txt:1: /opt/pkg is an absolute path"),
        ({"requirements.txt": "./sub/../../x\n"}, "is outside the project"),
        ({"requirements.txt": "~/pkg\n"}, "is an absolute path"),
        ({"requirements.txt": ".[train]\n"}, "installs the project with extras [train]"),
        ({"requirements.txt": "-c c.txt\n", "c.txt": "-e .\n"}, "c.txt:1: . in a constraints file names no version"),
        ({"requirements.txt": "--index-url https://u:p@pkgs.acme.example/simple\n"}, "carries a credential"),
        (
            {"requirements.txt": "--index-url https://a.example/simple\n-i https://b.example/simple\n"},
            "requirements.txt:2: --index-url https://b.example/simple replaces https://a.example/simple",
        ),
        ({"requirements.txt": "--find-links ./wheels\n"}, "--find-links is not honoured"),
        ({"requirements.txt": "./vendor/pkg-1.0.tar.gz\n"}, "is a source archive"),
        ({"requirements.txt": "https://h.example/pkg-1.0.tar.gz\n"}, "is a source archive"),
        ({"requirements.txt": "https://h.example/simple/pkg/\n"}, "names no wheel"),
        ({"requirements.txt": "git+ssh://git@github.com/a/b@main\n"}, "requirements.txt:1: (unnamed) @"),
        ({"requirements.txt": "git+https://github.com/a/b@main#egg=x[y]\n"}, "is not a distribution name"),
        ({"requirements.txt": "x @ git+ssh://github.com/a/b\n"}, "requirements.txt:1:"),
        ({"requirements.txt": "numpy --global-option=x\n"}, "--global-option=x is not honoured"),
        ({"requirements.txt": "numpy==${VERSION}\n"}, "environment variables"),
        ({"requirements.txt": "--pre\nnumpy\n"}, "requirements.txt:1: --pre is not honoured"),
    ],
)
def test_bad_requirements_files_are_refused_naming_the_line(files, needle):
    with pytest.raises(UsageError) as info:
        _reqs(files)
    assert needle in f"{info.value.message}\n{info.value.hint}" and info.value.hint
    assert info.value.message.split(":")[0].endswith(".txt")  # it names the file and line where it is


def test_a_diamond_of_includes_is_read_once():
    files = {"requirements.txt": "-r a.txt\n-r b.txt\n", "a.txt": "-r c.txt\n", "b.txt": "-r c.txt\n", "c.txt": "x\n"}
    deps = _reqs(files)
    assert deps.files == ("requirements.txt", "a.txt", "c.txt", "b.txt") and len(deps.declared) == 1


# ---- what conflicts ----------------------------------------------------------------------------------------------
def test_two_torch_pins_that_disagree_are_named_both(data):
    deps = _reqs({"requirements.txt": "torch==2.4.0\n-r more.txt\n", "more.txt": "torch==2.5.1\n"})
    with pytest.raises(UsageError) as info:
        project_axes.derive(deps, {}, DEFAULTS, data)
    assert info.value.message == "requirements.txt:1: torch==2.4.0 conflicts with more.txt:1: torch==2.5.1"
    _, problems = project_axes.cell_packages(Cell("12.1", "2.4.0", "4.48.2", "3.11"), deps)
    assert "requirements.txt:1: torch==2.4.0 conflicts with more.txt:1: torch==2.5.1" in problems


def test_an_axis_flag_against_the_file_is_named_both(data):
    deps = _reqs({"requirements.txt": "torch==2.4.0\ntransformers<4.40\n"})
    with pytest.raises(UsageError) as info:
        project_axes.derive(deps, {"torch": ("2.5.1",)}, DEFAULTS, data)
    assert info.value.message == "--torch 2.5.1 conflicts with requirements.txt:1: torch==2.4.0"
    with pytest.raises(UsageError) as info:
        project_axes.derive(deps, {"transformers": ("4.48.2",)}, DEFAULTS, data)
    assert info.value.message == "--transformers 4.48.2 conflicts with requirements.txt:2: transformers<4.40"
    pinned = _reqs({"requirements.txt": "torch==2.4.0+cu121\n"})
    with pytest.raises(UsageError, match=r"--cuda 12\.4 conflicts with requirements.txt:1: torch==2.4.0\+cu121"):
        project_axes.derive(pinned, {"cuda": ("12.4",)}, DEFAULTS, data)
    with pytest.raises(UsageError, match=r"--python 3.10 conflicts with pyproject.toml \[project\] requires-python"):
        project_axes.derive(_pyproject('requires-python = ">=3.11"\n'), {"python": ("3.10",)}, DEFAULTS, data)


def test_a_matrix_whose_axes_the_file_refuses_is_a_config_error_naming_both(data):
    deps = _reqs({"requirements.txt": "torch==2.4.0\naccelerate==1.3.0\n"})
    config = _config(
        '[matrix]\ncuda = ["12.1", "12.4"]\ntorch = ["2.4.0", "2.5.1"]\ntransformers = ["4.48.2"]\n'
        'python = ["3.11"]\npackages = ["accelerate==1.2.1"]\nrequirements = "requirements.txt"\n',
        data,
    )
    assert config.requirements == DepsSource("requirements.txt")
    with pytest.raises(ConfigError) as info:
        project_axes.apply(config, deps)
    problems = info.value.problems
    assert (
        "imagekit.toml: torch 2.5.1 (matrix.torch, cell cu121-torch2.5.1-py3.11-tf4.48.2) conflicts with "
        "requirements.txt:1: torch==2.4.0" in problems
    )
    assert "imagekit.toml: matrix.packages: accelerate==1.2.1 conflicts with requirements.txt:2: accelerate==1.3.0" in (
        problems
    )
    assert info.value.hint.startswith("keep one list")


# ---- the axes a declaration chooses ------------------------------------------------------------------------------
def test_pins_ranges_and_family_pins_choose_the_axes(data):
    pinned = project_axes.derive(_reqs({"requirements.txt": "torch==2.4.0\n"}), {}, DEFAULTS, data)
    assert pinned.values["torch"] == ("2.4.0",) and pinned.values["cuda"] == ("12.1",)  # PyPI's build of 2.4.0
    local = project_axes.derive(_reqs({"requirements.txt": "torch==2.4.0+cu118\n"}), {}, DEFAULTS, data)
    assert local.values["cuda"] == ("11.8",)
    ranged = project_axes.derive(_reqs({"requirements.txt": "torch>=2.6\n"}), {}, DEFAULTS, data)
    assert ranged.values["torch"] == ("2.8.0",) and ranged.values["cuda"] == ("12.8",)  # the defaults it allows
    older = project_axes.derive(_reqs({"requirements.txt": "torch<2.5\ntransformers<4.46\n"}), {}, DEFAULTS, data)
    assert older.values["torch"] == ("2.4.1",) and older.values["transformers"] == ("4.45.2",)
    assert any("the newest known release" in n for n in older.notes)
    vision = project_axes.derive(_reqs({"requirements.txt": "torchvision==0.20.1\n"}), {}, DEFAULTS, data)
    assert vision.values["torch"] == ("2.5.1",)  # torchvision 0.20.1 requires torch==2.5.1
    with pytest.raises(UsageError, match=r"no torch release imagekit knows satisfies requirements\.txt:1: torch>=99"):
        project_axes.derive(_reqs({"requirements.txt": "torch>=99\n"}), {}, DEFAULTS, data)


def test_requires_python_narrows_the_python_axis(data):
    assert project_axes.derive(_pyproject('requires-python = ">=3.12"\n'), {}, DEFAULTS, data).values["python"] == (
        "3.13",
    )
    assert project_axes.derive(_pyproject('requires-python = ">=3.10.9"\n'), {}, DEFAULTS, data).values["python"] == (
        "3.11",
    )
    assert project_axes.python_fits(">=3.10.9", "3.10") and not project_axes.python_fits("<3.10", "3.11")


def test_duplicates_of_the_axes_are_not_duplicated():
    deps = _reqs({"requirements.txt": "torch\ntransformers[sentencepiece]>=4.40\ntorchvision\nnumpy\nnumpy\n"})
    packages, problems = project_axes.cell_packages(CELL, deps)
    assert problems == []
    assert packages == ("numpy", "torchvision", "transformers[sentencepiece]==4.48.2")


def test_markers_are_judged_for_each_cells_python():
    deps = _reqs({"requirements.txt": "tomli ; python_version < '3.11'\nuvloop ; sys_platform == 'win32'\nx\n"})
    assert project_axes.cell_packages(Cell("12.4", "2.5.1", "4.48.2", "3.10"), deps)[0] == ("tomli", "x")
    assert project_axes.cell_packages(CELL, deps)[0] == ("x",)


# ---- pyproject.toml ----------------------------------------------------------------------------------------------
def _pyproject(extra: str = "", extras: tuple[str, ...] = ()) -> project_deps.ProjectDeps:
    text = (
        '[project]\nname = "My_Trainer"\nversion = "0.1"\ndependencies = ["accelerate>=1.0", "torch>=2.5"]\n'
        + extra
        + '[project.optional-dependencies]\ntrain = ["peft>=0.14", "tomli; python_version < \'3.11\'"]\n'
        'test = ["pytest"]\ndev = ["my-trainer[test]", "ruff"]\n'
    )
    return project_deps.from_pyproject(text, DepsSource("pyproject.toml", extras))


def test_pyproject_dependencies_and_the_groups_chosen():
    assert project_axes.cell_packages(CELL, _pyproject())[0] == ("accelerate>=1.0",)
    train = _pyproject(extras=("train",))
    assert project_axes.cell_packages(CELL, train)[0] == ("accelerate>=1.0", "peft>=0.14")
    assert project_axes.cell_packages(Cell("12.4", "2.5.1", "4.48.2", "3.10"), train)[0] == (
        "accelerate>=1.0",
        "peft>=0.14",
        "tomli",
    )
    dev = _pyproject(extras=("dev",))  # dev names the project's own test group
    assert dev.extras == ("dev", "test")
    assert project_axes.cell_packages(CELL, dev)[0] == ("accelerate>=1.0", "pytest", "ruff")


def test_pyproject_refusals():
    with pytest.raises(UsageError, match="has no optional-dependency group nope") as info:
        _pyproject(extras=("nope",))
    assert info.value.hint == "its groups: dev, test, train"
    with pytest.raises(UsageError, match="has no \\[project\\] table"):
        project_deps.from_pyproject("[tool.x]\n", DepsSource("pyproject.toml"))
    dynamic = '[build-system]\nbuild-backend = "hatchling.build"\n[project]\nname = "x"\ndynamic = ["dependencies"]\n'
    with pytest.raises(project_deps.NeedsBackend) as needs:
        project_deps.from_pyproject(dynamic, DepsSource("pyproject.toml"))
    assert needs.value.backend == "hatchling.build"
    with pytest.raises(UsageError, match="is a requirements file, which has no optional groups"):
        project_deps.source_of({"file": "requirements.txt", "extras": ["train"]})
    for bad in ("/etc/requirements.txt", "../requirements.txt", ".", "a\nb", 3, {"file": "r.txt", "x": 1}):
        with pytest.raises(UsageError):
            project_deps.source_of(bad)


# ---- a build backend's answer ------------------------------------------------------------------------------------
def test_metadata_and_egg_info_answers_read_alike():
    metadata = (
        "Metadata-Version: 2.1\nName: alignment-handbook\nVersion: 0.4.0.dev0\nRequires-Python: >=3.10.9\n"
        "Provides-Extra: dev\nProvides-Extra: tests\nRequires-Dist: accelerate>=1.0.1\n"
        'Requires-Dist: transformers>=4.48.2\nRequires-Dist: pytest; extra == "tests"\n'
        'Requires-Dist: alignment-handbook[tests]; extra == "dev"\n'
        'Requires-Dist: tomli; python_version < "3.11" and extra == "dev"\n'
    )
    egg_pkg_info = "Metadata-Version: 2.1\nName: alignment-handbook\nVersion: 0.4.0.dev0\nRequires-Python: >=3.10.9\n"
    egg_requires = (
        "accelerate>=1.0.1\ntransformers>=4.48.2\n\n[dev]\nalignment-handbook[tests]\n\n"
        '[dev:python_version < "3.11"]\ntomli\n\n[tests]\npytest\n'
    )
    source = DepsSource("setup.py", ("dev",))
    for deps in (
        backend_metadata.from_metadata(metadata, source, ("setup.py",)),
        backend_metadata.from_egg_info(egg_pkg_info, egg_requires, source, ("setup.py",)),
    ):
        assert deps.requires_python == (">=3.10.9", "setup.py (its build backend's metadata): Requires-Python")
        assert deps.extras == ("dev", "tests")
        assert project_axes.cell_packages(CELL, deps)[0] == ("accelerate>=1.0.1", "pytest")
        assert project_axes.cell_packages(Cell("12.4", "2.5.1", "4.48.2", "3.10"), deps)[0] == (
            "accelerate>=1.0.1",
            "pytest",
            "tomli",
        )


def test_the_matrix_file_refers_to_the_declaration(data):
    config = _config(
        '[matrix]\ncuda = ["12.4"]\ntorch = ["2.5.1"]\ntransformers = ["4.48.2"]\npython = ["3.11"]\n'
        'requirements = { file = "./py/../pyproject.toml", extras = ["Train"] }\n',
        data,
    )
    assert config.requirements == DepsSource("pyproject.toml", ("train",))
    with pytest.raises(ConfigError, match=r"matrix\.requirements: \.\./x\.txt is outside the project"):
        _config('[matrix]\ninclude = []\nrequirements = "../x.txt"\n', data)
    assert Path(DepsSource("a/setup.py").folder) == Path("a") and DepsSource("setup.cfg").kind == "setup"


def test_without_round_trips_and_refuses_what_is_no_name():
    source = project_deps.source_of({"file": "setup.py", "extras": ["torch"], "without": ["DeepSpeed", "deepspeed"]})
    assert source == DepsSource("setup.py", ("torch",), ("deepspeed",))
    assert tomllib.loads(f"r = {source.toml()}")["r"] == {
        "file": "setup.py",
        "extras": ["torch"],
        "without": ["deepspeed"],
    }
    for bad, needle in (("deepspeed", "expected a list"), (["a b"], "expected a list"), (["transformers"], "an axis")):
        with pytest.raises(UsageError, match=needle):
            project_deps.source_of({"file": "setup.py", "without": bad})


@pytest.mark.parametrize(
    ("constraints", "needle"),
    [
        ("urllib3<2\n", "c.txt:1: urllib3<2: constrains urllib3, which the project does not require directly"),
        ("numpy[extra]<2\n", "c.txt:1: numpy[extra]<2: a constraint cannot name extras"),
    ],
)
def test_a_constraint_imagekit_cannot_apply_is_refused_not_dropped(constraints, needle):
    """pip applies a constraint to a dependency of a dependency too; imagekit's lock would not: refused, saying how."""
    with pytest.raises(UsageError) as exc:
        _reqs({"requirements.txt": "requests\nnumpy\n-c c.txt\n", "c.txt": constraints})
    assert needle in exc.value.message, exc.value.message
    assert "[matrix] packages" in exc.value.hint or "extras" in exc.value.hint


def test_a_byte_order_mark_is_not_part_of_the_first_requirement():
    deps = _reqs({"requirements.txt": "\ufeffnumpy\nwandb\n"})
    assert [d.requirement for d in deps.declared] == ["numpy", "wandb"]


def test_a_reference_to_the_projects_own_group_under_a_python_marker_is_refused():
    text = (
        '[project]\nname = "p"\nversion = "1"\ndependencies = ["numpy", "p[log] ; python_version >= \'3.12\'"]\n'
        '[project.optional-dependencies]\nlog = ["wandb"]\ndev = ["p[log] ; sys_platform == \'linux\'"]\n'
    )
    with pytest.raises(UsageError, match="whose marker depends on the Python or the platform"):
        project_deps.from_pyproject(text, DepsSource("pyproject.toml"))
    plain = text.replace(" ; python_version >= '3.12'", "")  # a marker every image answers alike is followed
    assert project_deps.from_pyproject(plain, DepsSource("pyproject.toml", ("dev",))).extras == ("dev", "log")


def test_a_torchvision_pin_against_the_torch_axis_is_named_like_a_torch_pin(data):
    deps = _reqs({"requirements.txt": "torchvision==0.23.0\nnumpy\n"})
    _, problems = project_axes.cell_packages(CELL, deps, data)  # CELL's torch is 2.5.1; torchvision 0.23 wants 2.8.0
    assert (
        len(problems) == 1
        and "conflicts with requirements.txt:1: torchvision==0.23.0 (it requires torch==2.8.0)" in (problems[0])
    )
    fitting = Cell("12.8", "2.8.0", "4.48.2", "3.11")
    assert project_axes.cell_packages(fitting, deps, data)[1] == []


def test_without_names_only_what_some_image_would_install():
    text = (
        '[project]\nname = "p"\nversion = "1"\ndependencies = ["numpy", "deepspeed>=0.16"]\n'
        '[project.optional-dependencies]\nlog = ["wandb"]\n'
    )
    deps = project_deps.from_pyproject(text, DepsSource("pyproject.toml", (), ("deepspeed",)))
    assert [d.name for d in project_deps.leave_out(deps).declared] == ["numpy", "wandb"]  # wandb: its group's
    unchosen = project_deps.from_pyproject(text, DepsSource("pyproject.toml", (), ("wandb",)))
    with pytest.raises(UsageError, match=r"without: wandb is not among what pyproject\.toml states"):
        project_deps.leave_out(unchosen)  # only in a group not chosen: leaving it out would do nothing
    chosen = project_deps.from_pyproject(text, DepsSource("pyproject.toml", ("log",), ("wandb",)))
    assert "wandb" not in [d.name for d in project_deps.leave_out(chosen).declared]


def test_a_pep_735_group_is_named_as_such():
    text = '[project]\nname = "p"\nversion = "1"\ndependencies = ["numpy"]\n[dependency-groups]\ndev = ["pytest"]\n'
    with pytest.raises(UsageError, match=r"dev is a \[dependency-groups\] group \(PEP 735"):
        project_deps.from_pyproject(text, DepsSource("pyproject.toml", ("dev",)))


@pytest.mark.parametrize(
    ("value", "needle"),
    [(".", "is the project's folder, not a file of it"), ("/p/pyproject.toml", "is an absolute path"),
     ("../x.txt", "is outside the project")],
)  # fmt: skip
def test_a_path_that_is_no_file_of_the_project_says_which_way_it_is_wrong(value, needle):
    with pytest.raises(UsageError) as exc:
        project_deps.project_path(value)
    assert needle in exc.value.message


def test_a_huge_name_to_leave_out_is_not_echoed_whole():
    deps = _reqs({"requirements.txt": "numpy\n"})
    with pytest.raises(UsageError) as exc:
        project_deps.leave_out(replace(deps, source=DepsSource("requirements.txt", (), ("x" * 5000,))))
    assert "is not among what" in exc.value.message and len(exc.value.message) < 400
