"""Every reader of a project's files, a release record, a pod record or a cache turns malformed input into a usage
error (exit 2, `error:` + `hint:`) or, for imagekit's own memos, into "not there": never a traceback (issue 49).

Each reader is fed one corpus of hostile shapes (deep nesting, versions and markers packaging parses but nothing after
it can use, odd Unicode, huge values); the property test at the end draws documents from the same pieces and feeds
them to the readers' public entry points. The named cases were each seen failing on the code before the fix
(RecursionError, InvalidVersion, UndefinedEnvironmentName, InvalidRequirement, TOMLDecodeError tracebacks).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagekit.effects import pod_records
from imagekit.errors import CheckFailed, ImagekitError, UsageError
from imagekit.locking import lockfile, resolution, source_builds
from imagekit.matrix import backend_metadata, project_deps
from imagekit.matrix import matrix_file as matrix
from imagekit.matrix.project_deps import DepsSource
from imagekit.services import inputs
from imagekit.services.builds import base_images, image_manifest, staged_build
from imagekit.services.locks import lock_cells
from imagekit.services.publishing import release_index
from tests.matrix.test_project_deps import _files
from tests.props import examples

DEEP = 3000  # past Python's recursion limit: tomllib and json recurse once per level
ASTRAL = "\U0001f600"
HUGE = "a" * 900_000

# Requirement lines packaging's grammar accepts or rejects, and that nothing after the reader could use.
HOSTILE_LINES = [
    "torch===2.5.1x",  # arbitrary equality with a text that is no version
    "torch==2.5.1x",
    "torch==" + "9" * 5000,  # past int()'s digit limit
    'numpy; "a" == "a"',  # a marker comparing no variable
    'numpy; python_version == "3.11" and "x" in "y"',
    'numpy; python_version > "3',
    "numpy; " + "(" * DEEP + 'python_version > "3"' + ")" * DEEP,
    'numpy[a"b]',
    f"numpy{ASTRAL}",
    "numpy\u202e==1.0",
    "numpy\x1b[31m",
    "x @ file:///etc/passwd",
    "x @ https://user:secret@example.com/x-1-py3-none-any.whl#sha256=" + "0" * 64,
    "numpy==1.0 --install-option=--prefix=/",
    HUGE,
    "-r " + HUGE,
    "-r " + ASTRAL,
    "--index-url https://user:secret@example.com/simple",
    "--extra-index-url https://user:secret@download.pytorch.org/whl/cu124",
    "${HOME}",
    "-e .",
    "numpy ; extra == '\n'",
    # pip's own forms (issue 50): name-less VCS lines and URLs, the project's folders, index lines
    "git+https://github.com/o/r#egg=" + ASTRAL,
    "git+https://github.com/o/r@main#egg=x&subdirectory=../../etc",
    "git+file:///etc#egg=x",
    "-e git+ext::sh -c touch #egg=x",
    "git+https://github.com/o/r@" + "a" * 5000,
    "-e " + "../" * 50 + "etc",
    "./" + "a/" * 3000,
    "https://h/" + ASTRAL + "-1-py3-none-any.whl",
    "./wheels/../../x-1-py3-none-any.whl",
    "file:../x-1-py3-none-any.whl",
    ".[" + "a" * 100 + "]",
    "./a\\b",
    "-e",
    "--index-url",
    "--extra-index-url ftp://x/simple",
    "https://h/x-1-py3-none-any.whl ; " + "(" * DEEP + 'python_version > "3"' + ")" * DEEP,
]

PYPROJECT = '[project]\nname = "x"\nversion = "1"\n'
HOSTILE_PYPROJECTS = [
    PYPROJECT + "dependencies = " + "[" * DEEP + "]" * DEEP + "\n",
    PYPROJECT + "x = " + "{a = " * DEEP + "1" + "}" * DEEP + "\n",
    PYPROJECT + "dependencies = " + "[" * 40 + "]" * 40 + "\n",  # parsed by tomllib, deeper than any reader wants
    PYPROJECT + 'dependencies = []\n[project.optional-dependencies]\n"a\\"b" = ["peft"]\n',
    PYPROJECT + 'dependencies = []\n[project.optional-dependencies]\n"a\\nb" = ["peft"]\n',
    PYPROJECT + 'dependencies = ["numpy"]\n[project.optional-dependencies]\n"" = ["peft"]\n',
    PYPROJECT + 'requires-python = 3\ndependencies = ["numpy"]\n',
    PYPROJECT + 'requires-python = ">=3.' + "9" * 5000 + '"\ndependencies = ["numpy"]\n',
    PYPROJECT + 'dependencies = ["torch===2.5.1x"]\n',
    PYPROJECT + 'dependencies = [\'numpy; "a" == "a"\']\n',
    PYPROJECT + 'dependencies = ["' + HUGE + '"]\n',
    PYPROJECT + 'description = "\\udfff"\n',
    PYPROJECT + "dependencies = [1, 2]\n",
    PYPROJECT + "[project.optional-dependencies]\nx = " + "[" * 100 + "]" * 100 + "\n",
]


def _fails_well(fn, *args) -> ImagekitError | None:
    """Run a reader: it may answer, or refuse with imagekit's error; anything else (a traceback) fails the test."""
    try:
        fn(*args)
    except ImagekitError as exc:
        assert exc.message and exc.hint, f"an error without a hint: {exc.message[:200]}"
        assert len(exc.render()) < 8000, "an error as long as the input it quotes"
        return exc
    return None


