"""The in-image file primitives and the redaction of what the in-image programs print (imagekit/in_image/nofollow.py):
real links, FIFOs, devices and files on this machine, under an alarm so a read that blocks fails in seconds."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import stat
import subprocess
import sys

import pytest

from imagekit.in_image import nofollow
from tests.conftest import ROOT


@pytest.fixture(autouse=True)
def deadline():
    def hung(_signum, _frame):
        raise TimeoutError("blocked for 10 s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def place(tmp_path):
    (tmp_path / "file").write_bytes(b"hello\n")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    return tmp_path


@pytest.mark.parametrize("follow", [False, True])
def test_a_regular_file_is_read_and_a_missing_one_is_not_there(place, follow):
    assert nofollow.read_bytes(str(place / "file"), 100, follow=follow) == b"hello\n"
    assert nofollow.read_bytes(str(place / "missing"), 100, follow=follow) is None
    assert nofollow.read_bytes(str(place / "file" / "below"), 100, follow=follow) is None  # a file for a folder


@pytest.mark.parametrize(
    ("name", "follow", "says"),
    [
        ("link", False, "symbolic link"),
        ("zero", False, "symbolic link"),
        ("dangling", False, "symbolic link"),
        ("fifo", False, "FIFO"),
        ("fifo", True, "FIFO"),
        ("zero", True, "character device"),
        ("dir", False, "folder"),
        ("dir", True, "folder"),
    ],
)
def test_what_is_not_a_regular_file_is_refused_at_once(place, name, follow, says):
    with pytest.raises(nofollow.Refused) as err:
        nofollow.read_bytes(str(place / name), 1 << 20, follow=follow)
    assert isinstance(err.value, OSError) and says in str(err.value) and str(place / name) in str(err.value)


def test_a_link_is_followed_only_when_asked(place):
    assert nofollow.read_bytes(str(place / "link"), 100, follow=True) == b"hello\n"
    assert nofollow.read_bytes(str(place / "dangling"), 100, follow=True) is None


def test_a_read_is_bounded_also_where_the_size_says_nothing(place):
    with pytest.raises(nofollow.Refused, match="more than 5 bytes"):
        nofollow.read_bytes(str(place / "file"), 5)
    with open(place / "sparse", "wb") as fh:
        fh.truncate(8 << 30)
    with pytest.raises(nofollow.Refused, match="more than"):
        nofollow.read_bytes(str(place / "sparse"), 1 << 20)
    status = nofollow.read_bytes("/proc/self/status", 1 << 20)  # st_size 0: read until the end, within the bound
    assert status and b"Pid:" in status


def test_reads_relative_to_a_folder_descriptor(place):
    fd = nofollow.open_dir(str(place))
    try:
        assert nofollow.read_bytes("file", 100, dir_fd=fd) == b"hello\n"
        with pytest.raises(nofollow.Refused):
            nofollow.read_bytes("link", 100, dir_fd=fd)
        with pytest.raises(OSError):
            nofollow.open_dir("link", dir_fd=fd, follow=False)
        sub = nofollow.open_dir("dir", dir_fd=fd, follow=False)
        os.close(sub)
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        nofollow.open_dir(str(place / "fifo"))  # never blocks either


def test_a_new_file_replaces_a_planted_link_without_writing_through_it(place):
    victim = place / "victim"
    victim.write_text("precious\n")
    (place / "out.sha256").symlink_to(victim)
    fd = nofollow.open_dir(str(place))
    try:
        nofollow.write_replace(fd, "out.sha256", b"new\n", 0o600)
        nofollow.write_replace(fd, "out.sha256", b"newer\n", 0o644)
        with pytest.raises(IsADirectoryError):
            nofollow.write_replace(fd, "dir", b"x", 0o644)
    finally:
        os.close(fd)
    assert victim.read_text() == "precious\n"
    out = place / "out.sha256"
    assert not out.is_symlink() and out.read_bytes() == b"newer\n" and stat.S_IMODE(out.stat().st_mode) == 0o644
    assert sorted(p.name for p in place.iterdir()) == sorted(
        ["file", "link", "zero", "dangling", "fifo", "dir", "victim", "out.sha256"])  # fmt: skip


def test_a_new_file_gets_its_mode_whatever_the_umask():
    old = os.umask(0o077)
    try:
        fd = nofollow.open_dir("/tmp")
        name = f"imagekit-nofollow-test-{os.getpid()}"
        try:
            nofollow.write_replace(fd, name, b"x", 0o644)
            assert stat.S_IMODE(os.stat(name, dir_fd=fd).st_mode) == 0o644
        finally:
            os.unlink(name, dir_fd=fd)
            os.close(fd)
    finally:
        os.umask(old)


REDACTED = [
    ("POST http://user:s3cret@api.example/v1/pods/x/stop failed", "s3cret", "api.example/v1/pods/x/stop"),
    ("http://user:s3cret@api.example", "user", "api.example"),
    ("https://ghp_T0KEN@github.com/acme/x.git", "ghp_T0KEN", "github.com/acme/x.git"),
    ("https://u:p@ss/w@rd@host.example/x", "ss/w", "host.example/x"),
    ("git+ssh://git:pw@h.example/r", "pw@", "h.example/r"),
    ("'http://a:LEAK@h.example:8080/p'", "LEAK", "h.example:8080/p'"),
    ("https://h.example/v1?api_key=LEAK&page=2", "LEAK", "page=2"),
    ("https://h.example/v1?x=1&access_token=LEAK#frag", "LEAK", "x=1"),
    ("https://h.example/f?X-Amz-Signature=LEAK&X-Amz-Date=1", "LEAK", "X-Amz-Date=1"),
    ("https://h.example/f?password=LEAK", "LEAK", "h.example/f?password="),
    ('{"url": "https://h.example/?token=LEAK"}', "LEAK", '"}'),
    ("HTTP://U:LEAK@H.EXAMPLE/", "LEAK", "H.EXAMPLE/"),
]


@pytest.mark.parametrize(("text", "gone", "kept"), REDACTED)
def test_credentials_are_taken_out_of_urls(text, gone, kept):
    out = nofollow.redact(text)
    assert gone not in out and kept in out and "***" in out, out


@pytest.mark.parametrize("text", ["imagekit-guard: armed: deadline in 6h", "see https://docs.example/a@b?x=1",
                                  "user@host:~$ ls", "mailto:a@b.example", "IMAGEKIT_IDLE_GPU_UTIL='²'"])  # fmt: skip
def test_text_without_credentials_is_left_as_it_is(text):
    assert nofollow.redact(text) == text


def test_known_secrets_go_wherever_they_are_and_control_characters_are_escaped():
    assert nofollow.redact("Bearer rpa_KEY123 sent", secrets=("rpa_KEY123", "")) == "Bearer *** sent"
    assert nofollow.clean("a\x1b[2Jb\nc\x00 http://u:p@h/") == "a\\x1b[2Jb\\nc\\x00 http://***@h/"


@pytest.mark.programs
def test_the_module_runs_under_python_3_8():
    """It runs in images whose Python may be as old as 3.8: compiled and used there when this machine has one."""
    candidates = [*sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8.*/bin/python3.8"))),
                  shutil.which("python3.8") or ""]  # fmt: skip
    found = next((p for p in candidates if p and subprocess.run([p, "-c", "pass"], capture_output=True).returncode
                  == 0), None)  # fmt: skip
    if found is None:
        pytest.skip("no Python 3.8 on this machine")
    here = ROOT / "imagekit" / "in_image"
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import nofollow, guard; "
        "print(nofollow.redact('http://u:p@h/'), nofollow.read_bytes('/proc/self/status', 1 << 20)[:4], "
        "guard.settings({'IMAGEKIT_IDLE_GPU_UTIL': '²'})[1])"
    )
    res = subprocess.run([found, "-I", "-c", code, str(here)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("http://***@h/ b'Name'") and "IMAGEKIT_IDLE_GPU_UTIL" in res.stdout
    assert sys.version_info >= (3, 8)
