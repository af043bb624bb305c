"""`[image] copy` and `[image] command`: the user's code as the image's last layer, and a default command."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from imagekit.effects.files import read_code
from imagekit.errors import ConfigError, UsageError
from imagekit.image import code_layer, render
from imagekit.image.buildplan import BuildPlan, bootstrap_base
from imagekit.image.code_layer import CodeLayer, CopySpec, excluded
from imagekit.image.image_options import ImageOptions
from imagekit.locking.lockfile import parse as parse_lock
from imagekit.matrix import matrix_file as matrix
from tests.conftest import ROOT

CELL = "cu121-torch2.1.2-py3.11-tf4.48.2"
INCLUDE = '[[matrix.include]]\ncuda = "12.1"\ntorch = "2.1.2"\ntransformers = "4.48.2"\npython = "3.11"\n'


# ---- what is left out: .dockerignore's rules ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "patterns", "out"),
    [
        ("train.py", (), False),
        (".git/config", (), True),  # always: version control, imagekit's state, venvs, bytecode
        ("vendor/lib/.git/config", (), True),  # at any depth
        ("sub/.venv/bin/python", (), True),
        (".git/config", ("!.git",), True),  # and no `!` line brings them back
        (".imagekit/wheelhouse/x.whl", (), True),
        ("pkg/__pycache__/m.cpython-311.pyc", (), True),
        ("pkg/deep/m.pyc", (), True),
        ("data/train.jsonl", ("data/",), True),  # a folder leaves out all below it
        ("src/data/x", ("data/",), False),  # anchored at the folder's top, as Docker anchors it
        ("src/data/x", ("**/data",), True),
        ("ckpt/model.ckpt", ("*.ckpt",), False),  # `*` does not cross a folder
        ("ckpt/model.ckpt", ("**/*.ckpt",), True),
        ("logs/a.log", ("logs", "!logs/keep.log"), True),
        ("logs/keep.log", ("logs", "!logs/keep.log"), False),  # the last matching line wins
        ("keep.log", ("*.log", "!keep.log", "*.log"), True),
        ("notes.md", ("# a comment", ""), False),
        ("./train.py", ("./train.py",), True),
    ],
)
def test_excludes_follow_dockerignore(path, patterns, out):
    assert excluded(path.removeprefix("./"), patterns) is out


@pytest.mark.parametrize(
    ("to", "says"),
    [
        ("/workspace/app", "volume is mounted on /workspace"),
        ("/opt/venv/lib", "image's own"),
        ("/opt/imagekit", "image's own"),
        ("/", "too wide"),
        ("/opt", "too wide"),
        ("opt/app", "absolute path"),
        ("/opt/../etc", "absolute path"),
        ("/opt/app x", "absolute path"),
        ("/etc/app", "image's own"),
    ],
)
def test_a_destination_the_image_or_the_pod_owns_is_refused(to, says):
    assert says in code_layer.destination_problem(to)


def test_fine_destinations():
    assert code_layer.destination_problem("/opt/app") is None
    assert code_layer.destination_problem("/srv/my-project") is None


# ---- the layer's bytes -----------------------------------------------------------------------------------------
def test_the_layer_tarball_depends_on_the_files_alone():
    files = (("train.py", b"print(1)\n", 0o664), ("bin/run", b"#!/bin/sh\n", 0o775), ("a/b/c.txt", b"c", 0o600))
    one = CodeLayer("/opt/app", files)
    again = CodeLayer("/opt/app", tuple(reversed(files)))
    assert one.tar(1735689600) == again.tar(1735689600)  # order-free, host-free
    assert one.sha256(1735689600) != CodeLayer("/opt/app", ((*files[:2], ("a/b/c.txt", b"C", 0o600)))).sha256(
        1735689600
    )
    with tarfile.open(fileobj=io.BytesIO(one.tar(1735689600))) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert list(members) == sorted(members)
    assert {n for n, m in members.items() if m.isdir()} == {"opt", "opt/app", "opt/app/a", "opt/app/a/b", "opt/app/bin"}
    assert members["opt/app/bin/run"].mode == 0o755 and members["opt/app/a/b/c.txt"].mode == 0o644
    assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 1735689600)}


# ---- the matrix file ---------------------------------------------------------------------------------------------
def _parse(image: str, origin: str = "proj/imagekit.toml"):
    import tomllib

    from imagekit.services import inputs

    return matrix.parse(tomllib.loads(INCLUDE + "[image]\n" + image), origin, inputs.compat_data())


def test_copy_and_command_in_the_matrix_file():
    opts = _parse('copy = "."\ncommand = ["python", "/opt/app/train.py"]\n').options
    assert opts.copy == CopySpec("proj", "/opt/app", (), "proj") and opts.command == ("python", "/opt/app/train.py")
    table = _parse('copy = { from = "src", to = "/srv/code/", exclude = ["data/"] }\n').options.copy
    assert table == CopySpec("proj/src", "/srv/code", ("data/",), "proj")
    assert _parse('copy = "src/../app"\n', "/abs/proj/imagekit.toml").options.copy.source == "/abs/proj/app"
    for outside in ("../elsewhere", "/home/me", "src/../../x", ".."):
        with pytest.raises(ConfigError) as exc:  # the copy never reaches out of the project (~/.ssh ...)
            _parse(f'copy = "{outside}"\n', "/abs/proj/imagekit.toml")
        assert "outside the matrix file's folder" in exc.value.render()


@pytest.mark.parametrize(
    ("image", "says"),
    [
        ('copy = { from = ".", to = "/workspace" }\n', "image.copy.to"),
        ("copy = 3\n", "image.copy"),
        ('copy = { from = ".", into = "/opt/app" }\n', "unknown keys into"),
        ('copy = { exclude = "data/" }\n', "image.copy.exclude"),
        ('command = "python train.py"\n', "image.command"),
        ("command = []\n", "image.command"),
        ('command = ["python", "a\\nb"]\n', "image.command"),
    ],
)
def test_bad_copy_or_command_is_a_config_error_naming_the_key(image, says):
    with pytest.raises(ConfigError) as exc:
        _parse(image)
    assert says in exc.value.render()


# ---- reading the folder (the effect) ----------------------------------------------------------------------------
def test_reading_the_folder_honours_its_dockerignore_and_the_excludes(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_text("x = 1\n")
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"0" * 1000)
    (tmp_path / "secret.env").write_text("TOKEN=x\n")
    (tmp_path / ".dockerignore").write_text("# secrets stay home\n*.env\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    (tmp_path / "inside-link.py").symlink_to(tmp_path / "train.py")
    code = read_code(CopySpec(str(tmp_path), "/opt/app", ("data/",)))
    names = [rel for rel, _, _ in code.files]
    assert names == [".dockerignore", "inside-link.py", "pkg/model.py", "run.sh", "train.py"]
    assert dict((r, m & 0o100) for r, _, m in code.files)["run.sh"]
    assert dict((r, d) for r, d, _ in code.files)["inside-link.py"] == b"print('train')\n"  # a link within: its file


def test_a_link_out_of_the_folder_or_a_special_file_is_refused(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "outside.txt").write_text("not yours to copy\n")
    (tmp_path / "src" / "escape").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(UsageError) as exc:
        read_code(CopySpec(str(tmp_path / "src")))
    assert "links outside the folder" in exc.value.message and exc.value.hint
    (tmp_path / "src" / "escape").unlink()
    os.mkfifo(tmp_path / "src" / "pipe")
    with pytest.raises(UsageError) as exc:
        read_code(CopySpec(str(tmp_path / "src")))
    assert "not a regular file" in exc.value.message
    with pytest.raises(UsageError) as exc:
        read_code(CopySpec(str(tmp_path / "missing")))
    assert "is not a folder" in exc.value.message


def _hostile_clone(tmp_path: Path) -> tuple[Path, Path]:
    """A cloned repository and the user's home beside it, with what no image may carry."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    project = home / "clone"
    project.mkdir()
    (project / "imagekit.toml").write_text(INCLUDE + '[image]\ncopy = "src"\n')
    return project, home


