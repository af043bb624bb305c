"""`imagekit pod` against real OpenSSH servers on loopback: a gateway-like one (terminal only, banner, colored prompt,
no SFTP, like RunPod's proxy) and a full one (exec channel, SFTP). No mocks of paramiko or sshd."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import time
from pathlib import Path
from typing import ClassVar

import pytest

from imagekit.clouds.podwire import CHUNK, parse_target
from imagekit.services.pods import pod
from tests import loopback, sshd

ROOT = Path(__file__).resolve().parents[2]
# A `base64` earlier on the pod's PATH that corrupts bulk data (stdin over 8 KiB) for its first LIMIT runs: what a
# terminal that alters bytes in flight does to a chunk. Small inputs (the framed commands) pass untouched.
CORRUPTING_BASE64 = """#!/bin/sh
tmp=$(mktemp); cat > "$tmp"
n=$(cat {state} 2>/dev/null || echo 0)
if [ "$(wc -c < "$tmp")" -gt 8192 ] && [ "$n" -lt {limit} ]; then
  echo $((n + 1)) > {state}
  /usr/bin/base64 "$@" < "$tmp" | tr a b
else
  /usr/bin/base64 "$@" < "$tmp"
fi
c=$?; rm -f "$tmp"; exit $c
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("gateway")
    # where a blocked pod says so, and where runs live (the image's /run/imagekit/blocked, /workspace/.imagekit/runs)
    rc = f"export PATH={root / 'bin'}:$PATH IMAGEKIT_BLOCKED_FILE={root / 'blocked'} IMAGEKIT_RUNS={root / 'runs'}"
    with sshd.serve(root, "gateway", rc_extra=rc) as server:
        (root / "bin").mkdir()
        yield server


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    env = f"SetEnv IMAGEKIT_BLOCKED_FILE={root / 'blocked'} IMAGEKIT_RUNS={root / 'runs'}"
    with sshd.serve(root, "full", extra_config=[env]) as server:
        yield server


