"""`services/pods/pod.py`'s own decisions over a fake transport (`tests/fakes.py`), in milliseconds: which doctor runs
and
that its temporary folder goes whatever happens, where a copy lands, a folder as one tar stream, reconnecting and
resuming after a dropped connection. The wire itself (exec, SFTP, the terminal's chunks) is tested against real
OpenSSH servers in `test_pod.py` and `test_pod_hostile.py`."""

from __future__ import annotations

import pytest

from imagekit.clouds.podwire import parse_target
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.image import render
from imagekit.services.pods import pod
from tests.fakes import FakeTransport

TARGET = parse_target("root@pod.test:2222")
OPTS = pod.PodOptions()


def _nothing(*_: object) -> None:
    pass


def _doctor(t: FakeTransport, args=(), expect=None):
    out: list[str] = []
    code, how = pod.run_doctor(TARGET, list(args), expect, OPTS, out.append, _nothing, _nothing, dial=t.dial)
    return code, how, out


@pytest.mark.parametrize("mode", ["exec", "pty"])
def test_a_command_runs_once_on_the_transport_the_connection_chose(mode):
    t = FakeTransport(mode=mode, run_exit=42)
    out: list[str] = []
    assert pod.run_command(TARGET, "nvidia-smi", OPTS, out.append, _nothing, _nothing, dial=t.dial) == (42, mode)
    lease = ("capture", f"( {pod.LEASE})")  # an imagekit client while connected: the guard's exit stop waits for it
    assert t.calls == [("connect", str(TARGET)), lease, ("capture", pod._BLOCKED_PROBE), ("run", "nvidia-smi")]
    assert out == ["ran nvidia-smi\n"]


def test_a_blocked_pod_is_asked_first_and_the_command_never_sent():
    t = FakeTransport(answers={pod._BLOCKED_PROBE: (0, "BLOCKED\n====\nFAIL torch-probe: no GPU\n")})
    with pytest.raises(pod.CheckFailed, match="no GPU"):
        pod.run_command(TARGET, "python train.py", OPTS, _nothing, _nothing, _nothing, dial=t.dial)
    assert ("run", "python train.py") not in t.calls
    ran = pod.run_command(
        TARGET, "python train.py", OPTS, _nothing, _nothing, _nothing, dial=t.dial, ignore_blockers=True
    )
    assert ran[0] == 0 and ("run", "python train.py") in t.calls


def test_the_images_own_doctor_runs_and_nothing_is_sent():
    t = FakeTransport(own_doctor=True)
    code, how, _ = _doctor(t, ["--tier", "standard"])
    assert (code, how) == (0, "the image's doctor")
    assert ("run", "imagekit-doctor --tier standard") in t.calls
    assert not [c for c in t.calls if c[0] == "put"]
    assert t.commands()[-1] == "rm -rf /tmp/imagekit-doctor.FAKE"


def test_without_one_the_stdlib_doctor_is_sent_with_the_expect_file_and_run_isolated(tmp_path):
    expect = tmp_path / "cell.txt"
    expect.write_text("torch==2.5.1\n")
    t = FakeTransport(python="/opt/py/bin/python3")
    code, how, _ = _doctor(t, ["--json"], expect)
    assert code == 0 and "/opt/py/bin/python3" in how
    puts = [c[1] for c in t.calls if c[0] == "put"]
    assert puts == [  # the doctor and its sibling modules (a module per domain of checks), beside it
        "/tmp/imagekit-doctor.FAKE/cell.txt",
        *(f"/tmp/imagekit-doctor.FAKE/{name}" for name in pod.DOCTOR_FILES),
    ]
    assert pod.DOCTOR_FILES[0] == "imagekit_doctor.py" and {"facts.py", "nofollow.py"} <= set(pod.DOCTOR_FILES)
    ran = next(c[1] for c in t.calls if c[0] == "run")
    assert ran == (
        "/opt/py/bin/python3 -I /tmp/imagekit-doctor.FAKE/imagekit_doctor.py "
        "--json --expect /tmp/imagekit-doctor.FAKE/cell.txt"
    )
    for name in pod.DOCTOR_FILES:
        assert t.uploaded[f"/tmp/imagekit-doctor.FAKE/{name}"] == render.sources().program(name).read_bytes()
    assert t.commands()[-1] == "rm -rf /tmp/imagekit-doctor.FAKE"