# ---- requirements files ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("line", HOSTILE_LINES, ids=lambda line: repr(line[:40]))
def test_a_requirements_file_reader_refuses_with_an_error_never_a_traceback(line):
    _fails_well(project_deps.read_requirements, "r.txt", _files({"r.txt": f"numpy\n{line}\n"}))


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("torch===2.5.1x", "2.5.1x is not a PEP 440 version"),
        ("torch==" + "9" * 5000, "characters long, not a version"),
        ('numpy; "a" == "a"', "its marker cannot be evaluated"),
    ],
)
def test_versions_and_markers_nothing_can_use_are_refused_when_read(line, said):
    # Before: InvalidVersion, ValueError (int()'s digit limit) and UndefinedEnvironmentName tracebacks from the axes.
    exc = _fails_well(project_deps.read_requirements, "r.txt", _files({"r.txt": line + "\n"}))
    assert isinstance(exc, UsageError) and said in exc.message and "r.txt:1" in exc.message


def test_a_long_include_is_named_once_and_cut():
    # Before: a 900,000-character `-r` path printed twice (1.8 MB of error).
    exc = _fails_well(project_deps.read_requirements, "r.txt", _files({"r.txt": f"-r {HUGE}\n"}))
    assert exc is not None and len(exc.render()) < 2000


# ---- pyproject.toml ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", HOSTILE_PYPROJECTS, ids=lambda t: repr(t[len(PYPROJECT) : len(PYPROJECT) + 40]))
def test_a_pyproject_reader_refuses_with_an_error_never_a_traceback(text):
    for extras in ((), ("a",)):
        try:
            _fails_well(project_deps.from_pyproject, text, DepsSource("pyproject.toml", extras))
        except project_deps.NeedsBackend:
            pass


@pytest.mark.parametrize("group", ['a\\"b', "a\\nb", ""])
def test_a_group_name_that_cannot_go_into_a_marker_is_refused(group):
    # Before: InvalidRequirement tracebacks (a quote, a newline); "" was `extra == ""`: installed in every cell.
    text = PYPROJECT + f'dependencies = ["numpy"]\n[project.optional-dependencies]\n"{group}" = ["peft"]\n'
    exc = _fails_well(project_deps.from_pyproject, text, DepsSource("pyproject.toml"))
    assert isinstance(exc, UsageError) and "is not a group name" in exc.message


def test_requires_python_of_another_type_is_refused_not_ignored():
    exc = _fails_well(project_deps.from_pyproject, PYPROJECT + "requires-python = 3\n", DepsSource("pyproject.toml"))
    assert isinstance(exc, UsageError) and "requires-python: 3 is not a version specifier" in exc.message


