"""What a malicious package index can do through `fetch` and `fetch --dry-run`: every answer is data to check
(file names, sizes, hashes, JSON shape and size, Content-Length), never a path, a traceback or bytes on the
terminal. Against `tests.hostile_index`: a real loopback index whose pages the tests replace."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.hostile_index import HostileIndex, Route, honest_index, huge_number, json_page, nested, wheel_file

pytestmark = pytest.mark.resolver  # each test first locks a cell with real uv against the loopback index

NUMPY = "numpy-1.26.4-py3-none-any.whl"
MATRIX = '[[matrix.include]]\ncuda = "12.4"\ntorch = "2.5.1"\ntransformers = "4.48.2"\npython = "3.11"\n'
FETCH = ["fetch", "--matrix", "m.toml", "--lock-dir", "locks"]


@pytest.fixture
def hostile(app, runner, tmp_path, monkeypatch):
    """A cell locked against the honest index; then the test makes the index hostile. Cache and cwd: the test's."""
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.toml").write_text(MATRIX)
    with HostileIndex(honest_index(tmp_path)) as index:
        res = runner.invoke(app, ["lock", "--matrix", "m.toml", "--index-url", index.simple, "--dir", "locks"])
        assert res.exit_code == 0, res.output
        yield index


def _clean(res, code: int) -> str:
    out = res.output
    assert res.exit_code == code, out
    assert "Traceback" not in out and "error:" in out and "hint:" in out
    assert not any(c in out for c in "\x1b\x07\x9b"), "the index's bytes reached the terminal"
    return out


def _cache_files(tmp_path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if "pypi" not in p.parts)


@pytest.mark.parametrize(
    "filename",
    [
        "numpy-1.26.4-py3-none-any.\x1b]0;pwned\x07.whl",  # a terminal escape in a tag
        "numpy-1.26.4-py3-none-any.x/../../../../escaped.whl",  # a path (older `packaging` takes it as a tag)
        "numpy-1.26.4-1\x00-py3-none-any.whl",
    ],
)
def test_a_hostile_wheel_file_name_never_becomes_a_path(app, runner, hostile, tmp_path, filename):
    root = hostile.root
    _, sha = wheel_file(root, NUMPY)
    hostile.page("numpy", json_page({"filename": filename, "url": f"../../files/{NUMPY}", "hashes": {"sha256": sha}}))
    res = runner.invoke(app, FETCH)
    out = _clean(res, 3)
    assert "numpy==1.26.4" in out and "not a wheel file name" in out
    assert not [p for p in _cache_files(tmp_path) if "escaped" in p or "pwned" in p]
    assert not (tmp_path / "escaped.whl").exists() and not (tmp_path.parent / "escaped.whl").exists()


def test_a_percent_encoded_slash_in_an_html_link_never_becomes_a_path(app, runner, hostile, tmp_path):
    data, sha = wheel_file(hostile.root, NUMPY)
    href = "../../files/numpy-1.26.4-py3-none-any.x%2F..%2F..%2Fescaped.whl"
    hostile.html("numpy", f'<a href="{href}#sha256={sha}">numpy</a>')
    hostile.routes["/files/numpy-1.26.4-py3-none-any.x%2F..%2F..%2Fescaped.whl"] = Route(body=data)
    out = _clean(runner.invoke(app, FETCH), 3)
    assert "not a wheel file name" in out
    assert not [p for p in _cache_files(tmp_path) if "escaped" in p]


@pytest.mark.parametrize("page", [nested(100_000), '{"files": [], "n": ' + huge_number() + "}", b'{"files": ["\xff"]}'])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_hostile_json_page_is_a_clean_error(app, runner, hostile, page, dry_run):
    hostile.page("numpy", page)
    res = runner.invoke(app, [*FETCH, *(["--dry-run"] if dry_run else [])])
    if dry_run:  # the plan says the index could not be read, names it, and stops short of a traceback
        assert res.exit_code == 0 and "Traceback" not in res.output, res.output
        assert "index unreadable" in res.output and "/simple/numpy/" in res.output
    else:
        assert "/simple/numpy/" in _clean(res, 3)


