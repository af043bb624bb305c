"""`imagekit pod create`: hosts filtered by the cell's facts, the guard's env from flags, against a loopback stand-in of
RunPod's REST API (`POST /pods`) that records each request."""

from __future__ import annotations

import json

import pytest

from imagekit.clouds import runpod
from imagekit.errors import UsageError
from tests import hostile_http

KEY = "rp_create_key_0123"
CELL = "cu118-torch2.5.1-py3.11-tf4.48.2"
TAG = f"ghcr.io/acme/train:{CELL}-0123456789ab"


def _index(tmp_path, cell_extra=None, tag=TAG):
    cell = {"id": CELL, "cuda": "11.8", "torch": "2.5.1", "variant": "cu118", "transformers": "4.48.2",
            "python": "3.11", **(cell_extra or {})}  # fmt: skip
    entry = {
        "tag": tag,
        "alias": tag.rsplit("-", 1)[0],
        "digest": "sha256:" + "a" * 64,
        "size_bytes": 6_000_000_000,
        "lock_hash": "b" * 64,
        "published_at": "2026-12-01T10:00:00Z",
        "selftest": {"passed": True},
        "manifest": {"cell": cell, "image": {"ports": ["22/tcp", "8888/http"], "jupyter": True}},
    }
    path = tmp_path / "index.json"
    path.write_text(json.dumps({"schema": 1, "images": {tag: entry}}))
    return path


def _create(app, runner, index, *args, api=None):
    extra = ["--api-url", f"{api.url}/v2"] if api else []
    return runner.invoke(app, ["pod", "create", CELL, "--release-index", str(index), *extra, *args])


