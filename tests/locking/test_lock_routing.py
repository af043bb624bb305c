"""Locking against real PEP 503 indexes on loopback, serving wheels these tests build. uv is not mocked."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.locking import lockfile, resolution
from imagekit.model import Cell
from imagekit.services.locks import lock_cells as lock_service
from tests import loopback
from tests.wheelfactory import build_wheel, fake_pypi_wheels, serve, write_simple_index

CELL_118 = Cell("11.8", "2.5.1", "4.48.2", "3.11")
CELL_124 = Cell("12.4", "2.5.1", "4.48.2", "3.11")


pytestmark = pytest.mark.resolver  # real uv resolutions (against loopback indexes)


@pytest.fixture(autouse=True)
def _no_uv_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))


def _torch_index(root: Path) -> None:
    """download.pytorch.org's layout: one index per variant, torch builds with local labels, and a decoy numpy."""
    for variant, runtime in (
        ("cu118", "nvidia-cuda-runtime-cu11==11.8.89"),
        ("cu121", "nvidia-cuda-runtime-cu12==12.1.105"),
    ):
        wheels = [
            build_wheel(root / "w" / variant, "torch", f"2.5.1+{variant}", ["filelock", runtime]),
            build_wheel(root / "w" / variant, runtime.split("==")[0], runtime.split("==")[1]),
            build_wheel(root / "w" / variant, "numpy", "99.0.0"),  # must never win over PyPI's numpy
        ]
        write_simple_index(root / "whl" / variant, wheels)
        (root / "whl" / variant / "simple").rename(root / "whl" / variant / "tmp")
        for child in (root / "whl" / variant / "tmp").iterdir():
            child.rename(root / "whl" / variant / child.name)
        (root / "whl" / variant / "tmp").rmdir()
    # files are linked as ../../files/<name> from /whl/<variant>/<project>/ -> /whl/files? keep them beside
    for variant in ("cu118", "cu121"):
        for f in (root / "whl" / variant / "files").iterdir():
            (root / "whl" / "files").mkdir(exist_ok=True)
            (root / "whl" / "files" / f.name).write_bytes(f.read_bytes())


@pytest.fixture
def indexes(tmp_path):
    pypi_root, torch_root = tmp_path / "pypi", tmp_path / "pytorch"
    write_simple_index(pypi_root, fake_pypi_wheels(tmp_path / "pw"))
    _torch_index(torch_root)
    with serve(pypi_root) as pypi_url, serve(torch_root) as torch_url:
        yield {"pypi": f"{pypi_url}/simple", "torch": f"{torch_url}/whl", "pypi_root": pypi_root, "tmp": tmp_path}


def _settings(ix, **kw) -> resolution.LockSettings:
    return resolution.LockSettings(index_url=ix["pypi"], torch_index_base=ix["torch"], **kw)


def test_non_default_variant_routes_torch_family_to_the_pytorch_index(indexes, data, tmp_path):
    res = lock_service.lock_one(CELL_118, tmp_path / "locks", _settings(indexes), data)
    assert res.status == "locked", res.error and res.error.render()
    lock = res.lock
    pins = lock.pins()
    assert pins["torch"] == "2.5.1+cu118"
    assert pins["numpy"] == "1.26.4"  # the decoy 99.0.0 on the torch index was not chosen
    assert pins["nvidia-cuda-runtime-cu11"] == "11.8.89"
    torch_layer = {e.name for e in lock.torch}
    assert torch_layer == {"torch", "filelock", "nvidia-cuda-runtime-cu11"}
    assert {e.name for e in lock.app} == {"transformers", "numpy"}
    text = res.path.read_text()
    assert f"imagekit-torch-index: {indexes['torch']}/cu118" in text
    assert "imagekit lock --cuda 11.8 --torch 2.5.1 --transformers 4.48.2 --python 3.11" in text
    # the lock is a valid pip-tools file: every pin exact, every pin hashed
    entries = lockfile.parse_requirements(text)
    assert entries and all(e.hashes and e.version for e in entries)


def test_pypi_default_variant_resolves_from_pypi_alone(indexes, data, tmp_path):
    res = lock_service.lock_one(CELL_124, tmp_path / "locks", _settings(indexes), data)
    assert res.status == "locked", res.error and res.error.render()
    assert res.lock.pins()["torch"] == "2.5.1"
    assert "PyPI default (cu124)" in res.path.read_text()