def test_deep_nesting_in_pyproject_is_a_usage_error():
    exc = _fails_well(project_deps.from_pyproject, HOSTILE_PYPROJECTS[0], DepsSource("pyproject.toml"))
    assert isinstance(exc, UsageError) and "nested too deep" in exc.message


# ---- what a setup.py's build backend answers -------------------------------------------------------------------------
EGG_REQUIRES = [
    '[:"a" == "a"]\nnumpy\n',
    '[:python_version > "3]\nnumpy\n',
    '[:extra == "x\n]\nnumpy\n',
    '[a"b]\nnumpy\n',
    "[:" + "(" * DEEP + "]\nnumpy\n",
    "[train]\ntorch===2.5.1x\n",
    f"[{ASTRAL}]\nnumpy\n",
    f"{HUGE}\n",
]
METADATA = [
    "Name: x\nProvides-Extra: a\"b\nRequires-Dist: peft; extra == 'a\"b'\n",
    "Name: x\nProvides-Extra: \nRequires-Dist: peft\n",
    "Name: x\nRequires-Dist: torch===2.5.1x\n",
    "Name: x\nRequires-Python: 3\n",
    'Name: x\nRequires-Dist: numpy; "a" == "a"\n',
    f"Name: {HUGE}\nRequires-Dist: numpy\n",
]


@pytest.mark.parametrize("requires", EGG_REQUIRES, ids=lambda t: repr(t[:30]))
def test_an_egg_info_reader_refuses_with_an_error_never_a_traceback(requires):
    # Before: a `[:marker]` section that is no marker was pasted after each requirement: InvalidRequirement later.
    _fails_well(backend_metadata.from_egg_info, "Name: x\n", requires, DepsSource("setup.py"), ("setup.py",))


def test_an_egg_info_section_marker_that_is_no_marker_is_refused():
    exc = _fails_well(backend_metadata.from_egg_info, "Name: x\n", '[:"a" == "a"]\nnumpy\n', DepsSource("setup.py"), ())
    assert isinstance(exc, UsageError) and "its marker cannot be evaluated" in exc.message


@pytest.mark.parametrize("text", METADATA, ids=lambda t: repr(t[:40]))
def test_a_metadata_reader_refuses_with_an_error_never_a_traceback(text):
    _fails_well(backend_metadata.from_metadata, text, DepsSource("setup.py"), ("setup.py",))


# ---- the matrix file -------------------------------------------------------------------------------------------------
MATRIX = '[matrix]\ncuda = ["12.4"]\ntorch = ["2.5.1"]\ntransformers = ["4.48.2"]\npython = ["3.11"]\n'
HOSTILE_MATRICES = [
    MATRIX + "packages = " + "[" * DEEP + "]" * DEEP + "\n",
    MATRIX + "[image]\nenv = " + "{a = " * DEEP + "1" + "}" * DEEP + "\n",
    MATRIX + "[image]\nenv = " + "{a = " * 40 + "1" + "}" * 40 + "\n",
    MATRIX + f'packages = ["{HUGE}"]\n',
    MATRIX + 'packages = ["torch===2.5.1x"]\n',
    MATRIX + f'[image]\nrepository = "{HUGE}"\n',
    MATRIX + 'requirements = "r\\ud83d.txt"\n',
]


@pytest.mark.parametrize("text", HOSTILE_MATRICES, ids=lambda t: repr(t[len(MATRIX) : len(MATRIX) + 40]))
def test_a_matrix_file_reader_refuses_with_an_error_never_a_traceback(text, data, tmp_path):
    path = tmp_path / "imagekit.toml"
    path.write_text(text)
    exc = _fails_well(inputs.load_matrix, path, data)
    assert exc is None or isinstance(exc, UsageError)


# ---- locks and their headers -----------------------------------------------------------------------------------------
def _lock(header: str = "", body: str = "") -> str:
    return f"# imagekit lock\n{header}#\n{lockfile.TORCH_MARK}\n{body}{lockfile.APP_MARK}\n"


