"""What a build step leaves in its stage folder is another party's files: the layer tar is written from it without
following a link (the stage's root included), in name order whatever the file system's, with the owners and modes the
image's folders have, and a FIFO, a device, a setuid program, an owner past 65534, a folder that cannot be listed, a
2,000-deep tree or a `dirs.json` that is not a small regular file refused by name, promptly, with no traceback."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import threading
from pathlib import Path

import pytest

from imagekit.effects import foreign_files, layer_tar

EPOCH = 1735689600


def _members(root: Path, folders: dict | None = None) -> list[tarfile.TarInfo]:
    out = io.BytesIO()
    layer_tar.write_layer(root, out, EPOCH, folders)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        return tar.getmembers()


def _within(seconds: float, fn):  # type: ignore[no-untyped-def]
    """``fn()``'s result or exception, failing the test when it blocks (a read of a FIFO never ends)."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed back below
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still blocked after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """The build host's own files: what a hostile step wants in a pushed layer."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (home / ".docker").mkdir()
    (home / ".docker" / "config.json").write_text('{"auths": {"r": {"auth": "c2VjcmV0"}}}')
    return home


@pytest.mark.parametrize("target", ["../../..", "ABSOLUTE"])
def test_a_stage_root_that_a_step_made_a_link_is_refused_and_nothing_it_points_to_is_read(tmp_path, outside, target):
    stage = tmp_path / "state" / "stage" / "cell"
    stage.mkdir(parents=True)
    (stage / "root").symlink_to(str(outside) if target == "ABSOLUTE" else target)
    with pytest.raises(foreign_files.Refused, match="root: is a symbolic link") as caught:
        layer_tar.write_layer(stage / "root", None, EPOCH)
    assert "PRIVATE" not in str(caught.value)
    assert (outside / ".ssh" / "id_ed25519").read_text() == "PRIVATE KEY\n"  # a link is never followed, not even to go


def test_a_linked_folder_inside_the_stage_is_one_link_member_and_nothing_below_it(tmp_path, outside):
    root = tmp_path / "root"
    (root / "opt").mkdir(parents=True)
    (root / "opt" / "link").symlink_to(outside)
    (root / "opt" / "rel").symlink_to("../../home")
    members = {m.name: m for m in _members(root)}
    assert sorted(members) == ["opt", "opt/link", "opt/rel"]
    assert members["opt/link"].issym() and members["opt/link"].linkname == str(outside)
    assert members["opt/rel"].issym() and members["opt/rel"].linkname == "../../home"


def _reversed_listings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the file system list every folder in reverse name order (as tmpfs lists newest first, ext4 by hash)."""
    real_listdir, real_scandir = os.listdir, os.scandir

    class _Reversed:
        def __init__(self, entries: list) -> None:
            self.entries = iter(entries)

        def __iter__(self):  # type: ignore[no-untyped-def]
            return self

        def __next__(self):  # type: ignore[no-untyped-def]
            return next(self.entries)

        def __enter__(self):  # type: ignore[no-untyped-def]
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def close(self) -> None:
            pass

    def scandir(path=".") -> _Reversed:  # type: ignore[no-untyped-def]
        with real_scandir(path) as it:
            return _Reversed(sorted(it, key=lambda e: e.name, reverse=True))

    monkeypatch.setattr(os, "listdir", lambda path=".": sorted(real_listdir(path), reverse=True))
    monkeypatch.setattr(os, "scandir", scandir)