@pytest.mark.parametrize("python", ["", "python3", "/usr/bin/py\x1b[2Jthon"])
def test_a_pod_without_a_usable_python_is_exit_3_and_its_temporary_folder_still_goes(python):
    t = FakeTransport(python=python)
    with pytest.raises(EnvironmentFailure) as err:
        _doctor(t)
    assert err.value.exit_code == 3 and "\x1b" not in err.value.message
    assert not [c for c in t.calls if c[0] == "run"]
    assert t.commands()[-1] == "rm -rf /tmp/imagekit-doctor.FAKE"


def test_a_temporary_folder_the_pod_names_elsewhere_is_refused():
    t = FakeTransport(answers={"mktemp": (0, "/etc\n")})
    with pytest.raises(EnvironmentFailure, match="cannot make a temporary directory"):
        _doctor(t)
    assert not [c for c in t.calls if c[0] in ("put", "run")]


def test_an_upload_into_a_folder_lands_inside_it(tmp_path):
    local = tmp_path / "data.bin"
    local.write_bytes(b"x" * 10)
    t = FakeTransport(dirs={"/", "/workspace"})
    res = pod.copy(str(local), f"{TARGET}:/workspace", OPTS, _nothing, _nothing, dial=t.dial)
    assert (res.path, res.size, res.mode, res.resumed) == ("/workspace/data.bin", 10, "sftp", 0)
    assert t.files["/workspace/data.bin"] == b"x" * 10


