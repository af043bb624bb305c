"""`build --dry-run` / `fetch --dry-run`: the plan before the work, from the lock, the cache and index metadata
only; and a real build that refuses to start without the disk it needs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from imagekit.locking import uv_pin as tools
from imagekit.model import Cell
from tests.conftest import REAL_CELL, ROOT
from tests.wheelfactory import fake_pypi_wheels, serve, write_simple_index

CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A loopback PEP 503 index of small real wheels, an empty cache, no Docker engine."""
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.toml").write_text(
        '[[matrix.include]]\ncuda = "12.4"\ntorch = "2.5.1"\ntransformers = "4.48.2"\npython = "3.11"\n'
    )
    root = tmp_path / "pypi"
    write_simple_index(root, fake_pypi_wheels(tmp_path / "w"))
    with serve(root) as url:
        yield f"{url}/simple"


def _run(app, runner, command: str, *args: str):
    return runner.invoke(app, [command, "--matrix", "m.toml", *args])


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.resolver
def test_dry_run_plans_without_changing_anything(app, runner, fake, tmp_path):
    sel = ["--cell", CELL.id, "--lock-dir", "locks", "--state-dir", "state"]
    missing = _run(app, runner, "build", "--dry-run", "--json", "--index-url", fake, *sel)
    doc = json.loads(missing.stdout)
    (row,) = doc["cells"]
    assert row["lock"]["status"] == "missing" and row["wheels"] is None and row["image_estimate_bytes"] is None
    assert row["base"]["action"] == "unknown" and any("engine is not reachable" in n for n in doc["notes"])
    assert not (tmp_path / "locks").exists() and not (tmp_path / "state").exists()

    assert _run(app, runner, "lock", "--index-url", fake, "--dir", "locks", "--cell", CELL.id).exit_code == 0
    before = _tree(tmp_path / "locks")
    lock_text = (tmp_path / "locks" / f"{CELL.id}.txt").read_text()
    pins = [line for line in lock_text.splitlines() if "==" in line and not line.startswith("#")]
    res = _run(app, runner, "build", "--dry-run", "--json", "--index-url", fake, *sel)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)["cells"]
    assert row["lock"]["status"] == "up-to-date"
    w = row["wheels"]
    assert w["count"] == len(pins) + 1 and w["cached"] == 0 and w["download"] == len(pins) + 1  # + the uv wheel
    assert w["unknown_sizes"] == len(pins)  # a PEP 503 page declares no sizes: said, not guessed as 0 silently
    assert _tree(tmp_path / "locks") == before and not (tmp_path / "state").exists()

    # after a fetch the same plan counts every wheel as cached, with the bytes on disk and their installed size
    assert _run(app, runner, "fetch", "--lock-dir", "locks", "--cell", CELL.id, "--quiet").exit_code == 0
    cached = sorted((tmp_path / "cache" / "wheels").rglob("*.whl"))
    res = _run(app, runner, "fetch", "--dry-run", "--json", "--lock-dir", "locks", "--cell", CELL.id)
    doc = json.loads(res.stdout)
    w = doc["cells"][0]["wheels"]
    assert (w["cached"], w["download"], w["download_bytes"]) == (len(pins) + 1, 0, 0)
    assert w["cached_bytes"] == sum(p.stat().st_size for p in cached)
    unzipped = 0
    for p in cached:
        if p.name == tools.UV.filename:
            continue  # installs the layers, leaves no trace in the image
        with zipfile.ZipFile(p) as zf:
            unzipped += sum(i.file_size for i in zf.infolist())
    assert w["installed_bytes"] == unzipped
    assert [d["purpose"] for d in doc["disk"]] == ["wheel cache"] and doc["disk"][0]["needed_bytes"] == 0
    assert doc["cells"][0]["base"]["action"] == "none"  # fetch plans no base


