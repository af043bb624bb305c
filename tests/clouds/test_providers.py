"""The provider registry (imagekit/clouds/providers.py): each GPU cloud's host row (declared by clouds/<name>.py, found
from facts.PROVIDERS) joins its in-pod row, and the API clients, the commands and pod creation take their provider
facts from it: each is written once, and a provider's command is built from its row."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import typer

from imagekit import cli
from imagekit.cli import build_app
from imagekit.clouds import pod_create, podwire, providers
from imagekit.effects import runpod_api, vast_api
from imagekit.in_image import facts
from tests.clouds.test_runpod import CELL, TAG, _write_index
from tests.conftest import ROOT

pytestmark = pytest.mark.usefixtures("no_internet")
PACKAGE = ROOT / "imagekit"
ROWS = {p.name: p for p in providers.PROVIDERS}


def test_each_host_row_joins_its_in_pod_row():
    assert len(ROWS) == len(providers.PROVIDERS) and {"runpod", "vast"} <= set(ROWS)
    for name, p in ROWS.items():
        assert p.pod is facts.provider_named(name) and providers.named(name) is p
        assert p.pod.stop is not None and p.pod.terminate is not None  # the guard can end what the host rents
        assert urlsplit(p.template_url).scheme == "https" and p.account_key.endswith("_API_KEY")
    with pytest.raises(KeyError):
        providers.named("lambda")  # the doctor knows it; the host rents nothing there


def test_the_endpoints_and_keys_as_documented():
    runpod, vast = providers.named("runpod"), providers.named("vast")
    assert (runpod.account_key, runpod.api, runpod.template_url) == (
        "RUNPOD_API_KEY",
        "https://api.runpod.io/v2",
        "https://api.runpod.io/graphql",
    )
    assert (vast.account_key, vast.template_url) == ("VAST_API_KEY", "https://console.vast.ai/api/v0/template/")
    assert providers.pod_provider() is runpod and pod_create.CLOUDS == ("secure", "community")
    assert podwire.parse_target("abc-64411f2a@SSH.runpod.io").gateway and not podwire.parse_target("root@h").gateway


def test_the_api_clients_take_their_defaults_from_the_registry():
    runpod, vast = providers.named("runpod"), providers.named("vast")
    assert (runpod_api.DEFAULT_API, runpod_api.DEFAULT_REST, runpod_api.KEY_VARIABLE) == (
        runpod.template_url,
        runpod.api,
        runpod.account_key,
    )
    assert (vast_api.DEFAULT_API, vast_api.KEY_VARIABLE) == (vast.template_url, vast.account_key)


# ---- the CLI, from the registry -----------------------------------------------------------------------------------
ROOT_COMMAND = typer.main.get_command(build_app())


def _option(command: str | tuple[str, ...], name: str):
    cmd = ROOT_COMMAND
    for part in (command,) if isinstance(command, str) else command:
        cmd = cmd.commands[part]
    return next(p for p in cmd.params if p.name == name)


@pytest.mark.parametrize("p", providers.PROVIDERS, ids=lambda p: p.name)
def test_each_providers_template_command_is_registered_from_its_row(p):
    assert cli.COMMANDS[p.template_command] == "template_cmd" and p.template_command == f"{p.name}-template"
    assert p.template_command in ROOT_COMMAND.commands
    lazy = typer.main.get_command(build_app(p.template_command))  # `imagekit runpod-template` imports one module
    assert list(lazy.commands) == [p.template_command]
    assert _option(p.template_command, "api_url").default == p.template_url
    assert p.account_key in _option(p.template_command, "create").help


@pytest.mark.parametrize("command", ["create", "start", "stop", "terminate", "reap"])
def test_pod_commands_default_to_the_pod_provider_and_its_own_api(command):
    """Each lifecycle command takes --provider (RunPod by default) and talks to that provider's own API base unless
    --api-url says otherwise (None: the provider's row decides)."""
    assert _option(("pod", command), "provider").default == providers.pod_provider().name
    assert _option(("pod", command), "api_url").default is None


def test_without_the_account_key_each_create_says_which_variable(app, runner, tmp_path, monkeypatch):
    index = _write_index(tmp_path / "index.json", TAG, {"ports": ["22/tcp"], "jupyter": False})
    for p in providers.PROVIDERS:
        monkeypatch.delenv(p.account_key, raising=False)
        args = [p.template_command, CELL, "--release-index", str(index), "--create"]
        res = runner.invoke(app, args + (["--registry-auth", "auth1"] if p.name == "runpod" else []))
        assert res.exit_code == 2 and f"--create needs {p.account_key}" in res.output, (p.name, res.output)


# ---- the template builders ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", providers.PROVIDERS, ids=lambda p: p.name)
def test_each_template_builder_pins_the_immutable_tag_and_asks_for_a_gpu(p, tmp_path):
    index = _write_index(tmp_path / "index.json", TAG, {"ports": ["22/tcp"], "jupyter": False})
    entry = json.loads(index.read_text())["images"][TAG]
    body = p.template(entry)
    text = json.dumps(body)
    alias = TAG.rsplit("-", 1)[0]
    assert body["name"] == f"imagekit {CELL}" and TAG.rsplit(":", 1)[1] in text and f'{alias}"' not in text
    assert "IMAGEKIT_REQUIRE_GPU" in text


# ---- written once -------------------------------------------------------------------------------------------------
def _literals(path: Path) -> list[str]:
    """The string constants of a module, docstrings left out (f-strings' literal parts included)."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and node.body
        if isinstance(node.body[0], ast.Expr)
    }
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            if id(n) not in docs]  # fmt: skip


@pytest.mark.seconds
def test_no_host_module_writes_a_provider_fact_of_the_registry():
    """The API bases, endpoints, account keys, in-pod variables and gateways are written in facts.py and the
    provider's own module, clouds/<name>.py, only (help prose such as "RunPod's API" is not a fact of the table)."""
    known: dict[str, set[str]] = {}
    for p in providers.PROVIDERS:
        known[p.name] = {urlsplit(p.api).netloc, urlsplit(p.template_url).netloc, p.account_key, p.ssh_gateway}
        known[p.name] |= {p.pod.pod_id, p.pod.pod_key, p.pod.api_override}
        known[p.name].discard("")
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "facts.py" or "in_image" in path.parts:
            continue
        mine = path.stem if path.parent.name == "clouds" else None
        facts_here = set().union(*(k for name, k in known.items() if name != mine))
        hits = [s for s in _literals(path) if any(k in s for k in facts_here)]
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert not found, found
