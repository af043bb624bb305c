"""`imagekit pod exec|doctor|cp` against a malicious pod: real OpenSSH servers on loopback (full and gateway) whose
`tar`, `cat`, `dd`, ... send crafted data (tests/hostile_sshd.py). Whatever the pod sends, nothing is written
outside the destination, nothing half-written is left, and the terminal sees no escape sequences."""

from __future__ import annotations

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
