"""RunPod template from the release index, and `--create` against a local HTTP server that checks the request."""

from __future__ import annotations

import http.server
import json
import threading
from typing import ClassVar

import pytest

KEY = "rp_secret_key_123"
CELL = "cu121-torch2.1.2-py3.11-tf4.48.2"
TAG = f"127.0.0.1:5000/imagekit/train:{CELL}-0123456789ab"
DIGEST = "sha256:" + "a" * 64


@pytest.fixture
def index(tmp_path):
    entry = {
        "tag": TAG,
        "alias": f"127.0.0.1:5000/imagekit/train:{CELL}",
        "digest": DIGEST,
        "size_bytes": 5_318_482_994,
        "lock_hash": "b" * 64,
        "published_at": "2026-11-29T21:00:00Z",
        "selftest": {"passed": True},
        "manifest": {
            "cell": {"id": CELL, "torch": "2.1.2", "variant": "cu121", "transformers": "4.48.2", "python": "3.11"},
            "driver": {"minimum": "525.60.13"},
            "torch": {"archs": ["sm_80", "sm_90"]},
        },
    }
    path = tmp_path / "index.json"
    path.write_text(json.dumps({"schema": 1, "images": {TAG: entry}}))
    return path


def test_template_is_pinned_to_the_immutable_tag(app, runner, index):
    res = runner.invoke(app, ["runpod-template", CELL, "--release-index", str(index)])
    assert res.exit_code == 0, res.output
    body = json.loads(res.stdout)
    tpl = body["variables"]["input"]
    assert "saveTemplate" in body["query"]
    assert tpl["imageName"] == TAG and tpl["volumeMountPath"] == "/workspace"
    assert tpl["containerDiskInGb"] >= 18  # sized from the 5.3 GB image
    assert {"key": "HF_HOME", "value": "/workspace/.cache/huggingface"} in tpl["env"]
    assert {"key": "IMAGEKIT_REQUIRE_GPU", "value": "1"} in tpl["env"]
    res = runner.invoke(app, ["runpod-template", TAG, "--release-index", str(index), "--digest"])
    assert json.loads(res.stdout)["variables"]["input"]["imageName"] == f"{TAG}@{DIGEST}"


class _RunPod(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list] = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append({"auth": self.headers.get("Authorization"), "body": body, "path": self.path})
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self.send_response(401)
            self.end_headers()
            return
        tpl = body["variables"]["input"]
        answer = {"data": {"saveTemplate": {"id": "tpl-1", "name": tpl["name"], "imageName": tpl["imageName"]}}}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def runpod():
    _RunPod.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RunPod)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/graphql"
    server.shutdown()


def test_create_calls_the_api_and_never_prints_the_key(app, runner, index, runpod, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    res = runner.invoke(app, ["runpod-template", CELL, "--release-index", str(index), "--create", "--api-url", runpod])
    assert res.exit_code == 0, res.output
    assert KEY not in res.output
    assert json.loads(res.stdout)["saveTemplate"]["id"] == "tpl-1"
    (call,) = _RunPod.seen
    assert call["auth"] == f"Bearer {KEY}" and "mutation saveTemplate" in call["body"]["query"]
    assert call["body"]["variables"]["input"]["imageName"] == TAG


def test_create_with_a_rejected_key(app, runner, index, runpod, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "wrong")
    res = runner.invoke(app, ["runpod-template", CELL, "--release-index", str(index), "--create", "--api-url", runpod])
    assert res.exit_code == 1 and "refused the API key" in res.output and "wrong" not in res.stdout


def test_create_without_a_key_is_usage_error(app, runner, index, monkeypatch):
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    res = runner.invoke(app, ["runpod-template", CELL, "--release-index", str(index), "--create"])
    assert res.exit_code == 2 and "RUNPOD_API_KEY" in res.output


def test_unpublished_cell_is_refused(app, runner, index):
    res = runner.invoke(app, ["runpod-template", "cu999-torch9-py3.99-tf0", "--release-index", str(index)])
    assert res.exit_code == 2 and "hint:" in res.output
