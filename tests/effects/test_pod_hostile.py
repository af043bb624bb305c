"""`imagekit pod exec|doctor|cp` against a malicious pod: real OpenSSH servers on loopback (full and gateway) whose
`tar`, `cat`, `dd`, ... send crafted data (tests/hostile_sshd.py). Whatever the pod sends, nothing is written
outside the destination, nothing half-written is left, and the terminal sees no escape sequences."""

from __future__ import annotations

import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from tests import hostile_sshd
from tests.hostile_sshd import archive


@pytest.fixture(scope="module")
def evil_full(tmp_path_factory):
    with hostile_sshd.serve(tmp_path_factory.mktemp("evil-full"), "full") as pod:
        yield pod


@pytest.fixture(scope="module")
def evil_gateway(tmp_path_factory):
    with hostile_sshd.serve(tmp_path_factory.mktemp("evil-gateway"), "gateway") as pod:
        yield pod


@pytest.fixture(params=["full", "gateway"])
def evil(request, evil_full, evil_gateway, tmp_path, monkeypatch):
    """Each malicious pod in turn, with a HOME that knows both (strict host keys), the planted tools removed after."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "known_hosts").write_text(
        evil_full.known_hosts_line() + evil_gateway.known_hosts_line()
    )
    pod = evil_full if request.param == "full" else evil_gateway
    pod.clear()
    yield pod
    pod.clear()


def _cp(app, runner, pod, src, dst, *extra):
    return runner.invoke(app, ["pod", "cp", str(src), str(dst), "--key", str(pod.key), *extra])


def _remote_dir(pod, tmp_path: Path) -> Path:
    remote = pod.root / "trees" / tmp_path.name
    remote.mkdir(parents=True, exist_ok=True)
    (remote / "real.txt").write_text("the pod's real file\n")
    return remote


def _nothing_left(tmp_path: Path, dest: Path) -> None:
    assert not dest.exists() and not os.path.lexists(dest)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".") or "imk" in p.name]
    assert not leftovers, leftovers


# ---- HIGH 1: a crafted tar stream never writes outside the destination ---------------------------------------
def test_the_cve_2025_4517_symlink_chain_writes_nothing_outside(app, runner, evil, tmp_path):
    dest = tmp_path / "out"
    crafted = hostile_sshd.cve_2025_4517(evil.root / f"cve-{tmp_path.name}.tar", dest)
    evil.plant("tar", hostile_sshd.tar_sending(crafted))
    res = _cp(app, runner, evil, f"{evil.target}:{_remote_dir(evil, tmp_path)}", dest)
    assert not (tmp_path / "newfile").exists(), "the pod wrote outside the destination"
    assert res.exit_code == 3, res.output
    assert "error:" in res.output and "Traceback" not in res.output
    _nothing_left(tmp_path, dest)


OUTSIDE = "outside.txt"  # a file of the user's next to the destination: what the attacks try to overwrite


def _attacks(tmp_path: Path) -> dict[str, tuple]:
    outside = str(tmp_path / OUTSIDE)
    return {
        "absolute-symlink-then-write-through": (
            ("evil", tarfile.SYMTYPE, {"link": str(tmp_path)}),
            (f"evil/{OUTSIDE}", tarfile.REGTYPE, {"data": b"pwned"}),
        ),
        "dotdot-member": ((f"../{OUTSIDE}", tarfile.REGTYPE, {"data": b"pwned"}),),
        "absolute-member": ((outside, tarfile.REGTYPE, {"data": b"pwned"}),),
        "relative-symlink-leaving": (
            ("up", tarfile.SYMTYPE, {"link": ".."}),
            (f"up/{OUTSIDE}", tarfile.REGTYPE, {"data": b"pwned"}),
        ),
        "inner-symlink-then-write-through": (
            ("sub", tarfile.DIRTYPE, {"mode": 0o755}),
            ("alias", tarfile.SYMTYPE, {"link": "sub"}),
            ("alias/x", tarfile.REGTYPE, {"data": b"through a link"}),
        ),
        "hardlink-to-outside-file": (
            ("hl", tarfile.LNKTYPE, {"link": outside}),
            ("hl", tarfile.REGTYPE, {"data": b"pwned"}),
        ),
        "hardlink-dotdot": (("hl", tarfile.LNKTYPE, {"link": f"../{OUTSIDE}"}),),
        "char-device": (("null", tarfile.CHRTYPE, {}),),
        "block-device": (("disk", tarfile.BLKTYPE, {}),),
        "fifo": (("pipe", tarfile.FIFOTYPE, {}),),
        "duplicate-name": (("ok.txt", tarfile.REGTYPE, {"data": b"again"}),),
        "escape-sequence-name": (("\x1b]0;owned\x07\x1b[2J.txt", tarfile.REGTYPE, {"data": b"x"}),),
    }


ATTACKS = sorted(_attacks(Path("/x")))


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_crafted_member_is_refused_and_nothing_is_written(app, runner, evil, tmp_path, attack):
    (tmp_path / OUTSIDE).write_text("the user's own file\n")
    dest = tmp_path / "out"
    crafted = archive(evil.root / f"{attack}-{tmp_path.name}.tar", *_attacks(tmp_path)[attack])
    evil.plant("tar", hostile_sshd.tar_sending(crafted))
    res = _cp(app, runner, evil, f"{evil.target}:{_remote_dir(evil, tmp_path)}", dest)
    assert (tmp_path / OUTSIDE).read_text() == "the user's own file\n"
    assert res.exit_code == 3, res.output
    assert "error:" in res.output and "Traceback" not in res.output and "\x1b" not in res.output
    assert "nothing was written" in res.output
    (tmp_path / OUTSIDE).unlink()
    _nothing_left(tmp_path, dest)


def test_setuid_and_world_writable_modes_are_made_safe(app, runner, evil, tmp_path):
    dest = tmp_path / "out"
    crafted = archive(
        evil.root / f"modes-{tmp_path.name}.tar",
        ("suid", tarfile.REGTYPE, {"data": b"#!/bin/sh\n", "mode": 0o6777}),
        ("open", tarfile.DIRTYPE, {"mode": 0o1777}),
    )
    evil.plant("tar", hostile_sshd.tar_sending(crafted))
    res = _cp(app, runner, evil, f"{evil.target}:{_remote_dir(evil, tmp_path)}", dest)
    assert res.exit_code == 0, res.output
    assert stat.S_IMODE((dest / "suid").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "open").stat().st_mode) == 0o755
    assert (dest / "ok.txt").read_text() == "an ordinary file\n"


# ---- what a real (honest) pod's folders hold ----------------------------------------------------------------
def _venv_like(remote: Path) -> None:
    (remote / "bin").mkdir()
    (remote / "lib" / "site-packages").mkdir(parents=True)
    (remote / "lib" / "site-packages" / "m.py").write_text("x = 1\n")
    (remote / "bin" / "python3").symlink_to("/usr/bin/python3")  # what `python -m venv` makes
    (remote / "bin" / "python").symlink_to("python3")
    (remote / "lib64").symlink_to("lib")


def test_a_folder_with_links_leaving_it_is_refused_by_name_or_dereferenced(app, runner, evil, tmp_path):
    remote = _remote_dir(evil, tmp_path)
    _venv_like(remote)
    dest = tmp_path / "venv"
    res = _cp(app, runner, evil, f"{evil.target}:{remote}", dest)
    assert res.exit_code == 3, res.output
    assert "bin/python3 -> /usr/bin/python3" in res.output and "--dereference" in res.output
    _nothing_left(tmp_path, dest)
    res = _cp(app, runner, evil, f"{evil.target}:{remote}", dest, "--dereference")
    assert res.exit_code == 0, res.output
    assert (dest / "bin" / "python3").is_file() and not (dest / "bin" / "python3").is_symlink()
    assert not any(p.is_symlink() for p in dest.rglob("*"))  # every link replaced by what it points to
    assert (dest / "lib64" / "site-packages" / "m.py").read_text() == "x = 1\n"


def test_links_inside_the_folder_are_kept_as_links(app, runner, evil, tmp_path):
    remote = _remote_dir(evil, tmp_path)
    _venv_like(remote)
    (remote / "bin" / "python3").unlink()
    (remote / "bin" / "python3").write_text("#!/bin/sh\n")
    (remote / "lib" / "site-packages" / "up").symlink_to("../../bin")
    dest = tmp_path / "venv"
    res = _cp(app, runner, evil, f"{evil.target}:{remote}", dest)
    assert res.exit_code == 0, res.output
    assert os.readlink(dest / "bin" / "python") == "python3" and os.readlink(dest / "lib64") == "lib"
    assert (dest / "lib64" / "site-packages" / "up" / "python").read_text() == "#!/bin/sh\n"


# ---- MEDIUM: the destination ----------------------------------------------------------------------------------
@pytest.mark.parametrize("planted", ["dest.imkpart", "dest.imktar.imkpart", "dest.imktar"])
@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_a_planted_partial_download_link_is_never_written_through(app, runner, evil, tmp_path, planted, how):
    remote = _remote_dir(evil, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    dest = tmp_path / "dest"
    part = tmp_path / planted
    (part.symlink_to if how == "symlink" else part.hardlink_to)(victim)
    res = _cp(app, runner, evil, f"{evil.target}:{remote / 'real.txt' if planted == 'dest.imkpart' else remote}", dest)
    assert victim.read_text() == "the user's own file\n"
    if planted.endswith(".imkpart"):  # what a download writes into: refused
        assert res.exit_code == 2, res.output
        assert "not a partial download" in res.output and "nothing was written" in res.output
        assert not dest.exists()
    else:  # the archive's name is only ever replaced (a rename), never written through
        assert res.exit_code == 0, res.output
        assert (dest / "real.txt").is_file()


def test_a_download_lands_like_cp_and_overwrites_only_with_force(app, runner, evil, tmp_path, monkeypatch):
    remote = _remote_dir(evil, tmp_path)
    (remote / "sub").mkdir()
    (remote / "sub" / "new.txt").write_text("from the pod\n")
    into = tmp_path / "into"
    into.mkdir()
    for name in ("real.txt", "sub"):
        assert _cp(app, runner, evil, f"{evil.target}:{remote / name}", into).exit_code == 0
    assert (into / "real.txt").read_text() == "the pod's real file\n" and (into / "sub" / "new.txt").is_file()
    (into / "real.txt").write_text("edited here\n")
    (into / "sub" / "mine.txt").write_text("the user's own file\n")
    for name in ("real.txt", "sub"):
        res = _cp(app, runner, evil, f"{evil.target}:{remote / name}", into)
        assert res.exit_code == 2 and "exists: nothing was copied" in res.output and "--force" in res.output
    assert (into / "real.txt").read_text() == "edited here\n" and (into / "sub" / "mine.txt").is_file()
    assert sorted(p.name for p in into.iterdir()) == ["real.txt", "sub"]  # no partial left behind
    for name in ("real.txt", "sub"):
        assert _cp(app, runner, evil, f"{evil.target}:{remote / name}", into, "--force").exit_code == 0
    assert (into / "real.txt").read_text() == "the pod's real file\n"
    assert sorted(p.name for p in (into / "sub").iterdir()) == ["new.txt"]  # replaced, not merged
    res = _cp(app, runner, evil, f"{evil.target}:{remote / 'real.txt'}", into / "sub", "--force")
    assert res.exit_code == 0 and (into / "sub" / "real.txt").is_file()  # into the folder, as cp does
    (into / "file-here").write_text("x")
    res = _cp(app, runner, evil, f"{evil.target}:{remote / 'sub'}", into / "file-here", "--force")
    assert res.exit_code == 2 and "is a file" in res.output and (into / "file-here").read_text() == "x"
    monkeypatch.chdir(into)
    res = _cp(app, runner, evil, f"{evil.target}:{remote}/", ".")  # `.` as the destination, a trailing slash
    assert res.exit_code == 0, res.output
    assert (into / remote.name / "sub" / "new.txt").is_file()


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "/dev/null"])
def test_a_fifo_or_a_device_on_the_pod_is_refused_not_read_forever(app, runner, evil, tmp_path, special):
    if special == "fifo":
        special = str(evil.home / f"fifo-{tmp_path.name}")
        os.mkfifo(special)
    res = _cp(app, runner, evil, f"{evil.target}:{special}", tmp_path / "got")
    assert res.exit_code == 2 and "not a regular file or a folder" in res.output, res.output
    assert not (tmp_path / "got").exists()


def _cp_bounded(pod, src: str, dst: Path, *extra: str, limit: float = 45.0) -> tuple[int, str]:
    """`pod cp` as a process of its own, stopped after ``limit`` seconds (a copy that reads a FIFO or /dev/zero
    would never end; in-process it would hang the test run): (exit code, output). The test fails on a hang."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "imagekit", "pod", "cp", src, str(dst), "--key", str(pod.key), *extra]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=limit, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        pytest.fail(f"pod cp {src} still ran after {limit:g} s")
    return done.returncode, done.stdout + done.stderr