@pytest.mark.loopback
def test_the_request_carries_the_host_filters_the_guard_and_the_auth(app, runner, tmp_path, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    answer = hostile_http.json_answer({"id": "xedezhzb9la3ye", "status": "PROVISIONING", "cost": 0.43}, 201)
    with hostile_http.serve({"/v2/pods": answer}) as api:
        res = _create(
            app, runner, _index(tmp_path), "--gpu", "NVIDIA GeForce RTX 3090", "--count", "2", "--cloud", "community",
            "--max-runtime", "6h", "--idle-stop", "30m", "--on-exit", "stop", "--registry-auth", "clzdaifot0001",
            "--gpu-idle-stop", "45m",
            api=api,
        )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == "xedezhzb9la3ye" and "0.43 $/h" in res.stderr and "host CUDA 11.8+" in res.stderr
    (seen,) = api.seen
    assert (seen.method, seen.path, seen.headers["Authorization"]) == ("POST", "/v2/pods", f"Bearer {KEY}")
    body = json.loads(seen.body)  # RunPod's REST v2 CreatePodRequest
    gpu = body["gpu"]
    assert gpu["allowedCudaVersions"][0] == "11.8" and "13.0" in gpu["allowedCudaVersions"]
    assert (gpu["id"], gpu["count"]) == ("NVIDIA GeForce RTX 3090", 2)
    assert body["cloud"] == "COMMUNITY" and body["registry"] == "clzdaifot0001"
    assert body["image"] == TAG and body["ports"] == ["22/tcp", "8888/http"]
    assert body["mounts"] == {"persistent": {"size": 50, "path": "/workspace"}} and isinstance(body["disk"], int)
    assert set(body) <= {"name", "image", "gpu", "cloud", "disk", "mounts", "ports", "env", "registry"}
    assert body["env"]["IMAGEKIT_MAX_RUNTIME"] == "6h" and body["env"]["IMAGEKIT_IDLE_STOP"] == "30m"
    assert body["env"]["IMAGEKIT_ON_EXIT"] == "stop" and body["env"]["IMAGEKIT_REQUIRE_GPU"] == "1"
    assert body["env"]["IMAGEKIT_GPU_IDLE_STOP"] == "45m"
    assert KEY not in res.output


def test_a_gpu_the_cells_torch_has_no_kernels_for_is_refused_with_what_works(app, runner, tmp_path, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    res = _create(app, runner, _index(tmp_path), "--gpu", "NVIDIA GeForce RTX 5090")
    assert res.exit_code == 2
    assert "no kernels for NVIDIA GeForce RTX 5090 (sm_120" in res.output and "RTX 3090" in res.output
    assert "imagekit explain --arch RTX 5090 --torch X --cuda Y" in res.output  # an option explain has


def test_the_dry_run_prints_the_body_and_sends_nothing(app, runner, tmp_path):
    res = _create(app, runner, _index(tmp_path), "--gpu", "NVIDIA H100 80GB HBM3", "--dry-run")
    assert res.exit_code == 0, res.output
    body = json.loads(res.stdout)
    assert body["gpu"]["id"] == "NVIDIA H100 80GB HBM3" and "IMAGEKIT_MAX_RUNTIME" not in body["env"]


@pytest.mark.loopback
@pytest.mark.parametrize(
    "registry",
    ["127.0.0.1:5000", "localhost:5000", "10.0.0.7:5000", "registry.internal", "kind-registry:5000", "[::1]:5000"],
)
def test_an_image_no_pod_can_pull_is_refused_before_anything_is_sent(app, runner, tmp_path, monkeypatch, registry):
    """Not a dry run: the key is there and RunPod's API answers, yet a pod for an image on a loopback or private
    registry would sit in "pulling" forever, billing: refused (exit 2) with nothing sent to the API."""
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    created = hostile_http.json_answer({"id": "xedezhzb9la3ye", "cost": 0.44}, 201)
    with hostile_http.runpod(created) as api:
        res = _create(app, runner, _index(tmp_path, tag=f"{registry}/acme/train:{CELL}-0123456789ab"),
                      "--gpu", "NVIDIA GeForce RTX 3090", api=api)  # fmt: skip
        assert api.seen == []  # no request of any kind reached RunPod's API
    assert res.exit_code == 2, res.output
    assert f"error: no pod can pull {registry}/acme/train:" in res.output and "hint:" in res.output
    assert "xedezhzb9la3ye" not in res.output and "Traceback" not in res.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gpu", "Mystery GPU 9000"], "--arch sm_XY"),
        (["--gpu", "NVIDIA A100", "--max-runtime", "6 hours"], "not a duration"),
        (["--gpu", "NVIDIA A100", "--on-exit", "halt"], "stop or terminate"),
        (["--gpu", "NVIDIA A100", "--cloud", "moon"], "secure or community"),
        (["--gpu", "x\n; rm -rf /"], "not a GPU type id"),
        (["--gpu", "NVIDIA A100", "--registry-auth", "bad id!"], "--registry-auth"),
        (["--gpu", "Mystery GPU 9000", "--arch", "nan"], "--arch 'nan' is not a GPU architecture"),
        (["--gpu", "Mystery GPU 9000", "--arch", "sm_99999"], "is not a GPU architecture"),
    ],
)
def test_bad_flags_are_usage_errors_before_anything_is_sent(app, runner, tmp_path, args, says):
    res = _create(app, runner, _index(tmp_path), *args)
    assert res.exit_code == 2 and says in res.output, res.output


def test_an_unknown_gpu_with_its_arch_is_checked_by_the_arch(app, runner, tmp_path):
    res = _create(app, runner, _index(tmp_path), "--gpu", "Mystery GPU 9000", "--arch", "sm_90", "--dry-run")
    assert res.exit_code == 0, res.output
    res = _create(app, runner, _index(tmp_path), "--gpu", "Mystery GPU 9000", "--arch", "sm_120", "--dry-run")
    assert res.exit_code == 2 and "sm_120" in res.output