def test_a_folder_goes_up_as_one_tar_unpacked_then_removed(tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("a")
    (tree / "sub" / "b.txt").write_text("b")
    t = FakeTransport(copy_mode="pty")
    res = pod.copy(str(tree), f"{TARGET}:/workspace/tree", OPTS, _nothing, _nothing, dial=t.dial)
    assert (res.files, res.mode) == (2, "pty")
    (staged,) = [c[1] for c in t.calls if c[0] == "put"]
    assert staged.startswith("/tmp/.imk-") and staged.endswith(".tar")
    assert t.commands()[-1] == (
        f"mkdir -p /workspace/tree && tar -xf {staged} -C /workspace/tree; c=$?; rm -f {staged}; exit $c"
    )


@pytest.mark.seconds
def test_a_dropped_download_reconnects_and_the_folder_is_not_packed_again(tmp_path):
    t = FakeTransport(files={"/w/out/a.txt": b"a", "/w/out/d/b.txt": b"bb"}, dirs={"/", "/w", "/w/out"}, drops=1)
    logs: list[str] = []
    res = pod.copy(f"{TARGET}:/w/out", str(tmp_path / "out"), OPTS, _nothing, logs.append, dial=t.dial)
    assert res.resumed == 1 and t.connections == 2 and any("reconnecting and resuming (1/5)" in m for m in logs)
    packs = [c for c in t.commands() if "tar -c" in c]
    assert not packs[0].startswith("[ -f ") and packs[1].startswith("[ -f ")  # the archive made before the drop
    assert (tmp_path / "out" / "a.txt").read_bytes() == b"a" and (
        tmp_path / "out" / "d" / "b.txt"
    ).read_bytes() == b"bb"
    assert t.commands()[-1].startswith("rm -f /tmp/.imk-")  # the staged archive goes from the pod


@pytest.mark.seconds
def test_a_connection_that_keeps_dropping_gives_up_after_the_reconnects(tmp_path, monkeypatch):
    monkeypatch.setattr(pod, "RECONNECTS", 1)
    t = FakeTransport(files={"/w/f": b"f"}, drops=5)
    with pytest.raises(EnvironmentFailure, match="dropped"):
        pod.copy(f"{TARGET}:/w/f", str(tmp_path / "f"), OPTS, _nothing, _nothing, dial=t.dial)
    assert t.connections == 2 and not (tmp_path / "f").exists()


@pytest.mark.parametrize("kind", ["none", "other"])
def test_a_download_of_nothing_or_of_a_device_is_a_usage_error(tmp_path, kind):
    t = FakeTransport(answers={"if [ -d ": (0, kind + "\n")})
    with pytest.raises(UsageError):
        pod.copy(f"{TARGET}:/dev/zero", str(tmp_path / "z"), OPTS, _nothing, _nothing, dial=t.dial)
    assert not [c for c in t.calls if c[0] == "get"]


@pytest.mark.parametrize("bad", ["", "../../etc", "20261202T130501Z-1\n"])
def test_a_run_id_that_is_not_one_is_refused_before_any_connection(bad):
    from imagekit.services.pods import pod_runs

    t = FakeTransport()
    with pytest.raises(UsageError, match="is not a run id"):
        pod_runs.logs(TARGET, bad, True, OPTS, _nothing, _nothing, _nothing, dial=t.dial)
    with pytest.raises(UsageError, match="is not a run id"):
        pod_runs.wait(TARGET, bad, OPTS, _nothing, dial=t.dial)
    assert t.calls == []


@pytest.mark.parametrize(
    ("said", "raises", "says"),
    [
        ("IMAGEKIT-EXIT 7\n", None, ""),
        ("IMAGEKIT-EXIT 999\n", EnvironmentFailure, "unexpected answer"),
        ("IMAGEKIT-LOST\n", EnvironmentFailure, "without an exit code"),
        ("\x1b]0;pwned\x07IMAGEKIT-EXIT 1; rm -rf /\n", EnvironmentFailure, "unexpected answer"),
    ],
)
def test_what_a_pod_says_of_a_runs_end_is_checked(said, raises, says):
    from imagekit.services.pods import pod_runs

    t = FakeTransport(answers={"d=": (0, said)})
    if raises is None:
        assert pod_runs.wait(TARGET, None, OPTS, _nothing, dial=t.dial) == 7
        return
    with pytest.raises(raises, match=says) as err:
        pod_runs.wait(TARGET, None, OPTS, _nothing, dial=t.dial)
    assert "\x1b" not in err.value.message and "\x07" not in err.value.message


def test_the_doctor_sent_to_a_pod_goes_with_every_sibling_module_it_imports():
    """A sibling the stdlib doctor imports (``import facts`` when it runs as a program) and that is not sent with it
    makes `pod doctor` on a pod without imagekit fail with ModuleNotFoundError."""
    import ast

    from imagekit.image import render

    folder = render.sources().in_image
    needed, todo = set(), ["imagekit_doctor.py"]
    while todo:
        name = todo.pop()
        needed.add(name)
        for node in ast.walk(ast.parse((folder / name).read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    sibling = f"{alias.name}.py"
                    if (folder / sibling).is_file() and sibling not in needed:
                        todo.append(sibling)
    assert needed == set(pod.DOCTOR_FILES)


def test_a_runs_command_line_and_output_are_its_users_alone_and_the_job_keeps_the_shells_umask(tmp_path):
    """`pod run` keeps the command line (tokens included) on the volume: root-only, run through a real shell."""
    import stat
    import subprocess
    import time

    from imagekit.services.pods import pod_runs

    runs = tmp_path / "runs"
    env = {"PATH": "/usr/bin:/bin", "IMAGEKIT_RUNS": str(runs), "SHELL": "/bin/sh", "HOME": str(tmp_path)}
    script = "umask 022; " + pod_runs.start_script(f"HF_TOKEN=hf_s3cret touch {tmp_path}/made; echo done")
    res = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    run = runs / res.stdout.strip()
    for _ in range(100):
        if (run / "exit").exists():
            break
        time.sleep(0.05)
    assert (run / "exit").read_text().strip() == "0" and (run / "log").read_text().strip() == "done"
    assert stat.S_IMODE(runs.stat().st_mode) == 0o700 and stat.S_IMODE(run.stat().st_mode) == 0o700
    for name in ("command", "pid", "log", "exit"):
        assert stat.S_IMODE((run / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE((tmp_path / "made").stat().st_mode) == 0o644  # the job's own files: the shell's umask
