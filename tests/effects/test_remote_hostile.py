"""What a malicious registry, release record or provider API can do, and where credentials may go: against real
servers on 127.0.0.1 (Debian's docker-registry with htpasswd auth as the honest registry; tests/hostile_http.py's
recording servers as the attacker's registry and a lying RunPod)."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagekit.clouds import runpod
from imagekit.effects import registry as registry_api
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.oci import release_record
from imagekit.services.publishing import release_index
from tests import hostile_http
from tests.fakes import PASSED
from tests.hostile_http import Seen, serve
from tests.registry import Registry, free_port
from tests.services.test_release import push_image

pytestmark = pytest.mark.usefixtures("no_internet")  # a tag on ghcr.io is checked before --create

USER, PASSWORD = "ci-bot", "Reg1stryPassw0rd"
CELL_A, CELL_B, CELL_C = (
    "cu124-torch2.5.1-py3.11-tf4.48.2",
    "cu121-torch2.1.2-py3.11-tf4.48.2",
    "cu118-torch2.0.1-py3.10-tf4.40.0",
)
BUILD = "0123456789ab"
REPO = "imagekit-test/train"


@pytest.fixture(scope="module")
def honest_registry(tmp_path_factory):
    """The user's registry: it takes only USER/PASSWORD."""
    reg = Registry(tmp_path_factory.mktemp("good-reg"), free_port(), auth=(USER, PASSWORD)).start()
    yield reg
    reg.stop()


@pytest.fixture
def creds(monkeypatch):
    monkeypatch.setenv("IMAGEKIT_REGISTRY_USER", USER)
    monkeypatch.setenv("IMAGEKIT_REGISTRY_PASSWORD", PASSWORD)


def _entry(repo: str, cell: str, digest: str, config: str | None = None) -> dict:
    published = release_record.Published(f"{repo}:{cell}-{BUILD}", f"{repo}:{cell}", digest, False, config)
    manifest = {"cell": {"id": cell}}
    return release_index.release_entry(published, lock_hash="l" * 64, manifest=manifest, report=PASSED, size=1)


def _index(path: Path, *entries: dict) -> str:
    text = json.dumps({"schema": 1, "images": {e["tag"]: e for e in entries}}, indent=2)
    path.write_text(text)
    return text


def _clean(output: str) -> None:
    """What every failure must look like: `error:` + `hint:`, no traceback, no escape sequence."""
    assert "Traceback" not in output and "\x1b" not in output, output
    assert "error:" in output and "hint:" in output, output


# ---- HIGH 3: registry credentials go only to the registry they were given for -------------------------------------
def test_merge_sends_no_credentials_to_a_registry_the_user_did_not_name(app, runner, honest_registry, creds, in_tmp):
    """The index lists images of the user's registry; a record (a CI artifact anyone with a runner can upload)
    names the attacker's. Nothing of the credentials reaches it, the merge names the record, nothing is written,
    and `runpod-template` never gives the cell the attacker's image."""
    repo = f"{honest_registry.address}/{REPO}"
    d0, c0 = push_image(honest_registry, REPO, f"{CELL_A}-{BUILD}", "a", auth=(USER, PASSWORD))
    before = _index(in_tmp / "index.json", _entry(repo, CELL_A, d0, c0))
    d1, c1 = push_image(honest_registry, REPO, f"{CELL_B}-{BUILD}", "b", auth=(USER, PASSWORD))
    release_index.write_record(in_tmp / "records" / "runner-1", _entry(repo, CELL_B, d1, c1))
    with hostile_http.registry() as evil:
        image = evil.add_image(REPO, f"{CELL_C}-{BUILD}")
        bad = release_index.write_record(
            in_tmp / "records" / "runner-2", _entry(f"{evil.address}/{REPO}", CELL_C, image.digest, image.config_digest)
        )
        res = runner.invoke(app, ["release", "merge", "records", "--index", "index.json"])
        leaked = evil.server.credentials_seen()
    assert leaked == [], f"credentials reached the attacker's registry: {leaked}"
    assert res.exit_code == 1, res.output
    _clean(res.output)
    assert str(bad.relative_to(in_tmp)) in res.output and evil.address in res.output and "--registry" in res.output
    assert (in_tmp / "index.json").read_text() == before
    tpl = runner.invoke(app, ["runpod-template", CELL_C, "--release-index", "index.json"])
    assert tpl.exit_code == 2 and evil.address not in tpl.stdout