@pytest.fixture
def home(tmp_path, monkeypatch, gateway, full):
    """A HOME whose known_hosts knows both servers (strict host-key checking, as OpenSSH does by default)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "known_hosts").write_text(gateway.known_hosts_line() + full.known_hosts_line())
    return tmp_path / "home"


def _exec(app, runner, server, *command, extra=()):
    return runner.invoke(app, ["pod", "exec", server.target, "--key", str(server.key), *extra, "--", *command])


# ---- exec ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gateway", "full"])
def test_a_run_outlives_a_dropped_connection_and_is_followed_and_awaited_later(app, runner, home, request, kind):
    """`pod run` returns at once; the connection is killed while `pod logs -f` follows; the run goes on; a new
    connection follows the rest and `pod wait` returns the command's exit code."""
    import threading

    from imagekit.clouds.podwire import parse_target
    from imagekit.services.pods import pod as pod_service
    from imagekit.services.pods import pod_runs

    server = request.getfixturevalue(kind)
    gate = server.root / f"gate-{kind}"
    res = runner.invoke(
        app,
        ["pod", "run", server.target, "--key", str(server.key), "--",
         f"echo started; while [ ! -e {gate} ]; do sleep 0.1; done; echo finished; exit 7"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    run_id = res.stdout.strip()
    assert pod_runs.RUN_ID.fullmatch(run_id) and "imagekit pod wait" in res.stderr
    opts = pod_service.PodOptions(key=server.key, timeout=60)
    seen: list[str] = []
    failure: list[BaseException] = []

    def follow() -> None:
        try:
            pod_runs.logs(parse_target(server.target), None, True, opts, seen.append, seen.append, lambda _: None)
        except BaseException as exc:  # the connection dropped under it: what this test does
            failure.append(exc)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    request.addfinalizer(lambda: gate.write_text(""))  # the run ends whatever this test does
    for _ in range(200):
        if "started" in "".join(seen):
            break
        time.sleep(0.05)
    assert "started" in "".join(seen), failure
    server.drop_sessions()  # the connection, killed mid-run
    follower.join(30)
    assert not follower.is_alive() and "finished" not in "".join(seen)
    gate.write_text("")  # the run goes on by itself
    waited = runner.invoke(app, ["pod", "wait", server.target, "--key", str(server.key), "--run", run_id])
    assert waited.exit_code == 7, waited.output
    logs = runner.invoke(app, ["pod", "logs", server.target, "--key", str(server.key)])
    assert logs.exit_code == 0 and logs.stdout.split() == ["started", "finished"], logs.output
    bad = runner.invoke(app, ["pod", "wait", server.target, "--key", str(server.key), "--run", "../../etc"])
    assert bad.exit_code == 2 and "not a run id" in bad.output
    missing = runner.invoke(
        app, ["pod", "logs", server.target, "--key", str(server.key), "--run", "20990101T000000Z-1"]
    )
    assert missing.exit_code == 2 and "no such run" in missing.output


@pytest.mark.parametrize("kind", ["gateway", "full"])
def test_a_blocked_pod_refuses_work_unless_told_to_ignore_it(app, runner, home, request, kind):
    """The start check's banner on the pod: exec refuses (exit 1) naming the blocker and the fix; the command never
    ran. --ignore-blockers runs it."""
    server = request.getfixturevalue(kind)
    banner = server.root / "blocked"
    ran = server.root / "ran"
    banner.write_text(
        "\n==== imagekit: this pod has a blocker; training would fail or run on the CPU ====\n"
        "FAIL torch-probe: torch sees no GPU (cuda False)\x1b[2J\n  fix: run the pod on a GPU host\n"
    )
    try:
        res = _exec(app, runner, server, "touch", str(ran))
        assert res.exit_code == 1 and not ran.exists(), res.output
        assert "the pod has a blocker" in res.output and "torch sees no GPU" in res.output
        assert "--ignore-blockers" in res.output and "\x1b" not in res.output
        res = _exec(app, runner, server, "touch", str(ran), extra=["--ignore-blockers"])
        assert res.exit_code == 0 and ran.exists(), res.output
    finally:
        banner.unlink()
        ran.unlink(missing_ok=True)


@pytest.mark.parametrize("code", [0, 1, 42])
@pytest.mark.parametrize("kind", ["gateway", "full"])
def test_the_remote_exit_code_becomes_ours(app, runner, home, request, kind, code):
    server = request.getfixturevalue(kind)
    res = _exec(app, runner, server, f"echo out-{code}; exit {code}")
    assert res.exit_code == code, res.output
    assert f"out-{code}" in res.stdout


def test_the_gateway_refuses_what_ssh_would_do(gateway, home):
    """The test server behaves like RunPod's proxy: no exec channel, no SFTP."""
    from imagekit.effects.ssh.ssh_connection import Connection

    with Connection(parse_target(gateway.target), key=gateway.key) as conn:
        assert not conn.exec_works and conn.sftp() is None
        code, _, _ = conn.exec_run("true", 10, None, None)
        assert code == 1  # "Your SSH client doesn't support PTY"


def test_json_names_the_transport_and_returns_clean_text(app, runner, home, gateway, full):
    colorful = r"printf '\033[1;31mred\033[0m \033]0;title\007plain\033[2K\r\n'; printf 'last'"
    for server, transport in ((gateway, "pty"), (full, "exec")):
        res = _exec(app, runner, server, colorful, extra=["--json"])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        assert doc["transport"] == transport
        assert doc["output"] == "red plain\nlast"  # escapes gone, no trailing newline added
        assert "\x1b" not in res.stdout


def test_long_output_and_output_without_a_trailing_newline(app, runner, home, gateway):
    res = _exec(app, runner, gateway, "seq 1 200000; printf tail")
    assert res.exit_code == 0
    lines = res.stdout.split("\n")
    assert lines[:3] == ["1", "2", "3"] and lines[-2] == "200000" and lines[-1] == "tail"
    assert len(lines) == 200001


def test_a_long_command_is_sent_whole(app, runner, home, gateway):
    words = " ".join(f"w{i}" for i in range(3000))  # ~17 KB: beyond one terminal line
    res = _exec(app, runner, gateway, f"for w in {words}; do :; done; echo $w")
    assert res.exit_code == 0 and res.stdout.strip() == "w2999"


@pytest.mark.parametrize("kind", ["gateway", "full"])
def test_a_hanging_command_times_out_with_exit_3_naming_it(app, runner, home, request, kind):
    server = request.getfixturevalue(kind)
    res = _exec(app, runner, server, "sleep 60", extra=["--timeout", "2"])
    assert res.exit_code == 3 and "timed out after 2 s: sleep 60" in res.output


def test_no_command_and_bad_timeouts_are_usage_errors(app, runner, home, gateway):
    assert runner.invoke(app, ["pod", "exec", gateway.target, "--"]).exit_code == 2
    for bad in ("nan", "-1", "inf"):
        res = _exec(app, runner, gateway, "true", extra=["--timeout", bad])
        assert res.exit_code == 2 and "--timeout" in res.output, (bad, res.output)
    res = runner.invoke(app, ["pod", "exec", "not a target", "--", "true"])
    assert res.exit_code == 2 and "USER@HOST" in res.output


# ---- host keys -------------------------------------------------------------------------------------------
def test_host_keys_are_checked_like_openssh(app, runner, home, gateway):
    (home / ".ssh" / "known_hosts").write_text("")
    res = _exec(app, runner, gateway, "true")
    assert res.exit_code == 3 and "not a known host" in res.output and "SHA256:" in res.output
    assert "--accept-new-host-key" in res.output
    res = _exec(app, runner, gateway, "true", extra=["--insecure-host-key"])
    assert res.exit_code == 0 and "NOT verifying the host key" in res.output
    assert (home / ".ssh" / "known_hosts").read_text() == ""  # insecure records nothing
    res = _exec(app, runner, gateway, "true", extra=["--accept-new-host-key"])
    assert res.exit_code == 0 and (home / ".ssh" / "known_hosts").read_text().startswith(f"[127.0.0.1]:{gateway.port}")
    assert _exec(app, runner, gateway, "true").exit_code == 0  # now known
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{gateway.port} {other}\n")
    res = _exec(app, runner, gateway, "true")
    assert res.exit_code == 3 and "CHANGED" in res.output


def test_a_refused_key_is_exit_3(app, runner, home, gateway, tmp_path):
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    res = runner.invoke(app, ["pod", "exec", gateway.target, "--key", str(tmp_path / "other"), "--", "true"])
    assert res.exit_code == 3 and "refused the key" in res.output


# ---- cp --------------------------------------------------------------------------------------------------
def _payloads(tmp_path: Path) -> dict[str, Path]:
    rng = __import__("random").Random(7)
    files = {
        "empty": b"",
        "one": b"x",
        "all-bytes": bytes(range(256)) * 4099,  # every value 0-255, ~1 MiB, not a multiple of a chunk
        "random-10mb": rng.randbytes(10 * 1000 * 1000),
    }
    out = {}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        out[name] = tmp_path / name
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", ["gateway", "full"])
def test_cp_both_ways_is_exact(app, runner, home, request, tmp_path, kind):
    server = request.getfixturevalue(kind)
    remote = server.root / "files" / tmp_path.name
    for name, path in _payloads(tmp_path).items():
        up = runner.invoke(app, ["pod", "cp", str(path), f"{server.target}:{remote}/{name}", "--key", str(server.key)])
        assert up.exit_code == 0, up.output
        assert (remote / name).read_bytes() == path.read_bytes() and _sha(path) in up.output
        assert not list(remote.glob("*.imkpart"))
        back = tmp_path / f"back-{name}"
        down = runner.invoke(
            app, ["pod", "cp", f"{server.target}:{remote}/{name}", str(back), "--key", str(server.key), "--json"]
        )
        assert down.exit_code == 0, down.output
        assert back.read_bytes() == path.read_bytes()
        doc = json.loads(down.stdout)
        assert doc["sha256"] == _sha(path) and doc["mode"] == ("pty" if kind == "gateway" else "sftp")


def test_cp_directories_as_one_tar_stream(app, runner, home, gateway, tmp_path):
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "deep.bin").write_bytes(os.urandom(300_000))
    (tree / "top.txt").write_text("top\n")
    (tree / "empty").mkdir()
    remote = gateway.root / "dirs" / tmp_path.name
    res = runner.invoke(app, ["pod", "cp", str(tree), f"{gateway.target}:{remote}", "--key", str(gateway.key)])
    assert res.exit_code == 0, res.output
    assert (remote / "a" / "b" / "deep.bin").read_bytes() == (tree / "a" / "b" / "deep.bin").read_bytes()
    assert (remote / "empty").is_dir() and (remote / "top.txt").read_text() == "top\n"
    back = tmp_path / "back"
    res = runner.invoke(app, ["pod", "cp", f"{gateway.target}:{remote}", str(back), "--key", str(gateway.key)])
    assert res.exit_code == 0, res.output
    assert {p.relative_to(back) for p in back.rglob("*")} == {p.relative_to(tree) for p in tree.rglob("*")}
    assert (back / "a" / "b" / "deep.bin").read_bytes() == (tree / "a" / "b" / "deep.bin").read_bytes()
    assert not list(tmp_path.glob("*.imktar*"))


def _opts(server) -> pod.PodOptions:
    return pod.PodOptions(key=server.key)


@pytest.mark.parametrize("direction", ["upload", "download"])
def test_a_connection_killed_mid_copy_resumes(home, gateway, tmp_path, direction):
    data = os.urandom(6 * CHUNK + 12345)
    local, remote = tmp_path / "big.bin", gateway.root / "resume" / tmp_path.name / "big.bin"
    killed: list[int] = []

    def progress(done: int, total: int) -> None:
        if done >= 3 * CHUNK and not killed:
            killed.append(done)
            gateway.drop_sessions()  # the sshd serving this connection dies; the listener stays

    logs: list[str] = []
    if direction == "upload":
        local.write_bytes(data)
        result = pod.copy(str(local), f"{gateway.target}:{remote}", _opts(gateway), progress, logs.append)
        assert remote.read_bytes() == data
    else:
        remote.parent.mkdir(parents=True)
        remote.write_bytes(data)
        result = pod.copy(f"{gateway.target}:{remote}", str(local), _opts(gateway), progress, logs.append)
        assert local.read_bytes() == data
    assert killed and result.resumed >= 1, logs
    assert result.sent <= len(data) - 3 * CHUNK + CHUNK  # resumed, not restarted
    assert any("resuming" in m for m in logs), logs


@pytest.mark.parametrize("direction", ["upload", "download"])
def test_a_corrupted_chunk_is_sent_again(home, gateway, tmp_path, direction):
    state = tmp_path / "corruptions"
    fake = gateway.root / "bin" / "base64"
    fake.write_text(CORRUPTING_BASE64.format(state=state, limit=1))
    fake.chmod(0o755)
    data = os.urandom(2 * CHUNK + 7)
    local, remote = tmp_path / "f.bin", gateway.root / "corrupt" / tmp_path.name / "f.bin"
    logs: list[str] = []
    try:
        if direction == "upload":
            local.write_bytes(data)
            pod.copy(str(local), f"{gateway.target}:{remote}", _opts(gateway), lambda d, t: None, logs.append)
            assert remote.read_bytes() == data
        else:
            remote.parent.mkdir(parents=True)
            remote.write_bytes(data)
            pod.copy(f"{gateway.target}:{remote}", str(local), _opts(gateway), lambda d, t: None, logs.append)
            assert local.read_bytes() == data
    finally:
        fake.unlink()
    assert state.read_text().strip() == "1" and any("arrived corrupted" in m for m in logs), logs


def test_a_chunk_corrupted_every_time_is_exit_1_and_nothing_written(app, runner, home, gateway, tmp_path):
    fake = gateway.root / "bin" / "base64"
    fake.write_text(CORRUPTING_BASE64.format(state=tmp_path / "n", limit=1000))
    fake.chmod(0o755)
    local, remote = tmp_path / "f.bin", gateway.root / "corrupt-always" / tmp_path.name / "f.bin"
    local.write_bytes(os.urandom(CHUNK))
    try:
        res = runner.invoke(app, ["pod", "cp", str(local), f"{gateway.target}:{remote}", "--key", str(gateway.key)])
    finally:
        fake.unlink()
    assert res.exit_code == 1 and "arrived corrupted 3 times" in res.output
    assert not remote.exists() and not list(remote.parent.glob("*"))


def test_a_file_changing_during_a_download_is_exit_1(app, runner, home, gateway, tmp_path):
    remote = gateway.root / "changing" / tmp_path.name / "f.bin"
    remote.parent.mkdir(parents=True)
    remote.write_bytes(os.urandom(3 * CHUNK))
    local = tmp_path / "f.bin"

    def progress(done: int, total: int) -> None:
        if done == CHUNK:
            with remote.open("r+b") as fh:
                fh.seek(2 * CHUNK + 5)
                fh.write(b"\x00changed")

    with pytest.raises(pod.CheckFailed, match="corrupt and was removed"):
        pod.copy(f"{gateway.target}:{remote}", str(local), _opts(gateway), progress, lambda m: None)
    assert not local.exists() and not list(tmp_path.glob("*.imkpart"))


def test_cp_needs_exactly_one_remote_side(app, runner, home, gateway, tmp_path):
    (tmp_path / "a").write_text("a")
    for argv in ([str(tmp_path / "a"), str(tmp_path / "b")], [f"{gateway.target}:/x", f"{gateway.target}:/y"]):
        res = runner.invoke(app, ["pod", "cp", *argv])
        assert res.exit_code == 2 and "exactly one side" in res.output
    res = runner.invoke(
        app, ["pod", "cp", f"{gateway.target}:/no/such/file", str(tmp_path / "c"), "--key", str(gateway.key)]
    )
    assert res.exit_code == 2 and "no such file" in res.output


# ---- doctor ----------------------------------------------------------------------------------------------
def _doctor(app, runner, server, *extra):
    return runner.invoke(app, ["pod", "doctor", server.target, "--key", str(server.key), "--json", *extra])


def test_pod_doctor_sends_the_stdlib_doctor_to_a_pod_without_one(app, runner, home, gateway):
    before = set(Path("/tmp").glob("imagekit-doctor.*"))
    lock = ROOT / "lockfiles" / "cu121-torch2.1.2-py3.11-tf4.48.2.txt"
    res = _doctor(app, runner, gateway, "--tier", "quick", "--expect", str(lock))
    doc = json.loads(res.stdout)
    checks = {c["id"]: c for c in doc["checks"]}
    assert res.exit_code == doc["exit_code"] and res.exit_code in (0, 1) and "stdlib doctor sent over" in res.output
    assert checks["manifest"]["status"] == "pass"  # it read the lock we sent, uploaded next to the doctor
    assert checks["manifest"]["message"].startswith("expecting /tmp/imagekit-doctor.")
    assert checks["manifest"]["message"].endswith(lock.name)
    assert set(Path("/tmp").glob("imagekit-doctor.*")) == before  # removed afterwards


def test_pod_doctor_runs_the_images_own_doctor_and_returns_its_exit_code(app, runner, home, gateway):
    own = gateway.root / "bin" / "imagekit-doctor"
    own.write_text('#!/bin/sh\nprintf \'{"own": true, "args": "%s"}\\n\' "$*"\nexit 7\n')
    own.chmod(0o755)
    try:
        res = _doctor(app, runner, gateway, "--tier", "standard")
    finally:
        own.unlink()
    assert res.exit_code == 7, res.output
    assert json.loads(res.stdout) == {"own": True, "args": "--tier standard --json"}
    assert "the image's doctor" in res.output


# ---- stop / terminate ------------------------------------------------------------------------------------
class _RunPod(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str, str]]] = []
    status = 200

    pod: ClassVar[dict] = {}

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        action = json.loads(body).get("action", "") if body else ""
        path = f"{self.path} {action}" if action else self.path
        type(self).seen.append((self.command, path, self.headers.get("Authorization", "")))
        answer = type(self).pod if self.command == "GET" else {"status": "EXITED"}
        body = json.dumps({"id": self.path.split("/")[3].split("?")[0], **answer}).encode()
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def runpod_api():
    _RunPod.seen, _RunPod.status = [], 200
    _RunPod.pod = {"mounts": {"network": [{"volumeId": "nv1", "path": "/workspace"}]}}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RunPod)
    loopback.start(server)
    yield f"http://127.0.0.1:{server.server_address[1]}/v2"
    loopback.stop(server)