def test_a_copied_folder_that_links_out_of_the_project_is_refused_by_name(tmp_path):
    project, home = _hostile_clone(tmp_path)
    (project / "src").symlink_to(home)  # `src -> ~` in the cloned repository
    spec = _parse('copy = "src"\n', str(project / "imagekit.toml")).options.copy
    with pytest.raises(UsageError) as exc:
        read_code(spec)
    text = exc.value.render()
    assert "leads out of the project" in text and "src" in text and "PRIVATE" not in text
    (project / "src").unlink()
    (project / "src").symlink_to("../../home/.ssh")  # relative, through `..`
    with pytest.raises(UsageError, match="leads out of the project"):
        read_code(spec)
    (project / "src").unlink()
    (project / "lib").mkdir()
    (project / "lib" / "train.py").write_text("print(1)\n")
    (project / "src").symlink_to("lib")  # a link that stays inside is the folder it names
    assert [rel for rel, _, _ in read_code(spec).files] == ["train.py"]


def test_a_dockerignore_or_file_that_is_a_fifo_or_a_link_to_a_device_never_blocks(tmp_path):
    import threading

    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("x\n")
    os.mkfifo(src / ".dockerignore")

    said: list[str] = []

    def attempt() -> None:
        try:
            read_code(CopySpec(str(src)))
        except UsageError as exc:
            said.append(exc.message)

    worker = threading.Thread(target=attempt)
    worker.daemon = True
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "read_code blocked on a FIFO .dockerignore"
    assert said and "FIFO" in said[0], said
    (src / ".dockerignore").unlink()
    (src / ".dockerignore").symlink_to("/dev/zero")
    with pytest.raises(UsageError, match="symbolic link"):
        read_code(CopySpec(str(src)))