def _special(kind: str, where: Path) -> Path:
    """A FIFO, a socket, or a link to /dev/zero or to a FIFO, at ``where``."""
    import socket

    if kind == "fifo":
        os.mkfifo(where)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(where))
        sock.close()  # the socket file stays
    elif kind == "devzero-link":
        os.symlink("/dev/zero", where)
    else:
        os.mkfifo(where.with_name(where.name + ".target"))
        os.symlink(where.name + ".target", where)
    return where


@pytest.mark.parametrize(
    ("kind", "dereference"),
    [("fifo", False), ("socket", False), ("devzero-link", True), ("fifo-link", True)],
)
def test_a_folder_holding_a_special_file_is_refused_before_it_is_packed(app, runner, evil, tmp_path, kind, dereference):
    """A FIFO, a device or a socket inside a folder (or reached through its links with --dereference): exit 2 naming
    it, before the pod packs anything (it was packed, sent whole, then refused as the pod's tar's fault; a socket
    was left out without a word)."""
    remote = _remote_dir(evil, tmp_path)
    (remote / "sub").mkdir()
    _special(kind, remote / "sub" / "special")
    packed = evil.root / f"packed-{tmp_path.name}"
    evil.plant("tar", f'#!/bin/sh\ntouch {packed}\nexec /bin/tar "$@"\n')
    dest = tmp_path / "out"
    code, output = _cp_bounded(evil, f"{evil.target}:{remote}", dest, *(["--dereference"] if dereference else []))
    assert code == 2, output
    assert "sub/special" in output and "FIFO, a device or a socket" in output and "hint:" in output, output
    assert "Traceback" not in output
    assert not packed.exists(), "the folder was packed anyway"
    _nothing_left(tmp_path, dest)


