"""The one HTTP client, against real servers on 127.0.0.1: credentials never follow a redirect to another origin
(registry, RunPod, the doctor's Hub probe), only http(s) is read, downloads are bounded, and bad answers end in
`error:`/`hint:` with exit code 3."""

from __future__ import annotations

import hashlib
import json

import pytest

from imagekit.effects import http as client
from imagekit.effects import registry, remote_zip, runpod_api
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.in_image import imagekit_doctor as doc
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.services.wheels import fetch
from imagekit.trust import urls
from tests.hostile_http import Answer, Route, Seen, Server, basic, redirect, serve

# the recording server and its answers live in tests/hostile_http.py, shared with every remote feature's tests


# ---- the client's own rules ---------------------------------------------------------------------------------------
def test_origins():
    assert urls.origin("http://Example.org/a") == urls.origin("http://example.org:80/b")
    assert urls.origin("http://example.org/") != urls.origin("https://example.org/")
    assert urls.origin("http://127.0.0.1:5000/") != urls.origin("http://127.0.0.1:5001/")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.org/x", "/etc/passwd", "gopher://x/"])
def test_only_http_urls_are_read(url):
    with pytest.raises(UsageError, match="not an http"):
        client.get(url)


@pytest.mark.loopback
def test_a_cross_origin_redirect_drops_every_credential_header():
    with serve() as other, serve() as first:
        other.routes["/landed"] = (200, {}, b"here")
        first.routes["/start"] = redirect(f"{other.url}/landed")
        headers = {"Authorization": "Bearer t", "Cookie": "s=1", "X-Api-Key": "k", "Accept": "text/plain"}
        assert client.get(f"{first.url}/start", headers=headers) == b"here"
    (landed,) = other.seen
    assert {"authorization", "cookie", "x-api-key"}.isdisjoint(k.lower() for k in landed.headers)
    assert landed.headers["Accept"] == "text/plain"
    assert first.auth_seen() == ["Bearer t"]


@pytest.mark.loopback
def test_credentials_do_not_come_back_after_leaving_the_origin():
    """first -> other -> first: the second visit to the first origin carries no token either."""
    with serve() as other, serve() as first:
        first.routes["/start"] = redirect(f"{other.url}/bounce")
        other.routes["/bounce"] = redirect(f"{first.url}/end")
        first.routes["/end"] = (200, {}, b"ok")
        client.get(f"{first.url}/start", headers={"Authorization": "Bearer t"})
    assert first.auth_seen() == ["Bearer t", None] and other.auth_seen() == [None]


@pytest.mark.loopback
def test_a_same_origin_redirect_keeps_the_credentials():
    with serve() as server:
        server.routes["/old"] = redirect("/new", 301)
        server.routes["/new"] = (200, {}, b"ok")
        assert client.get(f"{server.url}/old", headers={"Authorization": "Bearer t"}) == b"ok"
    assert server.auth_seen() == ["Bearer t", "Bearer t"]


@pytest.mark.loopback
@pytest.mark.parametrize("target", ["file:///etc/passwd", "ftp://127.0.0.1/x"])
def test_a_redirect_out_of_http_is_refused(target):
    with serve({"/x": redirect(target)}) as server, pytest.raises(EnvironmentFailure) as exc:
        client.get(f"{server.url}/x")
    assert exc.value.exit_code == 3 and "redirected to" in exc.value.message and exc.value.hint


@pytest.mark.loopback
def test_a_redirect_loop_ends():
    with serve({"/a": redirect("/b"), "/b": redirect("/a")}) as server, pytest.raises(EnvironmentFailure) as exc:
        client.get(f"{server.url}/a")
    assert "redirects" in exc.value.message and len(server.seen) == client.MAX_REDIRECTS + 1