def test_an_index_entry_without_its_versions_is_refused(app, runner, tmp_path):
    res = _create(app, runner, _index(tmp_path, {"cuda": "$(reboot)"}), "--gpu", "NVIDIA A100", "--dry-run")
    assert res.exit_code == 2 and "names no runtime contract and no torch/CUDA versions" in res.output


def test_the_records_own_contract_decides_the_hosts(app, runner, tmp_path):
    """The image's runtime contract, as its release record carries it, wins over this imagekit's facts of the cell."""
    index = _index(tmp_path)
    doc = json.loads(index.read_text())
    doc["images"][TAG]["manifest"]["runtime"] = {
        "driver_min": "520.61.05", "cuda": "11.8", "cuda_major": 11, "sass": ["sm_90"], "ptx": None,
        "platform": "linux/amd64", "glibc_min": "2.28",
    }  # fmt: skip
    index.write_text(json.dumps(doc))
    res = _create(app, runner, index, "--gpu", "NVIDIA GeForce RTX 3090", "--dry-run")
    assert res.exit_code == 2 and "(sm_86; it has sm_90)" in res.output, res.output
    assert "(H100, H200)" in res.output  # GH200 has sm_90 too, on an arm64 host
    res = _create(app, runner, index, "--gpu", "NVIDIA H100 80GB HBM3", "--dry-run")
    assert res.exit_code == 0 and json.loads(res.stdout)["gpu"]["allowedCudaVersions"][0] == "11.8", res.output


@pytest.mark.parametrize(
    ("field", "value"),
    [("sass", ["sm_90", "$(reboot)"]), ("sass", "sm_90"), ("cuda", "12.2\n"), ("platform", "linux/s390x"),
     ("driver_min", None), ("ptx", "compute_90;x"), ("sass", []), ("sass", ["sm_90", "sm_90"]),
     ("cuda", "12.8"), ("cuda", "cu118")],
)  # fmt: skip
def test_a_hostile_contract_in_the_record_is_refused_naming_the_field(app, runner, tmp_path, field, value):
    index = _index(tmp_path)
    doc = json.loads(index.read_text())
    runtime = {"driver_min": "520.61.05", "cuda": "11.8", "sass": ["sm_90"], "platform": "linux/amd64"}
    doc["images"][TAG]["manifest"]["runtime"] = runtime | {field: value}
    index.write_text(json.dumps(doc))
    res = _create(app, runner, index, "--gpu", "NVIDIA H100 80GB HBM3", "--dry-run")
    assert res.exit_code == 2 and f"manifest.runtime.{field}" in res.output, res.output


def test_host_cuda_versions_are_the_images_or_newer_as_runpod_names_them():
    assert runpod.allowed_cuda_versions("12.4") == ["12.4", "12.5", "12.6", "12.7", "12.8", "12.9", "13.0"]
    # RunPod's list ends at 13.0: a 13.2 image runs on a 13.0 host's driver (minor-version compatibility: the 13.x
    # family's floor, 580.65.06, is the image's contract), so it is not refused
    assert runpod.allowed_cuda_versions("13.2") == ["13.0"]
    with pytest.raises(UsageError, match=r"no host CUDA version at or above 14\.0"):
        runpod.allowed_cuda_versions("14.0")


