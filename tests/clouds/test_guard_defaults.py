"""Every imagekit pod is guarded unless the user opts out: the env `pod create` and each template write by default
(stop, never terminate), what they say is armed, the opt-outs, and the marks `pod reap` finds imagekit's pods by."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from imagekit.clouds import guard_defaults as gd
from imagekit.clouds import reap, runpod, vast
from imagekit.errors import UsageError
from imagekit.in_image import guard
from tests.clouds.test_pod_create import CELL, _index

DEFAULTS = {
    "IMAGEKIT_IDLE_STOP": "45m",
    "IMAGEKIT_ON_BLOCKER": "stop",
    "IMAGEKIT_BLOCKER_GRACE": "20m",
    "IMAGEKIT_ON_EXIT": "stop",
    "IMAGEKIT_HUNG_STOP": "60m",
    "IMAGEKIT_GUARD_ACTION": "stop",
}
NOW = dt.datetime(2026, 12, 1, 10, 0, 0, tzinfo=dt.UTC)


def test_the_defaults_stop_and_never_terminate():
    env = gd.env(gd.GuardChoice())
    assert env == DEFAULTS
    assert "terminate" not in env.values()
    parsed, problems = guard.settings(env)  # the guard in the image reads every value as written
    assert problems == [] and guard.armed(parsed)
    assert (parsed["idle_stop"], parsed["on_blocker"], parsed["blocker_grace"]) == (2700, "stop", 1200)
    assert (parsed["on_exit"], parsed["action"], parsed["max_runtime"]) == ("stop", "stop", None)  # no deadline
    assert (parsed["hung_stop"], parsed["exit_grace"]) == (3600, 600)


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (gd.GuardChoice(no_guard=True), {}),
        (gd.GuardChoice(no_guard=True, deadline="6h"), {"IMAGEKIT_MAX_RUNTIME": "6h", "IMAGEKIT_GUARD_ACTION": "stop"}),
        (gd.GuardChoice(idle_stop="off", on_blocker="off", on_exit="off", hung_stop="off"), {}),
        (
            gd.GuardChoice(idle_stop="off", on_blocker="off", on_exit="off"),
            {"IMAGEKIT_HUNG_STOP": "60m", "IMAGEKIT_GUARD_ACTION": "stop"},
        ),
        (
            gd.GuardChoice(on_exit="stop", exit_grace="3m", hung_stop="2h"),
            {**DEFAULTS, "IMAGEKIT_EXIT_GRACE": "3m", "IMAGEKIT_HUNG_STOP": "2h"},
        ),
        (
            gd.GuardChoice(deadline="6h", idle_stop="30m", on_blocker="terminate", blocker_grace="5m"),
            {
                **DEFAULTS,
                "IMAGEKIT_MAX_RUNTIME": "6h",
                "IMAGEKIT_IDLE_STOP": "30m",
                "IMAGEKIT_ON_BLOCKER": "terminate",
                "IMAGEKIT_BLOCKER_GRACE": "5m",
            },
        ),
        (gd.GuardChoice(on_exit="terminate"), {**DEFAULTS, "IMAGEKIT_ON_EXIT": "terminate"}),
        (gd.GuardChoice(on_exit="terminate-always"), {**DEFAULTS, "IMAGEKIT_ON_EXIT": "terminate-always"}),
        (gd.GuardChoice(action="terminate"), {**DEFAULTS, "IMAGEKIT_GUARD_ACTION": "terminate"}),
    ],
)
def test_each_opt_out_and_each_ask(choice, expected):
    assert gd.env(choice) == expected


@pytest.mark.parametrize(
    ("choice", "says"),
    [
        (gd.GuardChoice(idle_stop="45 minutes"), "not a duration"),
        (gd.GuardChoice(on_exit="halt"), "--on-exit 'halt'"),
        (gd.GuardChoice(on_blocker="terminate-always"), "--on-blocker"),
        (gd.GuardChoice(action="off"), "--guard-action"),
        (gd.GuardChoice(deadline="off"), "not a duration"),
    ],
)
def test_a_value_the_guard_would_ignore_is_refused(choice, says):
    with pytest.raises(UsageError) as exc:
        gd.env(choice)
    assert says in exc.value.message


def test_terminate_is_said_to_mean_after_a_success_only():
    said = gd.armed(gd.env(gd.GuardChoice(on_exit="terminate")))
    assert (
        "terminate once every job and `pod run` has ended and nothing happened for 10m (no input, no `pod cp`) if "
        "they exited 0, else stop (IMAGEKIT_ON_EXIT)"
    ) in said


@pytest.mark.parametrize(
    ("choice", "says"),
    [
        (
            gd.GuardChoice(),
            "at most 1h30s after its last work (idle 45m; a process holding GPU memory with nothing "
            "else moving 60m; a look every 30s)",
        ),
        (gd.GuardChoice(hung_stop="off"), "at most 45m30s after its last work"),
        (gd.GuardChoice(idle_stop="2h"), "at most 2h30s after its last work"),
        (gd.GuardChoice(deadline="6h"), "at most 6h after its start (--deadline)"),
        (gd.GuardChoice(no_guard=True), "nothing stops this pod after its work ends"),
        (
            gd.GuardChoice(idle_stop="off", deadline="3h"),
            "nothing stops this pod after its work ends (no idle stop); at most 3h after its start",
        ),
    ],
)
def test_the_worst_case_is_said_as_the_armed_triggers_allow_it(choice, says):
    """The pod bills at most the longest window that can still be open after its last work, plus one look: idle, or
    hung where a process holds GPU memory (every other sign then absent); never a default deadline."""
    env = gd.env(choice)
    assert says in gd.worst_case(env) and "IMAGEKIT_MAX_RUNTIME" not in gd.env(gd.GuardChoice())
    said = gd.armed(gd.env(gd.GuardChoice(on_exit="terminate-always")))
    assert any("even after a failure" in s for s in said)


def _entry(tmp_path):
    return json.loads(_index(tmp_path).read_text())["images"].popitem()[1]


def test_the_runpod_template_is_armed_by_default_and_its_readme_says_how_to_turn_it_off(tmp_path):
    made = runpod.template(_entry(tmp_path))
    env = {e["key"]: e["value"] for e in made["env"]}
    assert {k: env[k] for k in DEFAULTS} == DEFAULTS and env[gd.CREATED] == "template"
    assert "IMAGEKIT_MAX_RUNTIME" not in env  # a deadline is offered, never defaulted
    assert "Lifetime guard (armed): stop after 45m idle (IMAGEKIT_IDLE_STOP)" in made["readme"]
    assert "`imagekit runpod-template --no-guard`" in made["readme"] and "off unless set" not in made["readme"]
    off = runpod.template(_entry(tmp_path), guard={})
    assert not {e["key"] for e in off["env"]} & set(DEFAULTS)
    assert "Lifetime guard: off (made with `imagekit runpod-template --no-guard`)" in off["readme"]


def test_the_vast_template_is_armed_by_default_and_its_readme_says_so(tmp_path):
    made = vast.template(_entry(tmp_path), launch="entrypoint")
    for key, value in DEFAULTS.items():
        assert f"-e {key}={value}" in made["env"]
    assert "Lifetime guard (armed)" in made["readme"] and "`imagekit vast-template --no-guard`" in made["readme"]
    assert "IMAGEKIT_ON_EXIT" not in vast.template(_entry(tmp_path), guard={})["env"]


@pytest.mark.parametrize("command", ["runpod-template", "vast-template"])
def test_each_template_command_arms_it_and_says_so(app, runner, tmp_path, command):
    index = str(_index(tmp_path))
    res = runner.invoke(app, [command, CELL, "--release-index", index, "--on-exit", "terminate-always"])
    assert res.exit_code == 0, res.output
    assert "lifetime guard armed: stop after 45m idle" in res.stderr and f"{command} --no-guard" in res.stderr
    assert "IMAGEKIT_ON_EXIT" in res.stdout and "terminate-always" in res.stdout
    res = runner.invoke(app, [command, CELL, "--release-index", index, "--no-guard"])
    assert res.exit_code == 0 and "lifetime guard: off" in res.stderr
    assert '"IMAGEKIT_IDLE_STOP"' not in res.stdout and "-e IMAGEKIT_IDLE_STOP" not in res.stdout  # the env only
    res = runner.invoke(app, [command, CELL, "--release-index", index, "--on-blocker", "later"])
    assert res.exit_code == 2 and "--on-blocker 'later'" in res.output


def _dry_run(app, runner, tmp_path, *args):
    res = runner.invoke(
        app, ["pod", "create", CELL, "--release-index", str(_index(tmp_path)), "--gpu", "NVIDIA A100", "--dry-run",
              *args],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["env"]


def test_pod_create_writes_the_defaults_and_its_mark(app, runner, tmp_path):
    env = _dry_run(app, runner, tmp_path)
    assert {k: env[k] for k in DEFAULTS} == DEFAULTS and "IMAGEKIT_MAX_RUNTIME" not in env
    assert gd.parse_stamp(env[gd.CREATED]) is not None and gd.DEADLINE not in env


def test_pod_create_offers_a_deadline_the_reaper_can_read(app, runner, tmp_path):
    env = _dry_run(app, runner, tmp_path, "--deadline", "6h", "--on-blocker", "terminate", "--on-exit", "terminate")
    assert env["IMAGEKIT_MAX_RUNTIME"] == "6h" and env["IMAGEKIT_ON_BLOCKER"] == "terminate"
    assert env["IMAGEKIT_ON_EXIT"] == "terminate"
    created, deadline = gd.parse_stamp(env[gd.CREATED]), gd.parse_stamp(env[gd.DEADLINE])
    assert deadline - created == dt.timedelta(hours=6)
    assert _dry_run(app, runner, tmp_path, "--max-runtime", "2h")["IMAGEKIT_MAX_RUNTIME"] == "2h"  # the old name


def test_pod_create_no_guard_arms_only_what_is_given(app, runner, tmp_path):
    env = _dry_run(app, runner, tmp_path, "--no-guard")
    assert not set(env) & {*DEFAULTS, "IMAGEKIT_MAX_RUNTIME"} and gd.CREATED in env  # still findable by `pod reap`
    env = _dry_run(app, runner, tmp_path, "--no-guard", "--idle-stop", "2h")
    assert env["IMAGEKIT_IDLE_STOP"] == "2h" and "IMAGEKIT_ON_EXIT" not in env


# ---- what `pod reap` decides ---------------------------------------------------------------------------------------
IDLE_RUNTIME = {"uptime": 7200, "gpus": [{"util": 0, "memoryUtil": 0}], "cpu": {"util": 1}, "memory": {"util": 9}}
BUSY_RUNTIME = {"uptime": 7200, "gpus": [{"util": 97, "memoryUtil": 80}], "cpu": {"util": 12}}


def _pod(**fields):
    """A pod as RunPod's REST v2 lists it (`GET /v2/pods`), reporting no work unless ``runtime`` says otherwise."""
    doc = {
        "id": "pod0000a",
        "name": "imagekit x",
        "status": "RUNNING",
        "cost": 0.44,
        "startedAt": "2026-12-01T08:00:00.123Z",
        "env": {gd.CREATED: "2026-12-01T07:00:00Z"},
        "runtime": IDLE_RUNTIME,
        **fields,
    }
    return runpod.reap_pod(doc, [])