def test_special_files_are_named_as_plain_text(app, runner, evil, tmp_path):
    """The names the pod's `find` prints are the pod's: shown without escape sequences, on no line of their own."""
    remote = _remote_dir(evil, tmp_path)
    os.mkfifo(remote / "\x1b]0;owned\x07\x1b[2Jpipe")
    os.mkfifo(remote / "x\nerror: spoofed")
    code, output = _cp_bounded(evil, f"{evil.target}:{remote}", tmp_path / "out")
    assert code == 2 and "pipe" in output, output
    assert "\x1b" not in output and "\x07" not in output
    assert not any(line.startswith("error: spoofed") for line in output.splitlines()), output


def test_the_host_reads_no_more_than_the_size_the_pod_gave(app, runner, evil, tmp_path):
    """After its size and sha256 are read, the pod swaps the file for a link to a 64 GiB (sparse) file: the download
    stops at the size it was told (exit 1, the sha256 differs, nothing kept); SFTP read until the end of whatever it
    found, filling the local disk."""
    import shlex

    remote = evil.home / f"grow-{tmp_path.name}.bin"
    remote.write_bytes(os.urandom(1000))
    huge = evil.root / f"huge-{tmp_path.name}"
    with huge.open("wb") as fh:
        fh.truncate(64 << 30)
    evil.plant(
        "sha256sum", f'#!/bin/sh\n/usr/bin/sha256sum "$@"\nc=$?\nln -sf {huge} {shlex.quote(str(remote))}\nexit $c\n'
    )
    dest = tmp_path / "got"
    code, output = _cp_bounded(evil, f"{evil.target}:{remote}", dest)
    assert code == 1 and "sha256" in output and "corrupt" in output, output
    _nothing_left(tmp_path, dest)
    huge.unlink()