@pytest.mark.loopback
def test_5xx_is_retried_then_reported():
    answers = iter([(503, {}, b"busy"), (200, {}, b"ok")])
    with serve({"/flaky": lambda _: next(answers), "/down": (500, {}, b"no")}) as server:
        assert client.get(f"{server.url}/flaky") == b"ok"
        with pytest.raises(EnvironmentFailure, match="HTTP 500"):
            client.get(f"{server.url}/down")
    assert [s.path for s in server.seen] == ["/flaky", "/flaky", "/down", "/down", "/down"]


@pytest.mark.loopback
def test_a_post_is_not_repeated_after_a_5xx():
    with serve({"/api": (502, {}, b"")}) as server:
        status, _, _ = client.request("POST", f"{server.url}/api", content=b"{}")
    assert status == 502 and len(server.seen) == 1


@pytest.mark.loopback
def test_non_json_answer_is_an_environment_failure_with_a_hint():
    with serve({"/simple/x/": (200, {"Content-Type": "text/html"}, b"<html>login</html>")}) as server:
        with pytest.raises(EnvironmentFailure) as exc:
            client.get_json(f"{server.url}/simple/x/")
    assert exc.value.exit_code == 3 and "did not answer JSON" in exc.value.message and exc.value.hint


@pytest.mark.loopback
def test_unreachable_server_is_an_environment_failure():
    with serve() as server:
        url = server.url
    with pytest.raises(EnvironmentFailure, match="cannot reach"):
        client.get(f"{url}/gone")


