"""The GPU clouds as the image knows them (imagekit/in_image/facts.py `PROVIDERS`): one table, read by the doctor and
the guard, so the two name the same provider from the same env, and no other in-image program writes a provider
fact of its own."""

from __future__ import annotations

import ast
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagekit.in_image import facts, guard, guard_files
from imagekit.in_image import imagekit_doctor as doctor
from tests.conftest import ROOT

IN_IMAGE = ROOT / "imagekit" / "in_image"
ENDERS = [row for row in facts.PROVIDERS if row.pod_id]  # the rows the guard can end a pod through
VARIABLES = sorted({v for row in facts.PROVIDERS for v in (*row.detect, row.pod_id, row.pod_key) if v})
KEY = "test_key_0123456789"


@pytest.fixture(autouse=True)
def own_secrets_and_log(monkeypatch, tmp_path):
    """The keys these tests hand the guard are taken out of its log lines in this test only; its log file is here."""
    monkeypatch.setattr(guard_files, "SECRETS", [])
    monkeypatch.setattr(guard_files, "LOG", str(tmp_path / "guard.log"))


# ---- the table ----------------------------------------------------------------------------------------------------
def test_each_provider_has_one_row_and_no_variable_names_two():
    names = [row.name for row in facts.PROVIDERS]
    assert len(names) == len(set(names)) and {"runpod", "vast"} <= set(names)
    detect = [v for row in facts.PROVIDERS for v in row.detect]
    assert len(detect) == len(set(detect)), detect
    assert all(row.volume_hint.startswith("on ") for row in facts.PROVIDERS)


@pytest.mark.parametrize("row", ENDERS, ids=lambda row: row.name)
def test_a_provider_the_guard_ends_pods_on_has_everything_a_call_needs(row):
    assert row.pod_id in row.detect  # the guard never acts on a cloud the doctor does not name
    assert (
        row.pod_key and row.api_override.startswith("IMAGEKIT_") and re.fullmatch(r"https://[a-z0-9.-]+/\S*", row.api)
    )
    for call in (row.stop, row.terminate, row.start):
        assert call.method in ("POST", "PUT", "DELETE") and call.path.startswith("/") and "{id}" in call.path
    assert guard.api_base(row.api, row.api_override) == row.api


def test_the_documented_variables():
    """docs/pods.md and the design notes: RunPod's RUNPOD_POD_ID and RUNPOD_API_KEY; Vast's CONTAINER_ID and
    CONTAINER_API_KEY (the doctor also knows Vast by VAST_CONTAINERLABEL)."""
    runpod, vast = facts.provider_named("runpod"), facts.provider_named("vast")
    assert (runpod.pod_id, runpod.pod_key, runpod.api) == (
        "RUNPOD_POD_ID",
        "RUNPOD_API_KEY",
        "https://api.runpod.io/v2",
    )
    assert (vast.pod_id, vast.pod_key, vast.api) == (
        "CONTAINER_ID",
        "CONTAINER_API_KEY",
        "https://console.vast.ai/api/v0",
    )
    assert set(vast.detect) == {"CONTAINER_ID", "VAST_CONTAINERLABEL"}
    with pytest.raises(KeyError):
        facts.provider_named("nimbus")


# ---- the doctor and the guard agree -------------------------------------------------------------------------------
@given(st.dictionaries(st.sampled_from(VARIABLES), st.sampled_from(["", "abc123", KEY])))
def test_the_doctor_and_the_guard_name_the_same_provider_from_the_same_env(env):
    named, _ = doctor.detect_provider(env)
    found = guard.provider(env)
    if found is not None:
        assert found[0] == named  # the guard ends pods only on the cloud the doctor says this is
    row = facts.detect_provider(env)
    if row is not None and row.pod_id and env.get(row.pod_id) and env.get(row.pod_key):
        assert found is not None  # and wherever that cloud gave the pod its id and key, the guard can end it


@pytest.mark.parametrize(
    ("env", "doctor_says", "guard_says"),
    [
        ({"CONTAINER_ID": "4242", "CONTAINER_API_KEY": KEY}, "vast", "vast"),  # what Vast sets in an instance
        ({"VAST_CONTAINERLABEL": "C.4242"}, "vast", None),  # Vast, but no key to end the instance with
        ({"CONTAINER_ID": "4242"}, "vast", None),
        ({"RUNPOD_POD_ID": "abc123", "RUNPOD_API_KEY": KEY}, "runpod", "runpod"),
        ({"RUNPOD_POD_ID": "abc123", "CONTAINER_ID": "4242", "CONTAINER_API_KEY": KEY}, "runpod", None),
        ({"LAMBDA_INSTANCE_ID": "i-1"}, "lambda", None),  # known to the doctor; the guard has no call there
        ({}, None, None),
    ],
)
def test_the_doctor_and_the_guard_on_each_clouds_env(env, doctor_says, guard_says):
    assert doctor.detect_provider(env)[0] == doctor_says
    found = guard.provider(env)
    assert (found[0] if found else None) == guard_says


@pytest.mark.parametrize("row", ENDERS, ids=lambda row: row.name)
@pytest.mark.parametrize("action", facts.GUARD_ACTIONS)
def test_the_guard_sends_each_rows_call(row, action):
    found = guard.provider({row.pod_id: "pod42", row.pod_key: KEY})
    call = getattr(row, action)
    assert found == (row.name, row.api, "pod42", KEY)
    assert guard.request(found, action) == (call.method, row.api + call.path.replace("{id}", "pod42"), call.body)


def test_without_credentials_the_guard_names_every_providers_variables(capsys):
    s, _ = guard.settings({})
    assert guard.act({}, s, "deadline", "stop", "reached") is False
    err = capsys.readouterr().err
    assert all(f"{row.pod_id}/{row.pod_key}" in err for row in ENDERS), err


# ---- written once -------------------------------------------------------------------------------------------------
def _literals(path):
    """The string constants of a module, its docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


@pytest.mark.seconds
def test_no_other_in_image_program_writes_a_provider_fact():
    facts_of = {v for row in facts.PROVIDERS for v in (*VARIABLES, row.api, row.api_override) if v}
    for path in sorted(IN_IMAGE.glob("*.py")):
        if path.name != "facts.py":
            written = [s for s in _literals(path) if any(f in s for f in facts_of)]
            assert not written, (path.name, written)