@pytest.mark.parametrize("how", ["/proc/kmsg", "link"])
def test_a_file_of_proc_or_sys_is_refused_not_read(app, runner, evil, tmp_path, how):
    """/proc/kmsg is a regular file whose reading blocks until the kernel logs something: the size probe waited
    five minutes on it, then said to raise a --timeout `pod cp` does not have. Files of /proc and /sys (their size
    is known only by reading them) are refused at once, also through a link."""
    source = "/proc/kmsg"
    if how == "link":
        source = str(evil.home / f"kmsg-{tmp_path.name}")
        os.symlink("/proc/kmsg", source)
    code, output = _cp_bounded(evil, f"{evil.target}:{source}", tmp_path / "got")
    assert code == 2, output
    assert "/proc or /sys" in output and "pod exec" in output and "Traceback" not in output, output
    _nothing_left(tmp_path, tmp_path / "got")


@pytest.mark.parametrize("staged", ["devzero-link", "fifo"])
def test_a_staged_archive_that_is_not_a_regular_file_is_never_read(app, runner, evil, tmp_path, staged):
    """The pod's `tar` leaves a link to /dev/zero or a FIFO where the archive goes: exit 3 at once (the size probe
    read /dev/zero, or waited on the FIFO, until its 5-minute timeout; SFTP would then read without end)."""
    make = 'ln -sf /dev/zero "$2"' if staged == "devzero-link" else 'rm -f "$2"; mkfifo "$2"'
    evil.plant("tar", f'#!/bin/sh\nif [ "$1" = -cf ]; then {make}; exit 0; fi\nexec /bin/tar "$@"\n')
    dest = tmp_path / "out"
    code, output = _cp_bounded(evil, f"{evil.target}:{_remote_dir(evil, tmp_path)}", dest)
    assert code == 3, output
    assert "not a regular file" in output and "tar" in output and "Traceback" not in output, output
    _nothing_left(tmp_path, dest)


