"""The image keeps to its lock: a constraints file of every pin, named by PIP_CONSTRAINT and UV_CONSTRAINT, and a pip
that says how to get another version the right way when the pins refuse one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imagekit.image import imageconfig, pins, render
from imagekit.locking.lockfile import Lock, LockEntry
from tests.test_core_mutants import H1, H2, _files
from tests.wheelfactory import build_wheel

LOCK = Lock(
    (LockEntry("torch", "2.5.1+cu124", (H1,)), LockEntry("nvidia-nccl-cu12", "2.21.5", (H2,))),
    (
        LockEntry("transformers", "4.48.2", (H2,)),
        LockEntry("acme-kernels", "1.0+cu12torch2.1", (H1,), url="https://example.com/acme_kernels-1.0.whl"),
    ),
)


def test_every_locked_distribution_is_pinned_once_sorted_and_the_header_says_how_to_change_one():
    text = pins.constraints(LOCK, "cu124-torch2.5.1-py3.11-tf4.48.2")
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body == [
        "acme-kernels==1.0+cu12torch2.1",  # a wheel named by URL is pinned by its version: pip cannot swap it
        "nvidia-nccl-cu12==2.21.5",
        "torch==2.5.1+cu124",
        "transformers==4.48.2",
    ]
    header = text.split("\n" + body[0])[0]
    assert "cu124-torch2.5.1-py3.11-tf4.48.2" in header and LOCK.short_hash in header
    assert "imagekit lock" in header and "env -u PIP_CONSTRAINT -u UV_CONSTRAINT pip install" in header


def test_the_image_carries_the_pins_where_its_environment_points_pip_and_uv(data):
    files = _files(data)
    env = dict(imageconfig.ENV)
    assert env["PIP_CONSTRAINT"] == env["UV_CONSTRAINT"] == pins.PATH
    text = files[f"rootfs/app{pins.PATH}"][0].decode()
    assert "torch==2.5.1\n" in text and "transformers==4.48.2\n" in text
    # on both builders: BuildKit's ENV instruction, and the legacy builder's app tarball
    legacy = render.app_tarball(files, 1)
    assert b"opt/imagekit/constraints.txt" in legacy and b"opt/venv/bin/pip3.11" in legacy


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A venv with pip, as the image's /opt/venv is, and a find-links folder with two versions of one package."""
    root = tmp_path_factory.mktemp("pins")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    for version in ("1.0", "2.0"):
        build_wheel(root / "wheels", "acme-pinned", version)
    (root / "constraints.txt").write_text(pins.constraints(Lock((), (LockEntry("acme-pinned", "1.0", (H1,)),)), "c"))
    return root


def _pip(venv: Path, *args: str, pinned: bool = True) -> subprocess.CompletedProcess:
    wrapper = Path(render.sources().program(render.PIP_WRAPPER))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    if pinned:
        env["PIP_CONSTRAINT"] = str(venv / "constraints.txt")
    argv = [
        str(venv / "venv" / "bin" / "python"),
        str(wrapper),
        *args,
        "--no-index",
        "--find-links",
        str(venv / "wheels"),
    ]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_pip_in_the_image_keeps_to_the_pins_and_names_the_way_to_another_version(venv):
    upgraded = _pip(venv, "install", "-U", "acme-pinned")
    assert upgraded.returncode == 0, upgraded.stderr
    assert "Successfully installed acme-pinned-1.0" in upgraded.stdout  # -U keeps to the pin
    refused = _pip(venv, "install", "acme-pinned==2.0")
    assert refused.returncode == 1
    assert "(constraint) acme-pinned==1.0" in refused.stdout  # pip's own words name the pin
    assert "ResolutionImpossible" in refused.stderr  # pip's stderr passes through
    assert "imagekit: this image pins its packages" in refused.stderr and "imagekit build" in refused.stderr
    assert "env -u PIP_CONSTRAINT -u UV_CONSTRAINT pip install acme-pinned==2.0" in refused.stderr
    past = _pip(venv, "install", "acme-pinned==2.0", pinned=False)  # the way past the pins, as the hint says
    assert past.returncode == 0 and "Successfully installed acme-pinned-2.0" in past.stdout, past.stderr


@pytest.mark.slow
def test_a_failure_that_is_not_the_pins_gets_pips_words_alone(venv):
    missing = _pip(venv, "install", "no-such-distribution")
    assert missing.returncode == 1 and "imagekit:" not in missing.stderr