def test_merge_takes_the_registries_the_user_names(app, runner, honest_registry, creds, in_tmp):
    """--registry HOST[/REPO] (repeatable) names where records may point and where the credentials go; a record
    elsewhere is refused before any request, even one on the named host but in another repository."""
    repo = f"{honest_registry.address}/{REPO}"
    digest, config = push_image(honest_registry, REPO, f"{CELL_B}-{BUILD}", "named", auth=(USER, PASSWORD))
    release_index.write_record(in_tmp / "records", _entry(repo, CELL_B, digest, config))
    with hostile_http.registry() as evil:
        image = evil.add_image(REPO, f"{CELL_C}-{BUILD}")
        release_index.write_record(
            in_tmp / "elsewhere", _entry(f"{evil.address}/{REPO}", CELL_C, image.digest, image.config_digest)
        )
        for flags in (["--registry", repo], ["--registry", honest_registry.address]):
            res = runner.invoke(app, ["release", "merge", "records", "elsewhere", "--index", "i.json", *flags])
            assert res.exit_code == 1 and "not a registry named" in res.output, res.output
        assert evil.seen == []
        other = f"{honest_registry.address}/other/repo"
        other_repo = runner.invoke(app, ["release", "merge", "records", "--index", "i.json", "--registry", other])
        assert other_repo.exit_code == 1 and "not a registry named" in other_repo.output, other_repo.output
    assert not (in_tmp / "i.json").exists()
    res = runner.invoke(app, ["release", "merge", "records", "--index", "i.json", "--registry", repo, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["added"] == [f"{repo}:{CELL_B}-{BUILD}"]
    # no --registry and no index to take them from: say how to name them
    (in_tmp / "i.json").unlink()
    res = runner.invoke(app, ["release", "merge", "records", "--index", "i.json"])
    assert res.exit_code == 2 and "--registry" in res.output, res.output
    bad = runner.invoke(app, ["release", "merge", "records", "--index", "i.json", "--registry", "ev il/../x"])
    assert bad.exit_code == 2 and "hint:" in bad.output


@pytest.mark.loopback
def test_a_record_digest_never_becomes_another_url_path(app, runner, creds, in_tmp):
    """`../../admin/delete?all=1#` as a record's digest: refused when the record is read, before any request."""
    with hostile_http.registry() as evil:
        repo = f"{evil.address}/{REPO}"
        image = evil.add_image(REPO, f"{CELL_A}-{BUILD}")
        before = _index(in_tmp / "index.json", _entry(repo, CELL_A, image.digest, image.config_digest))
        record = _entry(repo, CELL_B, "../../admin/delete?all=1#")
        (in_tmp / "records").mkdir()
        (in_tmp / "records" / release_record.record_name(record["tag"])).write_text(json.dumps(record))
        res = runner.invoke(app, ["release", "merge", "records", "--index", "index.json"])
        paths = [s.path for s in evil.seen]
    assert [p for p in paths if not p.startswith(f"/v2/{REPO}/")] == [], f"the registry was asked for {paths}"
    assert paths == []
    assert res.exit_code == 2 and "not a sha256 digest" in res.output, res.output
    _clean(res.output)
    assert (in_tmp / "index.json").read_text() == before


@pytest.mark.loopback
@pytest.mark.parametrize(
    "reference", ["../../admin", "latest/../../x", "sha256:abc", "tag?x=1", "a#b", "", "-x", "x" * 129, "tag\n"]
)
def test_the_registry_client_builds_no_url_from_an_unchecked_reference(reference):
    with serve() as server:
        client = registry_api.RegistryClient()
        remote = registry_api.Remote(server.address, "team/app")
        for call in (client.oci_manifest, client.oci_manifest_json, registry_api.anonymous_refusal):
            with pytest.raises(UsageError, match="not a tag or a digest"):
                call(remote, reference)
        for call in (client.blob_json, lambda r, d: client.blob(r, d, 10)):
            with pytest.raises(UsageError, match="not a sha256 digest"):
                call(remote, reference)
        with pytest.raises(UsageError):
            client.copy_tag(remote, reference, "latest")
    assert server.seen == []


@pytest.mark.parametrize("name", ["../admin", "Team/App", "team//app", "team/app/", "a" * 300, "team/app?x", ""])
def test_a_repository_name_outside_the_distribution_grammar_is_refused(name):
    with pytest.raises(UsageError):
        registry_api.Remote("127.0.0.1:5000", name)
    with pytest.raises(UsageError):
        registry_api.Remote.parse(f"127.0.0.1:5000/{name}")


@pytest.mark.loopback
def test_credentials_are_bound_to_their_registry():
    """The one rule in the client: Basic credentials go to the registries they were given for, and to the token
    realm such a registry names; to no other registry, whatever the caller asks."""
    with hostile_http.registry() as mine, hostile_http.registry() as other:
        mine.add_image("team/app", "v1")
        other.add_image("team/app", "v1")
        client = registry_api.RegistryClient(USER, PASSWORD, registries=[mine.address])
        assert client.oci_manifest(registry_api.Remote(mine.address, "team/app"), "v1") is not None
        assert client.oci_manifest(registry_api.Remote(other.address, "team/app"), "v1") is not None
        assert mine.server.auth_seen() == [hostile_http.basic(USER, PASSWORD)]
        assert other.server.auth_seen() == [None]
        # a registry outside the binding that asks for credentials gets none: a 401 is the answer
        other.override = lambda req: (401, {"WWW-Authenticate": f'Basic realm="{other.address}"'}, b"")
        with pytest.raises(EnvironmentFailure, match="none are given for it") as exc:
            client.oci_manifest(registry_api.Remote(other.address, "team/app"), "v1")
        assert "--registry" in exc.value.hint
        assert other.server.credentials_seen() == []


@pytest.mark.loopback
def test_a_challenge_from_where_a_redirect_led_gets_no_credentials():
    """The named registry redirects a manifest to another server, which answers 401 with a Bearer realm of its own:
    that is not the registry's challenge, so its realm never gets the registry's password."""
    with hostile_http.registry() as mine, hostile_http.serve() as evil:
        mine.add_image("team/app", "v1")
        evil.fallback = lambda req: (
            (200, {}, json.dumps({"token": "t"}).encode())
            if req.path.startswith("/token")
            else (401, {"WWW-Authenticate": f'Bearer realm="{evil.url}/token",service="x"'}, b"")
        )
        mine.override = lambda req: hostile_http.redirect(evil.url + req.path) if "/manifests/" in req.path else None
        client = registry_api.RegistryClient(USER, PASSWORD, registries=[mine.address])
        with contextlib.suppress(EnvironmentFailure):
            client.oci_manifest(registry_api.Remote(mine.address, "team/app"), "v1")
        assert evil.credentials_seen() == [], evil.credentials_seen()


# ---- HIGH 4: secrets that cannot go into a header are named, never printed -----------------------------------------
BAD_KEYS = [("rp_secret_key\r\n", "carriage return"), ("rp_secret\nkey", "line feed"), ("rp_sécret_key", "U+00E9")]


@pytest.fixture
def index(tmp_path):
    from tests.clouds.test_runpod import TAG, _write_index

    return _write_index(tmp_path / "index.json", TAG, {"ports": ["22/tcp"], "jupyter": False})


@pytest.mark.loopback
@pytest.mark.parametrize(("key", "why"), BAD_KEYS)
@pytest.mark.parametrize("command", ["runpod-template", "pod stop", "pod terminate"])
def test_a_runpod_key_that_cannot_be_a_header_is_named_never_printed(
    app, runner, index, monkeypatch, key, why, command
):
    monkeypatch.setenv("RUNPOD_API_KEY", key)
    with serve(fallback=lambda req: hostile_http.json_answer({"data": {"saveTemplate": {"id": "t1"}}})) as api:
        args = (
            ["runpod-template", CELL_B, "--release-index", str(index), "--create", "--api-url", f"{api.url}/graphql"]
            if command == "runpod-template"
            else [*command.split(), "abc123xyz456", "--api-url", f"{api.url}/v1"]
        )
        res = runner.invoke(app, args)
    assert "secret" not in res.output and "sécret" not in res.output, res.output
    assert res.exit_code == 2, res.output
    _clean(res.output)
    assert "RUNPOD_API_KEY" in res.output and why in res.output
    assert ("tr -d" in res.output) == ("\r" in key or "\n" in key), res.output
    assert api.seen == []  # nothing was sent


@pytest.mark.parametrize(("password", "why"), [("Reg1stry\r\n", "carriage return"), ("Reg1\nstry", "line feed")])
def test_a_registry_password_that_cannot_be_sent_is_named_never_printed(
    app, runner, honest_registry, monkeypatch, in_tmp, password, why
):
    monkeypatch.setenv("IMAGEKIT_REGISTRY_USER", USER)
    monkeypatch.setenv("IMAGEKIT_REGISTRY_PASSWORD", password)
    repo = f"{honest_registry.address}/{REPO}"
    digest, config = push_image(honest_registry, REPO, f"{CELL_A}-{BUILD}", "pw", auth=(USER, PASSWORD))
    release_index.write_record(in_tmp / "records", _entry(repo, CELL_A, digest, config))
    res = runner.invoke(app, ["release", "merge", "records", "--index", "i.json", "--registry", repo])
    assert "Reg1" not in res.output
    assert res.exit_code == 2, res.output
    _clean(res.output)
    assert "IMAGEKIT_REGISTRY_PASSWORD" in res.output and why in res.output
    assert not (in_tmp / "i.json").exists()


@pytest.mark.loopback
@pytest.mark.parametrize("token", ["tok\r\nX-Evil: 1", "tøken", "t" * 20_000, 17])
def test_a_token_the_token_service_sends_must_fit_a_header(token):
    with hostile_http.registry() as reg:
        reg.add_image("team/app", "v1")
        challenge = f'Bearer realm="{reg.server.url}/token",service="reg"'

        def override(req: Seen):
            if req.path.startswith("/token"):
                return hostile_http.json_answer({"token": token})
            if not (req.headers.get("Authorization") or "").startswith("Bearer"):
                return 401, {"WWW-Authenticate": challenge}, b""
            return None

        reg.override = override
        client = registry_api.RegistryClient(USER, PASSWORD, registries=[reg.address])
        with pytest.raises(EnvironmentFailure) as exc:
            client.oci_manifest(registry_api.Remote(reg.address, "team/app"), "v1")
    assert "token" in exc.value.message and "tok" not in exc.value.message.replace("token", "")
    assert exc.value.hint


# ---- HIGH 5: a password in a URL's user-info is never printed --------------------------------------------------
SECRET = "Pa55wordInUrl"


def _url_commands(base: str, index_file: Path) -> dict[str, list[str]]:
    url = base.replace("http://", f"http://u:{SECRET}@")
    return {
        "compat refresh": ["compat", "refresh", "--index-url", f"{url}/simple", "--out", "meta.json"],
        "compat refresh --check": ["compat", "refresh", "--check", "--index-url", f"{url}/simple"],
        "pod stop": ["pod", "stop", "abc123xyz456", "--api-url", f"{url}/v1"],
        "pod terminate": ["pod", "terminate", "abc123xyz456", "--api-url", f"{url}/v1"],
        "runpod-template --create": [
            "runpod-template",
            CELL_B,
            "--release-index",
            str(index_file),
            "--create",
            "--api-url",
            f"{url}/graphql",
        ],
        "lock": [
            "lock",
            "--cell",
            CELL_B,
            "--dir",
            "lockfiles",
            "--index-url",
            f"{url}/simple",
            "--torch-index-url",
            f"{url}/whl",
            "--jobs",
            "1",
        ],
    }


ANSWERS = {
    "dead port": None,
    "html": (200, {"Content-Type": "text/html"}, b"<html>sign in</html>"),
    "http 500": (500, {}, b"oops"),
    "http 404": (404, {}, b"no"),
    "redirect loop": (302, {"Location": "/loop"}, b""),
}


@pytest.mark.loopback
@pytest.mark.parametrize("answer", list(ANSWERS))
@pytest.mark.parametrize(
    "command", ["compat refresh", "compat refresh --check", "pod stop", "pod terminate", "runpod-template --create"]
)
def test_a_password_in_a_url_is_never_printed(app, runner, in_tmp, index, monkeypatch, command, answer):
    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    if ANSWERS[answer] is None:
        res = runner.invoke(app, _url_commands("http://127.0.0.1:9", index)[command])
    else:
        with serve(fallback=lambda req: ANSWERS[answer]) as server:
            res = runner.invoke(app, _url_commands(server.url, index)[command])
    assert SECRET not in res.output, res.output
    assert res.exit_code in (1, 2, 3), res.output
    assert "Traceback" not in res.output


@pytest.mark.resolver
def test_a_password_in_the_index_url_is_never_printed_by_lock(app, runner, in_tmp, index, fake_index):
    res = runner.invoke(app, _url_commands("http://127.0.0.1:9", index)["lock"])
    assert SECRET not in res.output and res.exit_code == 3, res.output


def test_display_redacts_user_info_and_secret_queries():
    from imagekit.trust import urls

    shown = urls.display(f"http://u:{SECRET}@h.example/simple/?private_token=abc&x=1")
    assert SECRET not in shown and "abc" not in shown and "h.example/simple/" in shown
    with pytest.raises(UsageError) as exc:
        urls.require_http(f"ftp://u:{SECRET}@h.example/x")
    assert SECRET not in exc.value.message


# ---- MEDIUM: what RunPod answers is checked, and shown only as plain text -------------------------------------------
@pytest.mark.loopback
@pytest.mark.parametrize("answer", list(hostile_http.RUNPOD_ANSWERS))
def test_create_says_created_only_for_a_saved_template(app, runner, index, monkeypatch, answer):
    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    with hostile_http.runpod(hostile_http.RUNPOD_ANSWERS[answer]) as api:
        args = ["runpod-template", CELL_B, "--release-index", str(index), "--create", "--api-url", f"{api.url}/graphql"]
        res = runner.invoke(app, args)
    assert res.exit_code == 3, res.output
    _clean(res.output)
    assert "created" not in res.output and "spoofed" not in res.output


@pytest.mark.loopback
def test_a_redirect_that_turns_the_post_into_a_get_is_not_created(app, runner, index, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    routes = {"/graphql": hostile_http.redirect("/landing", 302), "/landing": hostile_http.json_answer({"data": {}})}
    with serve(routes) as api:
        args = ["runpod-template", CELL_B, "--release-index", str(index), "--create", "--api-url", f"{api.url}/graphql"]
        res = runner.invoke(app, args)
    assert [s.method for s in api.seen] == ["POST", "GET"]
    assert res.exit_code == 3 and "created" not in res.output, res.output
    _clean(res.output)


@pytest.mark.loopback
@pytest.mark.parametrize("code", [302, 307])
def test_an_answer_from_where_a_redirect_led_is_not_runpods(app, runner, index, monkeypatch, code):
    """--api-url redirects to another server answering a saved template: the key stayed behind (never sent there),
    so nothing was created at RunPod, and the command must not say it was."""
    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    saved = hostile_http.json_answer({"data": {"saveTemplate": {"id": "t1", "name": "x"}}})
    with serve({"/graphql": saved}) as elsewhere:
        with serve({"/graphql": hostile_http.redirect(f"{elsewhere.url}/graphql", code)}) as api:
            args = ["runpod-template", CELL_B, "--release-index", str(index), "--create"]
            res = runner.invoke(app, [*args, "--api-url", f"{api.url}/graphql"])
        assert elsewhere.credentials_seen() == []
    assert res.exit_code == 3 and "created" not in res.output, res.output
    assert "redirected to another server" in res.output
    _clean(res.output)


@pytest.mark.loopback
def test_runpods_error_text_reaches_the_terminal_as_plain_text(app, runner, index, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    answer = hostile_http.json_answer({"errors": [{"message": hostile_http.SPOOF}]})
    with hostile_http.runpod(answer) as api:
        args = ["runpod-template", CELL_B, "--release-index", str(index), "--create", "--api-url", f"{api.url}/graphql"]
        res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    _clean(res.output)
    assert [line for line in res.output.splitlines() if line.startswith("error:")] == [
        line for line in res.output.splitlines() if line.startswith("error: RunPod rejected")
    ]
    assert "\u202e" not in res.output and "\x07" not in res.output and "rm -rf" in res.output


@pytest.mark.loopback
@pytest.mark.parametrize(
    "answer",
    [
        hostile_http.raw_json(hostile_http.nested(100_000)),
        hostile_http.raw_json('{"id": ' + hostile_http.HUGE_NUMBER + "}"),
        hostile_http.json_answer({"error": hostile_http.SPOOF}, 500),
    ],
)
@pytest.mark.parametrize("action", ["stop", "terminate"])
def test_pod_stop_survives_what_runpod_answers(app, runner, monkeypatch, answer, action):
    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    with hostile_http.runpod(answer) as api:
        res = runner.invoke(app, ["pod", action, "abc123xyz456", "--api-url", f"{api.url}/v1"])
    assert res.exit_code == 3, res.output
    _clean(res.output)


@pytest.mark.loopback
@pytest.mark.parametrize(
    "body", [hostile_http.nested(100_000), '{"schemaVersion": ' + hostile_http.HUGE_NUMBER + "}", '{"config": NaN}']
)
def test_a_registry_answer_of_hostile_json_is_exit_3(body):
    with hostile_http.registry() as reg:
        reg.override = lambda req: (200, {}, body.encode())  # no digest header: the JSON reader is what answers
        with pytest.raises(EnvironmentFailure) as exc:
            registry_api.RegistryClient().oci_manifest(registry_api.Remote(reg.address, "team/app"), "v1")
    assert exc.value.exit_code == 3 and exc.value.hint and "other bytes" not in exc.value.message


@pytest.mark.loopback
def test_a_registry_digest_header_that_is_no_digest_is_exit_3():
    with hostile_http.registry() as reg:
        image = reg.add_image("team/app", "v1")
        reg.override = lambda req: (200, {"Docker-Content-Digest": "../../x\x1b[31m"}, image.manifest)
        with pytest.raises(EnvironmentFailure) as exc:
            registry_api.RegistryClient().oci_manifest(registry_api.Remote(reg.address, "team/app"), "v1")
    assert "\x1b" not in exc.value.message


# ---- LOW: what the index check accepts, runpod-template can read; what goes into a template is bounded ------------
GOOD_ENTRY = {
    "tag": f"ghcr.io/acme/train:{CELL_B}-{BUILD}",
    "alias": f"ghcr.io/acme/train:{CELL_B}",
    "digest": "sha256:" + "a" * 64,
    "size_bytes": 5_000_000_000,
    "published_at": "2026-11-29T21:00:00Z",
    "manifest": {
        "cell": {"id": CELL_B, "torch": "2.1.2", "variant": "cu121", "transformers": "4.48.2", "python": "3.11"},
        "driver": {"minimum": "525.60.13"},
        "torch": {"archs": ["sm_80", "sm_90"]},
        "image": {"ports": ["22/tcp", "8888/http"], "jupyter": True},
    },
}
HOSTILE_VALUES = st.one_of(
    st.sampled_from(
        [
            None,
            True,
            0,
            -1,
            1e308,
            float("inf"),
            10**30,
            "",
            "22/tcp\nerror: x",
            "99999/tcp",
            "22/tcp,8888/http",
            "\x1b[31m",
            "a" * 10_000,
            [],
            {},
            ["22/tcp"],
            [22],
            {"x": 1},
            "sha256:" + "b" * 64,
            "ghcr.io/acme/train:x",
            "Ghcr.io/../x",
        ]
    ),
    st.text(max_size=20),
)
PATHS = [
    ("tag",),
    ("alias",),
    ("digest",),
    ("size_bytes",),
    ("published_at",),
    ("manifest",),
    ("manifest", "cell"),
    ("manifest", "cell", "id"),
    ("manifest", "cell", "torch"),
    ("manifest", "cell", "variant"),
    ("manifest", "cell", "python"),
    ("manifest", "driver"),
    ("manifest", "driver", "minimum"),
    ("manifest", "torch"),
    ("manifest", "torch", "archs"),
    ("manifest", "image"),
    ("manifest", "image", "ports"),
    ("manifest", "image", "jupyter"),
]
_PORTS = re.compile(r"\d{1,5}/(tcp|udp|http)(,\d{1,5}/(tcp|udp|http))*")


def _mutated(changes: list[tuple[tuple[str, ...], object, bool]]) -> dict:
    entry = json.loads(json.dumps(GOOD_ENTRY))
    for path, value, delete in changes:
        node = entry
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            if delete:
                node.pop(path[-1], None)
            else:
                node[path[-1]] = value
    return entry


@settings(derandomize=True, max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PATHS), HOSTILE_VALUES, st.booleans()), min_size=1, max_size=3))
def _an_entry_the_index_check_accepts_makes_a_sane_template(changes):
    entry = _mutated(changes)
    key = entry["tag"] if isinstance(entry.get("tag"), str) else "t"
    if release_record.index_problems({"images": {key: entry}}):
        ACCEPTED.append(False)
        return
    ACCEPTED.append(True)
    for with_digest in (False, True):
        tpl = runpod.template(entry, with_digest=with_digest)
        assert _PORTS.fullmatch(tpl["ports"]), tpl["ports"]
        assert isinstance(tpl["containerDiskInGb"], int) and 20 <= tpl["containerDiskInGb"] <= 20_000
        assert "\n" not in tpl["name"] and "\n" not in tpl["imageName"] and len(tpl["imageName"]) < 700
        for line in tpl["readme"].splitlines():
            assert line == runpod_printable(line)


ACCEPTED: list[bool] = []


@pytest.mark.seconds
def test_an_entry_the_index_check_accepts_makes_a_sane_template():
    """Every mutated entry the index check accepts makes a sane template; and the run is not vacuous: many mutated
    entries are accepted, many refused (counted in the same test, so no test order is assumed)."""
    ACCEPTED.clear()
    _an_entry_the_index_check_accepts_makes_a_sane_template()
    assert ACCEPTED.count(True) > 50 and ACCEPTED.count(False) > 50, (ACCEPTED.count(True), ACCEPTED.count(False))


def runpod_printable(line: str) -> str:
    from imagekit.trust import untrusted

    return untrusted.printable(line, 10_000)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("manifest", "image", "ports"), ["22/tcp\nerror: spoofed"]),
        (("manifest", "image", "ports"), ["70000/tcp"]),
        (("size_bytes",), 1e308),
        (("manifest", "cell", "torch"), "2.1.2\n# injected"),
        (("manifest", "torch", "archs"), "sm_80"),
        (("manifest", "driver"), "525"),
        (("digest",), "sha256:short"),
        (("alias",), "not a ref\n"),
    ],
)
def test_runpod_template_refuses_an_index_entry_it_cannot_use(app, runner, tmp_path, path, value):
    entry = _mutated([(path, value, False)])
    (tmp_path / "i.json").write_text(json.dumps({"schema": 1, "images": {entry["tag"]: entry}}))
    res = runner.invoke(app, ["runpod-template", CELL_B, "--release-index", str(tmp_path / "i.json")])
    assert res.exit_code == 2, res.output
    _clean(res.output)
    assert not [line for line in res.output.splitlines() if line.startswith("error: spoofed")]