@pytest.mark.parametrize("tool", ["wc", "sha256sum"])
@pytest.mark.parametrize("becomes", ["devzero-link", "fifo"])
def test_a_file_that_turns_special_during_the_copy_is_never_read(app, runner, evil, tmp_path, tool, becomes):
    """The pod swaps the file for a link to /dev/zero or a FIFO right after a probe (its `wc` or `sha256sum` does
    it): each remote read checks for a regular file first, and the host reads no more than the size it was told,
    so the copy ends at once, leaving nothing (it hung on `cat` of /dev/zero, or SFTP read /dev/zero forever)."""
    import shlex

    remote = evil.home / f"swap-{tmp_path.name}.bin"
    remote.write_bytes(os.urandom(1000))
    real = f"/usr/bin/{tool}"
    swap = (
        f"ln -sf /dev/zero {shlex.quote(str(remote))}"
        if becomes == "devzero-link"
        else f"rm -f {shlex.quote(str(remote))}; mkfifo {shlex.quote(str(remote))}"
    )
    evil.plant(tool, f'#!/bin/sh\n{real} "$@"\nc=$?\n{swap}\nexit $c\n')
    dest = tmp_path / "got"
    code, output = _cp_bounded(evil, f"{evil.target}:{remote}", dest)
    assert code in (1, 2, 3), output
    assert "error:" in output and "hint:" in output and "Traceback" not in output, output
    _nothing_left(tmp_path, dest)


# ---- MEDIUM: remote commands and names ---------------------------------------------------------------------------
def test_exec_over_a_full_server_gives_the_command_an_empty_stdin(app, runner, evil_full, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "known_hosts").write_text(evil_full.known_hosts_line())
    res = runner.invoke(
        app, ["pod", "exec", evil_full.target, "--key", str(evil_full.key), "--timeout", "20", "--", "cat; echo done"]
    )
    assert res.exit_code == 0 and res.stdout.strip() == "done", res.output


@pytest.mark.parametrize("name", ["-n", "--help"])
def test_remote_names_starting_with_a_dash_are_names_not_options(app, runner, evil, tmp_path, name):
    local = tmp_path / "payload.bin"
    local.write_bytes(os.urandom(100_000))
    try:
        up = _cp(app, runner, evil, local, f"{evil.target}:{name}")
        assert up.exit_code == 0, up.output
        assert (evil.home / name).read_bytes() == local.read_bytes()
        back = tmp_path / "back.bin"
        down = _cp(app, runner, evil, f"{evil.target}:{name}", back)
        assert down.exit_code == 0, down.output
        assert back.read_bytes() == local.read_bytes()
    finally:
        (evil.home / name).unlink(missing_ok=True)


@pytest.mark.parametrize("name", ["y\x15touch PWNED #", "z\x03touch PWNED", "a\x1b[2Jb", "c\x7fd"])
def test_a_control_character_in_a_remote_name_is_refused_never_typed(app, runner, evil, tmp_path, name):
    """Typed into the gateway's terminal, ^U erases the line before it and ^C interrupts: the rest of the name would
    run as a command on the pod. Refused (exit 2) before anything is sent; nothing runs."""
    local = tmp_path / "payload.bin"
    local.write_bytes(b"x" * 1000)
    up = _cp(app, runner, evil, local, f"{evil.target}:{name}")
    assert up.exit_code == 2, up.output
    assert "control character" in up.output
    assert not (evil.home / "PWNED").exists() and not list(evil.home.glob("*PWNED*"))


def test_the_chunk_line_types_no_name_as_it_is():
    from imagekit.clouds import podwire

    line = podwire.chunk_upload_line("ABC", "/workspace/it's $(here)", "0" * 64, 10)
    assert "it's" not in line and "$(here)" not in line  # the names travel as base64
    with pytest.raises(Exception, match="control character"):
        podwire.chunk_upload_line("ABC", "/workspace/a\x15b", "0" * 64, 10)


def test_exec_json_keeps_a_bounded_output(app, runner, evil_full, tmp_path, monkeypatch):
    """`pod exec --json` holds the output to print it whole: a pod printing without end must not grow it without
    bound; what was left out is said."""
    from imagekit.cli import pod_cmd

    _home_knowing(tmp_path, monkeypatch, evil_full)
    monkeypatch.setattr(pod_cmd, "JSON_OUTPUT_LIMIT", 1000)
    cmd = [
        "pod",
        "exec",
        evil_full.target,
        "--key",
        str(evil_full.key),
        "--json",
        "--",
        "head -c 200000 /dev/zero | tr '\\0' a",
    ]
    res = runner.invoke(app, cmd)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["output"]) == 1000 and doc["output_truncated"] is True and doc["output_chars"] >= 200000


def _failing_append(pod) -> None:
    """A `cat` that cannot append a received chunk (as on a full or read-only disk)."""
    pod.plant(
        "cat",
        '#!/bin/sh\ncase "$1" in *.imkpart.c) echo "cat: write error: No space left on device" >&2; exit 1;; esac\n'
        'exec /bin/cat "$@"\n',
    )


