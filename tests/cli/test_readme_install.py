"""The README's install lines work verbatim: a virtual environment of imagekit's own from a fresh clone, then the
`imagekit` command on PATH. Debian 12's and Ubuntu 24.04's system Python refuses `python3 -m pip install ./imagekit`
outside one (PEP 668, "externally-managed-environment"), which is what the lines said before."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import ROOT


def install_lines() -> list[str]:
    """The first screen's install lines: its ```bash block up to `cd my-project`, comments dropped."""
    section = (ROOT / "README.md").read_text().split("## Install, and start your own project", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md has no ```bash block under ## Install"
    lines = []
    for raw in block[1].splitlines():
        if raw.startswith("cd my-project"):
            return lines
        line = re.sub(r"\s+#\s.*$", "", raw).strip()
        if line:
            lines.append(line)
    raise AssertionError("the install block has no `cd my-project` line")


def test_the_install_lines_never_pip_install_into_the_system_python():
    lines = install_lines()
    assert lines and not any(re.match(r"(sudo )?python3? -m pip install|pip3? install", line) for line in lines)
    assert any("python3 -m venv" in line for line in lines)


@pytest.mark.network  # pip fetches imagekit's dependencies
@pytest.mark.programs
def test_the_install_lines_work_verbatim_from_a_fresh_clone(tmp_path):
    clone = tmp_path / "imagekit"
    argv = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(argv, cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    home = tmp_path / "home"
    home.mkdir()
    python = shutil.which("python3", path="/usr/bin")
    if python is None or subprocess.run([python, "-c", "import ensurepip"], capture_output=True).returncode:
        python = shutil.which("python3")  # no system Python with venv (python3-venv): the one on PATH
    assert python, "no python3"
    shims = tmp_path / "shims"  # `python3` is this machine's system Python where it has one (Debian's, PEP 668)
    shims.mkdir()
    (shims / "python3").symlink_to(python)
    script = "set -eu\n" + "\n".join(install_lines()) + "\ncommand -v imagekit\nimagekit --version\n"
    env = {**os.environ, "HOME": str(home), "PATH": f"{shims}:{os.environ['PATH']}", "PIP_USER": "0"}
    env.pop("VIRTUAL_ENV", None)
    res = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert res.stdout.splitlines()[-2] == str(home / ".venvs" / "imagekit" / "bin" / "imagekit")
    assert res.stdout.splitlines()[-1].startswith("imagekit ")