HOSTILE_LOCK_HEADERS = [
    "# imagekit-settings: " + "[" * DEEP + "]" * DEEP + "\n",
    "# imagekit-settings: " + "{" + '"a":' * 5 + "1" + "}" * 5 + "\n",
    "# imagekit-settings: 1" + "0" * 5000 + "\n",
    "# imagekit-built-x: " + "[" * DEEP + "]" * DEEP + "\n",
    '# imagekit-built-x: {"version": ' + "[" * DEEP + "]" * DEEP + "}\n",
    f"# imagekit-settings: {HUGE}\n",
]


@pytest.mark.parametrize("header", HOSTILE_LOCK_HEADERS, ids=lambda t: repr(t[:36]))
def test_a_lock_header_that_cannot_be_read_is_refused_never_a_traceback(header):
    # Before: RecursionError from json.loads on the settings line and on a built-from-source record.
    lock = lockfile.parse(_lock(header))
    if "settings" in lock.meta:
        assert isinstance(_fails_well(resolution.recorded_settings, lock), CheckFailed)
    else:
        assert isinstance(_fails_well(source_builds.recorded, lock.meta), CheckFailed)


@pytest.mark.parametrize(
    "body", [f"{HUGE}==1\n", "x==1\n    --hash=sha256:zz\n", f"x @ https://h/{ASTRAL}.whl\n", "x==" + "1" * 5000 + "\n"]
)
def test_a_lock_body_that_cannot_be_read_is_refused(body):
    assert isinstance(_fails_well(lockfile.parse, _lock(body=body)), UsageError)


def test_a_lock_that_is_a_fifo_is_refused_never_waited_on(tmp_path):
    fifo = tmp_path / "cell.txt"
    os.mkfifo(fifo)
    assert lock_cells.read_lock(fifo) is None  # before: blocked forever in read_text()
    with pytest.raises(OSError, match="FIFO"):
        lock_cells.lock_text(fifo)


# ---- release records, pod records, caches ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text", ["[" * DEEP + "]" * DEEP, '{"tag": ' + "[" * DEEP + "]" * DEEP + "}", '{"tag": 1' + "0" * 5000 + "}", ""]
)
def test_a_release_record_or_index_that_cannot_be_read_is_a_usage_error(text, tmp_path):
    path = tmp_path / "rec.json"
    path.write_text(text)
    assert isinstance(_fails_well(release_index.read_record, path), UsageError)
    assert isinstance(_fails_well(release_index.read_index, path), UsageError)


def test_a_pod_record_nested_deep_is_skipped_and_said(tmp_path, monkeypatch):
    # Before: RecursionError (json.loads caught ValueError only) ended `pod reap` and `pod list`.
    monkeypatch.setenv("IMAGEKIT_STATE", str(tmp_path))
    (tmp_path / "pods").mkdir()
    (tmp_path / "pods" / "pod-abcd1234.json").write_text("[" * DEEP + "]" * DEEP)
    (tmp_path / "pods" / "pending-0123456789abcdef.json").write_text('{"created": ' + "[" * DEEP + "]" * DEEP + "}")
    said: list[str] = []
    assert pod_records.load(said.append) == [] and len(said) == 2


def test_a_step_memo_or_base_state_nested_deep_is_not_there(tmp_path, monkeypatch):
    # Before: RecursionError from the step cache (4 KB hold 2,000 levels) and the base's state file.
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path))
    (tmp_path / "steps").mkdir(parents=True)
    (tmp_path / "steps" / "k.json").write_text("[" * 2000 + "]" * 2000)
    assert staged_build._cached("k") is None
    state = tmp_path / "state.json"
    state.write_text('{"sha256": ' + "[" * DEEP + "]" * DEEP + "}")
    assert base_images._state(state) is None


