"""`imagekit ci init --reap`: the reaper as a scheduled workflow of its own (every half hour, the account key from a
secret), which actionlint (a real one) passes; the build workflow's schedule stays weekly."""

from __future__ import annotations

import re

import pytest

from tests.matrix.test_ci import _init, actionlint


@pytest.mark.seconds
def test_reap_is_a_scheduled_workflow_that_passes_actionlint(app, runner, in_tmp):
    res = _init(app, runner, "--reap", "--reap-older-than", "12h")
    assert res.exit_code == 0, res.output
    reaper = in_tmp / ".github" / "workflows" / "reap.yml"
    lint = actionlint(reaper)
    assert lint.returncode == 0 and lint.stdout == "", lint.stdout + lint.stderr
    text = reaper.read_text()
    assert re.search(r'^  schedule:\n    - cron: "\*/30 \* \* \* \*"', text, re.M)
    assert "RUNPOD_API_KEY: ${{ secrets.RUNPOD_API_KEY }}" in text
    assert re.search(r"^        run: imagekit pod reap --older-than 12h$", text, re.M)
    assert "sha256sum --check --strict" in text  # the committed wheel, checked, as the build jobs install it
    images = (in_tmp / ".github" / "workflows" / "images.yml").read_text()
    assert "pod reap" not in images and '- cron: "23 4 * * 1"' in images  # the builds' schedule is untouched
    assert "secret RUNPOD_API_KEY" in res.output


def test_reap_is_not_written_unless_asked(app, runner, in_tmp):
    assert _init(app, runner).exit_code == 0
    assert not (in_tmp / ".github" / "workflows" / "reap.yml").exists()
    res = _init(app, runner, "--force", "--reap-older-than", "12h")
    assert res.exit_code == 2 and "--reap-older-than needs --reap" in res.output
    res = _init(app, runner, "--force", "--reap", "--reap-older-than", "half a day")
    assert res.exit_code == 2 and "not a duration" in res.output


@pytest.mark.seconds
def test_reap_steps_for_vast_and_runpod_each_with_its_own_secret(app, runner, in_tmp):
    res = _init(app, runner, "--reap", "--reap-provider", "vast", "--reap-provider", "runpod")
    assert res.exit_code == 0, res.output
    reaper = in_tmp / ".github" / "workflows" / "reap.yml"
    lint = actionlint(reaper)
    assert lint.returncode == 0 and lint.stdout == "", lint.stdout + lint.stderr
    text = reaper.read_text()
    assert re.search(r"^        run: imagekit pod reap --provider vast$", text, re.M)
    assert re.search(r"^        run: imagekit pod reap --provider runpod$", text, re.M)
    for key in ("VAST_API_KEY", "RUNPOD_API_KEY"):
        assert f"{key}: ${{{{ secrets.{key} }}}}" in text
    assert "--reap-provider vast --reap-provider runpod" in text  # how to write it again
    assert "secrets VAST_API_KEY and RUNPOD_API_KEY" in res.output
    res = _init(app, runner, "--force", "--reap", "--reap-provider", "lambda")
    assert res.exit_code == 2 and "--reap-provider 'lambda': runpod or vast" in res.output
    res = _init(app, runner, "--force", "--reap-provider", "vast")
    assert res.exit_code == 2 and "--reap-provider needs --reap" in res.output
