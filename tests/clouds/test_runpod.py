"""RunPod template from the release index, and `--create` against a local HTTP server that checks the request."""

from __future__ import annotations

import http.server
import json
from typing import ClassVar

import pytest

from tests import loopback

pytestmark = pytest.mark.usefixtures("no_internet")  # a tag on ghcr.io is checked before --create

KEY = "rp_secret_key_123"
CELL = "cu121-torch2.1.2-py3.11-tf4.48.2"
TAG = f"ghcr.io/acme/train:{CELL}-0123456789ab"
# a loopback registry no one serves (port 9, discard): what is running on the machine plays no part
LOCAL_TAG = f"127.0.0.1:9/imagekit/train:{CELL}-0123456789ab"
DIGEST = "sha256:" + "a" * 64


def _write_index(path, tag, image=None):
    entry = {
        "tag": tag,
        "alias": tag.rsplit("-", 1)[0],
        "digest": DIGEST,
        "size_bytes": 5_318_482_994,
        "lock_hash": "b" * 64,
        "published_at": "2026-11-29T21:00:00Z",
        "selftest": {"passed": True},
        "manifest": {
            "cell": {
                "id": CELL,
                "torch": "2.1.2",
                "cuda": "12.1",
                "variant": "cu121",
                "transformers": "4.48.2",
                "python": "3.11",
            },
            "driver": {"minimum": "525.60.13"},
            "torch": {"archs": ["sm_80", "sm_90"]},
            **({"image": image} if image else {}),
        },
    }
    path.write_text(json.dumps({"schema": 1, "images": {tag: entry}}))
    return path


@pytest.fixture
def index(tmp_path):
    return _write_index(tmp_path / "index.json", TAG, {"ports": ["22/tcp"], "jupyter": False})


@pytest.mark.seconds
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
    assert tpl["ports"] == "22/tcp"  # only what the image serves: no Jupyter in it
    assert "PUBLIC_KEY" in tpl["readme"] and "/workspace" in tpl["readme"] and "not in this image" in tpl["readme"]
    # what to pick in the console, as `pod create` sets it: the host CUDA filter and the GPUs with kernels
    assert "Rent: CUDA version filter: 12.1, 12.2, " in tpl["readme"]
    assert "13.0 (the host's driver must be >= 525.60.13" in tpl["readme"]
    assert "GPUs it runs on: A10, A100" in tpl["readme"] and "RTX 5090" in tpl["readme"].split("not on:")[1]
    assert "GH200" not in tpl["readme"].split("GPUs it runs on:")[1].split(";")[0]  # a Grace (arm64) host
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
def runpod_graphql():
    _RunPod.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RunPod)
    loopback.start(server)
    yield f"http://127.0.0.1:{server.server_address[1]}/graphql"
    loopback.stop(server)


