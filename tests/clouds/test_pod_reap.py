"""`imagekit pod reap` against a loopback stand-in of RunPod's REST API holding pods imagekit created and pods it did
not: only imagekit's overdue pods are stopped (or terminated), every other pod is untouched, a dry run changes
nothing; and a `pod create` killed after RunPod answered leaves its pod findable."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from imagekit.clouds import guard_defaults as gd
from tests import loopback
from tests.clouds.test_pod_create import CELL, _index

KEY = "rp_reap_key_0123"
IDLE = {"uptime": 3600, "gpus": [{"util": 0, "memoryUtil": 0}], "cpu": {"util": 0}}  # what RunPod reports of a pod
PAST, FUTURE = "2026-01-01T00:00:00Z", "2099-01-01T00:00:00Z"


@dataclass
class RunPod:
    """RunPod's REST API v2 as far as `pod create`, `pod start` and `pod reap` use it: GET /pods, POST /pods, POST
    /pods/{id}/action (start, stop, terminate), each seen as (method, path[ action]); ``stall_create``: the create's
    answer is sent whole but the connection is never closed (a client reading to the end waits for ever)."""

    pods: dict[str, dict] = field(default_factory=dict)
    looks: dict[str, list[dict | None]] = field(default_factory=dict)  # a pod's runtime at each GET /pods, in turn
    seen: list[tuple[str, str]] = field(default_factory=list)
    stall_create: bool = False
    answered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    def add(
        self, pod_id: str, env: dict | None = None, status: str = "RUNNING", name: str = "imagekit cell",
        runtime: dict | None = IDLE,
    ) -> None:  # fmt: skip
        self.pods[pod_id] = {"id": pod_id, "name": name, "status": status, "env": env or {}, "cost": 0.44,
                             "startedAt": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00Z",
                             "runtime": runtime if status == "RUNNING" else None}  # fmt: skip


@contextmanager
def runpod_api() -> Iterator[RunPod]:
    state = RunPod()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, doc: object, length: bool = True) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            if length:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

        def _answer(self) -> None:
            assert self.headers.get("Authorization") == f"Bearer {KEY}"
            path = self.path.split("?")[0].removeprefix("/v2")
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            action = json.loads(body).get("action", "?") if path.endswith("/action") else ""
            state.seen.append((self.command, f"{path} {action}" if action else path))
            if (self.command, path) == ("GET", "/pods"):
                for pod_id, runtimes in state.looks.items():
                    if runtimes and pod_id in state.pods:
                        state.pods[pod_id]["runtime"] = runtimes.pop(0)
                return self._send(200, {"pods": list(state.pods.values())})
            if (self.command, path) == ("POST", "/pods"):
                asked = json.loads(body)
                pod_id = f"made{len(state.pods):04d}x"
                state.add(pod_id, asked["env"], name=asked["name"])
                self._send(201, state.pods[pod_id], length=not state.stall_create)
                state.answered.set()
                if state.stall_create:
                    state.release.wait(30)  # the answer is all there; the connection never ends
                return None
            pod_id = path.split("/")[2]
            if pod_id not in state.pods:
                return self._send(404, {"title": "Not Found", "status": 404, "detail": "resource not found"})
            pod = state.pods[pod_id]
            allowed = {"RUNNING": ("stop", "terminate"), "EXITED": ("start", "terminate")}.get(pod["status"], ())
            if self.command == "POST" and action and action not in allowed:
                return self._send(409, {"title": "Conflict", "status": 409, "detail": f"cannot {action} a "
                                        f"{pod['status']} pod"})  # fmt: skip
            if action == "terminate":
                del state.pods[pod_id]
                self.send_response(204)
                self.end_headers()
                return None
            if action in ("stop", "start"):
                pod["status"] = "EXITED" if action == "stop" else "RUNNING"
            return self._send(200, pod)

        do_GET = do_POST = do_DELETE = _answer

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v2"
    loopback.start(server)
    try:
        yield state
    finally:
        state.release.set()
        loopback.stop(server)


def _fleet(api: RunPod) -> None:
    """Pods imagekit created (overdue or not, running or stopped) and pods it did not, some looking like its own."""
    api.add("ikoverdue01", {gd.CREATED: "2026-01-01T00:00:00Z", gd.DEADLINE: PAST})
    api.add("ikontime001", {gd.CREATED: "2026-01-01T00:00:00Z", gd.DEADLINE: FUTURE})
    api.add("iknodeadln1", {gd.CREATED: "2026-01-01T00:00:00Z"})
    api.add("ikstopped01", {gd.CREATED: "2026-01-01T00:00:00Z", gd.DEADLINE: PAST}, status="EXITED")
    api.add("otherdead01", {"DEADLINE": PAST}, name="imagekit lookalike")  # no mark: not imagekit's
    api.add("otherpod001", {}, name="my notebook")


def _reap(app, runner, api: RunPod, *args: str):
    """`pod reap` with one look at each pod (``--watch 0s``; the watch has its own test)."""
    watch = [] if "--watch" in args else ["--watch", "0s"]
    return runner.invoke(app, ["pod", "reap", "--api-url", api.url, *watch, *args])


def _changes(api: RunPod) -> list[tuple[str, str]]:
    return [s for s in api.seen if s[0] != "GET"]


@pytest.mark.loopback
def test_a_dry_run_lists_every_pod_and_changes_nothing(app, runner, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    with runpod_api() as api:
        _fleet(api)
        before = json.dumps(api.pods, sort_keys=True)
        res = _reap(app, runner, api, "--dry-run", "--terminate")
        assert res.exit_code == 0, res.output
        assert _changes(api) == [] and json.dumps(api.pods, sort_keys=True) == before
    lines = {ln.split()[0]: ln for ln in res.stdout.splitlines()}
    assert set(lines) == set(api.pods)
    assert "would terminate: past its deadline 2026-01-01T00:00:00Z" in lines["ikoverdue01"]
    assert "would terminate" in lines["ikstopped01"]
    assert "0.44 $/h" in lines["ikoverdue01"] and "$ since its last start" in lines["ikoverdue01"]
    assert "deadline 2099-01-01T00:00:00Z" in lines["ikontime001"] and "would" not in lines["ikontime001"]
    for other in ("otherdead01", "otherpod001"):
        assert "not imagekit's: left alone" in lines[other]
    assert KEY not in res.output


@pytest.mark.loopback
def test_only_imagekits_overdue_pods_are_stopped(app, runner, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    with runpod_api() as api:
        _fleet(api)
        res = _reap(app, runner, api)
        assert res.exit_code == 0, res.output
        assert _changes(api) == [("POST", "/pods/ikoverdue01/action stop")]  # the stopped one is left: its GPU is free
        assert api.pods["otherdead01"]["status"] == api.pods["otherpod001"]["status"] == "RUNNING"
        api.seen.clear()
        res = _reap(app, runner, api, "--older-than", "1h", "--terminate", "--json")
        assert res.exit_code == 0, res.output
        ended = ("iknodeadln1", "ikontime001", "ikoverdue01", "ikstopped01")  # imagekit's, all older than 1h
        assert sorted(_changes(api)) == [("POST", f"/pods/{p}/action terminate") for p in ended]
        assert sorted(api.pods) == ["otherdead01", "otherpod001"]  # others' pods, whatever their age: untouched
    doc = json.loads(res.stdout)
    assert {p["pod"]: p["action"] for p in doc["pods"]}["otherpod001"] is None and doc["failed"] == []


@pytest.mark.loopback
def test_pods_recorded_here_are_reported_against_the_list(app, runner, monkeypatch):
    from imagekit.effects import pod_records

    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    with runpod_api() as api:
        api.add("unmarked001", {}, name="renamed by hand")  # its env lost the mark: the local record still knows it
        for pod_id in ("unmarked001", "gonepod0001"):
            pending = pod_records.pending("2026-01-01T00:00:00Z", "imagekit cell", PAST, "test")
            pod_records.created(pending, pod_id)
        res = _reap(app, runner, api, "--dry-run")
        assert res.exit_code == 0 and _changes(api) == []
        assert "unmarked001" in res.stdout and "imagekit's (recorded here)" in res.stdout
        assert "would stop: past its deadline" in res.stdout
        assert "gonepod0001: recorded here ('imagekit cell', created 2026-01-01T00:00:00Z), not listed" in res.stderr
        assert "unmarked001: recorded here, still running" in res.stderr
        assert (pod_records.folder() / "pod-gonepod0001.json").exists()  # a dry run writes nothing here either
        res = _reap(app, runner, api)
        assert _changes(api) == [("POST", "/pods/unmarked001/action stop")] and "record dropped" in res.stderr
        assert not (pod_records.folder() / "pod-gonepod0001.json").exists()


@pytest.mark.loopback
@pytest.mark.programs
def test_a_create_killed_after_runpod_answered_leaves_the_pod_findable(app, runner, tmp_path, monkeypatch):
    """RunPod made the pod and sent its answer, but the client never finished reading it (the connection stays open)
    and is killed: the pod is found by the mark the create sent and the record it wrote before sending."""
    state = tmp_path / "state"
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    monkeypatch.setenv("IMAGEKIT_STATE", str(state))
    index = _index(tmp_path)
    with runpod_api() as api:
        api.add("otherpod001", {}, name="my notebook")
        api.stall_create = True
        cmd = [sys.executable, "-m", "imagekit", "pod", "create", CELL, "--release-index", str(index),
               "--gpu", "NVIDIA GeForce RTX 3090", "--api-url", api.url]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
        try:
            assert api.answered.wait(60), "the create never reached the stand-in"
            time.sleep(0.3)
            assert proc.poll() is None, proc.communicate()  # still waiting for the end of the answer
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
        (made,) = [p for p in api.pods if p.startswith("made")]
        res = _reap(app, runner, api, "--dry-run")
        assert res.exit_code == 0, res.output
        line = next(ln for ln in res.stdout.splitlines() if ln.startswith(made))
        assert "imagekit's (an unfinished create)" in line and "not overdue (no deadline)" in line
        assert f"{made}: the pod of a create that never recorded its id" in res.stderr
        assert _changes(api) == [("POST", "/pods")]  # the create's only: the dry run changed nothing
        time.sleep(1.1)  # the mark has whole seconds
        res = _reap(app, runner, api, "--older-than", "1s")
        assert res.exit_code == 0, res.output
        assert _changes(api) == [("POST", "/pods"), ("POST", f"/pods/{made}/action stop")]  # the other pod: untouched
    assert (state / "pods" / f"pod-{made}.json").exists()  # the real run recorded the id it found


@pytest.mark.loopback
def test_a_finished_create_records_the_id_before_it_prints(app, runner, tmp_path, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    monkeypatch.setenv("IMAGEKIT_STATE", str(tmp_path / "state"))  # this test's records alone
    with runpod_api() as api:
        res = runner.invoke(app, ["pod", "create", CELL, "--release-index", str(_index(tmp_path)),
                                  "--gpu", "NVIDIA GeForce RTX 3090", "--api-url", api.url])  # fmt: skip
    assert res.exit_code == 0, res.output
    pod_id = res.stdout.strip()
    from imagekit.effects import pod_records

    record = json.loads((pod_records.folder() / f"pod-{pod_id}.json").read_text())
    assert record["pod"] == pod_id and gd.parse_stamp(record["created"]) is not None
    assert "guard armed: stop after 45m idle" in res.stderr and "off: --no-guard" in res.stderr
    assert not list(pod_records.folder().glob("pending-*"))


# ---- age alone never ends a pod that works ---------------------------------------------------------------------------
BUSY = {"uptime": 108000, "gpus": [{"util": 97, "memoryUtil": 81}], "cpu": {"util": 14}}


@pytest.mark.loopback
def test_reap_by_age_stops_an_idle_30_hour_pod_and_leaves_a_busy_one(app, runner, monkeypatch):
    """`--older-than 1d` (what the template readmes suggested, and `ci init --reap` runs every half hour): a pod 30
    hours old training at 97 % is left alone, one reporting nothing for the whole watch is stopped, one whose GPUs
    dip to 0 at the first look and work at the next is left alone, one whose work RunPod does not report is left
    to its deadline."""
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    thirty = gd.stamp(dt.datetime.now(dt.UTC) - dt.timedelta(hours=30))
    with runpod_api() as api:
        api.add("ikbusy30h01", {gd.CREATED: thirty}, runtime=BUSY)
        api.add("ikidle30h01", {gd.CREATED: thirty})
        api.add("ikdipping01", {gd.CREATED: thirty})
        api.looks["ikdipping01"] = [IDLE, BUSY]  # a data-loading pause at the first look
        api.add("iknoreport1", {gd.CREATED: thirty}, runtime=None)
        res = _reap(app, runner, api, "--older-than", "1d", "--watch", "1s")
        assert res.exit_code == 0, res.output
        assert _changes(api) == [("POST", "/pods/ikidle30h01/action stop")]
        gets = [s for s in api.seen if s == ("GET", "/pods")]
        assert len(gets) == 2  # the list, and one more look at the pods only their age would end
        said = {line.split()[0]: line for line in res.stdout.splitlines()}
        assert "at work: 97 % utilisation reported" in said["ikbusy30h01"] and "age alone never ends" in said[
            "ikbusy30h01"]  # fmt: skip
        assert "with no work reported" in said["ikidle30h01"]
        assert "at work: 97 % utilisation reported (1 of 2 look(s))" in said["ikdipping01"]
        assert "reports no utilisation for it" in said["iknoreport1"]
        assert api.pods["ikbusy30h01"]["status"] == "RUNNING" and api.pods["ikidle30h01"]["status"] == "EXITED"


@pytest.mark.loopback
def test_pod_start_starts_a_stopped_pod_and_refuses_a_running_one(app, runner, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    with runpod_api() as api:
        api.add("ikstopped01", {gd.CREATED: PAST}, status="EXITED")
        res = runner.invoke(app, ["pod", "start", "ikstopped01", "--api-url", api.url])
        assert res.exit_code == 0, res.output
        assert _changes(api) == [("POST", "/pods/ikstopped01/action start")] and "is starting" in res.stderr
        assert api.pods["ikstopped01"]["status"] == "RUNNING"
        res = runner.invoke(app, ["pod", "start", "ikstopped01", "--api-url", api.url])
        assert res.exit_code == 1 and "will not start pod ikstopped01" in res.stderr
        assert "cannot start a RUNNING pod" in res.stderr