def test_pypi_torch_with_the_wrong_cuda_runtime_fails_loudly(tmp_path, data):
    root = tmp_path / "pypi"
    write_simple_index(root, fake_pypi_wheels(tmp_path / "w", runtime="12.1.105"))
    with serve(root) as url:
        settings = resolution.LockSettings(index_url=f"{url}/simple")
        res = lock_service.lock_one(CELL_124, tmp_path / "locks", settings, data)
    assert res.status == "failed" and isinstance(res.error, CheckFailed)
    assert "CUDA runtime 12.1.105, not 12.4" in res.error.message
    assert not res.path.exists()


def test_index_without_the_variant_build_is_refused(tmp_path, data):
    """A cu118 index that only has +cu121 builds: no silent fallback to another build."""
    root = tmp_path / "pt"
    wrong = [build_wheel(tmp_path / "w", "torch", "2.5.1+cu121", ["filelock"])]
    write_simple_index(root, wrong)
    (root / "whl").mkdir()
    (root / "simple").rename(root / "whl" / "cu118")
    (root / "files").rename(root / "whl" / "files")
    pypi = tmp_path / "pypi"
    write_simple_index(pypi, fake_pypi_wheels(tmp_path / "pw"))
    with serve(pypi) as pypi_url, serve(root) as torch_url:
        settings = resolution.LockSettings(index_url=f"{pypi_url}/simple", torch_index_base=f"{torch_url}/whl")
        res = lock_service.lock_one(CELL_118, tmp_path / "locks", settings, data)
    assert res.status == "failed" and res.error.exit_code == 1
    assert "torch==2.5.1+cu118" in res.error.message
    assert not res.path.exists()


def test_unreachable_torch_index_is_exit_3_naming_it(indexes, data, tmp_path):
    settings = resolution.LockSettings(index_url=indexes["pypi"], torch_index_base="http://127.0.0.1:9/whl")
    res = lock_service.lock_one(CELL_118, tmp_path / "locks", settings, data)
    assert isinstance(res.error, EnvironmentFailure) and res.error.exit_code == 3
    assert "http://127.0.0.1:9/whl/cu118" in res.error.message and "--torch-index-url" in res.error.hint


def test_credentials_never_reach_the_lockfile(indexes, data, tmp_path):
    secret_url = indexes["pypi"].replace("http://", "http://user:s3cr3t@")
    res = lock_service.lock_one(CELL_124, tmp_path / "locks", resolution.LockSettings(index_url=secret_url), data)
    assert res.status == "locked", res.error and res.error.render()
    assert "s3cr3t" not in res.path.read_text()