# ---- registry: Basic and Bearer, blobs redirected to another origin --------------------------------------------------
CONFIG = b'{"rootfs": {"diff_ids": []}}'
C = "sha256:" + hashlib.sha256(CONFIG).hexdigest()
MANIFEST = json.dumps(
    {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": {"digest": C}}
).encode()
D = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()  # digests bind: the bytes' own
MANIFEST_ANSWER = (200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json", "Docker-Content-Digest": D})


def _remote(server: Server) -> registry.Remote:
    return registry.Remote(f"127.0.0.1:{server.port}", "team/app")


@pytest.mark.loopback
def test_registry_basic_credentials_stay_with_the_registry():
    with serve() as cdn, serve() as reg:
        cdn.routes["/store/manifest"] = (*MANIFEST_ANSWER, MANIFEST)
        reg.routes["/v2/team/app/manifests/latest"] = redirect(f"{cdn.url}/store/manifest", 307)
        info = registry.RegistryClient("ci", "s3cret", registries=[reg.address]).oci_manifest(_remote(reg), "latest")
    assert info == registry.OciManifest(D, C)
    assert reg.auth_seen() == [basic("ci", "s3cret")]
    assert cdn.auth_seen() == [None]


@pytest.mark.loopback
def test_registry_bearer_flow_and_same_origin_redirects():
    def guarded(answer: Answer) -> Route:
        def route(req: Seen) -> Answer:
            if req.headers.get("Authorization") != "Bearer tok":
                challenge = f'Bearer realm="{auth.url}/token",service="reg",scope="repository:team/app:pull"'
                return 401, {"WWW-Authenticate": challenge}, b"{}"
            return answer

        return route

    with serve() as auth, serve() as cdn, serve() as reg:
        auth.routes["/token"] = lambda req: (
            (200, {}, b'{"token": "tok"}') if req.headers.get("Authorization") == basic("ci", "pw") else (401, {}, b"")
        )
        reg.routes["/v2/team/app/manifests/latest"] = guarded(redirect(f"/v2/team/app/manifests/{D}"))
        reg.routes[f"/v2/team/app/manifests/{D}"] = guarded((*MANIFEST_ANSWER, MANIFEST))
        reg.routes[f"/v2/team/app/blobs/{C}"] = guarded(redirect(f"{cdn.url}/blob?sig=abc"))
        cdn.routes["/blob"] = (200, {}, CONFIG)
        client_ = registry.RegistryClient("ci", "pw", registries=[reg.address])
        assert client_.oci_manifest(_remote(reg), "latest") == registry.OciManifest(D, C)
        assert client_.blob_json(_remote(reg), C) == {"rootfs": {"diff_ids": []}}
    assert auth.auth_seen() == [basic("ci", "pw"), basic("ci", "pw")]
    # same-origin redirect: the token went along to the manifest by digest
    assert (f"/v2/team/app/manifests/{D}", "Bearer tok") in [(s.path, s.headers.get("Authorization")) for s in reg.seen]
    assert cdn.auth_seen() == [None]


@pytest.mark.loopback
def test_registry_non_json_manifest_is_exit_3():
    with serve({"/v2/team/app/manifests/latest": (200, {}, b"<html>proxy</html>")}) as reg:
        with pytest.raises(EnvironmentFailure) as exc:
            registry.RegistryClient().oci_manifest(_remote(reg), "latest")
    assert exc.value.exit_code == 3 and "did not answer JSON" in exc.value.message and "--registry" in exc.value.hint


@pytest.mark.loopback
def test_registry_refuses_a_token_realm_outside_http():
    challenge = 'Bearer realm="file:///etc/passwd",service="reg"'
    with serve({"/v2/team/app/manifests/latest": (401, {"WWW-Authenticate": challenge}, b"")}) as reg:
        with pytest.raises(EnvironmentFailure, match="token realm"):
            registry.RegistryClient("ci", "pw", registries=[reg.address]).oci_manifest(_remote(reg), "latest")


# ---- RunPod: the API key ---------------------------------------------------------------------------------------------
DATA = (200, {"Content-Type": "application/json"}, b'{"data": {"saveTemplate": {"id": "t"}}}')


@pytest.mark.loopback
def test_runpod_key_is_not_sent_to_another_origin():
    with serve({"/graphql": DATA}) as other, serve() as api:
        api.routes["/graphql"] = redirect(f"{other.url}/graphql", 307)
        with pytest.raises(EnvironmentFailure, match="redirected to another server"):
            runpod_api.post({"query": "q"}, "rp_key", f"{api.url}/graphql")  # whatever answers there is not RunPod
    assert api.auth_seen() == ["Bearer rp_key"]
    (landed,) = other.seen
    assert "rp_key" not in json.dumps(landed.headers) and json.loads(landed.body) == {"query": "q"}


@pytest.mark.loopback
def test_runpod_key_follows_a_same_origin_redirect():
    with serve({"/graphql": DATA, "/v1/graphql": redirect("/graphql", 308)}) as api:
        assert runpod_api.post({"query": "q"}, "rp_key", f"{api.url}/v1/graphql")["data"]["saveTemplate"]["id"] == "t"
    assert api.auth_seen() == ["Bearer rp_key", "Bearer rp_key"] and [s.method for s in api.seen] == ["POST", "POST"]


@pytest.mark.loopback
@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ((200, {}, b"<html>maintenance</html>"), EnvironmentFailure),
        ((200, {}, b"[1, 2]"), EnvironmentFailure),
        ((503, {}, b""), EnvironmentFailure),
        ((403, {}, b""), EnvironmentFailure),  # a refused key: exit 3, like an index refusing access
    ],
)
def test_runpod_bad_answers(answer, error):
    with serve({"/graphql": answer}) as api, pytest.raises(error) as exc:
        runpod_api.post({"query": "q"}, "rp_key", f"{api.url}/graphql")
    assert exc.value.hint and "rp_key" not in exc.value.message


def test_runpod_api_url_must_be_http():
    with pytest.raises(UsageError, match="--api-url"):
        runpod_api.post({}, "rp_key", "file:///etc/passwd")