@pytest.mark.resolver
def test_dry_run_names_a_stale_lock_and_its_reason(app, runner, fake, tmp_path):
    assert _run(app, runner, "lock", "--index-url", fake, "--dir", "locks", "--cell", CELL.id).exit_code == 0
    res = _run(
        app, runner, "build", "--dry-run", "--index-url", fake, "--lock-dir", "locks", "--cell", CELL.id,
        "--exclude-newer", "2024-01-01T00:00:00Z",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert f"{CELL.id}: lock stale: re-resolve" in res.stdout and "nothing was changed" in res.stdout


@pytest.mark.resolver
def test_dry_run_text_names_what_is_to_download(app, runner, fake, tmp_path):
    assert _run(app, runner, "lock", "--index-url", fake, "--dir", "locks", "--cell", CELL.id).exit_code == 0
    res = _run(app, runner, "build", "--dry-run", "--index-url", fake, "--lock-dir", "locks", "--cell", CELL.id)
    assert "lock up to date" in res.stdout and "to download" in res.stdout and "of unknown size" in res.stdout
    assert "base unknown" in res.stdout and "disk wheel cache" in res.stdout


def _root_mounts() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = 'd=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs "$d" && umount "$d"; rc=$?; rmdir "$d"; exit $rc'
    return subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True).returncode == 0