def test_folders_are_written_in_name_order_whatever_order_the_file_system_lists_them_in(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    names = [f"pkg{n}" for n in range(10)]
    for name in reversed(names):  # made last first
        (root / name).mkdir()
        (root / name / "b.py").write_text("b\n")
        (root / name / "a.py").write_text("a\n")
    _reversed_listings(monkeypatch)
    got = [m.name for m in _members(root)]
    assert got[:10] == names
    assert got[10:] == [f"{n}/{f}" for n in names for f in ("a.py", "b.py")]


def test_a_folder_the_image_has_keeps_its_mode_and_its_owners_not_only_its_mode(tmp_path):
    root = tmp_path / "root"
    (root / "usr/local/lib/python3.11").mkdir(parents=True)
    (root / "home/user").mkdir(parents=True)
    folders = {"usr/local/lib/python3.11": [0o2775, 0, 50], "home/user": [0o750, 1000, 1000]}
    members = {m.name: m for m in _members(root, folders)}
    assert (members["usr/local/lib/python3.11"].mode, members["usr/local/lib/python3.11"].gid) == (0o2775, 50)
    assert (members["home/user"].mode, members["home/user"].uid, members["home/user"].gid) == (0o750, 1000, 1000)


@pytest.mark.parametrize("bits", [stat.S_ISUID, stat.S_ISGID])
def test_a_setuid_or_setgid_program_a_step_planted_is_refused_by_name(tmp_path, bits):
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/helper").write_bytes(b"\x7fELF")
    os.chmod(root / "usr/bin/helper", 0o755 | bits)
    with pytest.raises(foreign_files.Refused, match="usr/bin/helper: is setuid or setgid"):
        layer_tar.write_layer(root, None, EPOCH)


def test_special_files_and_foreign_owners_are_refused_by_name(tmp_path):
    cases = {"fifo": lambda p: os.mkfifo(p), "socket": None}
    if os.geteuid() == 0:
        cases["null"] = lambda p: os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    import socket

    for name, make in cases.items():
        root = tmp_path / name
        root.mkdir()
        if make is None:
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(str(root / name))
            sock.close()
        else:
            make(root / name)
        with pytest.raises(foreign_files.Refused, match=f"{name}: is a"):
            _within(5, lambda r=root: layer_tar.write_layer(r, None, EPOCH))
    if os.geteuid() == 0:
        root = tmp_path / "owners"
        root.mkdir()
        (root / "f").write_text("x")
        os.chown(root / "f", 100000, 100000)
        with pytest.raises(foreign_files.Refused, match="f: belongs to 100000:100000, above 65534"):
            layer_tar.write_layer(root, None, EPOCH)


@pytest.mark.seconds
def test_a_2000_deep_tree_is_refused_and_removed_without_a_traceback(tmp_path):
    root = tmp_path / "stage" / "root"
    root.mkdir(parents=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(2000):
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(fd)
    try:
        with pytest.raises(foreign_files.Refused, match="more than 256 folders deep"):
            layer_tar.write_layer(root, None, EPOCH)
    finally:
        foreign_files.remove_tree(tmp_path / "stage")  # past the recursion limit shutil.rmtree hits
    assert not (tmp_path / "stage").exists()


def test_remove_tree_removes_links_as_links(tmp_path, outside):
    stage = tmp_path / "stage"
    (stage / "a/b").mkdir(parents=True)
    (stage / "a/b/home").symlink_to(outside)
    (stage / "root").symlink_to("../..")
    foreign_files.remove_tree(stage)
    assert not stage.exists() and (outside / ".ssh" / "id_ed25519").exists()
    (tmp_path / "link").symlink_to(outside)
    foreign_files.remove_tree(tmp_path / "link")
    assert not (tmp_path / "link").is_symlink() and outside.is_dir()


SHAPES = ["fifo", "dev-zero", "link-to-file", "huge", "not-a-map", "setuid", "dotdot", "owner"]


@pytest.mark.parametrize("shape", SHAPES)
def test_dirs_json_is_read_as_a_small_regular_file_of_its_shape(tmp_path, shape):
    path = tmp_path / "dirs.json"
    if shape == "fifo":
        os.mkfifo(path)
    elif shape == "dev-zero":
        path.symlink_to("/dev/zero")
    elif shape == "link-to-file":
        (tmp_path / "real.json").write_text("{}")
        path.symlink_to(tmp_path / "real.json")
    elif shape == "huge":
        with open(path, "wb") as fh:
            fh.truncate(layer_tar.MAX_FOLDERS_JSON + 1)
    else:
        doc = {
            "not-a-map": [],
            "setuid": {"usr": [0o4755, 0, 0]},
            "dotdot": {"../etc": [0o755, 0, 0]},
            "owner": {"usr": [0o755, 70000, 0]},
        }[shape]
        path.write_text(json.dumps(doc))
    with pytest.raises(foreign_files.Refused, match=r"dirs\.json"):
        _within(5, lambda: layer_tar.read_folders(tmp_path))


def test_a_missing_dirs_json_is_no_folders(tmp_path):
    assert layer_tar.read_folders(tmp_path) == {}


def _as_nobody(fn) -> None:  # type: ignore[no-untyped-def]
    """Run ``fn`` in a child that is not root (as a build host's user is); its exception's text comes back."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            os.setgid(65534)
            os.setuid(65534)
            fn()
        except BaseException as exc:
            os.write(write, f"{type(exc).__name__}: {exc}".encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        said = fh.read().decode()
    os.waitpid(pid, 0)
    if said:
        raise AssertionError(said)


def test_a_folder_the_host_user_cannot_list_fails_the_layer_instead_of_going_in_empty(tmp_path):
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="imagekit-test-", dir="/tmp"))  # reachable by another user
    try:
        root = shared / "root"
        (root / "opt/secret").mkdir(parents=True)
        (root / "opt/secret/f").write_text("x")
        os.chmod(shared, 0o755)
        os.chmod(root / "opt/secret", 0o700)
        if os.geteuid() == 0:
            for path in (root, root / "opt"):
                os.chown(path, 65534, 65534)
            with pytest.raises(AssertionError, match="opt/secret: cannot be listed"):
                _as_nobody(lambda: layer_tar.write_layer(root, None, EPOCH))
        else:
            os.chmod(root / "opt/secret", 0)
            with pytest.raises(foreign_files.Refused, match="opt/secret: cannot be listed"):
                layer_tar.write_layer(root, None, EPOCH)
    finally:
        os.chmod(shared / "root/opt/secret", 0o700)
        foreign_files.remove_tree(shared)


def test_private_dir_makes_the_stage_and_its_parent_root_only_and_refuses_a_link(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "stage").mkdir(mode=0o755)
    os.chmod(state / "stage", 0o755)
    stage = foreign_files.private_dir(state / "stage" / "cell", levels=2)
    assert stat.S_IMODE(os.stat(stage).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(state / "stage").st_mode) == 0o700
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(foreign_files.Refused, match="linked"):
        foreign_files.private_dir(tmp_path / "linked", levels=1)


def test_a_file_swapped_for_another_after_it_was_listed_is_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a").write_text("honest\n")
    with foreign_files.folder(root) as fd:
        entry = next(foreign_files.walk(fd))
        (root / "a").unlink()
        (root / "a").write_text("swapped in\n")
        with pytest.raises(foreign_files.Refused, match="changed while it was read"):
            entry.open()


def test_read_bytes_refuses_links_special_files_and_what_is_too_large(tmp_path):
    (tmp_path / "ok").write_bytes(b"1234")
    assert foreign_files.read_bytes(tmp_path / "ok", 4) == b"1234"
    with pytest.raises(foreign_files.Refused, match="more than the 3"):
        foreign_files.read_bytes(tmp_path / "ok", 3)
    (tmp_path / "link").symlink_to(tmp_path / "ok")
    with pytest.raises(foreign_files.Refused, match="symbolic link"):
        foreign_files.read_bytes(tmp_path / "link", 10)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(foreign_files.Refused, match="FIFO"):
        _within(5, lambda: foreign_files.read_bytes(tmp_path / "fifo", 10))