def test_the_header_command_reproduces_the_lock(indexes, tmp_path, app, runner, monkeypatch):
    """The command a lock's header says regenerates it selects the same cell with the same settings: run with
    `--check`, it finds the lock up to date (a header that dropped --index-url or --extra-index-url would not)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.toml").write_text(
        '[matrix]\ncuda = ["12.4"]\ntorch = ["2.5.1"]\ntransformers = ["4.48.2"]\npython = ["3.11"]\n'
    )
    settings = ["--index-url", indexes["pypi"], "--torch-index-url", indexes["torch"]]
    settings += ["--extra-index-url", indexes["pypi"] + "/"]
    made = runner.invoke(app, ["lock", "--matrix", "m.toml", "--lock-dir", "locks", *settings])
    assert made.exit_code == 0, made.output
    (lock,) = (tmp_path / "locks").glob("*.txt")
    command = next(line for line in lock.read_text().splitlines() if line.startswith("#    imagekit lock"))
    argv = shlex.split(command.removeprefix("#    imagekit "))
    assert argv.count("--extra-index-url") == 1 and "--index-url" in argv and "--torch-index-url" in argv
    check = runner.invoke(app, [*argv, "--lock-dir", "locks", "--check"])
    assert check.exit_code == 0, check.output
    bare = runner.invoke(app, ["lock", "--matrix", "m.toml", "--lock-dir", "locks", "--check"])
    assert bare.exit_code == 1  # without the settings the same cell is another lock: the header must carry them


def test_unchanged_inputs_are_a_no_op_and_check_passes(indexes, data, tmp_path):
    locks = tmp_path / "locks"
    settings = _settings(indexes)
    first = lock_service.lock_one(CELL_124, locks, settings, data)
    stat = first.path.stat()
    again = lock_service.lock_one(CELL_124, locks, settings, data)
    assert again.status == "up-to-date"
    assert first.path.stat().st_mtime_ns == stat.st_mtime_ns and first.path.stat().st_ino == stat.st_ino
    assert [r.status for r in lock_service.check_cells([CELL_124], locks, settings, data)] == ["up-to-date"]


def test_relocking_after_changing_one_cell_resolves_exactly_that_cell(indexes, data, tmp_path):
    locks = tmp_path / "locks"
    settings = _settings(indexes)
    cells = [CELL_124, CELL_118, Cell("12.4", "2.5.1", "4.49.0", "3.11")]
    assert {r.status for r in lock_service.lock_cells(cells, locks, settings, data, jobs=3)} == {"locked"}
    changed = [cells[0], cells[1], Cell("12.4", "2.5.1", "4.49.0", "3.11", ("numpy==1.26.4",))]
    results = lock_service.lock_cells(changed, locks, settings, data, jobs=3)
    assert [r.status for r in results] == ["up-to-date", "up-to-date", "locked"]


def test_check_names_stale_and_missing_and_writes_nothing(indexes, data, tmp_path, app, runner):
    locks = tmp_path / "locks"
    settings = _settings(indexes)
    lock_service.lock_one(CELL_124, locks, settings, data)
    before = {p.name: p.read_bytes() for p in locks.iterdir()}
    other = resolution.LockSettings(index_url=indexes["pypi"], exclude_newer="2030-01-01T00:00:00Z")
    results = lock_service.check_cells([CELL_124, CELL_118], locks, other, data)
    assert [r.status for r in results] == ["stale", "missing"]
    assert {p.name: p.read_bytes() for p in locks.iterdir()} == before
    # the CLI: exit 1 and each path named
    matrix_file = tmp_path / "m.toml"
    matrix_file.write_text(
        '[matrix]\ninclude = [{cuda = "12.4", torch = "2.5.1", transformers = "4.48.2", python = "3.11"},'
        ' {cuda = "11.8", torch = "2.5.1", transformers = "4.48.2", python = "3.11"}]\n'
    )
    res = runner.invoke(
        app,
        [
            "lock",
            "--matrix",
            str(matrix_file),
            "--dir",
            str(locks),
            "--check",
            "--index-url",
            indexes["pypi"],
            "--torch-index-url",
            indexes["torch"],
        ],
    )
    assert res.exit_code == 1
    assert "missing" in res.output and "cu118-torch2.5.1-py3.11-tf4.48.2.txt" in res.output


def test_transformers_bump_leaves_the_torch_layer_byte_identical(indexes, data, tmp_path):
    locks = tmp_path / "locks"
    settings = _settings(indexes)
    old = lock_service.lock_one(CELL_124, locks, settings, data).lock
    # a newer filelock appears on the index; the bumped cell must still get the same torch layer
    extra = [("filelock", "3.99.0", [])]
    write_simple_index(indexes["pypi_root"], fake_pypi_wheels(indexes["tmp"] / "pw2", extra=extra))
    bumped = lock_service.lock_one(Cell("12.4", "2.5.1", "4.49.0", "3.11"), locks, settings, data).lock
    assert bumped.layer_text("torch") == old.layer_text("torch")
    assert bumped.pins()["transformers"] == "4.49.0"
    # and --upgrade-package moves only what it names
    moved = lock_service.lock_one(CELL_124, locks, settings, data, upgrade=("filelock",)).lock
    assert moved.pins()["filelock"] == "3.99.0" and moved.pins()["numpy"] == old.pins()["numpy"]


def test_the_lock_installs_with_plain_pip_require_hashes(indexes, data, tmp_path):
    res = lock_service.lock_one(CELL_118, tmp_path / "locks", _settings(indexes), data)
    target = tmp_path / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--require-hashes",
            "--target",
            str(target),
            "--index-url",
            indexes["pypi"],
            "--extra-index-url",
            indexes["torch"] + "/cu118",
            "-r",
            str(res.path),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert (target / "torch" / "__init__.py").read_text().startswith('__version__ = "2.5.1+cu118"')


def test_a_killed_lock_leaves_the_old_file(indexes, data, tmp_path):
    """SIGKILL while `imagekit lock` runs against a slow index: the previous lock is untouched, nothing else appears."""
    locks = tmp_path / "locks"
    lock_service.lock_one(CELL_124, locks, _settings(indexes), data)
    path = lock_service.lock_path(locks, CELL_124)
    before = path.read_bytes()
    matrix_file = tmp_path / "m.toml"
    matrix_file.write_text(
        '[matrix]\ninclude = [{cuda = "12.4", torch = "2.5.1", transformers = "4.48.2", '
        'python = "3.11", packages = ["numpy==1.26.4"]}]\n'
    )
    with serve(indexes["pypi_root"], delay=1.0) as slow:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "imagekit",
                "lock",
                "--matrix",
                str(matrix_file),
                "--dir",
                str(locks),
                "--index-url",
                f"{slow}/simple",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
        )
        time.sleep(2.5)
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert path.read_bytes() == before
    assert sorted(p.name for p in locks.iterdir()) == [path.name]


def test_write_atomic_leaves_no_partial_file(tmp_path):
    from imagekit.effects.files import write_atomic

    target = tmp_path / "lock.txt"
    target.write_text("old")
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "x").write_text("a non-empty folder cannot be replaced by a file")
    with pytest.raises(OSError):
        write_atomic(tmp_path / "blocker", "new")
    write_atomic(target, "new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker", "lock.txt"]


def test_json_summary(indexes, tmp_path, app, runner):
    matrix_file = tmp_path / "m.toml"
    matrix_file.write_text(
        '[matrix]\ninclude = [{cuda = "12.4", torch = "2.5.1", transformers = "4.48.2", python = "3.11"}]\n'
    )
    res = runner.invoke(
        app,
        ["lock", "--matrix", str(matrix_file), "--dir", str(tmp_path / "l"), "--json", "--index-url", indexes["pypi"]],
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert rows[0]["status"] == "locked" and len(rows[0]["lock_hash"]) == 64


@pytest.mark.pip_tools
def test_pip_tools_backend_where_host_is_target(indexes, data, tmp_path):
    settings = resolution.LockSettings(index_url=indexes["pypi"], resolver="pip-tools")
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    res = lock_service.lock_one(Cell("12.4", "2.5.1", "4.48.2", host), tmp_path / "locks", settings, data)
    assert res.status == "locked", res.error and res.error.render()
    assert res.lock.pins()["torch"] == "2.5.1" and all(e.hashes for e in res.lock.entries)
    assert {e.name for e in res.lock.torch} == {"torch", "filelock", "nvidia-cuda-runtime-cu12"}


def test_pip_tools_backend_refuses_what_it_cannot_do(indexes, data, tmp_path):
    settings = resolution.LockSettings(index_url=indexes["pypi"], resolver="pip-tools")
    routed = lock_service.lock_one(CELL_118, tmp_path / "locks", settings, data)
    assert routed.status == "failed" and "PyTorch index" in routed.error.message
    other = "3.12" if sys.version_info[:2] != (3, 12) else "3.11"
    cross = lock_service.lock_one(Cell("12.4", "2.5.1", "4.48.2", other), tmp_path / "locks", settings, data)
    assert cross.status == "failed" and "resolves for the host" in cross.error.message


@pytest.mark.parametrize("status", [401, 403])
def test_an_index_refusing_access_is_exit_3_not_a_conflict(data, tmp_path, status):
    """uv words a 401 from the index as 'not found ... unsatisfiable'; it is the environment, not the pins."""
    import http.server

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.send_header("WWW-Authenticate", 'Basic realm="index"')
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    loopback.start(server)
    try:
        url = f"http://user:s3cr3t@127.0.0.1:{server.server_address[1]}/simple"
        res = lock_service.lock_one(CELL_124, tmp_path / "locks", resolution.LockSettings(index_url=url), data)
    finally:
        loopback.stop(server)
    assert isinstance(res.error, EnvironmentFailure) and res.error.exit_code == 3, res.error
    assert f"HTTP {status}" in res.error.message and "credentials" in res.error.hint
    assert "s3cr3t" not in res.error.message + res.error.hint and not res.path.exists()