def test_a_manifest_in_an_image_nested_deep_is_the_environments_error():
    data = ("[" * DEEP + "]" * DEEP).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("opt/imagekit/manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    exc = _fails_well(image_manifest._from_tar, buf.getvalue())
    assert exc is not None and exc.exit_code == 3


# ---- the readers' public entry points, property-tested ------------------------------------------------------------
# Documents drawn from the grammar of each file, with the corpus's hostile values in every slot: a name, a specifier's
# version, a marker, a group's name, a nesting depth. Each is read as the commands read it (`inputs.load_matrix`:
# the matrix file, the declaration it names, the axes it derives), and by each reader's own entry point.
NAMES = st.sampled_from(["numpy", "torch", "transformers", "peft", "x", "a" * 300, f"n{ASTRAL}", "my_pkg.x"])
VERSIONS = st.sampled_from(["2.5.1", "2.5.1x", "1.*", "9" * 5000, "1.0+cu124", "", "v1", "1.0.post1.dev2", "0" * 70])
OPS = st.sampled_from(["==", "===", ">=", "~=", "!=", "<", ""])
MARKERS = st.sampled_from(
    [
        "",
        'python_version >= "3.11"',
        '"a" == "a"',
        'extra == "x"',
        '"3.11" > python_version',
        'os_name == "nt" and "x" in "y"',
        'python_version > "3',
        "(" * 500 + 'python_version > "3"' + ")" * 500,
        'platform_machine == "aarch64" or python_full_version < "3.12.1"',
        'python_version ~= "3.x"',
    ]
)
GROUPS = st.sampled_from(["train", "", 'a"b', "a\nb", ASTRAL, "x" * 300, "dev-tools", "Train_X"])
DEPTHS = st.sampled_from([0, 1, 5, 40, 3000])


@st.composite
def requirement_lines(draw: st.DrawFn) -> str:
    line = draw(NAMES) + draw(OPS) + (draw(VERSIONS) if draw(st.booleans()) else "")
    marker = draw(MARKERS)
    return f"{line}; {marker}" if marker else line


def _nested(text: str, depth: int) -> str:
    return "[" * depth + text + "]" * depth


@st.composite
def pyprojects(draw: st.DrawFn) -> str:
    deps = draw(st.lists(requirement_lines(), max_size=4))
    group = draw(GROUPS)
    rp = draw(st.sampled_from(['">=3.10"', "3", '"3"', '">=4"', '"~=3"', '">=3.' + "9" * 5000 + '"']))
    listed = _nested(", ".join(json.dumps(d, ensure_ascii=False) for d in deps), draw(DEPTHS))
    return (
        PYPROJECT
        + f"requires-python = {rp}\ndependencies = [{listed}]\n[project.optional-dependencies]\n"
        + f"{json.dumps(group, ensure_ascii=False)} = {json.dumps(draw(st.lists(requirement_lines(), max_size=2)))}\n"
    )


@st.composite
def egg_infos(draw: st.DrawFn) -> str:
    sections = []
    for _ in range(draw(st.integers(0, 3))):
        head = draw(GROUPS) + (":" + draw(MARKERS) if draw(st.booleans()) else "")
        sections.append(f"[{head}]\n" + "\n".join(draw(st.lists(requirement_lines(), max_size=2))))
    return "\n".join(draw(st.lists(requirement_lines(), max_size=2)) + sections)


@pytest.mark.seconds
@settings(derandomize=True, max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(requirement_lines(), min_size=1, max_size=5), pyprojects(), egg_infos(), DEPTHS)
def test_no_reader_of_a_project_file_raises_anything_but_imagekits_error(data, lines, pyproject, egg, depth):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "requirements.txt").write_text("\n".join(lines) + "\n")
        (root / "pyproject.toml").write_text(pyproject)
        for declared in ("requirements.txt", "pyproject.toml"):
            (root / "imagekit.toml").write_text(
                MATRIX + f"requirements = {json.dumps(declared)}\n[image]\nenv = {_nested('', depth) or '{}'}\n"
            )
            _fails_well(inputs.load_matrix, root / "imagekit.toml", data)
    for fn, *args in (
        (project_deps.read_requirements, "r.txt", _files({"r.txt": "\n".join(lines)})),
        (project_deps.from_pyproject, pyproject, DepsSource("pyproject.toml", ("train",))),
        (backend_metadata.from_egg_info, "Name: x\n", egg, DepsSource("setup.py"), ()),
        (backend_metadata.from_metadata, "".join(f"Requires-Dist: {r}\n" for r in lines), DepsSource("setup.py"), ()),
        (matrix.parse_text, MATRIX + f"packages = [{_nested(json.dumps(lines[0]), depth)}]\n", "imagekit.toml"),
    ):
        try:
            _fails_well(fn, *args)
        except project_deps.NeedsBackend:
            pass
    header = f"# imagekit-settings: {_nested('', depth)}\n# imagekit-built-x: {_nested(json.dumps(lines[0]), depth)}\n"
    lock = _fails_well(lockfile.parse, _lock(header, f"{lines[0]}\n"))
    if lock is None:
        parsed = lockfile.parse(_lock(header))
        _fails_well(resolution.recorded_settings, parsed)
        _fails_well(source_builds.recorded, parsed.meta)


