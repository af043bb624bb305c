"""Every value that can reach a template is validated; no accepted input adds a Dockerfile instruction."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagekit.errors import ConfigError, UnknownVersionError, UsageError
from imagekit.image import render
from imagekit.image.buildplan import BuildPlan, bootstrap_base
from imagekit.locking import direct_wheels
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.matrix import matrix_file as matrix
from imagekit.model import Cell
from imagekit.trust import validate
from tests.props import examples

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
    assert direct_wheels.requirement(req)


@pytest.mark.parametrize("req", ["accelerate==1.2.1\nRUN x", "pkg @ https://evil.example/pkg.whl", "==1.0", "a b c"])
def test_requirements_rejected(req):
    with pytest.raises(UsageError):
        direct_wheels.requirement(req)


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
    plan = BuildPlan.make(cell=cell, lock=_lock(), base=bootstrap_base(spec), repository=repository, data=data)
    return render.render_plan(plan)["Dockerfile"][0].decode()


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
    max_examples=examples(300),
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
        render.render_plan(BuildPlan.make(cell=cell, lock=x, base=bootstrap_base(spec), repository="r/x", data=data))
        for x in (lock, annotated)
    ]
    torch = "rootfs/app/opt/imagekit/requirements-torch.txt"
    assert files[0][torch] == files[1][torch]
    assert b"# via" not in files[1][torch][0] and "# via" in annotated.render()


# ---- the validators added for hostile inputs: exact answers --------------------------------------------------
@pytest.mark.parametrize(
    "good",
    ["2024-06-01", "2024-06-01T00:00:00Z", "2024-06-01T23:59:59+02:00", "2024-06-01T00:00:00.123456789-05:30"],
)
def test_exclude_newer_accepts_rfc3339_dates_and_timestamps(good):
    assert validate.exclude_newer(good) == good


@pytest.mark.parametrize(
    "bad",
    [
        "nan",
        "-1",
        "2024-13-45",
        "2024-02-30",
        "2024-06-01T25:00:00Z",
        "2024-06-01T00:00:00",
        "2024-06-01 00:00:00Z",
        "2024-6-1",
        " 2024-06-01",
        "2024-06-01T00:00:00+99:99",
        "",
        None,
        20240601,
        "2024-06-01T00:00:00.1234567890Z",
    ],
)
def test_exclude_newer_refuses_anything_else_naming_the_option(bad):
    with pytest.raises(UsageError) as info:
        validate.exclude_newer(bad)
    assert info.value.message == (
        f"invalid --exclude-newer {bad!r}: expected an RFC 3339 date or timestamp such as '2024-06-01' or "
        "'2024-06-01T00:00:00Z'"
    )


@pytest.mark.parametrize("good", ["https://api.runpod.io/graphql", "http://127.0.0.1:9/v1", "https://h/p?q=1"])
def test_http_url_accepts_an_http_url_on_one_line(good):
    assert validate.http_url(good, "--api-url") == good


@pytest.mark.parametrize(
    ("bad", "shown"),
    [
        ("", "''"),
        ("ftp://h/x", "'ftp://h/x'"),
        ("https://h/x\ny", "'https://h/xy'"),  # shown without the line break
        ("https://[::1", "'<unparseable URL>'"),
        ("https://h:99999/x", "'<unparseable URL>'"),
        ("ftp://u:secret@h/x", "'ftp://h/x'"),  # credentials never shown
        ("https://h/é", "'https://h/é'"),
        (5, "5"),
    ],
)
def test_http_url_refuses_and_never_shows_credentials(bad, shown):
    with pytest.raises(UsageError) as info:
        validate.http_url(bad, "--api-url")
    assert info.value.message == f"invalid --api-url {shown}: expected an http(s) URL such as https://host/path"


def test_versions_long_or_not_canonical_are_named_exactly():
    with pytest.raises(UsageError) as info:
        validate.version("1" * 65, "--torch")
    assert info.value.message == (
        f"invalid --torch {'1' * 65!r}: expected a version of at most 64 characters such as '2.5.1'"
    )
    validate.version("1" * 64)  # the limit itself is fine
    with pytest.raises(UsageError) as info:
        validate.version("v2.5.1", "--torch")
    assert info.value.message == "invalid --torch 'v2.5.1': expected the canonical form '2.5.1'"
    assert info.value.hint == "write versions without spaces or prefixes"
    with pytest.raises(UsageError) as info:
        validate.version(2.5, "--torch")
    assert info.value.message == "invalid --torch 2.5: expected a version string such as '2.5.1'"
    with pytest.raises(UsageError) as info:
        validate.version("2.x")
    assert info.value.message == "invalid version '2.x': expected a PEP 440 version such as '2.5.1'"


def test_a_long_value_is_named_by_its_length_not_echoed():
    err = validate._bad("thing", "x" * 500, "something")
    assert err.message == f"invalid thing {repr('x' * 500)[:60]}... (500 characters): expected something"
    short = validate._bad("thing", "x" * 98, "something", "a hint")
    assert short.message == f"invalid thing {'x' * 98!r}: expected something" and short.hint == "a hint"
    other = validate._bad("thing", ["y" * 200], "something")
    assert other.message.endswith(f"... ({len(repr(['y' * 200]))} characters): expected something")


@pytest.mark.parametrize("bad", ["https://h:99999/simple", "https://[::1/simple", "https://h:port/simple"])
def test_an_index_url_urllib_cannot_take_apart_is_refused(bad):
    with pytest.raises(UsageError, match="invalid index URL"):
        validate.index_url(bad)


def test_a_value_is_cut_from_101_characters_of_repr_on():
    assert validate._bad("t", "x" * 98, "e").message == f"invalid t {'x' * 98!r}: expected e"  # repr: 100 characters
    assert (
        validate._bad("t", "x" * 99, "e").message == f"invalid t {repr('x' * 99)[:60]}... (99 characters): expected e"
    )


@pytest.mark.parametrize(
    "value", ["user:s3cret@127.0.0.1:5000/team/app", "https://user:s3cret@registry.example/team", "s3cret@host/x"]
)
def test_an_invalid_value_holding_a_password_is_named_without_it(value):
    with pytest.raises(UsageError) as exc:
        validate.repository(value + "/\x1bBAD")
    assert "s3cret" not in exc.value.render()


def test_a_digest_reference_is_echoed_as_it_is():
    with pytest.raises(UsageError) as exc:
        validate.image_ref("reg/repo@sha256:not-hex", "IMAGE")
    assert "reg/repo@sha256:not-hex" in exc.value.render()
