"""`imagekit pod reap --provider vast` against a loopback stand-in of Vast's API (`GET /instances/`, `PUT` and
`DELETE /instances/{id}/`) holding instances made from imagekit's Vast template and instances it did not make: only
imagekit's overdue instances are stopped (or destroyed), every other one is untouched, a dry run changes nothing, and
what Vast answers is read as another party's data."""

from __future__ import annotations

import http.server
import json
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from imagekit.clouds import guard_defaults as gd
from imagekit.clouds import reap, vast
from tests import loopback
from tests.clouds.test_guard_defaults import _entry

KEY = "vast_reap_key_0123"
JAN_2026 = 1767225600.0  # 2026-01-01T00:00:00Z


@dataclass
class Vast:
    instances: dict[int, dict] = field(default_factory=dict)
    seen: list[tuple[str, str, bytes]] = field(default_factory=list)
    listing: object = None  # an answer to GET /instances/ other than the instances (a hostile or broken API)
    refuse: bool = False  # PUT and DELETE answer {"success": false}
    url: str = ""

    def add(self, ident: int, env: list | None, status: str = "running", label: str | None = "train") -> None:
        self.instances[ident] = {"id": ident, "label": label, "intended_status": status, "actual_status": status,
                                 "gpu_util": 0.0,
                                 "extra_env": env, "start_date": JAN_2026, "dph_total": 0.31}  # fmt: skip


def extra_env(template_env: str) -> list[list[str]]:
    """A template's docker options as Vast lists them on an instance made from it: ``-e NAME=VALUE`` as ``[NAME,
    VALUE]``, a port option as ``["-p A:B", "1"]`` (Vast's documented `extra_env`)."""
    words, pairs = shlex.split(template_env), []
    for flag, value in zip(words[::2], words[1::2], strict=True):
        pairs.append(value.split("=", 1) if flag == "-e" else [f"{flag} {value}", "1"])
    return pairs


@contextmanager
def vast_api() -> Iterator[Vast]:
    state = Vast()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _answer(self) -> None:
            assert self.headers.get("Authorization") == f"Bearer {KEY}"
            path = self.path.removeprefix("/api/v0")
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state.seen.append((self.command, path, body))
            if (self.command, path) == ("GET", "/instances/"):
                listing = state.listing if state.listing is not None else list(state.instances.values())
                return self._send(200, {"instances_found": len(state.instances), "instances": listing})
            m = re.fullmatch(r"/instances/([0-9]+)/", path)
            if not m or int(m.group(1)) not in state.instances:
                return self._send(404, {"success": False, "error": "no_such_instance"})
            if state.refuse:
                return self._send(200, {"success": False, "msg": "\x1b[31mnot now\x1b[0m"})
            if self.command == "PUT" and json.loads(body) == {"state": "stopped"}:
                state.instances[int(m.group(1))]["intended_status"] = "stopped"
            elif self.command == "DELETE":
                del state.instances[int(m.group(1))]
            return self._send(200, {"success": True})

        do_GET = do_PUT = do_DELETE = _answer

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/api/v0"
    loopback.start(server)
    try:
        yield state
    finally:
        loopback.stop(server)


def _fleet(api: Vast, tmp_path) -> None:
    """Instances made from imagekit's Vast template (its env, as Vast lists it), running or stopped, and others."""
    ours = extra_env(vast.template(_entry(tmp_path))["env"])
    api.add(1001, ours)
    api.add(1002, ours, status="stopped")
    api.add(1003, [*ours, [gd.DEADLINE, "2099-01-01T00:00:00Z"]], label=None)
    api.add(2001, [["IMAGEKIT_IDLE_STOP", "45m"], ["-p 22:22", "1"]], label="imagekit lookalike")  # no mark
    api.add(2002, None, label="my notebook")


def _reap(app, runner, api: Vast, *args: str):
    return runner.invoke(app, ["pod", "reap", "--provider", "vast", "--api-url", api.url, "--watch", "0s", *args])


def _changes(api: Vast) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in api.seen if m != "GET"]