@pytest.mark.loopback
def test_docker_logins_credentials_serve_merge_and_a_wrong_one_stops_build_before_it_builds(
    app, runner, honest_registry, in_tmp, tmp_path, monkeypatch
):
    """A user who only ran `docker login`: `release merge` verifies with those credentials; with a wrong saved
    password, `build --push` stops at once (exit 3), before any lock, base or build, naming `docker login`."""
    import base64

    def saved(password: str) -> None:
        auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
        (tmp_path / "docker").mkdir(exist_ok=True)
        (tmp_path / "docker" / "config.json").write_text(
            json.dumps({"auths": {honest_registry.address: {"auth": auth}}})
        )

    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    for name in ("IMAGEKIT_REGISTRY_USER", "IMAGEKIT_REGISTRY_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    repo = f"{honest_registry.address}/{REPO}"
    digest, config = push_image(honest_registry, REPO, f"{CELL_C}-{BUILD}", "dl", auth=(USER, PASSWORD))
    release_index.write_record(in_tmp / "records" / "runner-1", _entry(repo, CELL_C, digest, config))
    saved(PASSWORD)
    res = runner.invoke(app, ["release", "merge", "records", "--index", "i.json", "--registry", repo])
    assert res.exit_code == 0, res.output
    assert f"{repo}:{CELL_C}-{BUILD}" in json.loads((in_tmp / "i.json").read_text())["images"]
    saved("wrong-password")
    res = runner.invoke(app, ["build", "--cell", CELL_B, "--push", "--registry", repo, "--lock-dir", "nolocks"])
    assert res.exit_code == 3, res.output
    assert "refused the credentials" in res.output and f"docker login {honest_registry.address}" in res.output
    assert not (in_tmp / "nolocks").exists() and not (in_tmp / ".imagekit").exists()  # nothing was started
