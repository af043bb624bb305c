"""An unreachable index is found by a probe that runs beside the resolver and stops it: one probe per index URL and
process, one error (uv's own retries would take half a minute and end in a misleading message).

Real loopback servers only: one that answers (and counts what it is asked), a port where nothing listens
(connection refused), and one that accepts a connection and never answers (the probe's timeout).
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from imagekit.effects import resolver
from imagekit.effects.resolver import IndexUnreachable
from imagekit.locking import resolution
from imagekit.model import Cell
from imagekit.services.locks import lock_cells as lock_service
from tests import loopback
from tests.conftest import ROOT

CU118_CELLS = 5  # the default matrix's cu118 cells: every one takes torch from the PyTorch index


@contextmanager
def answering() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """An index that answers every request with 200, recording (method, path)."""
    seen: list[tuple[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _ok(self) -> None:
            seen.append((self.command, self.path))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = _ok

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    loopback.start(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        loopback.stop(server)


@contextmanager
def silent() -> Iterator[tuple[str, list[socket.socket]]]:
    """A server that accepts connections and never answers; yields its URL and the connections it accepted."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        listener.close()
        for conn in accepted:
            conn.close()


def dead_url() -> str:
    """A loopback port nothing listens on: a connection is refused at once."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def cli(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    full = {**clean, "NO_COLOR": "1", "COLUMNS": "200", "NO_PROXY": "127.0.0.1,localhost", **env}
    full["UV_CACHE_DIR"] = str(cwd / "uv-cache")
    return subprocess.run(
        [sys.executable, "-m", "imagekit", *args], capture_output=True, text=True, cwd=cwd, env=full, timeout=120
    )


def lines_starting(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


@pytest.mark.loopback
def test_an_unreachable_pytorch_index_is_one_error_after_one_probe_per_url(tmp_path):
    with answering() as (pypi, seen):
        torch_index = f"{dead_url()}/whl"
        res = cli(tmp_path, "lock", "--cuda", "11.8", "--dir", "locks", "--index-url", f"{pypi}/simple",
                  "--torch-index-url", torch_index, "--jobs", "4")  # fmt: skip
    assert res.returncode == 3, res.stderr
    [error] = lines_starting(res.stderr, "error:")
    assert error.startswith(f"error: cannot reach the PyTorch index {torch_index}/cu118: ConnectError")
    [hint] = lines_starting(res.stderr, "hint:")
    assert "--torch-index-url" in hint and "--source pypi" in hint and "proxy" in hint
    assert res.stderr.count("error") == 1 and "Traceback" not in res.stderr
    assert len([line for line in res.stderr.splitlines() if line.strip().startswith("failed cu118-")]) == CU118_CELLS
    assert "not available" not in res.stderr  # uv was stopped: no "Python 3.10 is not available" on the way
    assert [s for s in seen if s[0] == "HEAD"] == [("HEAD", "/simple")]  # five cells, four at once: probed once
    assert not (tmp_path / "locks").exists() or not any((tmp_path / "locks").iterdir())


@pytest.mark.resolver  # the probe stops the uv runs `lock --jobs 4` started beside it (and waits its 5 s timeout)
def test_an_index_that_never_answers_is_probed_once_with_the_short_timeout(tmp_path):
    with answering() as (pypi, seen), silent() as (torch_base, accepted):
        res = cli(tmp_path, "lock", "--cuda", "11.8", "--dir", "locks", "--index-url", f"{pypi}/simple",
                  "--torch-index-url", f"{torch_base}/whl", "--jobs", "4")  # fmt: skip
        connections = len(accepted)
    assert res.returncode == 3, res.stderr
    [error] = lines_starting(res.stderr, "error:")
    assert f"{torch_base}/whl/cu118" in error and f"no answer within {resolver.PROBE_TIMEOUT_S:g} s" in error
    assert len(lines_starting(res.stderr, "hint:")) == 1
    assert resolver.PROBE_TIMEOUT_S <= 10  # "a few seconds", where uv's own retries took ~20 s
    assert [s for s in seen if s[0] == "HEAD"] == [("HEAD", "/simple")]  # one probe per URL, no retry
    assert connections >= 1  # the probe's (and those of the uv runs it stopped)


@pytest.mark.loopback
def test_an_unreachable_main_index_names_the_flag_that_replaces_it(tmp_path):
    dead = f"{dead_url()}/simple"
    res = cli(tmp_path, "lock", "--cuda", "12.4", "--source", "pypi", "--dir", "locks", "--index-url", dead)
    assert res.returncode == 3, res.stderr
    [error] = lines_starting(res.stderr, "error:")
    assert error.startswith(f"error: cannot reach the package index {dead}: ")
    [hint] = lines_starting(res.stderr, "hint:")
    assert "--index-url" in hint and "--source pypi" not in hint  # PyPI cells need the main index too


@pytest.mark.loopback
def test_up_to_date_locks_need_no_network(tmp_path):
    """Every proxy points at a dead port: a probe (or uv) would fail, so exit 0 proves nothing was asked."""
    shutil.copytree(ROOT / "lockfiles", tmp_path / "locks")
    dead = dead_url()
    proxies = {k: dead for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")}
    res = cli(tmp_path, "lock", "--cuda", "12.4", "--source", "pypi", "--dir", "locks", NO_PROXY="", **proxies)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("up-to-date") == 3 and "error" not in res.stderr


@pytest.mark.resolver
def test_every_cell_in_a_process_shares_one_probe_and_one_error(data, tmp_path):
    """`lock` resolves cells concurrently and `build` calls lock_one per stale cell: each URL is probed once."""
    cells = [Cell("11.8", t, "4.48.2", "3.11") for t in ("2.5.1", "2.6.0", "2.7.1")]
    with answering() as (pypi, seen):
        settings = resolution.LockSettings(index_url=f"{pypi}/simple", torch_index_base=f"{dead_url()}/whl")
        concurrent = lock_service.lock_cells(cells, tmp_path / "locks", settings, data, jobs=3)
        one_by_one = [lock_service.lock_one(c, tmp_path / "locks", settings, data) for c in cells]
    errors = [r.error for r in concurrent + one_by_one]
    assert all(isinstance(e, IndexUnreachable) and e.exit_code == 3 for e in errors)
    assert all(e is errors[0] for e in errors)  # the same object: a caller reports it once
    assert [s for s in seen if s[0] == "HEAD"] == [("HEAD", "/simple")]
    assert not (tmp_path / "locks").exists() or not any((tmp_path / "locks").iterdir())
