"""What the guard reads of the machine it runs on, kept to each test's own folders: the machine running the tests may
have SSH sessions (another test's sshd), a Jupyter server, a volume at /workspace or the start check's markers in
/run/imagekit; a test of those gives its own. The guard's state lives in a folder of the test's, beside (not in) its
tmp_path: ``workspace/`` stands for the volume, ``disk/`` for the container's own disk. The pod's processes, as the
progress sign reads them, are none unless a test names a /proc to read (``guard_signs.process_usage("/proc")``)."""

from __future__ import annotations

import pytest

from imagekit.in_image import guard_files, guard_signs


@pytest.fixture(autouse=True)
def guard_sees_only_the_test(monkeypatch, tmp_path_factory):
    root = tmp_path_factory.mktemp("guard-state")
    (root / "workspace").mkdir()
    (root / "disk").mkdir()
    (root / "run").mkdir()
    monkeypatch.setattr(guard_signs, "SSHD_EXES", ())
    monkeypatch.setattr(guard_signs, "JUPYTER_RUNTIME", ())
    monkeypatch.setattr(guard_files, "STATE_DIR", str(root / "workspace" / ".imagekit" / "guard"))
    monkeypatch.setattr(guard_files, "STATE_FALLBACK", str(root / "disk" / "imagekit" / "guard"))
    monkeypatch.setattr(guard_files, "CHECKED", str(root / "run" / "checked"))
    monkeypatch.setattr(guard_files, "WARNING", str(root / "run" / "guard-warning"))
    monkeypatch.setattr(guard_files, "CLIENTS", str(root / "run" / "clients"))
    monkeypatch.setattr(guard_files, "JOB_EXIT", str(root / "run" / "job-exit"))
    monkeypatch.setattr(guard_signs, "DEV", str(root / "dev"))
    real_usage = guard_signs.process_usage  # the machine's other processes (another test worker) are not the pod's work
    monkeypatch.setattr(guard_signs, "process_usage", lambda proc=None: {} if proc is None else real_usage(proc))
    monkeypatch.setattr(guard_files, "_BANNER", [None])
    return root


@pytest.fixture(scope="module")
def api(engine, tmp_path_factory):
    """The provider's API for the real-image guard tests: a stand-in where the pods reach the host (guard_pod.py); at
    the module's end, the scenarios run so far written as docs/pods.md's table."""
    from tests import guard_pod

    with guard_pod.stand_in(engine) as server:
        yield server
    guard_pod.write_table(tmp_path_factory.getbasetemp())