# ---- the doctor's Hub probe (stdlib) -----------------------------------------------------------------------------
@pytest.mark.loopback
def test_doctor_hf_token_never_leaves_the_hub():
    info = json.dumps({"gated": "manual", "siblings": [{"rfilename": "config.json"}]}).encode()
    with serve() as cdn, serve() as hub:
        hub.routes["/api/models/org/old"] = redirect("/api/models/org/new", 307)  # a renamed repo
        hub.routes["/api/models/org/new"] = (200, {"Content-Type": "application/json"}, info)
        hub.routes["/org/old/resolve/main/config.json"] = redirect("/org/new/resolve/main/config.json", 307)
        hub.routes["/org/new/resolve/main/config.json"] = redirect(f"{cdn.url}/lfs/config.json")  # to the CDN
        result = doc.check_hf_repo("org/old", hub.url, "hf_tok")
    assert result["status"] == "pass" and "this token has access" in result["message"], result
    assert "moved to" in result["message"] and result["evidence"]["file_status"] == 302
    assert hub.auth_seen() == ["Bearer hf_tok"] * 4  # same origin: the token follows the rename
    assert cdn.seen == []  # another origin: not followed, so the token never goes there


@pytest.mark.loopback
def test_doctor_redirect_handler_follows_same_origin_only():
    with serve() as other, serve() as hub:
        other.routes["/x"] = (200, {}, b"elsewhere")
        hub.routes["/away"] = redirect(f"{other.url}/x")
        hub.routes["/here"] = redirect("/x")
        hub.routes["/x"] = (200, {}, b"home")
        code, _, body, final = doc._hub_get(f"{hub.url}/here", "t", 5)
        assert (code, body, final) == (200, "home", f"{hub.url}/x")
        code, headers, _, _ = doc._hub_get(f"{hub.url}/away", "t", 5)
        assert code == 302 and headers["Location"] == f"{other.url}/x"
    assert other.seen == [] and hub.auth_seen() == ["Bearer t"] * 3


# ---- the index: fetch and refresh ----------------------------------------------------------------------------------
WHEEL = "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"


def _page(url: str, sha: str, size: int | None = None) -> Answer:
    entry = {"filename": WHEEL, "url": url, "hashes": {"sha256": sha}, **({"size": size} if size is not None else {})}
    return (
        200,
        {"Content-Type": client.SIMPLE_JSON},
        json.dumps({"meta": {"api-version": "1.1"}, "files": [entry]}).encode(),
    )


def _fetch(index: str, sha: str) -> list[fetch.FetchedWheel]:
    lock = Lock((), (LockEntry("numpy", "1.26.4", (f"sha256:{sha}",)),), {"index": index})
    return fetch.fetch_lock(lock, "3.11", "2.36")


def _cache_files(tmp_path) -> list[str]:
    root = tmp_path / "cache"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path


@pytest.mark.loopback
def test_a_wheel_within_its_declared_size_is_fetched(cache):
    payload = b"w" * 1000
    sha = hashlib.sha256(payload).hexdigest()
    with serve({"/files/w.whl": (200, {}, payload)}) as idx:
        idx.routes["/simple/numpy/"] = _page("../../files/w.whl", sha, len(payload))  # relative, as PEP 691 allows
        (got,) = _fetch(f"{idx.url}/simple", sha)
    assert got.downloaded and got.path.read_bytes() == payload
    assert _cache_files(cache) == [f"wheels/{sha}/{WHEEL}"]


@pytest.mark.loopback
@pytest.mark.parametrize("length", ["declared", "unsaid"])
def test_a_download_larger_than_declared_is_refused_and_leaves_nothing(cache, length):
    payload = b"w" * 100_000
    sha = hashlib.sha256(payload).hexdigest()  # the right bytes: only the size gives it away
    headers = {} if length == "declared" else {"X-No-Length": "1"}
    with serve({"/files/w.whl": (200, headers, payload)}) as idx:
        idx.routes["/simple/numpy/"] = _page(f"{idx.url}/files/w.whl", sha, 10)
        with pytest.raises(EnvironmentFailure, match="larger than the 10 bytes") as exc:
            _fetch(f"{idx.url}/simple", sha)
    assert exc.value.exit_code == 3 and exc.value.hint
    assert _cache_files(cache) == []


@pytest.mark.loopback
def test_a_wrong_hash_leaves_nothing(cache):
    with serve({"/files/w.whl": (200, {}, b"other bytes")}) as idx:
        idx.routes["/simple/numpy/"] = _page(f"{idx.url}/files/w.whl", "a" * 64)
        with pytest.raises(CheckFailed, match="sha256"):
            _fetch(f"{idx.url}/simple", "a" * 64)
    assert _cache_files(cache) == []


