"""The image's start logic on this host: env saved for shells and SSH sessions, keys, banner, job mode.

Pod mode itself (sshd, tini, a root-owned volume, `docker stop`) is tested on the real image in
tests/test_pod_e2e.py; here the pieces run against temporary folders and real shells.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from imagekit.in_image import podstart
from tests.conftest import ROOT

PODSTART = ROOT / "imagekit" / "in_image" / "podstart.py"
PROFILE = ROOT / "templates" / "context" / "etc" / "profile.sh"
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHQnkEdIvQk0m3f1H0QfZ6G7m0U0b1m3aB8b3lJ4k9Zp user@laptop"


def test_env_is_saved_quoted_and_private(tmp_path):
    environ = {
        "HF_TOKEN": "hf_secret",
        "RUNPOD_POD_ID": "abc123",
        "TRICKY": 'it\'s $HOME `id` "quoted"',
        "MULTI": "line one\nline two",
        "HOME": "/root",
        "bad-name": "x",
        "PATH": "/opt/venv/bin:/usr/bin:/bin",
    }
    podstart.save_env(environ, env_sh=str(tmp_path / "etc" / "env.sh"), ssh_dir=str(tmp_path / "ssh"))
    env_sh = tmp_path / "etc" / "env.sh"
    ssh_env = tmp_path / "ssh" / "environment"
    for path in (env_sh, ssh_env):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # secrets: root only
    assert stat.S_IMODE((tmp_path / "ssh").stat().st_mode) == 0o700
    # a real shell reads back exactly what the container was given
    out = subprocess.run(
        ["sh", "-c", f'. {env_sh} && printf \'%s|%s|%s\' "$TRICKY" "$MULTI" "$HF_TOKEN"'],
        capture_output=True,
        text=True,
        check=True,
        env={},
    ).stdout
    assert out == 'it\'s $HOME `id` "quoted"|line one\nline two|hf_secret'
    lines = ssh_env.read_text().splitlines()
    assert "RUNPOD_POD_ID=abc123" in lines and "HF_TOKEN=hf_secret" in lines
    assert not any(line.startswith(("MULTI=", "HOME=", "bad-name")) for line in lines)


def test_profile_puts_the_venv_first_for_login_shells(tmp_path):
    """Debian's /etc/profile resets PATH for login shells; the profile hook puts the venv back in front."""
    out = subprocess.run(
        ["sh", "-c", f"PATH=/usr/bin:/bin; . {PROFILE}; echo $PATH $VIRTUAL_ENV"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0].startswith("/opt/venv/bin:") and out[1] == "/opt/venv"


def test_public_keys():
    keys, rejected = podstart.public_keys(f"{ED25519}\\n\nnot a key\n  \necdsa-sha2-nistp256 AAAAE2Vj= me")
    assert keys == [ED25519, "ecdsa-sha2-nistp256 AAAAE2Vj= me"] and rejected == 1
    assert podstart.public_keys("") == ([], 0)
    assert podstart.public_keys('command="rm -rf /" ssh-ed25519 AAAA') == ([], 1)  # no forced-command options


def test_pod_keys_are_exactly_public_key(tmp_path):
    """Rewritten at every start: a key dropped from PUBLIC_KEY stops working after a restart."""
    path = podstart.write_pod_keys([ED25519, "ssh-rsa AAAAB3 other"], str(tmp_path / "authorized_keys"))
    podstart.write_pod_keys([ED25519], path)
    assert Path(path).read_text().splitlines() == [ED25519]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert podstart.public_keys("ssh-ed25519\tAAAAC3Nz  me") == (["ssh-ed25519\tAAAAC3Nz  me"], 0)


def test_nested_shells_keep_what_the_user_changed(tmp_path):
    env_sh = tmp_path / "env.sh"
    env_sh.write_text("export HF_HOME=/workspace/hf\n")
    profile = PROFILE.read_text().replace("/etc/imagekit/env.sh", str(env_sh))
    (tmp_path / "profile.sh").write_text(profile)
    script = (
        f". {tmp_path / 'profile.sh'}; export HF_HOME=/mine PATH=/other/venv/bin:$PATH; "
        f"sh -c '. {tmp_path / 'profile.sh'}; echo $HF_HOME ${{PATH%%:*}}'"
    )
    out = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"}
    )
    assert out.stdout.split() == ["/mine", "/other/venv/bin"]


def test_banner_says_what_and_how():
    text = podstart.banner("[FAIL] cpu-fallback: torch sees no GPU\n       fix: restart the pod")
    assert "blocker" in text and "fix: restart the pod" in text and "imagekit-doctor && accelerate launch" in text


@pytest.mark.programs
@pytest.mark.parametrize(("env", "code", "ran"), [({}, 0, True), ({"IMAGEKIT_REQUIRE_GPU": "1"}, 1, False)])
def test_job_mode_runs_the_command_unless_blocked(tmp_path, env, code, ran):
    marker = tmp_path / "ran"
    res = subprocess.run(
        [sys.executable, str(PODSTART), "sh", "-c", f"touch {marker}"],
        capture_output=True,
        text=True,
        env={
            "PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "HF_HOME": str(tmp_path / "hf"),
            **env,
        },
    )
    assert res.returncode == code, res.stderr
    assert marker.exists() is ran
    if ran:
        assert "start check took" in res.stderr and "not starting" not in res.stderr
    else:  # blocked: the start tier's torch probe ran (the quick tier says "no GPU" too, but never probes)
        assert f"the start check found a blocker; not starting `sh -c 'touch {marker}'`" in res.stderr
        assert re.search(r"^\[FAIL\] (torch-probe|cpu-fallback): ", res.stderr, re.M), res.stderr


def test_a_failing_step_never_exits_a_pod(capsys):
    def boom():
        raise PermissionError(13, "Permission denied", "/etc/imagekit/env.sh")

    assert podstart.safely("saving the env", boom, default="went on") == "went on"
    assert "saving the env failed: PermissionError" in capsys.readouterr().err
