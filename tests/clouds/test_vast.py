"""Vast.ai template from the release index per launch mode, and `--create` against a local HTTP stand-in of Vast's
template API that checks the request and answers as Vast does (or as a hostile server would)."""

from __future__ import annotations

import http.server
import json
from contextlib import contextmanager
from typing import ClassVar

import pytest

from imagekit.clouds import vast
from tests import loopback
from tests.clouds.test_runpod import CELL, DIGEST, TAG, _write_index

pytestmark = pytest.mark.usefixtures("no_internet")

KEY = "vast_secret_key_456"


@pytest.fixture
def index(tmp_path):
    path = _write_index(tmp_path / "index.json", TAG, {"ports": ["22/tcp", "8888/http"], "jupyter": True})
    doc = json.loads(path.read_text())
    doc["images"][TAG]["manifest"]["cell"]["cuda"] = "12.1"
    path.write_text(json.dumps(doc))
    return path


def _template(app, runner, index, *args):
    res = runner.invoke(app, ["vast-template", CELL, "--release-index", str(index), *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_ssh_launch_mode_runs_the_start_check_and_sshd_from_onstart(app, runner, index):
    body = _template(app, runner, index)
    assert (body["image"], body["tag"]) == tuple(TAG.rsplit(":", 1))  # the immutable tag, never a moving alias
    assert body["runtype"] == "ssh" and body["ssh_direct"] is True and body["use_ssh"] is True
    assert body["onstart"] == "/opt/imagekit/bin/entrypoint --onstart"  # Vast's entrypoint replaces the image's
    assert "-e IMAGEKIT_REQUIRE_GPU=1" in body["env"] and "-p 22:22" in body["env"]
    assert "-p 8888" not in body["env"]  # the image's JupyterLab is not started in this mode
    assert body["extra_filters"] == {  # hosts whose driver runs CUDA 12.1, whose GPU torch has kernels for
        "cuda_max_good": {"gte": 12.1},
        "compute_cap": {"in": [700, 750, 800, 860, 890, 900]},  # sm_50..sm_90 + PTX sm_90 (compat-facts)
        "cpu_arch": {"eq": "amd64"},
    }
    assert "GPUs it runs on: A10, A100" in body["readme"] and "RTX 5090" in body["readme"].split("not on:")[1]
    assert "not on GB200, GH200 hosts (Grace: arm64 CPUs; this image is linux/amd64)" in body["readme"]
    assert body["recommended_disk_space"] >= 18 and body["docker_login_repo"] == ""
    assert "imagekit-doctor &&" in body["readme"] and DIGEST in body["readme"]


def test_entrypoint_mode_keeps_the_images_entrypoint_and_its_ports(app, runner, index):
    body = _template(app, runner, index, "--launch", "entrypoint")
    assert body["runtype"] == "args" and body["onstart"] == "" and body["use_ssh"] is False
    assert "-p 22:22" in body["env"] and "-p 8888:8888" in body["env"]  # sshd and JupyterLab are the image's
    assert "PUBLIC_KEY" in body["readme"] and "job mode" in body["readme"]


def test_jupyter_mode_and_a_private_image(app, runner, index):
    body = _template(app, runner, index, "--launch", "jupyter", "--login")
    assert body["runtype"] == "jupyter" and body["jup_direct"] is True and body["onstart"].endswith("--onstart")
    assert body["docker_login_repo"] == "ghcr.io"  # Vast asks for the registry's credentials


def test_a_bad_launch_mode_is_a_usage_error(app, runner, index):
    res = runner.invoke(app, ["vast-template", CELL, "--release-index", str(index), "--launch", "direct"])
    assert res.exit_code == 2 and "ssh, jupyter, entrypoint" in res.output


def test_the_records_own_contract_makes_the_filters(app, runner, index):
    """What the image says of itself wins over what this imagekit's facts would say of its cell."""
    doc = json.loads(index.read_text())
    runtime = {"driver_min": "535.54.03", "cuda": "12.1", "cuda_major": 12, "sass": ["sm_90"], "ptx": None,
               "platform": "linux/amd64", "glibc_min": "2.28"}  # fmt: skip
    doc["images"][TAG]["manifest"]["runtime"] = runtime
    index.write_text(json.dumps(doc))
    body = _template(app, runner, index)
    assert body["extra_filters"]["compute_cap"] == {"in": [900]} and body["extra_filters"]["cuda_max_good"] == {
        "gte": 12.1
    }
    assert "driver >= 535.54.03" in body["readme"] and "GPUs it runs on: H100, H200;" in body["readme"]


def test_a_hostile_cuda_in_the_index_gives_no_filter_and_no_crash():
    entry = json.loads(_write_index_doc())["images"][TAG]
    entry["manifest"]["cell"]["cuda"] = "12.1; rm -rf /"
    body = vast.template(entry)
    assert body["extra_filters"] == {} and "rm -rf" not in body["readme"]


def _write_index_doc() -> str:
    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return _write_index(pathlib.Path(tmp) / "i.json", TAG).read_text()


# ---- --create against a stand-in of Vast's API -----------------------------------------------------------------
class _Vast(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list] = []
    answer: ClassVar[tuple[int, bytes]] = (200, b"")

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append({"auth": self.headers.get("Authorization"), "body": body, "path": self.path})
        status, data = self.answer
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            status, data = 401, b'{"success": false, "msg": "bad key"}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def vast_api(status: int, answer: object):
    _Vast.seen = []
    _Vast.answer = (status, answer if isinstance(answer, bytes) else json.dumps(answer).encode())
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Vast)
    loopback.start(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api/v0/template/"
    finally:
        loopback.stop(server)


MADE = {
    "success": True,
    "msg": "Template Created Successfully! New Template ID: 7",
    "template": {"id": 7, "hash_id": "4e17788f74f075dd9aab7d0d4427968f"},
}


@pytest.mark.loopback
def test_create_posts_the_template_with_the_key_and_prints_its_hash_id(app, runner, index, monkeypatch):
    monkeypatch.setenv("VAST_API_KEY", KEY)
    with vast_api(200, MADE) as url:
        res = runner.invoke(app, ["vast-template", CELL, "--release-index", str(index), "--create", "--api-url", url])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"template": {"id": 7, "hash_id": MADE["template"]["hash_id"]}}
    (seen,) = _Vast.seen
    assert seen["auth"] == f"Bearer {KEY}" and seen["body"]["image"] == TAG.rsplit(":", 1)[0]
    assert KEY not in res.output


@pytest.mark.loopback
@pytest.mark.parametrize(
    ("status", "answer", "code", "says"),
    [
        (200, {"success": False, "msg": "image not allowed\x1b[31m"}, 1, "Vast did not create the template"),
        (200, {"success": True, "template": {"id": "7", "hash_id": "x"}}, 3, "did not say which template"),
        (200, {"success": True, "template": {"id": 7, "hash_id": "../../etc"}}, 3, "not one"),
        (200, b"<html>gateway</html>", 3, "did not answer JSON"),
        (200, b"[" * 5000 + b"]" * 5000, 3, "Vast API"),
        (500, {"success": False, "error": "internal"}, 1, "internal"),
    ],
)
def test_what_vast_answers_is_checked_before_it_is_used(app, runner, index, monkeypatch, status, answer, code, says):
    monkeypatch.setenv("VAST_API_KEY", KEY)
    with vast_api(status, answer) as url:
        res = runner.invoke(app, ["vast-template", CELL, "--release-index", str(index), "--create", "--api-url", url])
    assert res.exit_code == code, res.output
    assert says in res.output and "Traceback" not in res.output and "\x1b" not in res.output


@pytest.mark.loopback
def test_a_wrong_key_is_exit_3_naming_the_variable(app, runner, index, monkeypatch):
    monkeypatch.setenv("VAST_API_KEY", "wrong")
    with vast_api(200, MADE) as url:
        res = runner.invoke(app, ["vast-template", CELL, "--release-index", str(index), "--create", "--api-url", url])
    assert res.exit_code == 3 and "VAST_API_KEY" in res.output and "wrong" not in res.output.replace("wrong key", "")


def test_create_without_a_key_or_for_a_loopback_registry_is_refused(app, runner, tmp_path, monkeypatch):
    from tests.clouds.test_runpod import LOCAL_TAG

    monkeypatch.delenv("VAST_API_KEY", raising=False)
    local = _write_index(tmp_path / "local.json", LOCAL_TAG)
    res = runner.invoke(app, ["vast-template", CELL, "--release-index", str(local), "--create"])
    assert res.exit_code == 2 and "no instance can pull" in res.output
    res = runner.invoke(
        app, ["vast-template", CELL, "--release-index", str(local), "--create", "--allow-private-registry"]
    )
    assert res.exit_code == 2 and "VAST_API_KEY" in res.output


def test_two_entries_for_a_cell_one_without_a_date_and_one_without_cuda(app, runner, tmp_path):
    path = _write_index(tmp_path / "i.json", TAG)
    doc = json.loads(path.read_text())
    del doc["images"][TAG]["manifest"]["cell"]["cuda"]  # a record from before cells named their CUDA
    older = json.loads(json.dumps(doc["images"][TAG]))
    older["tag"] = TAG.replace("0123456789ab", "ba9876543210")
    older["published_at"] = None
    doc["images"][older["tag"]] = older
    path.write_text(json.dumps(doc))
    res = runner.invoke(app, ["vast-template", CELL, "--release-index", str(path)])
    assert res.exit_code == 0 and json.loads(res.stdout)["tag"] == TAG.rsplit(":", 1)[1], res.output
    assert "names no CUDA version" in res.stderr and "hint:" in res.stderr  # no offer filter: said, not silent
    res = runner.invoke(app, ["runpod-template", CELL, "--release-index", str(path)])
    assert res.exit_code == 0, res.output