@pytest.mark.loopback
def test_runpods_answer_is_checked_before_it_is_shown(app, runner, tmp_path, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    for answer, says, code in (
        (hostile_http.json_answer({"id": "../../x\x1b[2J"}, 201), "no pod id", 3),
        (hostile_http.json_answer({"id": "abcd1234", "cost": "NaN"}, 201), "(?)", 0),
        ((400, {}, b"no instances of NVIDIA A100 \x1b[31mavailable"), "RunPod refused the pod", 1),
    ):
        with hostile_http.serve({"/v2/pods": answer}) as api:
            res = _create(app, runner, _index(tmp_path), "--gpu", "NVIDIA A100", api=api)
        assert res.exit_code == code and says in res.output and "\x1b" not in res.output, res.output


def test_the_runtime_contract_is_one_label_that_reads_back(data):
    from imagekit.image import naming, render
    from imagekit.image.buildplan import BaseRef, BuildPlan
    from imagekit.model import Cell
    from imagekit.services.locks.lock_cells import read_lock
    from tests.conftest import ROOT

    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11")
    lock = read_lock(ROOT / "lockfiles" / f"{cell.id}.txt")
    base = BaseRef(
        "b", "r.example.com/py@sha256:" + "c" * 64, "sha256:" + "c" * 64, "3.11", "2.36", "/usr/bin/python3.11"
    )
    files = render.render_plan(BuildPlan.make(cell, lock, base, "r.example.com/x", data))
    runtime = json.loads(files["rootfs/app/opt/imagekit/manifest.json"][0])["runtime"]
    assert runtime["driver_min"] == "525.60.13" and runtime["cuda_major"] == 12 and "sm_90" in runtime["sass"]
    assert runtime["platform"] == "linux/amd64" and runtime["glibc_min"] == "2.17"
    label = naming.runtime_label(runtime)
    assert f'"imagekit.runtime"="{label}"' in files["Dockerfile"][0].decode()
    back = naming.parse_runtime_label(label + " evil=1")
    assert back["sass"] == runtime["sass"] and back["driver_min"] == "525.60.13" and "evil" not in back


def test_a_grace_gpu_is_refused_for_an_amd64_image(app, runner, tmp_path):
    """GH200 and GB200 come on Grace (arm64) boards: an amd64 image would not start there, whatever its kernels."""
    for gpu in ("NVIDIA GH200 480GB", "NVIDIA GB200"):
        res = _create(app, runner, _index(tmp_path), "--gpu", gpu, "--dry-run")
        assert res.exit_code == 2 and "hosts are arm64 (Grace CPUs)" in res.output, res.output
        assert "linux/amd64" in res.output and "H100" in res.output


# ---- a 201 that cannot be read: RunPod accepted the request, so a pod may exist and bill -----------------------------
UNREADABLE_201 = {
    "HTML": (201, {"Content-Type": "text/html"}, b"<html><body>Created</body></html>"),
    "empty": (201, {}, b""),
    "JSON without id": hostile_http.json_answer({"status": "PROVISIONING", "cost": 0.44}, 201),
    "JSON list": hostile_http.json_answer([{"id": "abcd1234"}], 201),
    "id with escapes": hostile_http.json_answer({"id": "abcd1234\x1b[2J\x1b]0;owned\x07\nerror: spoofed"}, 201),
    "id too long": hostile_http.json_answer({"id": "a" * 65}, 201),
    "id a number": hostile_http.json_answer({"id": 1234567}, 201),
    "truncated": (201, {"Content-Type": "application/json", "Content-Length": "400"}, b'{"id": "abcd12'),
    "deeply nested": hostile_http.raw_json('{"id": "abcd1234", "x": ' + hostile_http.nested(100_000) + "}", 201),
    "huge number": hostile_http.raw_json('{"id": "abcd1234", "cost": ' + hostile_http.HUGE_NUMBER + "}", 201),
    "200 not JSON": (200, {}, b"\x1b[31mok\x1b[0m"),
}


@pytest.mark.loopback
@pytest.mark.parametrize("case", sorted(UNREADABLE_201))
def test_an_unreadable_answer_to_a_create_says_a_pod_may_exist_and_bill(app, runner, tmp_path, monkeypatch, case):
    """RunPod answered 2xx (it accepted the request: a pod may exist and bill from now on) but the answer cannot be
    read: exit 3 saying so, with how to find and stop it; nothing of the answer reaches the terminal raw."""
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    status = UNREADABLE_201[case][0]
    with hostile_http.serve({"/v2/pods": UNREADABLE_201[case]}) as api:
        res = _create(app, runner, _index(tmp_path), "--gpu", "NVIDIA A100", api=api)
    assert res.exit_code == 3, res.output
    assert f"RunPod accepted the request (HTTP {status})" in res.output, res.output
    assert "a pod may exist and bill" in res.output
    assert "imagekit pod terminate" in res.output and "console" in res.output and f"{api.url}/v2/pods" in res.output
    assert CELL in res.output  # the pod's name, to find it among others
    assert "\x1b" not in res.output and "\x07" not in res.output and "Traceback" not in res.output
    assert not any(line.startswith("error: spoofed") for line in res.output.splitlines()), res.output
    assert res.stdout == ""  # nothing a script would take for a pod id
    assert KEY not in res.output


PASSWORD = "pw_s3cret_0123"


@pytest.mark.loopback
@pytest.mark.parametrize(
    "answer",
    [
        (500, {}, b"boom"),
        (404, {}, b"no"),
        (401, {}, b"who"),
        (400, {}, f"bad request to http://u:{PASSWORD}@127.0.0.1/v2/pods".encode()),
        (201, {}, b"not json"),
        hostile_http.json_answer({"nope": 1}, 201),
        hostile_http.redirect("http://127.0.0.1:9/v2/pods", 307),
    ],
)
def test_an_api_url_with_credentials_is_redacted_in_every_message(app, runner, tmp_path, monkeypatch, answer):
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    with hostile_http.serve({"/v2/pods": answer}) as api:
        res = runner.invoke(
            app,
            ["pod", "create", CELL, "--release-index", str(_index(tmp_path)), "--gpu", "NVIDIA A100",
             "--api-url", f"http://u:{PASSWORD}@127.0.0.1:{api.port}/v1"],
        )  # fmt: skip
    assert res.exit_code in (1, 3), res.output
    assert "error:" in res.output and "Traceback" not in res.output
    assert PASSWORD not in res.output and KEY not in res.output, res.output


@pytest.mark.seconds
@pytest.mark.parametrize(
    "url",
    [
        f"http://u:{PASSWORD}@127.0.0.1:9/v1",  # nothing listens
        f"http://u:{PASSWORD}@[::1/v1",
        f"ftp://u:{PASSWORD}@127.0.0.1/v1",
        f"http://u:{PASSWORD}@127.0.0.1:99999/v1",
        f"http://127.0.0.1:9/v1?api_key={PASSWORD}",
    ],
)
def test_an_unusable_api_url_with_credentials_is_redacted(app, runner, tmp_path, monkeypatch, url):
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    res = runner.invoke(
        app, ["pod", "create", CELL, "--release-index", str(_index(tmp_path)), "--gpu", "NVIDIA A100", "--api-url", url]
    )
    assert res.exit_code in (2, 3), res.output
    assert "error:" in res.output and "Traceback" not in res.output
    assert PASSWORD not in res.output, res.output


@pytest.mark.loopback
def test_a_create_sent_but_never_answered_says_a_pod_may_exist(app, runner, tmp_path, monkeypatch):
    """The server reads the whole request and hangs up without an answer: RunPod may have made the pod."""
    import socketserver

    from tests import loopback

    class HangUp(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            length = 0
            while (line := self.rfile.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            self.rfile.read(length)  # the whole request arrived; no answer

    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), HangUp)
    loopback.start(server)
    try:
        url = f"http://u:{PASSWORD}@127.0.0.1:{server.server_address[1]}/v1"
        res = runner.invoke(
            app,
            ["pod", "create", CELL, "--release-index", str(_index(tmp_path)), "--gpu", "NVIDIA A100", "--api-url", url],
        )
    finally:
        loopback.stop(server)
    assert res.exit_code == 3, res.output
    assert "the request was sent, but no answer came" in res.output and "a pod may exist and bill" in res.output
    assert "imagekit pod terminate" in res.output and PASSWORD not in res.output and "Traceback" not in res.output