def test_a_folder_past_the_limits_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(code_layer, "MAX_FILES", 3)
    for i in range(5):
        (tmp_path / f"f{i}.py").write_text("x\n")
    with pytest.raises(UsageError) as exc:
        read_code(CopySpec(str(tmp_path)))
    assert "more than 3 files" in exc.value.message and "volume" in exc.value.hint


# ---- the rendered Dockerfile --------------------------------------------------------------------------------------
def _plan(builder: str, code: CodeLayer | None, command: tuple[str, ...] = ()) -> BuildPlan:
    from imagekit.services import inputs

    data = inputs.compat_data()
    cell = _parse("").cells[0]
    lock = parse_lock((ROOT / "lockfiles" / f"{CELL}.txt").read_text())
    base = bootstrap_base(data.bases["3.11"])
    options = ImageOptions(builder=builder, command=command)
    return BuildPlan.make(cell, lock, base, "r/x", data, options=options, code=code)


def _render(plan: BuildPlan) -> dict:
    return render.render_plan(plan)


def test_the_code_is_the_last_layer_and_a_code_change_changes_only_that_line():
    one = CodeLayer("/opt/app", (("train.py", b"print(1)\n", 0o644),))
    two = CodeLayer("/opt/app", (("train.py", b"print(2)\n", 0o644),))
    a = _render(_plan("legacy", one))["Dockerfile"][0].decode().splitlines()
    b = _render(_plan("legacy", two))["Dockerfile"][0].decode().splitlines()
    runs = [i for i, line in enumerate(a) if line.startswith("RUN ")]
    assert (
        a[runs[-1]]
        == f"RUN /opt/imagekit/bin/install-layer --files http://imagekit-wheels:8765/code.tar#sha256={one.sha256(1735689600)}"
    )
    assert [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y] == [runs[-1]]  # every layer below: cached
    assert "your code (1 file, 0.0 kB) in /opt/app" in "\n".join(a)
    without = _render(_plan("legacy", None))["Dockerfile"][0].decode()
    assert "code.tar" not in without and "your code" not in without


def test_buildkit_copies_the_code_from_the_context_last_and_sets_the_command():
    code = CodeLayer("/opt/app", (("train.py", b"print(1)\n", 0o644), ("run.sh", b"#!/bin/sh\n", 0o755)))
    files = _render(_plan("buildkit", code, ("python", "/opt/app/train.py")))
    text = files["Dockerfile"][0].decode()
    assert files["rootfs/code/opt/app/train.py"] == (b"print(1)\n", 0o644)
    assert files["rootfs/code/opt/app/run.sh"][1] == 0o755
    assert text.index("COPY rootfs/code/ /") > text.rindex("install-layer")
    assert 'CMD ["python", "/opt/app/train.py"]' in text
    assert "CMD []" in _render(_plan("buildkit", None))["Dockerfile"][0].decode()


def test_a_link_never_brings_back_what_the_excludes_leave_out(tmp_path):
    (tmp_path / ".env").write_text("TOKEN=secret\n")
    (tmp_path / "config.env").symlink_to(".env")
    (tmp_path / "train.py").write_text("x\n")
    with pytest.raises(UsageError) as exc:
        read_code(CopySpec(str(tmp_path), "/opt/app", (".env",)))
    assert "links to a file the excludes leave out" in exc.value.message


@pytest.mark.parametrize("make", ["loop", "self", "dangling"])
def test_a_link_that_leads_nowhere_is_a_usage_error_naming_it(tmp_path, make):
    if make == "loop":
        (tmp_path / "a").symlink_to("b")
        (tmp_path / "b").symlink_to("a")
    elif make == "self":
        (tmp_path / "a").symlink_to("a")
    else:
        (tmp_path / "a").symlink_to("missing")
    with pytest.raises(UsageError) as exc:
        read_code(CopySpec(str(tmp_path)))
    assert "leads nowhere" in exc.value.message and exc.value.hint


def test_a_negation_brings_a_file_back_from_an_excluded_folder_as_docker_does(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.txt").write_text("k\n")
    (tmp_path / "data" / "big.bin").write_text("b\n")
    names = [r for r, _, _ in read_code(CopySpec(str(tmp_path), "/opt/app", ("data/", "!data/keep.txt"))).files]
    assert names == ["data/keep.txt"]


def test_control_characters_in_a_file_name_never_reach_the_terminal(tmp_path):
    os.mkfifo(tmp_path / "f\x1b]0;pwned\x07x")
    with pytest.raises(UsageError) as exc:
        read_code(CopySpec(str(tmp_path)))
    assert "\x1b" not in exc.value.render() and "\x07" not in exc.value.render()