def _failing_decode(pod) -> None:
    """A `base64 -d` whose output cannot be written (the disk filled while a chunk arrived)."""
    pod.plant(
        "base64",
        '#!/bin/sh\nif [ "$1" = -d ]; then cat >/dev/null; echo "base64: write error: No space left on device" >&2; '
        'exit 1; fi\nexec /usr/bin/base64 "$@"\n',
    )


@pytest.mark.parametrize("failure", [_failing_append, _failing_decode])
def test_a_pod_that_cannot_write_an_upload_fails_fast_with_exit_3(
    app, runner, evil_gateway, tmp_path, monkeypatch, failure
):
    import time

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "known_hosts").write_text(evil_gateway.known_hosts_line())
    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(300_000))
    failure(evil_gateway)
    started = time.monotonic()
    try:
        res = _cp(app, runner, evil_gateway, local, f"{evil_gateway.target}:{evil_gateway.home / tmp_path.name}")
    finally:
        evil_gateway.clear()
    assert res.exit_code == 3, res.output
    assert "cannot write" in res.output and "No space left on device" in res.output
    assert time.monotonic() - started < 30


def test_a_command_killed_by_a_signal_is_128_plus_n_and_said(app, runner, evil, evil_full):
    res = runner.invoke(app, ["pod", "exec", evil.target, "--key", str(evil.key), "--", "kill -KILL $$"])
    assert res.exit_code == 137, res.output
    if evil is evil_full:  # the exec channel reports the signal; a terminal's shell reports 128 + N itself
        assert "killed by signal KILL" in res.output


# ---- LOW: keys, host keys, servers that are not SSH servers -------------------------------------------------
def _home_knowing(tmp_path: Path, monkeypatch, *pods, lines: str = "") -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    (tmp_path / "home" / ".ssh").mkdir(parents=True, exist_ok=True)
    known = tmp_path / "home" / ".ssh" / "known_hosts"
    known.write_text(lines + "".join(p.known_hosts_line() for p in pods))
    return known


def _bad_keys(tmp_path: Path, pod) -> dict[str, tuple[Path, str]]:
    import subprocess

    binary, latin = tmp_path / "binary-key", tmp_path / "latin-key"
    binary.write_bytes(bytes(range(256)) * 4)
    latin.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n\xff\xfe\xe9t\xe9\n-----END OPENSSH PRIVATE KEY-----\n")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret", "-f", str(tmp_path / "enc")], check=True)
    return {
        "binary": (binary, "is not a private key imagekit can read"),
        "non-utf8": (latin, "is not a private key imagekit can read"),
        "public": (Path(str(pod.key) + ".pub"), "is a public key"),
        "encrypted": (tmp_path / "enc", "is encrypted"),
    }


@pytest.mark.parametrize("which", ["binary", "non-utf8", "public", "encrypted"])
def test_a_key_that_is_not_a_usable_private_key_says_what_it_is(
    app, runner, evil_gateway, tmp_path, monkeypatch, which
):
    _home_knowing(tmp_path, monkeypatch, evil_gateway)
    key, said = _bad_keys(tmp_path, evil_gateway)[which]
    res = runner.invoke(app, ["pod", "exec", evil_gateway.target, "--key", str(key), "--", "true"])
    assert res.exit_code == 2, res.output
    assert said in res.output and "Traceback" not in res.output and "check the address" not in res.output
    if which == "encrypted":
        assert "ssh-agent" in res.output


def test_no_key_at_all_says_so(app, runner, evil_gateway, tmp_path, monkeypatch):
    _home_knowing(tmp_path, monkeypatch, evil_gateway)
    res = runner.invoke(app, ["pod", "exec", evil_gateway.target, "--", "true"])
    assert res.exit_code == 2 and "no SSH key" in res.output and "--key" in res.output, res.output


def test_a_malformed_known_hosts_line_is_skipped_with_a_warning(app, runner, evil_gateway, tmp_path, monkeypatch):
    bad = "garbage\nhost ssh-ed25519 !!!not-base64!!!\n[127.0.0.1]:1 ssh-rsa AAAA\n@cert-authority * ssh-ed25519 AAAA\n"
    known = _home_knowing(tmp_path, monkeypatch, evil_gateway, lines=bad)
    known.write_bytes(known.read_bytes() + b"\xff\xfe binary line\n")
    res = runner.invoke(app, ["pod", "exec", evil_gateway.target, "--key", str(evil_gateway.key), "--", "echo hi"])
    assert res.exit_code == 0, res.output
    assert "hi" in res.stdout and "line 1 cannot be read as a host key; skipped" in res.output
    assert "Traceback" not in res.output