def test_the_matrix_a_project_file_named_with_an_emoji_gives_is_readable(app, runner, in_tmp, data):
    # Before: `init --from r😀.txt` wrote `requirements = "r\ud83d\ude00.txt"` (JSON's surrogates), which TOML
    # refuses: a TOMLDecodeError traceback, and every later command failed the same way.
    name = f"r{ASTRAL}.txt"
    (in_tmp / name).write_text("numpy\n")
    res = runner.invoke(app, ["init", "--from", name, "--repository", "ghcr.io/acme/x"])
    assert res.exit_code == 0, res.output
    assert inputs.load_matrix(None, data).requirements == DepsSource(name)


def test_init_never_writes_through_a_pyproject_link_that_leads_out(app, runner, in_tmp, tmp_path_factory):
    # Before: `init --pyproject` appended [tool.imagekit] to the file a planted pyproject.toml link named.
    outside = tmp_path_factory.mktemp("elsewhere") / "pyproject.toml"
    outside.write_text('[project]\nname = "victim"\n')
    (in_tmp / "pyproject.toml").symlink_to(outside)
    res = runner.invoke(app, ["init", "--pyproject"])
    assert res.exit_code == 2 and "leads out of the project" in res.stderr and "hint:" in res.stderr
    assert outside.read_text() == '[project]\nname = "victim"\n'


def test_init_writes_through_a_pyproject_link_inside_the_project(app, runner, in_tmp):
    (in_tmp / "sub").mkdir()
    (in_tmp / "sub" / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (in_tmp / "pyproject.toml").symlink_to("sub/pyproject.toml")
    res = runner.invoke(app, ["init", "--pyproject"])
    assert res.exit_code == 0, res.output
    assert "[tool.imagekit.matrix]" in (in_tmp / "sub" / "pyproject.toml").read_text()


def test_init_notes_show_no_credentials_and_no_escapes(app, runner, in_tmp):
    # Before: the ignored --extra-index-url was printed as written: the password and the escape sequence raw.
    (in_tmp / "requirements.txt").write_text(
        "--extra-index-url https://user:hunter2@download.pytorch.org/whl/cu124\x1b]0;pwned\x07\nnumpy\n"
    )
    res = runner.invoke(app, ["init", "--from", "requirements.txt", "--repository", "ghcr.io/acme/x"])
    assert res.exit_code == 0, res.output
    assert "ignored" in res.stderr and "hunter2" not in res.output and "\x1b" not in res.output


@pytest.mark.seconds
@pytest.mark.parametrize(
    "argv",
    [
        ["init", "--from", "r.txt", "--out", "o.toml"],
        ["matrix", "--matrix", "m.toml"],
    ],
)
def test_the_cli_turns_each_hostile_file_into_exit_2(app, runner, in_tmp, argv):
    (in_tmp / "m.toml").write_text(MATRIX + 'requirements = "r.txt"\n')
    for line in HOSTILE_LINES[:8]:
        (in_tmp / "r.txt").write_text(line + "\n")
        res = runner.invoke(app, argv)
        assert ("Traceback" not in res.output and res.exception is None) or isinstance(res.exception, SystemExit)
        assert res.exit_code == 2 and "error:" in res.stderr and "hint:" in res.stderr, (line[:40], res.output)


def test_errors_quoting_a_file_carry_no_terminal_escapes():
    exc = UsageError("r.txt:1: \x1b]0;title\x07numpy\x1b[2J is not a requirement", "fix \x9b31m it")
    shown = exc.render()
    assert "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown and "numpy" in shown
