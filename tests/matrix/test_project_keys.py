"""`[image] install`, `env` and `smoke` in the matrix file (matrix_file._image_options): what each takes, where
`install` is resolved (as `copy`'s `from`: from the matrix file's folder, and inside the copied folder), and every
problem reported at once with its key."""

from __future__ import annotations

import pytest

from imagekit.errors import ConfigError
from imagekit.image.image_options import ImageOptions
from imagekit.matrix import matrix_file as matrix

AXES = {"cuda": ["12.4"], "torch": ["2.5.1"], "transformers": ["4.48.2"], "python": ["3.11"]}


def _image(data, image: dict, origin: str = "proj/imagekit.toml") -> ImageOptions:
    return matrix.parse({"matrix": AXES, "image": image}, origin, data).options


def _problems(data, image: dict) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        _image(data, image)
    assert exc.value.exit_code == 2 and "imagekit matrix --help" in exc.value.hint
    return exc.value.problems


def test_a_project_as_it_is_installed_configured_and_smoke_tested(data):
    options = _image(data, {
        "copy": ".",
        "install": ".",
        "env": {"WANDB_PROJECT": "sft", "TOKENIZERS_PARALLELISM": "false"},
        "smoke": ["python -c 'import alignment'", "python /opt/app/scripts/run_sft.py --help"],
    })  # fmt: skip
    assert options.copy is not None and options.copy.source == "proj" and options.install == "proj"
    assert options.env == (("TOKENIZERS_PARALLELISM", "false"), ("WANDB_PROJECT", "sft"))  # sorted by name
    assert options.smoke == ("python -c 'import alignment'", "python /opt/app/scripts/run_sft.py --help")
    sub = _image(data, {"copy": {"from": "src"}, "install": "src/pkg"})
    assert sub.copy is not None and sub.copy.source == "proj/src" and sub.install == "proj/src/pkg"
    plain = _image(data, {"copy": "."})
    assert (plain.install, plain.env, plain.smoke) == (None, (), ())  # none of it unless asked for


def test_every_problem_with_the_three_keys_is_reported_with_its_key(data):
    problems = _problems(data, {
        "install": ".",  # without copy
        "env": {"PATH": "/x", "LD_PRELOAD": "/y.so", "HF_TOKEN": "hf_x", "OK": "fine", "BAD": "a\nb"},
        "smoke": "python -c 'import x'",  # a string, not a list
    })  # fmt: skip
    keys = [p.split(": ")[1] for p in problems]
    assert keys == ["image.install", "image.env.PATH", "image.env.LD_PRELOAD", "image.env.HF_TOKEN", "image.env.BAD",
                    "image.smoke"]  # fmt: skip
    assert 'add copy = "."' in problems[0] and "the image's own" in problems[1]
    assert "dynamic loader" in problems[2] and "looks like a secret" in problems[3]
    assert "expected a list of 1 to 16 shell commands" in problems[5]


@pytest.mark.parametrize(
    ("image", "needle"),
    [
        ({"copy": "src", "install": "."}, "is not inside the copied folder"),
        ({"copy": ".", "install": "../other"}, "is not inside the copied folder"),
        ({"copy": ".", "install": "a b"}, "expected a folder of the project"),
        ({"copy": ".", "install": ["."]}, "expected a folder of the project"),
        ({"env": ["A=1"]}, "expected a table"),
        ({"env": {f"V{i}": "x" for i in range(65)}}, "at most 64"),
        ({"env": {"A": 1}}, "expected a string value"),
        ({"smoke": []}, "expected a list of 1 to 16 shell commands"),
        ({"smoke": ["ok", "two\nlines"]}, "expected a list of 1 to 16 shell commands"),
        ({"smoke": ["   "]}, "expected a list of 1 to 16 shell commands"),
        ({"smoke": ["x" * 1025]}, "expected a list of 1 to 16 shell commands"),
        ({"smoke": ["true"] * 17}, "expected a list of 1 to 16 shell commands"),
    ],
)
def test_a_bad_value_is_refused_saying_what_is_expected(data, image, needle):
    (problem,) = _problems(data, image)
    assert needle in problem, problem


def test_skip_imports_takes_top_level_module_names_of_the_installed_project(data):
    options = _image(data, {"copy": ".", "install": ".", "skip_imports": ["recipes", "_private", "recipes"]})
    assert options.skip_imports == ("_private", "recipes")  # sorted, once each
    assert _image(data, {"copy": ".", "install": "."}).skip_imports == ()


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("recipes", "expected a list of at most 64 top-level module names"),
        ([1], "expected a list of at most 64 top-level module names"),
        (["m"] * 65, "expected a list of at most 64"),
        (["acme.recipes"], "name the top-level module ('acme')"),
        (["../../etc"], "not a top-level module name: '../../etc'"),
        (["rec\x1b[2Jipes"], "not a top-level module name: 'rec\\x1b[2Jipes'"),  # shown as its repr, never raw
        (["x" * 101], "not a top-level module name"),
        (["import"], "not a top-level module name: 'import'"),
        (["café"], "not a top-level module name"),  # what pip's wheels name: ASCII
        ([""], "not a top-level module name"),
    ],
)
def test_a_hostile_skip_imports_is_refused(data, value, needle):
    (problem,) = _problems(data, {"copy": ".", "install": ".", "skip_imports": value})
    assert "image.skip_imports" in problem and needle in problem, problem
    assert "\x1b" not in problem


def test_skip_imports_without_install_is_refused(data):
    (problem,) = _problems(data, {"copy": ".", "skip_imports": ["recipes"]})
    assert "only the project's wheel's modules are imported: set install too" in problem