@pytest.mark.parametrize(
    ("pod", "older_than", "terminate", "action"),
    [
        (_pod(), None, False, None),  # imagekit's, no deadline, no --older-than: listed only
        (_pod(env={gd.CREATED: "2026-12-01T07:00:00Z", gd.DEADLINE: "2026-12-01T09:59:00Z"}), None, False, "stop"),
        (_pod(env={gd.CREATED: "2026-12-01T07:00:00Z", gd.DEADLINE: "2026-12-01T10:01:00Z"}), None, False, None),
        (_pod(), 3 * 3600, False, "stop"),  # created 3h ago
        (_pod(), 3 * 3600 + 1, False, None),
        (_pod(env={gd.CREATED: "template"}), 2 * 3600 - 60, False, "stop"),  # a template's pod: from its last start
        (_pod(), 3600, True, "terminate"),
        (_pod(status="EXITED", runtime=None), 3600, False, None),  # stopped already: its GPU bills nothing
        (_pod(status="EXITED", runtime=None), 3600, True, "terminate"),
        (_pod(runtime=BUSY_RUNTIME), 3600, False, None),  # old, but training: age alone never ends it
        (_pod(runtime={"gpus": [{"util": 0}], "cpu": {"util": 60}}), 3600, False, None),  # CPU work is work too
        (_pod(runtime=None), 3600, True, None),  # its work is not reported: left to its deadline
        (_pod(runtime={"gpus": [{"util": "99"}], "cpu": None}), 3600, False, None),  # not a number: not reported
        (_pod(runtime=BUSY_RUNTIME, env={gd.CREATED: "x", gd.DEADLINE: "2026-12-01T09:00:00Z"}), None, False, "stop"),
        (_pod(status="STARTING"), 3600, False, "stop"),  # on its way to RUNNING: billed as one
        (_pod(env={}), 60, True, None),  # not imagekit's: never touched
        (_pod(env={"IMAGEKIT_CREATED": 7}), 60, True, None),  # a mark of another type is no mark
    ],
)
def test_reap_ends_only_imagekits_overdue_pods(pod, older_than, terminate, action):
    assert reap.decide(pod, NOW, older_than, terminate).action == action


def test_reap_says_what_a_pod_has_cost_since_its_start():
    pod = _pod()
    assert reap.cost_so_far(pod, NOW) == pytest.approx(0.88, rel=1e-3)  # 0.44 $/h, started 2h ago
    assert "0.44 $/h  ~0.88 $ since its last start" in reap.line(reap.decide(pod, NOW, None, False), NOW, True)
    assert reap.cost_so_far(_pod(status="EXITED"), NOW) is None
    assert runpod.reap_pod({"id": "../x"}, []) is None  # no id imagekit could act on: not listed