def test_create_calls_the_api_and_never_prints_the_key(app, runner, index, runpod_graphql, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    args = ["runpod-template", CELL, "--release-index", str(index), "--create", "--api-url", runpod_graphql]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert KEY not in res.output
    assert json.loads(res.stdout)["saveTemplate"]["id"] == "tpl-1"
    assert "warning: could not check that pods can pull ghcr.io/acme/train:" in res.output  # no internet here
    (call,) = _RunPod.seen
    assert call["auth"] == f"Bearer {KEY}" and "mutation saveTemplate" in call["body"]["query"]
    assert call["body"]["variables"]["input"]["imageName"] == TAG


def test_create_with_a_rejected_key(app, runner, index, runpod_graphql, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "wrong")
    args = ["runpod-template", CELL, "--release-index", str(index), "--create", "--api-url", runpod_graphql]
    res = runner.invoke(app, args)
    assert res.exit_code == 3 and "refused the API key" in res.output and "wrong" not in res.stdout


@pytest.mark.loopback
def test_create_with_a_non_json_answer_is_exit_3(app, runner, index, monkeypatch):
    """A proxy's login page or a wrong --api-url: `error:` and `hint:`, exit 3, no traceback, no key."""

    class Page(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>sign in</html>")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    loopback.start(server)
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/graphql"
        res = runner.invoke(app, ["runpod-template", CELL, "--release-index", str(index), "--create", "--api-url", url])
    finally:
        loopback.stop(server)
    assert res.exit_code == 3, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert "error:" in res.output and "hint:" in res.output and "Traceback" not in res.output
    assert KEY not in res.output


@pytest.mark.seconds
def test_create_without_a_key_is_usage_error(app, runner, index, monkeypatch):
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    res = runner.invoke(app, ["runpod-template", CELL, "--release-index", str(index), "--create"])
    assert res.exit_code == 2 and "RUNPOD_API_KEY" in res.output


@pytest.mark.parametrize(
    "text",
    ["{not json", "[]", '{"images": []}', '{"images": {"x": {"tag": "x"}}}', '{"images": {"x": {"manifest": {}}}}'],
)
def test_a_malformed_release_index_is_a_usage_error(app, runner, tmp_path, text):
    path = tmp_path / "index.json"
    path.write_text(text)
    res = runner.invoke(app, ["runpod-template", CELL, "--release-index", str(path)])
    assert res.exit_code == 2 and "error:" in res.output and "hint:" in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_unpublished_cell_is_refused(app, runner, index):
    res = runner.invoke(app, ["runpod-template", "cu999-torch9-py3.99-tf0", "--release-index", str(index)])
    assert res.exit_code == 2 and "hint:" in res.output


def test_jupyter_image_lists_its_port(app, runner, tmp_path):
    path = _write_index(tmp_path / "i.json", TAG, {"ports": ["22/tcp", "8888/http"], "jupyter": True})
    tpl = json.loads(runner.invoke(app, ["runpod-template", CELL, "--release-index", str(path)]).stdout)
    tpl = tpl["variables"]["input"]
    assert tpl["ports"] == "22/tcp,8888/http" and "JUPYTER_PASSWORD" in tpl["readme"]


@pytest.mark.parametrize(
    ("image", "why"),
    [
        ("127.0.0.1:5000/imagekit/train:x", "loopback"),
        ("localhost:5000/train:x", "local name"),
        ("192.168.1.20:5000/train:x", "not a public address"),
        ("10.0.0.5/train:x", "not a public address"),
        ("[::1]:5000/train:x", "loopback"),
        ("registry.internal/train:x", "local name"),
        ("LOCALHOST:5000/train:x", "local name"),
        ("localhost.:5000/train:x", "local name"),
        ("myreg:5000/train:x", "single-label"),
        ("127.1:5000/train:x", "loopback"),
        ("100.64.1.2/train:x", "not a public address"),
        ("[fe80::1]:5000/train:x", "not a public address"),
    ],
)
def test_unreachable_registries(image, why):
    from imagekit.clouds import runpod

    assert why in runpod.unreachable_registry(image)


@pytest.mark.parametrize("image", ["ghcr.io/acme/train:x", "acme/train:x", "train:x", "docker.io/acme/train:x"])
def test_public_registries(image):
    from imagekit.clouds import runpod

    assert runpod.unreachable_registry(image) is None


def test_create_refuses_a_loopback_registry(app, runner, tmp_path, runpod_graphql, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    path = _write_index(tmp_path / "i.json", LOCAL_TAG)
    args = ["runpod-template", CELL, "--release-index", str(path), "--create", "--api-url", runpod_graphql]
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "no pod can pull" in res.output and "hint:" in res.output
    assert _RunPod.seen == []  # nothing was sent
    printed = runner.invoke(app, ["runpod-template", CELL, "--release-index", str(path)])
    assert printed.exit_code == 0 and "warning: no pod can pull" in printed.stderr
    res = runner.invoke(app, [*args, "--allow-private-registry"])
    assert res.exit_code == 0 and _RunPod.seen[0]["body"]["variables"]["input"]["imageName"] == LOCAL_TAG
    assert res.exit_code == 0


def test_ipv4_forms_read_as_inet_aton_reads_them():
    """The pure reader of short, integer, hex and octal IPv4 forms agrees with the C library's inet_aton."""
    import ipaddress
    import random
    import socket

    from imagekit.clouds.pull import _inet_aton

    rng = random.Random(0)
    cases = ["127.1", "2130706433", "0x7f.1", "0177.0.0.1", "1.2.3.4.5", "256.1", "0x", "08", "1.2.65536", "", "1..2"]
    for _ in range(2000):
        values = [rng.choice([rng.randint(0, 300), rng.randint(0, 70000), rng.randint(0, 2**32)]) for _ in range(4)]
        forms = [rng.choice([str, hex, lambda v: "0" + oct(v)[2:]])(v) for v in values[: rng.randint(1, 4)]]
        cases.append(".".join(forms))
    for case in cases:
        try:
            want = ipaddress.ip_address(socket.inet_aton(case))
        except OSError:
            want = None
        assert _inet_aton(case) == want, case


@pytest.mark.loopback
def test_a_private_image_needs_registry_auth_for_create(app, runner, tmp_path, monkeypatch):
    """A template for an image only credentials can pull gives pods that never start: --create refuses it, naming
    RunPod's registry-auth setting; --registry-auth ID sets containerRegistryAuthId, and the printed template too."""
    from tests import hostile_http

    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    saved = {"data": {"saveTemplate": {"id": "t1", "name": "x", "imageName": "x"}}}
    with hostile_http.serve() as private, hostile_http.runpod(hostile_http.json_answer(saved)) as api:
        tag = f"{private.address}/imagekit/train:{CELL}-0123456789ab"
        private.routes[f"/v2/imagekit/train/manifests/{CELL}-0123456789ab"] = (
            401, {"WWW-Authenticate": 'Basic realm="private"'}, b"",
        )  # fmt: skip
        path = _write_index(tmp_path / "i.json", tag)
        create = ["runpod-template", CELL, "--release-index", str(path), "--create", "--allow-private-registry",
                  "--api-url", f"{api.url}/graphql"]  # fmt: skip
        res = runner.invoke(app, create)
        assert res.exit_code == 2, res.output
        assert "cannot pull" in res.output and "asks for credentials" in res.output
        assert "--registry-auth ID" in res.output and "Container Registry Auth" in res.output
        assert api.seen == []  # nothing was created
        res = runner.invoke(app, [*create, "--registry-auth", "clx9reg-auth_1"])
        assert res.exit_code == 0, res.output
        [request] = api.seen
        assert json.loads(request.body)["variables"]["input"]["containerRegistryAuthId"] == "clx9reg-auth_1"
    printed = runner.invoke(app, ["runpod-template", CELL, "--release-index", str(path), "--registry-auth", "a1"])
    assert json.loads(printed.stdout)["variables"]["input"]["containerRegistryAuthId"] == "a1"
    bad = runner.invoke(app, ["runpod-template", CELL, "--release-index", str(path), "--registry-auth", "a b\n"])
    assert bad.exit_code == 2 and "invalid --registry-auth" in bad.output and "hint:" in bad.output
