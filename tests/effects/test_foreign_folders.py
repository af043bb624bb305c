"""The one rule for a folder another party writes (issue 49): made by imagekit in a private parent (0700, this
user's), read without following links, bounded, removed without recursion whatever was planted in it. The metadata
reader keeps no such folder at all: a setup.py's container has nothing of the host to write.

The walk's own guards are held by tests for bugs planted on purpose (each comment names the bug; each test was run
with it planted, and failed, and without it, and passed)."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from imagekit.effects import foreign_files, layer_tar
from imagekit.image.buildplan import BaseRef
from imagekit.matrix.project_deps import DepsSource
from imagekit.services.locks import project_metadata

DEEP = 1200  # past Python's recursion limit: shutil.rmtree raised RecursionError on it
ANSWER = '{"kind": "metadata", "metadata": "Name: x\\nVersion: 1\\nRequires-Dist: numpy\\n"}'


def _plant(folder: Path) -> None:
    """What a hostile writer leaves: the folder opened to everyone, a setuid program, a tree too deep for recursion,
    a FIFO, a folder it made unreadable, a link out."""
    os.chmod(folder, 0o777)
    prog = folder / "id"
    prog.write_bytes(b"\x7fELF")
    os.chmod(prog, 0o4755)
    deep = folder
    for _ in range(DEEP):
        deep = deep / "d"
        deep.mkdir()
    os.mkfifo(folder / "fifo")
    (folder / "locked" / "inner").mkdir(parents=True)
    (folder / "locked" / "inner" / "f").write_text("x")
    os.chmod(folder / "locked" / "inner", 0o500)
    os.chmod(folder / "locked", 0o000)
    (folder / "out").symlink_to("/etc")


@pytest.mark.seconds
def test_a_scratch_folder_is_private_and_removed_whatever_was_planted(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with foreign_files.scratch("imagekit-test-") as folder:
        parent = folder.parent
        info = os.lstat(parent)
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
        _plant(folder)
    assert not parent.exists() and os.path.isdir("/etc")
    assert list(tmp_path.iterdir()) == []


class _Container:
    """A stand-in for the engine at its true outer boundary: the setup.py's container. It does to every folder of
    the host mounted read-write what a hostile setup.py did, and answers as the driver does (the answer file in the
    earlier protocol, the output line now)."""

    def __init__(self) -> None:
        self.volumes: dict[str, dict] = {}

    def run(self, image, argv, **kw):  # type: ignore[no-untyped-def]
        self.volumes = kw.get("volumes") or {}
        for host, how in self.volumes.items():
            if how["mode"] == "rw":
                Path(host, "answer.json").write_text(ANSWER)
                _plant(Path(host))
        return 0, f"noise\n{project_metadata.MARK}{ANSWER}\n", ""


def test_the_metadata_hook_gets_no_folder_of_the_host_to_write(tmp_path, monkeypatch):
    # Before: /out was a host folder mounted read-write; the hook made it 0777, left a setuid program in it (euid 0
    # for any local user) and a 1,200-deep tree that made shutil.rmtree raise RecursionError: a traceback, the folder
    # left behind.
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "project").mkdir()
    base = BaseRef("debian-bookworm", "imagekit/base:x", None, "3.11", "2.36")
    container = _Container()
    raw = project_metadata._run(container, base, tmp_path / "project", DepsSource("setup.py"), "setuptools.build_meta")
    assert b'"kind": "metadata"' in raw
    assert all(how["mode"] == "ro" for how in container.volumes.values())
    assert list((tmp_path / "tmp").iterdir()) == []


def test_the_answer_is_the_last_line_after_the_mark_and_bounded():
    mark = project_metadata.MARK
    assert project_metadata.answer_of(f"{mark}{{}}\nlog\n{mark}{ANSWER}\n") == ANSWER.encode()
    assert project_metadata.answer_of("no answer\n") is None
    huge = "x" * (project_metadata.ANSWER_LIMIT + 1)
    assert project_metadata.answer_of(f"\n{mark}{huge}\n") is None


def test_a_container_that_times_out_is_named_without_quoting_a_program_it_was_handed():
    # Before: "IMAGE: -I -c \nimport glob, json, os, ... did not finish": imagekit's own driver quoted in the error.
    from imagekit.effects.docker import _command

    shown = _command(["/usr/bin/python3.11"], ["-I", "-c", project_metadata.DRIVER, "/project", "x", "180"])
    assert "import" not in shown and shown.startswith("/usr/bin/python3.11 -I -c … /project")


# ---- the walk's guards, each held against a bug planted on purpose ---------------------------------------------------
# Planted: foreign_files._walk without the (st_dev, st_ino) comparison of an entered folder with the listed one.
def test_a_folder_replaced_between_listing_and_entering_is_detected(tmp_path):
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "kept").write_text("listed\n")
    with foreign_files.folder(root) as fd:
        walk = foreign_files.walk(fd)
        assert next(walk).rel == "d"  # root listed; d not entered yet
        os.rename(root / "d", tmp_path / "d.old")
        (root / "d").mkdir()  # another folder under the same name
        (root / "d" / "planted").write_text("swapped in\n")
        with pytest.raises(foreign_files.Refused, match="d: was replaced while it was read"):
            list(walk)


# Planted: foreign_files.Entry.open comparing the sizes alone (`now.st_size != self.info.st_size`).
def test_a_file_swapped_for_another_of_the_same_size_after_listing_is_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a").write_text("honest\n")
    with foreign_files.folder(root) as fd:
        entry = next(foreign_files.walk(fd))
        (root / "a.new").write_text("HONEST\n")  # the same size; made while the listed file exists: another inode
        os.replace(root / "a.new", root / "a")
        with pytest.raises(foreign_files.Refused, match="changed while it was read"):
            entry.open()


def _nest(root: Path, levels: int) -> None:
    for _ in range(levels):
        root = root / "d"
        root.mkdir()


# Planted: foreign_files._walk `if depth > max_depth` -> `if depth >= max_depth` (and -> `depth > max_depth + 1`).
@pytest.mark.seconds
@pytest.mark.parametrize("limit", [1, 3, foreign_files.MAX_DEPTH])
def test_the_depth_bound_is_exact_at_its_limit(tmp_path, limit):
    at, past = tmp_path / "at", tmp_path / "past"
    at.mkdir()
    past.mkdir()
    _nest(at, limit)  # folders `limit` deep below the root: read
    _nest(past, limit + 1)  # one more: refused
    with foreign_files.folder(at) as fd:
        assert len(list(foreign_files.walk(fd, max_depth=limit))) == limit
    with foreign_files.folder(past) as fd, pytest.raises(foreign_files.Refused, match=f"more than {limit} folders"):
        list(foreign_files.walk(fd, max_depth=limit))


# Planted: foreign_files.privileged without its setgid-folder exception (`return bool(info.st_mode & _PRIVILEGED)`).
def test_a_setgid_folder_such_as_debians_usr_local_lib_python_is_read_not_refused(tmp_path):
    root = tmp_path / "stage"
    site = root / "usr" / "local" / "lib" / "python3.11"
    (site / "dist-packages").mkdir(parents=True)
    (site / "dist-packages" / "m.py").write_text("x = 1\n")
    os.chmod(site, 0o2775)  # root:staff, setgid, as Debian makes it
    out = io.BytesIO()
    layer_tar.write_layer(root, out, 1735689600, None)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        names = {m.name: m for m in tar.getmembers()}
    assert "usr/local/lib/python3.11/dist-packages/m.py" in names
    assert names["usr/local/lib/python3.11"].mode & stat.S_ISGID
    prog = root / "setgid-program"
    prog.write_bytes(b"\x7fELF")
    os.chmod(prog, 0o2755)  # a setgid file is still refused
    with pytest.raises(foreign_files.Refused, match="setgid-program"):
        layer_tar.write_layer(root, io.BytesIO(), 1735689600, None)
