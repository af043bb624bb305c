"""A third GPU cloud is three files: its row of `facts.PROVIDERS` (in_image/facts.py), its module `clouds/<name>.py`
(host row, template builder, the spec of its command's options) and its API client `effects/<name>_api.py`. Acme, made
up here (the row below, the two modules under tests/clouds/third_provider/), is given to the registry exactly so: the
row appended to the facts table, the modules found by their names on the packages' paths. Nothing else is touched;
`imagekit acme-template` prints its template and creates it through a local stand-in of Acme's API, and its whole pod
lifecycle (`pod create`, `start`, `stop`, `terminate`, `reap` with `--provider acme`) goes through the same three."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

import imagekit.clouds
import imagekit.effects
from imagekit.cli import build_app, guard_options
from imagekit.clouds import providers
from imagekit.in_image import facts
from tests import hostile_http
from tests.clouds.test_runpod import CELL, TAG, _write_index

pytestmark = pytest.mark.usefixtures("no_internet")

FILES = Path(__file__).parent / "third_provider"  # clouds/acme.py, effects/acme_api.py
ROW = facts.ProviderFacts(  # what its row of facts.PROVIDERS would say
    "acme",
    detect=("ACME_POD_ID",),
    volume_hint="on Acme, a stopped machine keeps its disk; deleting it deletes the disk",
    pod_id="ACME_POD_ID",
    pod_key="ACME_POD_KEY",
    api="https://api.acme.example/v1",
    api_override="IMAGEKIT_ACME_API",
    stop=facts.PodCall("POST", "/machines/{id}/stop"),
    terminate=facts.PodCall("DELETE", "/machines/{id}"),
    start=facts.PodCall("POST", "/machines/{id}/start"),
)
MODULES = ("imagekit.clouds.acme", "imagekit.effects.acme_api")
KEY = "acme_secret_key_789"


@pytest.fixture
def acme(monkeypatch: pytest.MonkeyPatch) -> Iterator[providers.Provider]:
    monkeypatch.setattr(facts, "PROVIDERS", (*facts.PROVIDERS, ROW))
    monkeypatch.setattr(imagekit.clouds, "__path__", [*imagekit.clouds.__path__, str(FILES / "clouds")])
    monkeypatch.setattr(imagekit.effects, "__path__", [*imagekit.effects.__path__, str(FILES / "effects")])
    monkeypatch.setattr(providers, "PROVIDERS", providers.discover(facts.PROVIDERS))
    try:
        yield providers.named("acme")
    finally:
        for name in MODULES:
            sys.modules.pop(name, None)
            package, _, attr = name.rpartition(".")
            if hasattr(sys.modules[package], attr):
                delattr(sys.modules[package], attr)


@pytest.fixture
def index(tmp_path: Path) -> Path:
    return _write_index(tmp_path / "index.json", TAG, {"ports": ["22/tcp"], "jupyter": False})


def test_the_three_files_are_all_there_is(acme):
    assert sorted(str(p.relative_to(FILES)) for p in FILES.rglob("*.py")) == ["clouds/acme.py", "effects/acme_api.py"]
    assert [p.name for p in providers.PROVIDERS] == ["runpod", "vast", "acme"]  # the facts table's order
    assert acme.pod is ROW and acme.template_command == "acme-template"
    assert acme.template_url == "https://api.acme.example/v1/templates" and acme.pod_create
    assert Path(sys.modules["imagekit.clouds.acme"].__file__).is_relative_to(FILES)


def test_its_command_is_built_from_its_spec(acme):
    root = typer.main.get_command(build_app())
    assert list(root.commands)[7:10] == ["runpod-template", "vast-template", "acme-template"]
    command = root.commands["acme-template"]
    # the lifetime guard's options come with every provider's command: its template is guarded unless --no-guard
    assert [p.name for p in command.params] == [
        "ref", "release_index", "platform", "region", "spot", *guard_options.NAMES, "create", "api_url",
        "allow_private_registry",
    ]  # fmt: skip
    assert command.help == "Print the Acme template for a published image; --create makes it on Acme."
    assert command.epilog == (
        "Examples: imagekit acme-template cu121-torch2.1.2-py3.11-tf4.48.2; "
        "ACME_API_KEY=... imagekit acme-template CELL --region us --create"
    )
    options = {p.name: p for p in command.params}
    assert options["create"].help == "Call Acme's API (needs ACME_API_KEY)."
    assert options["api_url"].default == acme.template_url and options["region"].metavar == "eu|us"
    assert options["spot"].is_flag and options["spot"].opts == ["--spot"] and not options["spot"].secondary_opts
    lazy = typer.main.get_command(build_app("acme-template"))  # `imagekit acme-template` builds its command alone
    assert list(lazy.commands) == ["acme-template"]


def test_print_mode(acme, runner, index):
    res = runner.invoke(build_app(), ["acme-template", CELL, "--release-index", str(index), "--region", "us", "--spot"])
    assert res.exit_code == 0, res.output
    body = json.loads(res.stdout)
    assert body["image"] == TAG and body["region"] == "us" and body["interruptible"] is True
    assert body["min_cuda"] == "12.1"  # the image's contract
    assert body["env"] == {  # the lifetime guard, armed by default for a provider that only passes it on
        "IMAGEKIT_REQUIRE_GPU": "1", "IMAGEKIT_IDLE_STOP": "45m", "IMAGEKIT_ON_BLOCKER": "stop",
        "IMAGEKIT_BLOCKER_GRACE": "20m", "IMAGEKIT_ON_EXIT": "stop", "IMAGEKIT_HUNG_STOP": "60m",
        "IMAGEKIT_GUARD_ACTION": "stop",
    }  # fmt: skip
    assert "lifetime guard armed: stop after 45m idle" in res.stderr and "acme-template --no-guard" in res.stderr


@pytest.mark.seconds
def test_its_checks_run_where_the_spec_puts_them(acme, runner, tmp_path, index, monkeypatch):
    app = build_app()
    missing = str(tmp_path / "none.json")
    res = runner.invoke(app, ["acme-template", CELL, "--release-index", missing, "--region", "mars"])
    assert res.exit_code == 2 and "invalid --region 'mars'" in res.output  # before the release index is read
    monkeypatch.delenv("ACME_API_KEY", raising=False)
    res = runner.invoke(app, ["acme-template", CELL, "--release-index", str(index), "--create"])
    assert res.exit_code == 2 and "--create needs ACME_API_KEY in the environment" in res.output
    local = _write_index(tmp_path / "local.json", f"127.0.0.1:9/imagekit/train:{CELL}-0123456789ab")
    res = runner.invoke(app, ["acme-template", CELL, "--release-index", str(local), "--create"])
    assert res.exit_code == 2 and "no machine can pull" in res.output and "your machines reach it" in res.output


@pytest.mark.loopback
def test_create_goes_through_its_api_client(acme, runner, index, monkeypatch):
    monkeypatch.setenv("ACME_API_KEY", KEY)
    with hostile_http.serve({"/v1/templates": hostile_http.json_answer({"id": "tpl42"}, 201)}) as api:
        args = [
            "acme-template",
            CELL,
            "--release-index",
            str(index),
            "--create",
            "--api-url",
            f"{api.url}/v1/templates",
        ]
        res = runner.invoke(build_app(), args)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"template": {"id": "tpl42"}}
    assert f"created Acme template tpl42 for {TAG} in eu" in res.stderr and KEY not in res.output
    [request] = api.seen
    assert request.method == "POST" and request.headers["Authorization"] == f"Bearer {KEY}"
    assert json.loads(request.body)["image"] == TAG


@pytest.mark.loopback
def test_its_pod_lifecycle_goes_through_the_same_three_files(acme, runner, index, monkeypatch, tmp_path):
    """`pod create|start|stop|terminate|reap --provider acme`: the create request from its module, every call through
    its API client, the record naming its provider, the reaper reading its list with its module's reader."""
    import datetime as dt

    from imagekit.clouds import guard_defaults as gd

    monkeypatch.setenv("ACME_API_KEY", KEY)
    monkeypatch.setenv("IMAGEKIT_STATE", str(tmp_path / "state"))
    machines: dict[str, dict] = {}

    def route(seen):  # Acme: POST /machines, GET /machines, POST .../stop|start, DELETE /machines/{id}
        path = seen.path.removeprefix("/v1")
        if (seen.method, path) == ("POST", "/machines"):
            asked = json.loads(seen.body)
            machines["acm01"] = {"id": "acm01", "name": asked["name"], "state": "on", "env": asked["env"], "since": 1,
                              "gpu_percent": 0, "usd_per_hour": 0.5}  # fmt: skip
            return 201, {}, json.dumps({"id": "acm01", "usd_per_hour": 0.5}).encode()
        if (seen.method, path) == ("GET", "/machines"):
            return 200, {}, json.dumps({"machines": list(machines.values())}).encode()
        ident = path.split("/")[2]
        if seen.method == "DELETE":
            machines.pop(ident, None)
        else:
            machines[ident]["state"] = "off" if path.endswith("/stop") else "on"
        return 200, {}, b"{}"

    app = build_app()
    with hostile_http.serve(fallback=route) as api:
        base = ["--provider", "acme", "--api-url", f"{api.url}/v1"]
        res = runner.invoke(app, ["pod", "create", CELL, "--gpu", "NVIDIA H100 80GB HBM3", "--cloud", "us",
                                  "--release-index", str(index), *base])  # fmt: skip
        assert res.exit_code == 0, res.output
        assert res.stdout.strip() == "acm01" and "created Acme pod acm01 (0.5 $/h)" in res.stderr
        asked = json.loads(api.seen[0].body)
        assert asked["region"] == "us" and asked["env"]["IMAGEKIT_IDLE_STOP"] == "45m" and gd.CREATED in asked["env"]
        [record] = (tmp_path / "state" / "pods").iterdir()
        assert json.loads(record.read_text())["provider"] == "acme"
        for action in ("stop", "start"):
            res = runner.invoke(app, ["pod", action, "acm01", *base])
            assert res.exit_code == 0, res.output
        res = runner.invoke(app, ["pod", "reap", "--older-than", "1h", "--watch", "0s", "--dry-run", *base])
        assert res.exit_code == 0 and "acm01  RUNNING" in res.stdout and "recorded here" in res.stdout, res.output
        assert "not overdue (no deadline)" in res.stdout  # minutes old, not an hour
        res = runner.invoke(app, ["pod", "terminate", "acm01", "--yes", *base])
        assert res.exit_code == 0 and machines == {}, res.output
    assert [(s.method, s.path) for s in api.seen if s.method != "GET"] == [
        ("POST", "/v1/machines"), ("POST", "/v1/machines/acm01/stop"), ("POST", "/v1/machines/acm01/start"),
        ("DELETE", "/v1/machines/acm01"),
    ]  # fmt: skip
    assert all(s.headers["Authorization"] == f"Bearer {KEY}" for s in api.seen) and dt
