"""The real torch image started the way a pod platform starts it, and used the way people use a pod.

Detached, no TTY, no command, env injected (PUBLIC_KEY from a key this test makes, RUNPOD_*, HF_TOKEN), a root-owned
folder bind-mounted on /workspace, port 22 published on 127.0.0.1; then the real OpenSSH client, scp, sftp and
rsync against the image's own sshd, `docker exec` shells, and `docker stop`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests import containers
from tests.conftest import REAL_CELL

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def ssh_key(tmp_path_factory) -> Path:
    key = tmp_path_factory.mktemp("ssh") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pod-test", "-f", str(key)], check=True)
    return key


class Pod:
    """A container started like a pod (tests/containers.py: through testcontainers, ready when it says so), with an
    SSH client pointed at its published port 22."""

    def __init__(
        self,
        engine,
        image: str,
        env: dict[str, str],
        volume: Path,
        key: Path,
        mounts: dict | None = None,
        **start_kw: object,
    ):
        self.key = key
        volumes = {str(volume): ("/workspace", "rw")}
        volumes.update({host: (m["bind"], m["mode"]) for host, m in (mounts or {}).items()})
        self.running = containers.start(engine, image, env=env, volumes=volumes, ports=("22/tcp",), **start_kw)
        self.container = self.running.container

    def wait_ready(self, timeout: float = 120, starts: int = 1) -> str:
        """The logs, once the pod start said it is ready ``starts`` times (a restart says it again)."""
        return self.running.wait(containers.ready_times(containers.READY, starts), timeout)

    def logs(self) -> str:
        return self.running.logs()

    @property
    def port(self) -> int:
        return self.running.port("22/tcp")

    def ssh_opts(self) -> list[str]:
        return [
            "-i",
            str(self.key),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
        ]

    def ssh(self, command: str, *, tty: bool = False, stdin: str | None = None) -> subprocess.CompletedProcess:
        argv = ["ssh", *self.ssh_opts(), "-p", str(self.port), *(["-tt"] if tty else []), "root@127.0.0.1"]
        return subprocess.run(
            argv + ([command] if command else []), input=stdin, capture_output=True, text=True, timeout=120
        )

    def exec(self, *argv: str) -> tuple[int, str]:
        return self.running.exec(*argv)

    def remove(self) -> None:
        self.running.remove()


def _root_owned_volume(tmp_path: Path) -> Path:
    vol = tmp_path / "volume"
    vol.mkdir(parents=True)
    vol.chmod(0o755)  # root-owned, as RunPod and Vast.ai mount volumes
    return vol


def _fingerprints(logs: str) -> set[str]:
    return set(re.findall(r"SHA256:[A-Za-z0-9+/]+", logs))


def test_pod_mode_ssh_shells_env_volume_and_stop(real_build, engine, ssh_key, tmp_path):
    result, _ = real_build
    vol = _root_owned_volume(tmp_path)
    hook = tmp_path / "post_start.sh"
    hook.write_text("echo post-start ran > /workspace/post-start.txt\n")
    env = {
        "PUBLIC_KEY": ssh_key.with_suffix(".pub").read_text().strip(),
        "RUNPOD_POD_ID": "pod-sim-1",
        "HF_TOKEN": "hf_test_secret",
        "TEMPLATE_SETTING": "with spaces and 'quotes'",
    }
    pod = Pod(engine, result.tag, env, vol, ssh_key, {str(hook): {"bind": "/post_start.sh", "mode": "ro"}})
    other = None
    try:
        logs = pod.wait_ready()
        print(logs)
        assert "pod mode (cu121-torch2.1.2-py3.11-tf4.48.2)" in logs
        assert re.search(r"start check took \d+\.\d+ s", logs) and "BLOCKED" not in logs
        assert "sshd listening on port 22" in logs and len(_fingerprints(logs)) >= 2
        time.sleep(3)
        pod.container.reload()
        assert pod.container.status == "running"  # no TTY, no command: it stays up

        # exec channel (what RunPod's gateway lacks): the venv's python and the container's env
        res = pod.ssh(
            'command -v python; python -c "import sys, torch; print(sys.prefix, torch.__version__)"; '
            'echo "$RUNPOD_POD_ID|$HF_TOKEN|$TEMPLATE_SETTING"'
        )
        assert res.returncode == 0, res.stderr
        lines = res.stdout.splitlines()
        assert lines[0] == "/opt/venv/bin/python" and lines[1] == "/opt/venv 2.1.2+cu121"
        assert lines[2] == "pod-sim-1|hf_test_secret|with spaces and 'quotes'"
        # a login shell (Debian's /etc/profile resets PATH) and an interactive PTY session, as people get them
        res = pod.ssh("bash -lc 'for t in python python3 pip accelerate torchrun; do command -v $t; done'")
        assert res.stdout.split() == [
            f"/opt/venv/bin/{t}" for t in ("python", "python3", "pip", "accelerate", "torchrun")
        ], res.stdout
        res = pod.ssh("", tty=True, stdin='echo "py=$(command -v python3) pod=$RUNPOD_POD_ID"; exit\n')
        assert "py=/opt/venv/bin/python3 pod=pod-sim-1" in res.stdout, res.stdout
        # the tools of working on a pod: fetch code and data, keep a session, edit, look at processes
        tools = "git curl wget tmux nano vi less ps unzip ssh"
        res = pod.ssh(f"for t in {tools}; do command -v $t >/dev/null || echo missing $t; done; git --version")
        assert res.returncode == 0 and "missing" not in res.stdout and "git version" in res.stdout, res.stdout
        res = pod.ssh("stat -c '%a %U' /etc/imagekit/env.sh /root/.ssh/environment; id -u")
        assert res.stdout.split() == ["600", "root", "600", "root", "0"]

        # the root-owned volume and HF_HOME under it are writable; the hook ran
        res = pod.ssh('mkdir -p "$HF_HOME/hub" && echo ckpt > /workspace/ckpt.txt && echo "$HF_HOME"')
        assert res.returncode == 0 and res.stdout.strip() == "/workspace/.cache/huggingface"
        assert (vol / "ckpt.txt").read_text() == "ckpt\n" and (vol / ".cache" / "huggingface" / "hub").is_dir()
        assert (vol / "post-start.txt").read_text() == "post-start ran\n"

        # scp, sftp and rsync through the direct port
        src = tmp_path / "data.bin"
        src.write_bytes(bytes(range(256)) * 4096)
        opts = pod.ssh_opts()
        scp = ["scp", *opts, "-P", str(pod.port)]
        assert subprocess.run([*scp, str(src), "root@127.0.0.1:/workspace/up.bin"], capture_output=True).returncode == 0
        assert (vol / "up.bin").read_bytes() == src.read_bytes()
        down = tmp_path / "down.bin"
        subprocess.run([*scp, "root@127.0.0.1:/workspace/up.bin", str(down)], check=True, capture_output=True)
        assert down.read_bytes() == src.read_bytes()
        batch = tmp_path / "batch"
        batch.write_text(f"put {src} /workspace/sftp.bin\nget /workspace/sftp.bin {tmp_path / 'sftp-back.bin'}\n")
        sftp = subprocess.run(
            ["sftp", *opts, "-P", str(pod.port), "-b", str(batch), "root@127.0.0.1"], capture_output=True, text=True
        )
        assert sftp.returncode == 0, sftp.stderr
        assert (tmp_path / "sftp-back.bin").read_bytes() == src.read_bytes()
        rsh = " ".join(["ssh", *opts, "-p", str(pod.port)])
        (tmp_path / "tree" / "sub").mkdir(parents=True)
        (tmp_path / "tree" / "sub" / "f.txt").write_text("rsynced\n")
        rs = subprocess.run(
            ["rsync", "-a", "-e", rsh, f"{tmp_path / 'tree'}/", "root@127.0.0.1:/workspace/tree/"],
            capture_output=True,
            text=True,
        )
        assert rs.returncode == 0, rs.stderr
        assert (vol / "tree" / "sub" / "f.txt").read_text() == "rsynced\n"

        # docker exec shells are the image's environment too, and the doctor is on PATH and passes
        _code, out = pod.exec("bash", "-lc", "command -v python; echo $RUNPOD_POD_ID")
        assert out.split() == ["/opt/venv/bin/python", "pod-sim-1"]
        res = pod.ssh("imagekit-doctor --tier quick >/dev/null; echo exit=$?")
        assert res.stdout.strip() == "exit=0", res.stdout

        # a restart (what platforms do after a host reboot or a stop/start) comes back with the same host keys
        pod.container.restart(timeout=20)
        again = pod.wait_ready(starts=2)
        second_start = again[again.index("imagekit: ready") :]
        assert _fingerprints(second_start) == _fingerprints(logs)
        res = pod.ssh("echo $RUNPOD_POD_ID; ls /workspace/ckpt.txt")
        assert res.returncode == 0 and res.stdout.split() == ["pod-sim-1", "/workspace/ckpt.txt"], res.stderr

        # a second pod of the same image has its own host keys
        other = Pod(engine, result.tag, env, _root_owned_volume(tmp_path / "b"), ssh_key)
        other_logs = other.wait_ready()
        assert _fingerprints(other_logs) and not (_fingerprints(other_logs) & _fingerprints(logs))

        start = time.time()
        pod.container.stop(timeout=20)
        stopped_in = time.time() - start
        print(f"docker stop took {stopped_in:.2f} s")
        assert stopped_in < 5  # tini forwards SIGTERM; no 10 s wait for a SIGKILL
    finally:
        pod.remove()
        if other:
            other.remove()
        shutil.rmtree(vol, ignore_errors=True)


def test_a_blocked_pod_stays_up_and_reachable(real_build, engine, ssh_key, tmp_path):
    """IMAGEKIT_REQUIRE_GPU=1 (the RunPod template's setting) on this GPU-less machine: blocked, never exited."""
    result, _ = real_build
    vol = _root_owned_volume(tmp_path)
    env = {"PUBLIC_KEY": ssh_key.with_suffix(".pub").read_text().strip(), "IMAGEKIT_REQUIRE_GPU": "1"}
    pod = Pod(engine, result.tag, env, vol, ssh_key)
    try:
        logs = pod.wait_ready()
        print(logs)
        assert "BLOCKED" in logs and "no GPU" in logs and "fix:" in logs
        assert re.search(r"start check took \d+\.\d+ s \(torch CUDA probe: fail\)", logs)
        time.sleep(2)
        pod.container.reload()
        assert pod.container.status == "running"
        res = pod.ssh("imagekit-doctor --tier quick; echo exit=$?")
        assert "exit=1" in res.stdout and "no GPU" in res.stdout
        res = pod.ssh("imagekit-doctor && echo training started")
        assert res.returncode == 1 and "training started" not in res.stdout
        res = pod.ssh("", tty=True, stdin="exit\n")
        assert "this pod has a blocker" in res.stdout  # the login banner
    finally:
        pod.remove()


# What Vast's init does in its SSH launch mode, as far as the image sees it: the user's key in ~/.ssh/authorized_keys,
# the image's entrypoint never run, the template's onstart run, the container kept up by Vast's own process.
VAST_INIT = """mkdir -p /root/.ssh && printf '%s\\n' "$VAST_SIM_KEY" > /root/.ssh/authorized_keys
chmod 700 /root/.ssh && chmod 600 /root/.ssh/authorized_keys
sh -c "$ONSTART"; echo "vast-sim: onstart exited $?"
exec sleep infinity
"""


def test_vast_ssh_launch_mode_runs_the_start_check_and_sshd_from_onstart(real_build, engine, ssh_key, tmp_path):
    """The template `imagekit vast-template` makes, started the Vast way: the entrypoint replaced, the onstart run."""
    from imagekit.clouds import vast

    result, _ = real_build
    entry = {"tag": result.tag, "digest": result.digest, "size_bytes": 1, "manifest": {"cell": REAL_CELL.to_json()}}
    tpl = vast.template(entry, launch="ssh")
    env = dict(re.findall(r"-e ([A-Z_]+)=(\S+)", tpl["env"]))
    assert env["IMAGEKIT_REQUIRE_GPU"] == "1"  # as the template sets it: this GPU-less machine is a blocked host
    env.update({"VAST_SIM_KEY": ssh_key.with_suffix(".pub").read_text().strip(), "ONSTART": tpl["onstart"]})
    pod = Pod(
        engine, result.tag, env, _root_owned_volume(tmp_path), ssh_key, entrypoint=["sh", "-c"], command=[VAST_INIT]
    )
    try:
        logs = pod.wait_ready()
        print(logs)
        assert "onstart (cu121-torch2.1.2-py3.11-tf4.48.2)" in logs and "pod mode" not in logs
        assert "SSH: sshd listening on port 22" in logs  # for the key Vast wrote, no PUBLIC_KEY needed
        assert "BLOCKED" in logs and "no GPU" in logs
        time.sleep(1)
        assert "vast-sim: onstart exited 1" in pod.logs()  # it returned: Vast's process keeps the container up
        pod.container.reload()
        assert pod.container.status == "running"
        res = pod.ssh("imagekit-doctor --tier quick; echo exit=$?")
        assert "exit=1" in res.stdout and "no GPU" in res.stdout, res.stdout + res.stderr
        res = pod.ssh("", tty=True, stdin="exit\n")
        assert "this pod has a blocker" in res.stdout  # the login banner
    finally:
        pod.remove()


def test_no_public_key_no_sshd_and_jupyter_says_why(real_build, engine, tmp_path, ssh_key):
    result, _ = real_build
    pod = Pod(engine, result.tag, {"JUPYTER_PASSWORD": "pw"}, _root_owned_volume(tmp_path), ssh_key)
    try:
        logs = pod.wait_ready()
        assert "SSH: off" in logs and "no JupyterLab" in logs
        _code, out = pod.exec("sh", "-c", "pgrep -x sshd || echo none; ls /etc/ssh/ | grep -c ssh_host_ || true")
        assert out.split() == ["none", "0"]  # no host key was ever baked into the image
    finally:
        pod.remove()


def test_job_mode_runs_the_command_as_root(real_build, engine, tmp_path):
    result, _ = real_build
    vol = _root_owned_volume(tmp_path)
    code, out, err = engine.run(
        result.tag,
        ["sh", "-c", "id -u; touch /workspace/job.txt && echo wrote"],
        volumes={str(vol): {"bind": "/workspace", "mode": "rw"}},
    )
    assert code == 0 and out.split() == ["0", "wrote"], err
    assert "start check took" in err


def test_jupyter_starts_with_a_password_and_serves_the_workspace(user_project, engine, ssh_key, tmp_path):
    """On the user project's image (`[image] jupyter = true`, tests/conftest.py)."""
    import json
    import urllib.error
    import urllib.request

    vol = _root_owned_volume(tmp_path)
    (vol / "notes.txt").write_text("on the volume\n")
    from imagekit.services.builds.image_manifest import from_engine

    features = from_engine(user_project["result"]["tag"])["image"]
    assert features["jupyter"] is True and features["ports"] == ["22/tcp", "8888/http"]
    notes = "/api/contents/notes.txt"
    container = containers.start(
        engine,
        user_project["result"]["tag"],
        env={"JUPYTER_PASSWORD": "s3cret"},
        volumes={str(vol): ("/workspace", "rw")},
        ports=("8888/tcp",),
        ready=containers.http_ready(8888, f"{notes}?token=s3cret"),
        timeout=90,
    )
    try:
        url = f"http://127.0.0.1:{container.port('8888/tcp')}{notes}"
        with urllib.request.urlopen(f"{url}?token=s3cret", timeout=5) as resp:
            status, body = resp.status, json.loads(resp.read())
        assert status == 200, container.logs()
        assert body["content"] == "on the volume\n"
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(url, timeout=5)
        assert denied.value.code in (401, 403)
        _code, out = container.exec("sh", "-c", "ps -eo args | grep -c '[s]3cret' || true")
        assert out.strip() == "0"  # the password is not on any command line
    finally:
        container.remove()


def test_imagekit_pod_reaches_the_images_own_sshd(real_build, engine, ssh_key, tmp_path, app, runner):
    """`imagekit pod` against the image's sshd: exec, the image's own doctor, verified copies; and the terminal path
    (what RunPod's gateway forces) on the image's real login shell."""
    from imagekit.clouds.podwire import parse_target
    from imagekit.services.pods import pod as pod_service

    result, _ = real_build
    vol = _root_owned_volume(tmp_path)
    pod = Pod(engine, result.tag, {"PUBLIC_KEY": ssh_key.with_suffix(".pub").read_text().strip()}, vol, ssh_key)
    try:
        pod.wait_ready()
        target = f"root@127.0.0.1:{pod.port}"
        common = ["--key", str(ssh_key), "--insecure-host-key"]
        res = runner.invoke(
            app,
            [
                "pod",
                "exec",
                target,
                *common,
                "--json",
                "--",
                "python -c 'import torch; print(torch.__version__)'; exit 5",
            ],
        )
        doc = json.loads(res.stdout)
        assert res.exit_code == 5 and doc["transport"] == "exec" and doc["output"].strip().startswith(result.cell.torch)
        res = runner.invoke(app, ["pod", "doctor", target, *common, "--json", "--tier", "quick"])
        expected = pod.ssh("imagekit-doctor --tier quick --json >/dev/null; echo $?").stdout.strip()
        assert str(res.exit_code) == expected and "the image's doctor" in res.output
        assert {c["id"] for c in json.loads(res.stdout)["checks"]} >= {"manifest", "interpreter-identity"}
        data = tmp_path / "data.bin"
        data.write_bytes(os.urandom(3_000_000))
        res = runner.invoke(app, ["pod", "cp", str(data), f"{target}:/workspace/in/data.bin", *common])
        assert res.exit_code == 0 and "via sftp" in res.output, res.output
        assert (vol / "in" / "data.bin").read_bytes() == data.read_bytes()
        opts = pod_service.PodOptions(key=ssh_key, host_keys="insecure", force_pty=True, timeout=120)
        lines: list[str] = []
        code, how = pod_service.run_command(
            parse_target(target), "which python; echo $HF_HOME; exit 3", opts, lines.append, lines.append, print
        )
        assert (code, how) == (3, "pty")
        assert "".join(lines).split() == ["/opt/venv/bin/python", "/workspace/.cache/huggingface"]
        back = tmp_path / "back.bin"
        got = pod_service.copy(f"{target}:/workspace/in/data.bin", str(back), opts, lambda d, t: None, print)
        assert got.mode == "pty" and back.read_bytes() == data.read_bytes()
    finally:
        pod.remove()
        shutil.rmtree(vol, ignore_errors=True)