@pytest.mark.loopback
@pytest.mark.parametrize("wheel_url", ["file:///etc/passwd", "ftp://127.0.0.1/w.whl"])
def test_an_index_cannot_point_the_client_at_files(cache, wheel_url):
    with serve() as idx:
        idx.routes["/simple/numpy/"] = _page(wheel_url, "a" * 64)
        with pytest.raises(EnvironmentFailure, match="not an http") as exc:
            _fetch(f"{idx.url}/simple", "a" * 64)
    assert exc.value.hint and _cache_files(cache) == []


@pytest.mark.loopback
def test_an_html_index_cannot_point_the_client_at_files(cache):
    """PEP 503: the file name comes from the URL's path, so a file:// URL naming a wheel is refused, not skipped."""
    html = f'<a href="file:///tmp/{WHEEL}#sha256={"a" * 64}">{WHEEL}</a>'.encode()
    with serve({"/simple/numpy/": (200, {"Content-Type": "text/html"}, html)}) as idx:
        with pytest.raises(EnvironmentFailure, match="not an http"):
            _fetch(f"{idx.url}/simple", "a" * 64)


def test_a_file_index_is_refused(cache):
    with pytest.raises(UsageError, match="the lock's index"):
        _fetch("file:///srv/simple", "a" * 64)


@pytest.mark.loopback
@pytest.mark.parametrize(
    ("answer", "needle"),
    [
        ((401, {"WWW-Authenticate": "Basic"}, b""), "HTTP 401"),
        ((200, {}, b"{not json"), "is not JSON"),
        ((200, {}, b'{"files": 3}'), "no list of files"),
        ((200, {}, b'{"files": [{"filename": 1}]}'), "without a filename"),
    ],
)
def test_bad_index_answers_are_exit_3(cache, answer, needle):
    with serve({"/simple/numpy/": answer}) as idx, pytest.raises(EnvironmentFailure, match=needle) as exc:
        _fetch(f"{idx.url}/simple", "a" * 64)
    assert exc.value.exit_code == 3 and exc.value.hint


@pytest.mark.loopback
def test_refresh_refuses_file_urls_in_the_index():
    from imagekit.services.locks.compat_refresh import simple_page

    with serve() as idx:
        idx.routes["/simple/torch/"] = _page("file:///etc/passwd", "a" * 64)
        with pytest.raises(EnvironmentFailure, match="not an http"):
            simple_page(f"{idx.url}/simple", "torch")
        idx.routes["/simple/torch/"] = _page("../../files/x.whl", "a" * 64)
        page = simple_page(f"{idx.url}/simple", "torch")
    assert page["files"][0]["url"] == f"{idx.url}/files/x.whl"


@pytest.mark.loopback
def test_remote_zip_needs_range_support():
    with serve({"/w.whl": (200, {}, b"PK whole file")}) as server, pytest.raises(EnvironmentFailure, match="range"):
        remote_zip.read_member(f"{server.url}/w.whl", ".dist-info/METADATA")


@pytest.mark.loopback
def test_the_shared_client_follows_the_proxy_environment(monkeypatch):
    """httpx reads the proxy settings when a client is made: a client made before they change must not be reused
    (a process that sets HTTPS_PROXY later, or a test sandbox, would otherwise bypass the proxy)."""
    for var in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
    ):
        monkeypatch.delenv(var, raising=False)
    with serve({"/x": (200, {}, b"direct")}) as srv:
        assert client.get(f"{srv.url}/x") == b"direct"
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens: through it, nothing is reached
        with pytest.raises(EnvironmentFailure, match="cannot reach"):
            client.get(f"{srv.url}/x")
        monkeypatch.delenv("HTTP_PROXY")
        assert client.get(f"{srv.url}/x") == b"direct"
    assert len(srv.seen) == 2