def test_stop_and_terminate_call_runpods_rest_api(app, runner, runpod_api, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_secret")
    res = runner.invoke(app, ["pod", "stop", "abc123xyz456", "--api-url", runpod_api])
    assert res.exit_code == 0 and "stopped" in res.output and "rpa_secret" not in res.output
    res = runner.invoke(app, ["pod", "terminate", "abc123xyz456", "--api-url", runpod_api, "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["action"] == "terminate"
    assert _RunPod.seen == [  # RunPod's REST v2
        ("POST", "/v2/pods/abc123xyz456/action stop", "Bearer rpa_secret"),
        ("GET", "/v2/pods/abc123xyz456", "Bearer rpa_secret"),
        ("POST", "/v2/pods/abc123xyz456/action terminate", "Bearer rpa_secret"),
    ]
    assert json.loads(res.stdout)["warning"] is None  # a network volume: nothing dies with the pod


@pytest.mark.parametrize(
    ("pod", "warned"),
    [
        ({"mounts": {"persistent": {"size": 50, "path": "/workspace"}}}, "its 50 GB pod volume on /workspace"),
        (
            {"mounts": {"persistent": {"size": 20, "path": "/data\x1b[2J"}, "network": None}},
            "its 20 GB pod volume on /workspace",
        ),
        ({"mounts": {"network": [{"volumeId": "agv6w2qcg7", "path": "/workspace"}]}}, None),
        ({"mounts": {"persistent": {"size": 50, "path": "/workspace"}, "network": [{"volumeId": "agv6w2qcg7"}]}}, None),
        ({"mounts": {}}, None),  # nothing on a volume: only the container disk goes
        ({"mounts": {"persistent": {"size": "lots"}}}, None),
        ({"mounts": "everything"}, None),
    ],
)
def test_terminate_names_the_files_that_die_with_the_pod_first(app, runner, runpod_api, monkeypatch, pod, warned):
    """RunPod deletes the pod volume on terminate; only a network volume outlives the pod."""
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_secret")
    _RunPod.pod = pod
    res = runner.invoke(app, ["pod", "terminate", "abc123xyz456", "--api-url", runpod_api])
    assert res.exit_code == 0, res.output
    assert [(m, p.rsplit(" ")[-1]) for m, p, _a in _RunPod.seen] == [
        ("GET", "/v2/pods/abc123xyz456"),
        ("POST", "terminate"),
    ]  # said before, not after, the pod is gone
    if warned:
        assert f"warning: pod abc123xyz456 has no network volume: terminate deletes {warned}" in res.stderr
        assert "imagekit pod stop abc123xyz456" in res.stderr and "\x1b" not in res.stderr
    else:
        assert "warning" not in res.stderr


def test_stop_refusals_are_clear(app, runner, runpod_api, monkeypatch):
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    res = runner.invoke(app, ["pod", "stop", "abc123xyz456", "--api-url", runpod_api])
    assert res.exit_code == 2 and "RUNPOD_API_KEY" in res.output and not _RunPod.seen
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_secret")
    res = runner.invoke(app, ["pod", "stop", "../../etc", "--api-url", runpod_api])
    assert res.exit_code == 2 and "not a RunPod pod id" in res.output and not _RunPod.seen
    _RunPod.status = 401
    res = runner.invoke(app, ["pod", "terminate", "abc123xyz456", "--api-url", runpod_api])
    assert res.exit_code == 3 and "refused the API key" in res.output and "rpa_secret" not in res.output
    _RunPod.status = 404
    res = runner.invoke(app, ["pod", "stop", "abc123xyz456", "--api-url", runpod_api])
    assert res.exit_code == 1 and "no pod abc123xyz456" in res.output


@pytest.mark.seconds
def test_the_doctor_sent_to_any_pod_parses_as_python_3_8():
    """`pod doctor` runs the stdlib doctor with the pod's own Python (>= 3.8, e.g. runpod/pytorch's 3.10)."""
    import ast

    for path in sorted((ROOT / "imagekit" / "in_image").glob("*.py")):
        name, source = path.name, path.read_text()
        ast.parse(source, feature_version=(3, 8))  # no match statements, parenthesized context managers, ...
        after_38 = r"\.remove(?:prefix|suffix)\(|functools\.cache\b|is_relative_to\(|, strict=True|\bzoneinfo\b"
        newer = re.findall(after_38, source)
        assert not newer, (name, newer)  # standard-library calls that came after 3.8
        assert "from __future__ import annotations" in source or name != "imagekit_doctor.py"