@pytest.mark.parametrize("size", [1e308, -5, 10**30, "12", True])
def test_a_declared_size_out_of_range_counts_as_unknown(app, runner, hostile, size):
    _, sha = wheel_file(hostile.root, NUMPY)
    entry = {"filename": NUMPY, "url": f"../../files/{NUMPY}", "hashes": {"sha256": sha.upper()}, "size": size}
    hostile.page("numpy", json_page(entry))
    res = runner.invoke(app, [*FETCH, "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    wheels = json.loads(res.stdout)["cells"][0]["wheels"]
    assert wheels["error"] is None and wheels["download_bytes"] < 10**9  # not 1e308 bytes "to download"
    assert json.loads(res.stdout)["disk_ok"]


@pytest.mark.parametrize("length", ["1e308", "-1", huge_number(50), "12, 13"])
def test_a_lying_content_length_is_a_clean_error_and_leaves_nothing(app, runner, hostile, tmp_path, length):
    data, _ = wheel_file(hostile.root, NUMPY)
    hostile.routes[f"/files/{NUMPY}"] = Route(body=data, content_length=length)
    out = _clean(runner.invoke(app, FETCH), 3)
    assert NUMPY in out
    assert not [p for p in _cache_files(tmp_path) if ".download-" in p or ".partial-" in p]


# ---- SIGTERM during a download, and the partial files a killed run leaves ---------------------------------------
def _imagekit(*args: str, cwd, env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "imagekit", *args],
        cwd=cwd,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _partials(cache) -> list[str]:
    return sorted(p.name for p in (cache / "wheels").rglob("*") if p.name.startswith((".download-", ".partial-")))


def test_sigterm_during_fetch_removes_its_partial_downloads(hostile, tmp_path):
    data, _ = wheel_file(hostile.root, NUMPY)
    hostile.routes[f"/files/{NUMPY}"] = Route(body=data, stall_after=len(data) // 2, chunk=256)
    cache = tmp_path / "cache"
    proc = _imagekit(*FETCH, "--quiet", cwd=tmp_path, env={"IMAGEKIT_CACHE": str(cache)})
    try:
        assert hostile.stalled.wait(30), proc.communicate(timeout=5)
        deadline = time.monotonic() + 10
        while not _partials(cache) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _partials(cache), "no partial download to interrupt"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and "error: fetch was stopped (SIGTERM)" in stderr and "hint:" in stderr
    assert _partials(cache) == []


def test_a_download_whose_partial_folder_was_discarded_never_makes_it_again(hostile, tmp_path, monkeypatch):
    """SIGTERM's discard removed a download's folder just as that download began (between its lock and its first
    byte): the download made the folder again and wrote into it, and the process, exiting with 143 meanwhile, left
    it for good (the CI run of `test_sigterm_during_fetch_...` above, once). Now the download fails there."""
    import threading

    from imagekit.locking.wheel_choice import Candidate
    from imagekit.services.wheels import wheel_cache

    data, sha = wheel_file(hostile.root, NUMPY)
    hostile.routes[f"/files/{NUMPY}"] = Route(body=data, stall_after=len(data) // 2, chunk=256)
    real_flock, signalled = fcntl.flock, []

    def flock(fd, op):  # the signal arrives as the download has taken its lock
        real_flock(fd, op)
        if not signalled:
            signalled.append(True)
            wheel_cache.discard_partials()

    monkeypatch.setattr(wheel_cache.fcntl, "flock", flock)
    dest = tmp_path / "cache" / "wheels" / sha / NUMPY
    dest.parent.mkdir(parents=True)
    failed: list[BaseException] = []

    def fetch() -> None:
        try:
            wheel_cache.download(Candidate(NUMPY, f"{hostile.url}/files/{NUMPY}", sha, len(data)), dest)
        except BaseException as exc:  # what the download raised is the evidence
            failed.append(exc)

    worker = threading.Thread(target=fetch, daemon=True)
    worker.start()
    try:
        worker.join(10)
        assert not hostile.stalled.is_set(), "the discarded download went on writing"
        assert [type(e) for e in failed] == [wheel_cache.Interrupted] and not worker.is_alive()
        assert _partials(tmp_path / "cache") == [] and not dest.exists()
    finally:
        hostile.release()
        wheel_cache.allow_downloads()
        worker.join(10)


def test_the_next_fetch_sweeps_partials_no_live_process_holds(app, runner, hostile, tmp_path):
    _, sha = wheel_file(hostile.root, NUMPY)
    folder = tmp_path / "cache" / "wheels" / sha
    (folder / ".partial-dead").mkdir(parents=True)  # a killed run's: its lock file free
    (folder / ".partial-dead" / ".lock").write_text("")
    (folder / ".partial-dead" / ".download-x").write_bytes(b"half a wheel")
    (folder / ".partial-live").mkdir()  # a concurrent run's: its lock held
    (folder / ".partial-live" / ".download-y").write_bytes(b"being written")
    live = open(folder / ".partial-live" / ".lock", "w")  # held across the fetch
    fcntl.flock(live, fcntl.LOCK_EX)
    old = folder / ".download-old"  # an older imagekit's, not written for hours
    old.write_bytes(b"x" * 1000)
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    (folder / ".download-new").write_bytes(b"y")  # an older imagekit's, maybe still running
    try:
        res = runner.invoke(app, [*FETCH, "--dry-run"])  # a plan sweeps nothing
        assert res.exit_code == 0 and (folder / ".partial-dead").exists(), res.output
        hostile.routes[f"/files/{NUMPY}"] = Route(status=503)  # the sweep comes first; the download may fail
        runner.invoke(app, FETCH)
        assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == [".download-new", ".partial-live"]
        assert (folder / ".partial-live" / ".download-y").read_bytes() == b"being written"
    finally:
        live.close()