@pytest.mark.loopback
@pytest.mark.parametrize("greeting", [b"", b"HTTP/1.1 400 Bad Request\r\n\r\n"])
def test_a_port_that_is_not_an_ssh_server_is_a_clean_exit_3(tmp_path, monkeypatch, capfd, greeting):
    from imagekit.clouds.podwire import parse_target
    from imagekit.errors import EnvironmentFailure
    from imagekit.services.pods import pod

    monkeypatch.setenv("HOME", str(tmp_path))
    with hostile_sshd.mute_port(greeting) as port:
        with pytest.raises(EnvironmentFailure) as err:
            pod.run_command(
                parse_target(f"root@127.0.0.1:{port}"),
                "true",
                pod.PodOptions(connect_timeout=0.3),
                lambda _: None,
                lambda _: None,
                lambda _: None,
            )
    assert err.value.exit_code == 3
    assert "did not answer as an SSH server" in err.value.message, err.value.message
    assert "Exception (client)" not in capfd.readouterr().err


@pytest.mark.sshd
def test_a_silent_terminal_is_said_with_its_timeout(tmp_path_factory, tmp_path, monkeypatch):
    from imagekit.clouds.podwire import parse_target
    from imagekit.errors import EnvironmentFailure
    from imagekit.services.pods import pod

    with hostile_sshd.serve(tmp_path_factory.mktemp("silent"), "silent") as silent:
        _home_knowing(tmp_path, monkeypatch, silent)
        opts = pod.PodOptions(key=silent.key, connect_timeout=2.0, timeout=10.0**9)
        with pytest.raises(EnvironmentFailure) as err:
            pod.run_command(parse_target(silent.target), "true", opts, lambda _: None, lambda _: None, lambda _: None)
    assert "did not start a shell within 2 s" in err.value.message, err.value.message
    assert "e+09" not in err.value.message


# ---- LOW: what the pod prints ------------------------------------------------------------------------------------
def test_c1_and_bidi_controls_never_reach_the_terminal(app, runner, evil, tmp_path, monkeypatch):
    _home_knowing(tmp_path, monkeypatch, evil)
    # U+009B (8-bit CSI), U+0085 (NEL), U+202E (right-to-left override), as UTF-8; ESC too
    command = r"printf 'a\302\23331mb\302\205c\342\200\256d\033[2Je\n'"
    res = runner.invoke(app, ["pod", "exec", evil.target, "--key", str(evil.key), "--", command])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == "abcde", ascii(res.stdout)


def test_a_pods_words_in_an_error_are_printable_one_line(app, runner, evil, tmp_path, monkeypatch):
    _home_knowing(tmp_path, monkeypatch, evil)
    evil.plant("mkdir", "#!/bin/sh\nprintf '\\033]0;owned\\007\\033[2Jdenied\\nerror: spoofed\\n'\nexit 1\n")
    local = tmp_path / "f.txt"
    local.write_text("x")
    res = _cp(app, runner, evil, local, f"{evil.target}:{evil.home}/sub/f.txt")
    assert res.exit_code == 3, res.output
    assert "\x1b" not in res.output and "\x07" not in res.output
    assert not any(line.startswith("error: spoofed") for line in res.output.splitlines()), res.output


@pytest.mark.parametrize("tool", ["wc", "dd"])
def test_a_pod_printing_without_end_is_cut_off(app, runner, evil, evil_full, tmp_path, monkeypatch, tool):
    import time

    if tool == "dd" and evil is evil_full:
        pytest.skip("SFTP reads the file itself: no dd")
    _home_knowing(tmp_path, monkeypatch, evil)
    remote = evil.home / f"f-{tmp_path.name}"
    remote.write_bytes(os.urandom(1000))
    evil.plant(tool, hostile_sshd.printing_forever())
    started = time.monotonic()
    res = _cp(app, runner, evil, f"{evil.target}:{remote}", tmp_path / "got")
    assert res.exit_code == 3, res.output
    assert "printed more than" in res.output and not (tmp_path / "got").exists()
    assert time.monotonic() - started < 60


# ---- the wire, without a server ----------------------------------------------------------------------------------
def test_port_0_and_out_of_range_ports_are_refused():
    from imagekit.clouds.podwire import parse_target, split_remote
    from imagekit.errors import UsageError

    for text in ("root@host:0", "root@host:65536", "root@host:00"):
        with pytest.raises(UsageError):
            parse_target(text)
    with pytest.raises(UsageError):
        split_remote("root@host:0:/workspace")
    assert parse_target("root@host:1").port == 1 and parse_target("root@host:65535").port == 65535


