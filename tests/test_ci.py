"""`imagekit ci init` and the repository's workflow: actionlint (a real one) finds nothing, and they do not drift."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imagekit import ci

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / ".github" / "workflows" / "images.yml"


def actionlint(path: Path, labels: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """actionlint on one file; ``labels``: self-hosted runner labels, declared as a repository declares them
    (.github/actionlint.yaml), since actionlint reports a label it does not know."""
    exe = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    assert exe, "actionlint is in the test extra (pip install -e '.[test]')"
    argv = [exe, "-no-color"]
    if labels:
        config = path.parent / "actionlint.yaml"
        config.write_text("self-hosted-runner:\n  labels: [" + ", ".join(labels) + "]\n")
        argv += ["-config-file", str(config)]
    return subprocess.run([*argv, str(path)], capture_output=True, text=True, timeout=120)


def _init(app, runner, *args: str):
    return runner.invoke(app, ["ci", "init", *args])


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--gpu-runner", "gpu"],
        ["--gpu-runner", "self-hosted", "--gpu-runner", "h100", "--registry", "docker.io/acme/t"],
    ],
)
def test_written_workflow_passes_actionlint(app, runner, in_tmp, args):
    res = _init(app, runner, *args)
    assert res.exit_code == 0, res.output
    written = in_tmp / ".github" / "workflows" / "images.yml"
    lint = actionlint(written, tuple(a for i, a in enumerate(args) if i and args[i - 1] == "--gpu-runner"))
    assert lint.returncode == 0 and lint.stdout == "", lint.stdout + lint.stderr
    text = written.read_text()
    assert "fromJSON(needs.plan.outputs.matrix)" in text and "fail-fast: false" in text
    assert "imagekit release merge records" in text and "actions/upload-artifact@v4" in text
    if "--gpu-runner" in args:
        assert (
            "--gpus on --require-gpu" in text
            and "runs-on: ubuntu-latest\n    permissions:\n      contents: read\n      packages: write" not in text
        )
        assert "skipped, not passed" in text  # a GPU check skipped on a GPU runner is still reported as such
    else:
        assert "--gpus off" in text and "This runner has no GPU" in text
    if "--registry" in args:
        assert "registry: docker.io" in text and "secrets.REGISTRY_PASSWORD" in text
    else:
        assert "registry: ghcr.io" in text and "secrets.GITHUB_TOKEN" in text


def _job(text: str, name: str) -> str:
    """The lines of one job of a workflow (jobs are indented two spaces; their contents more)."""
    block = re.search(rf"^  {name}:\n((?:    .*\n|\n)+)", text.split("\njobs:\n", 1)[1], re.M)
    assert block, f"no job {name!r}"
    return block[1]


def test_the_schedule_checks_the_compatibility_data_against_pypi(app, runner, in_tmp):
    """The weekly run fails, in a job of its own, when PyPI has releases the compatibility data lacks."""
    assert _init(app, runner).exit_code == 0
    for text in ((in_tmp / ".github" / "workflows" / "images.yml").read_text(), COMMITTED.read_text()):
        assert re.search(r"^  schedule:\n    - cron: ", text, re.M)
        job = _job(text, "compat")
        assert "    if: github.event_name == 'schedule' || github.event_name == 'workflow_dispatch'\n" in job
        assert "needs:" not in job  # a lagging data file blocks no build, and a failed build does not skip it
        steps = re.findall(r"^        run: (.+)$", job, re.M)
        assert any(re.fullmatch(r"imagekit compat refresh --check( .*)?", run) for run in steps), steps
        assert "continue-on-error" not in job and "|| true" not in job  # its failure stays visible
        assert "imagekit compat refresh --check" not in _job(text, "plan")  # only on the schedule


def test_actionlint_catches_a_broken_workflow(tmp_path):
    """The lint above can fail: a typo'd job dependency and an unknown function are both reported."""
    broken = tmp_path / "images.yml"
    text = COMMITTED.read_text()
    broken.write_text(text.replace("needs: [plan, build]", "needs: [plan, biuld]").replace("fromJSON(", "fromJSN("))
    lint = actionlint(broken)
    assert lint.returncode == 1
    assert "biuld" in lint.stdout and "fromJSN" in lint.stdout


def test_committed_workflow_passes_actionlint_and_matches_ci_init():
    """.github/workflows/images.yml is `imagekit ci init --install .` (this repository installs itself)."""
    lint = actionlint(COMMITTED)
    assert lint.returncode == 0 and lint.stdout == "", lint.stdout + lint.stderr
    expected = ci.workflow(ci.CiOptions(install="."))
    assert COMMITTED.read_text() == expected, "regenerate: imagekit ci init --install . --force"


def test_ci_init_never_replaces_without_force(app, runner, in_tmp):
    out = in_tmp / "wf.yml"
    out.write_text("mine\n")
    res = _init(app, runner, "--out", "wf.yml")
    assert res.exit_code == 2 and "wf.yml exists" in res.output and "hint: pass --force" in res.output
    assert out.read_text() == "mine\n"
    res = _init(app, runner, "--out", "wf.yml", "--force", "--gpu-runner", "gpu")
    assert res.exit_code == 0 and "--require-gpu" in out.read_text()
    assert [p.name for p in in_tmp.iterdir()] == ["wf.yml"]  # written through a temp file, none left


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--gpu-runner", "gpu; rm -rf /"], "invalid --gpu-runner"),
        (["--gpu-runner", "${{ secrets.X }}"], "invalid --gpu-runner"),
        (["--install", "imagekit' && curl x"], "invalid --install"),
        (["--install", "--index-url=http://x"], "invalid --install"),
        (["--registry", "not a repo"], "image repository"),
    ],
)
def test_ci_init_refuses_values_that_would_break_the_workflow(app, runner, in_tmp, args, needle):
    res = _init(app, runner, *args)
    assert res.exit_code == 2 and needle in res.output and "hint:" in res.output
    assert not (in_tmp / ".github").exists()