@pytest.mark.loopback
def test_vast_template_instances_are_imagekits_and_only_overdue_ones_are_ended(app, runner, monkeypatch, tmp_path):
    monkeypatch.setenv("VAST_API_KEY", KEY)
    with vast_api() as api:
        _fleet(api, tmp_path)
        res = _reap(app, runner, api, "--dry-run", "--older-than", "1h", "--terminate")
        assert res.exit_code == 0, res.output
        assert _changes(api) == []
        lines = {ln.split()[0]: ln for ln in res.stdout.splitlines()}
        assert set(lines) == {"1001", "1002", "1003", "2001", "2002"}
        assert "imagekit's (marked)" in lines["1001"] and "would terminate: started" in lines["1001"]
        assert "0.31 $/h" in lines["1001"] and "$ since its last start" in lines["1001"]
        assert "would terminate" in lines["1002"] and "'?'" in lines["1003"]
        assert "not imagekit's: left alone" in lines["2001"] and "not imagekit's: left alone" in lines["2002"]

        res = _reap(app, runner, api)  # no deadline passed, no --older-than: nothing is overdue
        assert res.exit_code == 0 and _changes(api) == []
        res = _reap(app, runner, api, "--older-than", "1h")
        assert res.exit_code == 0, res.output
        stops = [(m, p, json.loads(b)) for m, p, b in api.seen if m != "GET"]
        assert stops == [("PUT", f"/instances/{i}/", {"state": "stopped"}) for i in (1001, 1003)]  # 1002: stopped
        assert api.instances[2001]["intended_status"] == api.instances[2002]["intended_status"] == "running"
        api.seen.clear()
        res = _reap(app, runner, api, "--older-than", "1h", "--terminate", "--json")
        assert res.exit_code == 0, res.output
        assert sorted(_changes(api)) == [("DELETE", f"/instances/{i}/") for i in (1001, 1002, 1003)]
        assert sorted(api.instances) == [2001, 2002]
    doc = json.loads(res.stdout)
    assert {p["pod"]: p["action"] for p in doc["pods"]}["2002"] is None and KEY not in res.output


@pytest.mark.loopback
def test_a_refused_stop_is_exit_3_and_vasts_words_are_shown_as_plain_text(app, runner, monkeypatch, tmp_path):
    monkeypatch.setenv("VAST_API_KEY", KEY)
    with vast_api() as api:
        _fleet(api, tmp_path)
        api.refuse = True
        res = _reap(app, runner, api, "--older-than", "1h")
    assert res.exit_code == 3, res.output
    assert "Vast did not stop instance 1001" in res.output and "\x1b" not in res.output


@pytest.mark.loopback
@pytest.mark.parametrize(
    "listing",
    [
        {"not": "a list"},  # the instances field is not a list
        "instances",
    ],
)
def test_a_listing_that_is_not_one_is_exit_3_and_nothing_is_sent(app, runner, monkeypatch, listing):
    monkeypatch.setenv("VAST_API_KEY", KEY)
    with vast_api() as api:
        api.add(1001, [[gd.CREATED, "template"]])
        api.listing = listing
        res = _reap(app, runner, api, "--older-than", "1s")
    assert res.exit_code == 3 and "has no list of instances" in res.output, res.output
    assert _changes(api) == []


@pytest.mark.parametrize(
    "doc",
    [
        {"id": True}, {"id": "1001"}, {"id": -4}, {"id": 10**13}, {"id": 1.5}, {},  # no id imagekit could act on
    ],
)  # fmt: skip
def test_an_instance_without_a_usable_id_is_not_listed(doc):
    assert vast.reap_pod({**doc, "extra_env": [[gd.CREATED, "template"]]}, []) is None


def test_what_vast_says_of_an_instance_is_checked_field_by_field():
    weird = {
        "id": 7, "label": "\x1b]0;owned\x07name", "intended_status": ["running"], "start_date": float("nan"),
        "dph_total": "1e400", "extra_env": [[gd.CREATED, 5], ["A"], "X=Y", [gd.DEADLINE, "2000-01-01T00:00:00Z"]],
    }  # fmt: skip
    pod = vast.reap_pod(weird, [])
    assert pod is not None and pod.id == "7" and "\x1b" not in pod.name and "\x07" not in pod.name
    assert (pod.status, pod.started, pod.price, pod.ours) == ("?", None, None, None)  # the mark is not text: not ours
    assert reap.decide(pod, pod.deadline, None, False).why == "not imagekit's: left alone"
    marked = vast.reap_pod({"id": 8, "extra_env": [[gd.CREATED, "template"]], "intended_status": "frozen"}, [])
    assert marked is not None and marked.ours == "marked" and marked.status == "RUNNING"  # frozen still bills the GPU


