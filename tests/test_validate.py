"""Every value that can reach a template is validated; no accepted input adds a Dockerfile instruction."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagekit import matrix, render, validate
from imagekit.errors import ConfigError, UnknownVersionError, UsageError
from imagekit.lockfile import Lock, LockEntry
from imagekit.model import Cell
from imagekit.plan import BuildPlan, bootstrap_base

INJECTION = "4.48.2\nRUN curl x | sh"


@pytest.mark.parametrize("bad", [INJECTION, "4.48.2\n", " 4.48.2", "4.48.2 ", "v4.48.2", "4.48.2;", "", "4.48.2\r"])
def test_versions_must_be_canonical_and_single_line(bad):
    with pytest.raises(UsageError):
        validate.version(bad)


@pytest.mark.parametrize(
    ("value", "canonical"), [("12.4", "12.4"), ("cu118", "11.8"), ("cu130", "13.0"), ("11.8", "11.8")]
)
def test_cuda(value, canonical):
    assert validate.cuda(value) == canonical


@pytest.mark.parametrize("bad", ["12", "12.4.1", "12.4\n", "cu12", "twelve", "12.4 "])
def test_bad_cuda(bad):
    with pytest.raises(UsageError):
        validate.cuda(bad)


@pytest.mark.parametrize(
    "ref",
    [
        "debian:bookworm",
        "127.0.0.1:5000/imagekit/train:cu124-torch2.5.1-py3.11-tf4.48.2",
        "registry.example.com/team/base@sha256:" + "a" * 64,
        "ghcr.io/org/img:tag@sha256:" + "0" * 64,
        "localhost:5000/a__b/c-d.e",
    ],
)
def test_image_refs_accepted(ref):
    assert validate.image_ref(ref) == ref


@pytest.mark.parametrize(
    "ref",
    ["UPPER/case", "img:tag\nRUN x", "img::tag", "img@sha256:xyz", "-img", "img:" + "t" * 200, "a b", "img:tag@md5"],
)
def test_image_refs_rejected(ref):
    with pytest.raises(UsageError):
        validate.image_ref(ref)


@pytest.mark.parametrize("req", ["accelerate==1.2.1", "peft>=0.10,<0.20", "trl==0.20.0; python_version >= '3.9'"])
def test_requirements_accepted(req):
    assert validate.requirement(req)


@pytest.mark.parametrize("req", ["accelerate==1.2.1\nRUN x", "pkg @ https://evil.example/pkg.whl", "==1.0", "a b c"])
def test_requirements_rejected(req):
    with pytest.raises(UsageError):
        validate.requirement(req)


def _lock() -> Lock:
    torch = LockEntry("torch", "2.5.1", ("sha256:" + "1" * 64,))
    tf = LockEntry("transformers", "4.48.2", ("sha256:" + "2" * 64,))
    return Lock((torch,), (tf,), {"input-hash": "sha256:" + "3" * 64})


def _instructions(dockerfile: str) -> list[str]:
    """The instruction keyword of every logical line (continuations joined), comments dropped."""
    logical, current = [], ""
    for line in dockerfile.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line
        if line.endswith("\\"):
            current = current[:-1]
            continue
        logical.append(current)
        current = ""
    return [re.split(r"\s", x.strip(), maxsplit=1)[0] for x in logical]


def _render(cell: Cell, data, repository: str = "127.0.0.1:5000/x") -> str:
    spec = data.bases["3.11"]
    plan = BuildPlan(cell=cell, lock=_lock(), base=bootstrap_base(spec), repository=repository)
    return render.render_plan(plan, data)["Dockerfile"][0].decode()


text_or_injection = st.one_of(
    st.text(max_size=30),
    st.builds(
        lambda a, b: a + b,
        st.sampled_from(["2.5.1", "4.48.2", "12.4", "3.11"]),
        st.sampled_from(["\nRUN curl x | sh", "\n", "\r\nUSER root", " \\\nRUN x", "$(id)", '"', "\x00"]),
    ),
    st.sampled_from(["2.5.1", "4.48.2", "12.4", "3.11", "cu118", "2.5.1+cu118", "1!2.0", "2.5.1.post1"]),
)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI on a fresh clone is deterministic
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    cuda=text_or_injection,
    torch=text_or_injection,
    tf=text_or_injection,
    py=text_or_injection,
    repo=st.one_of(st.text(max_size=30), st.just("127.0.0.1:5000/team/img")),
)
def test_no_accepted_input_adds_an_instruction(data, cuda, torch, tf, py, repo):
    doc = {
        "matrix": {"include": [{"cuda": cuda, "torch": torch, "transformers": tf, "python": py}]},
        "image": {"repository": repo},
    }
    try:
        config = matrix.parse(doc, "<hypothesis>", data)
    except (ConfigError, UsageError):
        return  # refused: never rendered
    reference = _instructions(_render(Cell("12.4", "2.5.1", "4.48.2", "3.11"), data))
    try:
        rendered = _render(config.cells[0], data, config.repository)
    except UnknownVersionError:
        return  # a well-formed version the compatibility data does not know (e.g. cuda 0.0): exit 2, never rendered
    assert _instructions(rendered) == reference
    assert "\r" not in rendered and "\x00" not in rendered


def test_injection_rejected_from_a_matrix_file_with_exit_2(app, runner, in_tmp):
    (in_tmp / "m.toml").write_text(
        '[matrix]\ninclude = [{cuda = "12.4", torch = "2.5.1", python = "3.11", '
        'transformers = "4.48.2\\nRUN curl x | sh"}]\n'
    )
    res = runner.invoke(app, ["render", "--matrix", "m.toml", "--out", "out"])
    assert res.exit_code == 2
    assert "matrix.include[0].transformers" in res.output and "invalid transformers version" in res.output
    assert not (in_tmp / "out").exists()


def test_injection_rejected_on_the_command_line(app, runner):
    res = runner.invoke(app, ["explain", "--transformers", INJECTION])
    assert res.exit_code == 2
    assert res.output.startswith("error: invalid transformers version")


def test_label_filter_refuses_quotes_and_dollars():
    for bad in ['a"b', "a$b", "a\\b", "a\nb"]:
        with pytest.raises(UsageError):
            render._dq(bad)


def test_installed_layers_ignore_via_annotations(data):
    """A package gaining a dependent elsewhere (jupyterlab next to jinja2) must not change the torch layer's input."""
    from dataclasses import replace

    lock = _lock()
    annotated = replace(lock, torch=(replace(lock.torch[0], via=("jupyter-server", "sympy")),))
    spec = data.bases["3.11"]
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11")
    files = [
        render.render_plan(BuildPlan(cell=cell, lock=x, base=bootstrap_base(spec), repository="r/x"), data)
        for x in (lock, annotated)
    ]
    assert files[0]["requirements-torch.txt"] == files[1]["requirements-torch.txt"]
    assert b"# via" not in files[1]["requirements-torch.txt"] and "# via" in annotated.render()
