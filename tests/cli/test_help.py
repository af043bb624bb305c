"""Every command's --help: it works, names values as a CLI does (VERSION, FILE, DIR, URL), and shows bracketed
text such as `[tool.imagekit]` as written. The commands are found by walking the real typer app."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from imagekit.cli import build_app
from imagekit.cli.matrix_cmd import EPILOG
from imagekit.matrix import matrix_file as matrix
from imagekit.services import inputs

# typer's type labels (`<list[str]>`, `<path>`, `<int range>`): what a value is called when no metavar is given
TYPE_LABEL = re.compile(r"<(list\[|str>|bool>|int|float|path>|file>|dir>|text>|integer>|uuid>|datetime>)")
ROOT = typer.main.get_command(build_app())


def _walk(cmd: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, cmd)]
    for name, sub in getattr(cmd, "commands", {}).items():
        found += _walk(sub, (*path, name))
    return found


COMMANDS = _walk(ROOT)


def _help(path: tuple[str, ...]) -> str:
    res = CliRunner().invoke(build_app(), [*path, "--help"], terminal_width=120)
    assert res.exit_code == 0, (path, res.output)
    assert "Traceback" not in res.output
    return res.output


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"init", "matrix", "build", "lock", "compat refresh", "pod exec", "pod cp", "base bootstrap"} <= names
    assert len(names) >= 18  # the root, 3 groups and their commands


@pytest.mark.seconds
@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "imagekit")
def test_help_exits_0_without_type_labels(path: tuple[str, ...]) -> None:
    text = _help(path)
    assert "Usage:" in text or "usage:" in text
    labels = TYPE_LABEL.findall(text)
    assert not labels, f"imagekit {' '.join(path)} --help shows type labels {labels}:\n{text}"


@pytest.mark.seconds
@pytest.mark.parametrize(
    ("path", "cmd"),
    [(p, c) for p, c in COMMANDS if c.params],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else "",
)
def test_every_value_has_a_metavar_and_flags_none(path: tuple[str, ...], cmd: Any) -> None:
    text = _help(path)
    for param in cmd.params:
        if param.param_type_name == "option" and (param.is_flag or param.count):
            flag = max(param.opts, key=len)
            line = next(ln for ln in text.splitlines() if re.match(rf"\s+(-\w, )?{re.escape(flag)}(\s|$)", ln))
            after = line.split(flag, 1)[1].split("  ")[0].strip()
            assert after == "", f"{' '.join(path)} {flag} shows a value name {after!r}"
            continue
        assert param.metavar, f"imagekit {' '.join(path)}: {param.opts} has no metavar"
        assert param.metavar.rstrip(".") == param.metavar.rstrip(".").strip(), param.metavar
        assert param.metavar in text, f"{param.metavar} missing from imagekit {' '.join(path)} --help"


@pytest.mark.seconds
def test_bracketed_help_text_survives() -> None:
    build = _help(("build",))
    assert "[tool.imagekit]" in build  # --matrix's default
    assert "[image] repository" in build  # --registry's default
    assert "./pyproject.toml ," not in build and "matrix's  repository" not in build
    assert "<cell id>" in _help(("lock",))
    assert "USER@HOST[:PORT]" in _help(("pod", "exec"))


@pytest.mark.seconds
def test_arguments_read_as_their_metavar() -> None:
    assert "Usage: imagekit pod exec [OPTIONS] TARGET COMMAND..." in _help(("pod", "exec"))
    assert "Usage: imagekit pod cp [OPTIONS] SRC DST" in _help(("pod", "cp"))
    assert "Usage: imagekit runpod-template [OPTIONS] CELL_OR_TAG" in _help(("runpod-template",))


def test_matrix_help_shows_the_file_format() -> None:
    """The config error's hint sends the user to `imagekit matrix --help`: it shows every section and key."""
    text = _help(("matrix",))
    for key in ("[matrix]", "[targets]", "[image]", "[bases.", "include", "exclude", "packages", "imagekit init"):
        assert key in text, key
    for section, keys in {
        "matrix": (*matrix.AXES, "packages", "requirements", "include", "exclude"),
        "targets": ("gpus", "min_driver"),
        "image": ("repository", "jupyter", "compiler"),
        "bases": ("reference", "glibc", "python"),
    }.items():
        for key in keys:
            assert re.search(rf"^\s*{key} = ", text, re.M), (section, key)


def test_matrix_help_example_is_a_valid_matrix() -> None:
    """The example in `imagekit matrix --help` parses, as shown, into compatible cells."""
    blocks = [b.split("\n\n")[0] for b in EPILOG.split("\b\n")[1:]]
    doc = tomllib.loads("\n".join(blocks).replace("<64 hex digits>", "ab" * 32))
    data = inputs.compat_data()
    config = matrix.parse(doc, "help", data)
    assert config.repository == "ghcr.io/acme/train" and "3.11" in config.bases
    ids = {c.id for c in config.cells}
    assert "cu128-torch2.5.1-py3.11-tf4.48.2" not in ids  # excluded
    assert "cu129-torch2.8.0-py3.12-tf5.9.0" in ids  # included
    assert any(e.verdict.compatible for e in matrix.evaluate(config, data))


def test_config_error_hint_points_at_what_exists(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.toml").write_text("[matrix]\ncolour = 1\n")
    res = CliRunner().invoke(build_app(), ["matrix", "--matrix", "m.toml"])
    assert res.exit_code == 2
    hint = next(ln for ln in res.output.splitlines() if ln.startswith("hint:"))
    assert "`imagekit matrix --help`" in hint and "`imagekit init`" in hint
    assert "init" in {p[0] for p, _ in COMMANDS if p}