def test_clean_strips_c1_controls_decoded_from_utf8():
    from imagekit.clouds.podwire import clean

    text = "a\xc2\x9b31mb\xc2\x85c\xe2\x80\xaed\x1b[2Je\r\n".encode("latin-1").decode("utf-8")
    assert clean(text) == "abcde\n"  # U+009B 3 1 m is an 8-bit CSI: gone whole
    assert clean("".join(chr(c) for c in range(0x80, 0xA0))) == ""


def _pty_peer(script: list[bytes]):
    """A Shell on one end of a real socket pair; the other end answers the setup line, then sends ``script``'s
    pieces one by one, each as its own read (the nonce of the command filled in for ``{N}``)."""
    import re
    import socket
    import threading
    import time

    from imagekit.effects.ssh.ssh_terminal import Shell

    ours, theirs = socket.socketpair()

    def pod() -> None:
        buf = b""
        while b"\n" not in buf:
            buf += theirs.recv(4096)
        nonce = re.search(rb"IMK%s%s\\n' ([0-9A-F]+) R", buf)[1]
        theirs.sendall(b"IMK" + nonce + b"R\r\n")
        buf = b""
        while b"\n" not in buf:
            buf += theirs.recv(65536)
        nonce = re.search(rb"' ([0-9A-F]+) S", buf)[1]
        for piece in script:
            try:
                theirs.sendall(piece.replace(b"{N}", nonce))
            except OSError:  # the Shell hung up (it refused what came)
                return
            time.sleep(0.05)  # each piece its own read

    thread = threading.Thread(target=pod, daemon=True)
    thread.start()
    return Shell(ours, 5.0), thread, theirs


def test_the_end_sentinel_is_matched_only_with_its_line_end():
    """An exit code split across two reads (``E 12`` then ``7``) is 127, not 12 or 1."""
    shell, thread, theirs = _pty_peer([b"\r\nIMK{N}S\r\n", b"out\r\n\r\nIMK{N}E 1", b"2", b"7\r\n"])
    got: list[str] = []
    assert shell.run("whatever", 10, got.append) == 127
    assert "".join(got) == "out\n"
    thread.join(2)
    theirs.close()
    shell.chan.close()


def test_a_chunk_bigger_than_a_chunk_can_be_is_refused():
    from imagekit.clouds.podwire import TYPED_LINE, chunk_text_limit
    from imagekit.effects.ssh.ssh_errors import TooMuchOutput

    line = b"A" * TYPED_LINE + b"\r\n"
    shell, thread, theirs = _pty_peer([b"\r\nIMK{N}S\r\n", line * 2000])  # 6 MB of base64: more than 4 MiB decoded
    with pytest.raises(TooMuchOutput):
        shell.capture_raw("dd ...", 30, limit=chunk_text_limit())
    thread.join(5)
    theirs.close()
    shell.chan.close()


# ---- a resumed download ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("partial", ["matching", "changed"])
def test_a_resumed_download_keeps_a_partial_only_when_it_matches_the_pods(evil_gateway, tmp_path, monkeypatch, partial):
    from imagekit.clouds.podwire import CHUNK
    from imagekit.services.pods import pod

    _home_knowing(tmp_path, monkeypatch, evil_gateway)
    data = os.urandom(2 * CHUNK + 5)
    remote = evil_gateway.home / f"resume-{tmp_path.name}.bin"
    remote.write_bytes(data)
    local = tmp_path / "got.bin"
    prefix = bytearray(data[: CHUNK + 100])  # a whole chunk and a bit, as a dropped copy leaves it
    if partial == "changed":
        prefix[CHUNK - 1] ^= 0xFF  # the last byte of the last whole chunk differs from the pod's
    (tmp_path / "got.bin.imkpart").write_bytes(bytes(prefix))
    logs: list[str] = []
    result = pod.copy(
        f"{evil_gateway.target}:{remote}",
        str(local),
        pod.PodOptions(key=evil_gateway.key),
        lambda d, t: None,
        logs.append,
    )
    assert local.read_bytes() == data
    if partial == "matching":
        assert result.sent == len(data) - CHUNK and any("resuming" in m for m in logs), logs
    else:
        assert result.sent == len(data) and not any("resuming" in m for m in logs), logs


def test_pod_doctor_output_from_a_hostile_pod_is_clean(app, runner, evil, tmp_path, monkeypatch):
    _home_knowing(tmp_path, monkeypatch, evil)
    evil.plant("imagekit-doctor", "#!/bin/sh\nprintf '\\033]0;owned\\007\\033[2J\\302\\233Hok\\n'\nexit 1\n")
    res = runner.invoke(app, ["pod", "doctor", evil.target, "--key", str(evil.key)])
    assert res.exit_code == 1, res.output
    assert "ok" in res.stdout and "\x1b" not in res.output and "\x9b" not in res.output and "\x07" not in res.output