@pytest.mark.network
@pytest.mark.docker
@pytest.mark.skipif(not _root_mounts(), reason="needs root and mount namespaces (unshare -m)")
def test_build_refuses_to_start_without_the_disk_it_needs(tmp_path):
    """The real demo cell's 2.7 GB of wheels into a wheel cache on a 1 MB tmpfs: exit 3 with the numbers, before
    any base, download or docker build (sizes from PyPI's metadata)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    imagekit = [sys.executable, "-m", "imagekit"]
    common = ["--cell", REAL_CELL.id, "--lock-dir", str(ROOT / "lockfiles"), "--state-dir", str(tmp_path / "state")]
    script = (
        f'mount -t tmpfs -o size=1m tmpfs "{cache}" || exit 99\n'
        f"{' '.join(imagekit)} build --dry-run --json {' '.join(common)} > {tmp_path}/plan.json\n"
        f"echo dry=$? >&2\n"
        f"{' '.join(imagekit)} build {' '.join(common)} --release-index {tmp_path}/rel.json\n"
    )
    env = {**os.environ, "IMAGEKIT_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    res = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert "dry=3" in res.stderr, res.stderr
    doc = json.loads((tmp_path / "plan.json").read_text())
    short = [d for d in doc["disk"] if not d["ok"]]
    assert short and short[0]["purpose"] == "wheel cache" and short[0]["needed_bytes"] > 2_000_000_000
    assert short[0]["free_bytes"] <= 1 << 20
    assert res.returncode == 3, res.stderr
    assert "error: not enough disk to build: wheel cache" in res.stderr and "hint:" in res.stderr
    assert (
        "bootstrapping" not in res.stderr
        and "Step 1/" not in res.stderr
        and "download " not in res.stderr.replace("to download", "")
    )
    assert not (tmp_path / "state").exists() and not (tmp_path / "rel.json").exists()


def _read_only_mounts() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = 'd=$(mktemp -d) && mount --bind -o ro "$d" "$d" && umount "$d"; rc=$?; rmdir "$d"; exit $rc'
    return subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True).returncode == 0


@pytest.mark.resolver
@pytest.mark.parametrize("kind", ["file", "fifo", "under-a-file"])
def test_a_wheel_cache_that_cannot_take_files_is_a_blocker(app, runner, fake, tmp_path, monkeypatch, kind):
    assert _run(app, runner, "lock", "--index-url", fake, "--dir", "locks", "--cell", CELL.id).exit_code == 0
    cache = tmp_path / "not-a-cache"
    if kind == "fifo":
        os.mkfifo(cache)
    else:
        cache.write_text("a file the user keeps\n")
    monkeypatch.setenv("IMAGEKIT_CACHE", str(cache / "deeper" if kind == "under-a-file" else cache))
    for command in (["fetch", "--dry-run"], ["build", "--dry-run", "--index-url", fake], ["fetch"]):
        res = _run(app, runner, *command, "--lock-dir", "locks", "--cell", CELL.id)
        assert res.exit_code == 3, (command, res.output)
        assert "error: " in res.output and "wheel cache cannot be used" in res.output and "hint:" in res.output
        assert ("a FIFO" if kind == "fifo" else "a file") in res.output and "Traceback" not in res.output
    assert kind == "fifo" or cache.read_text() == "a file the user keeps\n"


@pytest.mark.resolver
@pytest.mark.skipif(not _read_only_mounts(), reason="needs root and mount namespaces (unshare -m)")
def test_a_read_only_wheel_cache_is_a_blocker(fake, tmp_path):
    """The cache on a read-only mount (root ignores permission bits, a mount it cannot)."""
    cache = tmp_path / "ro-cache"
    (cache / "wheels").mkdir(parents=True)
    env = {**os.environ, "IMAGEKIT_CACHE": str(cache), "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    imagekit = f"{sys.executable} -m imagekit"
    script = (
        f'mount --bind -o ro "{cache}" "{cache}" || exit 99\n'
        f"{imagekit} lock --matrix m.toml --index-url {fake} --dir locks --cell {CELL.id} >/dev/null 2>&1 || exit 98\n"
        f"{imagekit} fetch --dry-run --matrix m.toml --lock-dir locks --cell {CELL.id}\n"
    )
    res = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)  # fmt: skip
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert "wheel cache cannot be used" in res.stderr and "not writable (read-only)" in res.stderr
    assert "NOT USABLE" in res.stdout and "Traceback" not in res.stderr


@pytest.mark.resolver
def test_the_projects_backend_is_locked_by_itself_and_dry_run_refuses_what_its_wheel_would_need(
    app, runner, tmp_path, monkeypatch
):
    """`[image] install`: `lock` takes the project's [build-system] requires without the user naming it, and
    `build --dry-run` names a dependency of the project's wheel the lock lacks, before anything is downloaded."""
    from tests.wheelfactory import BACKEND, backend_wheel

    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["{BACKEND}>=1.0"]\nbuild-backend = "imagekit_test_backend"\n'
        '[project]\nname = "acme"\nversion = "0.1.0"\ndependencies = ["numpy>=1.17", "trl>=0.9"]\n'
    )
    (tmp_path / "m.toml").write_text(
        '[[matrix.include]]\ncuda = "12.4"\ntorch = "2.5.1"\ntransformers = "4.48.2"\npython = "3.11"\n'
        '[image]\ncopy = "."\ninstall = "."\n'
    )
    root = tmp_path / "pypi"
    write_simple_index(root, [*fake_pypi_wheels(tmp_path / "w"), backend_wheel(tmp_path / "w")])
    with serve(root) as url:
        locked = _run(app, runner, "lock", "--index-url", f"{url}/simple", "--dir", "locks", "--cell", CELL.id)
        assert locked.exit_code == 0, locked.output
        assert f"{BACKEND}==1.0" in (tmp_path / "locks" / f"{CELL.id}.txt").read_text()  # nobody named it
        res = _run(app, runner, "build", "--dry-run", "--json", "--index-url", f"{url}/simple", "--cell", CELL.id,
                   "--lock-dir", "locks", "--state-dir", "state")  # fmt: skip
    assert res.exit_code == 1, res.output
    (blocker,) = json.loads(res.stdout)["blockers"]
    assert blocker["message"] == (
        "[image] install: the project's wheel needs what the lock does not hold: trl>=0.9 (not in the lock)"
    )
    assert '[matrix] requirements = "pyproject.toml"' in blocker["hint"]
    assert not (tmp_path / "cache" / "wheels").exists() or not any((tmp_path / "cache" / "wheels").rglob("*.whl"))