@pytest.mark.loopback
def test_the_key_vast_echoes_back_is_never_shown(app, runner, monkeypatch):
    key = "a" * 64  # a key shaped as Vast's: hex, which no generic redaction can tell from a hash
    monkeypatch.setenv("VAST_API_KEY", key)

    def echo(seen):
        return 200, {}, f"<html>bad key {seen.headers['Authorization']}</html>".encode()

    from tests import hostile_http

    with hostile_http.serve(fallback=echo) as server:
        res = runner.invoke(app, ["pod", "reap", "--provider", "vast", "--api-url", f"{server.url}/api/v0"])
    assert res.exit_code == 3 and key not in res.output and "<VAST_API_KEY>" in res.output, res.output


@pytest.mark.loopback
def test_an_id_listed_twice_is_left_alone(app, runner, monkeypatch):
    monkeypatch.setenv("VAST_API_KEY", KEY)
    with vast_api() as api:
        api.add(7, [[gd.CREATED, "template"]])
        api.listing = [api.instances[7], {**api.instances[7], "extra_env": None}]  # marked once, unmarked once
        res = _reap(app, runner, api, "--older-than", "1s")
    assert res.exit_code == 0 and _changes(api) == [], res.output
    assert "7: listed more than once by vast" in res.output


@pytest.mark.loopback
def test_a_stop_is_sent_where_it_was_aimed_never_where_a_redirect_points(app, runner, monkeypatch):
    from tests import hostile_http

    monkeypatch.setenv("VAST_API_KEY", KEY)
    listing = {"instances": [{"id": 601, "extra_env": [[gd.CREATED, "template"]], "intended_status": "running",
                              "gpu_util": 0, "start_date": JAN_2026}]}  # fmt: skip
    routes = {"/api/v0/instances/": hostile_http.json_answer(listing),
              "/api/v0/instances/601/": hostile_http.redirect("/api/v0/instances/12345/", 307)}  # fmt: skip
    with hostile_http.serve(routes, fallback=lambda _s: (200, {}, b'{"success": true}')) as server:
        res = runner.invoke(app, ["pod", "reap", "--provider", "vast", "--api-url", f"{server.url}/api/v0",
                                  "--older-than", "1s", "--watch", "0s"])  # fmt: skip
    assert res.exit_code == 3 and "HTTP 307" in res.output, res.output
    assert [(s.method, s.path) for s in server.seen] == [
        ("GET", "/api/v0/instances/"),
        ("PUT", "/api/v0/instances/601/"),
    ]


def test_a_template_instance_past_its_guards_runtime_is_overdue_and_an_empty_mark_is_no_mark():
    env = [[gd.CREATED, "template"], ["IMAGEKIT_MAX_RUNTIME", "6h"]]
    pod = vast.reap_pod({"id": 9, "extra_env": env, "intended_status": "running", "start_date": JAN_2026}, [])
    assert pod is not None and pod.deadline is not None and gd.stamp(pod.deadline) == "2026-01-01T06:00:00Z"
    verdict = reap.decide(pod, pod.deadline, None, False)
    assert verdict.action == "stop" and "past its deadline 2026-01-01T06:00:00Z" in verdict.why
    garbage = vast.reap_pod({"id": 9, "extra_env": [[gd.CREATED, "template"], ["IMAGEKIT_MAX_RUNTIME", "9" * 30]],
                              "start_date": JAN_2026}, [])  # fmt: skip
    assert garbage is not None and garbage.deadline is None
    unmarked = vast.reap_pod({"id": 10, "extra_env": [[gd.CREATED, ""]]}, [])
    assert unmarked is not None and unmarked.ours is None


@pytest.mark.loopback
@pytest.mark.parametrize("answer", [{"success": "false"}, ["ok"], {"success": False}])
def test_a_stop_vast_did_not_say_it_took_is_a_failure(app, runner, monkeypatch, answer):
    from tests import hostile_http

    monkeypatch.setenv("VAST_API_KEY", KEY)
    listing = {"instances": [{"id": 5, "extra_env": [[gd.CREATED, "template"]], "start_date": JAN_2026,
                              "gpu_util": 0, "intended_status": "running"}]}  # fmt: skip
    routes = {"/api/v0/instances/": hostile_http.json_answer(listing), "/api/v0/instances/5/": hostile_http.json_answer(
        answer)}  # fmt: skip
    with hostile_http.serve(routes) as server:
        res = runner.invoke(app, ["pod", "reap", "--provider", "vast", "--api-url", f"{server.url}/api/v0",
                                  "--older-than", "1s", "--watch", "0s"])  # fmt: skip
    assert res.exit_code == 3 and "Vast did not stop instance 5" in res.output, res.output
