"""`imagekit ci init` and the repository's workflow: actionlint (a real one) finds nothing, and they do not drift."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imagekit.errors import UsageError
from imagekit.matrix import ci_workflow as ci
from tests import hostile_http

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.mark.seconds
@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--gpu-runner", "gpu"],
        ["--gpu-runner", "self-hosted", "--gpu-runner", "h100", "--registry", "docker.io/acme/t"],
        ["--arm64-runner", "ubuntu-24.04-arm"],
        ["--gpu-runner", "h100", "--arm64-runner", "self-hosted", "--arm64-runner", "grace"],
    ],
)
def test_written_workflow_passes_actionlint(app, runner, in_tmp, args):
    res = _init(app, runner, *args)
    assert res.exit_code == 0, res.output
    written = in_tmp / ".github" / "workflows" / "images.yml"
    labels = tuple(a for i, a in enumerate(args) if i and args[i - 1] in ("--gpu-runner", "--arm64-runner"))
    lint = actionlint(written, labels)
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
    # each platform's cell is a job of its own, built for its platform, its report and record named apart
    assert 'imagekit build --cell "$CELL" --platform "$PLATFORM"' in text
    assert "release-record-${{ matrix.slug }}" in text
    if "--arm64-runner" in args:
        arm_labels = [a for i, a in enumerate(args) if i and args[i - 1] == "--arm64-runner"]
        arm = json.dumps(arm_labels, separators=(",", ":"))
        assert f"fromJSON(matrix.platform == 'linux/arm64' && '{arm}'" in text and "qemu-user-static" not in text
    else:
        assert "Emulate linux/arm64" in text and "if: matrix.platform == 'linux/arm64'" in text
    if "--registry" in args:
        assert "registry: docker.io" in text and "secrets.REGISTRY_PASSWORD" in text
    else:
        assert "registry: ghcr.io" in text and "secrets.GITHUB_TOKEN" in text


@pytest.mark.seconds
@pytest.mark.parametrize(
    "args", [["--pages"], ["--pages", "--gpu-runner", "gpu", "--arm64-runner", "ubuntu-24.04-arm"]]
)
def test_pages_publishes_the_release_page_after_the_release_with_github_pages_own_actions(app, runner, in_tmp, args):
    """`--pages`: a job after the release, on the default branch only, builds `imagekit release page` from the index
    this run merged and the failed builds' self-test reports (each build uploads its report, whatever happened), and
    deploys it with actions/upload-pages-artifact and actions/deploy-pages, with the permissions they need only."""
    res = _init(app, runner, *args)
    assert res.exit_code == 0, res.output
    assert "Settings > Pages > Source to GitHub Actions" in res.output
    written = in_tmp / ".github" / "workflows" / "images.yml"
    labels = tuple(a for i, a in enumerate(args) if i and args[i - 1] in ("--gpu-runner", "--arm64-runner"))
    lint = actionlint(written, labels)
    assert lint.returncode == 0 and lint.stdout == "", lint.stdout + lint.stderr
    text = written.read_text()
    assert text.startswith("# Build") and " --pages`" in text.splitlines()[1]  # how to write it again
    pages = _job(text, "pages")
    assert "    needs: release\n" in pages
    assert "needs.release.result == 'success'" in pages and "refs/heads/{0}" in pages  # the default branch only
    assert "      contents: read\n      pages: write" in pages and "      id-token: write" in pages
    assert "packages: write" not in pages and "contents: write" not in pages
    assert "    environment:\n      name: github-pages\n      url: ${{ steps.deployment.outputs.page_url }}" in pages
    assert re.search(r"uses: actions/upload-pages-artifact@v3\n        with:\n          path: \$\{\{ runner.temp }}"
                     r"/release-page\n", pages)  # fmt: skip
    assert "id: deployment\n        uses: actions/deploy-pages@v4" in pages
    assert (
        'imagekit release page --release-index releases/index.json --reports reports --out "$RUNNER_TEMP/release-page"'
        in pages
    )
    assert "pattern: release-index" in pages and "pattern: selftest-report-*" in pages
    assert pages.index("Install imagekit") < pages.index("imagekit release page")
    build = _job(text, "build")
    upload = build.index("name: selftest-report-${{ matrix.slug }}")
    assert "if: always()" in build[upload - 200 : upload] and "path: ${{ runner.temp }}/imagekit/reports/" in build
    assert text.count("      - name: Install imagekit\n") == 5
    # the job's own command line, run here as the runner runs it: the options it names exist and do what it needs
    [line] = [x.strip() for x in pages.splitlines() if x.strip().startswith("imagekit release page")]
    (in_tmp / "releases").mkdir()
    (in_tmp / "releases" / "index.json").write_text('{"schema": 1, "images": {}}')
    (in_tmp / "reports").mkdir()
    words = shlex.split(line.replace("$RUNNER_TEMP", str(in_tmp / "runner-temp")))
    done = runner.invoke(app, words[1:])
    assert done.exit_code == 0, done.output
    assert (in_tmp / "runner-temp" / "release-page" / "index.html").is_file()
    plain = ci.workflow(ci.CiOptions(install="."))
    assert "pages" not in plain and "selftest-report" not in plain  # opt in: the default workflow is as it was


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


def _install_lines(text: str) -> set[str]:
    return set(re.findall(r"^      - name: Install imagekit\n        run: (\|\n(?:          .*\n)+|.*\n)", text, re.M))


@pytest.mark.programs
def test_every_job_installs_the_committed_wheel_of_the_imagekit_that_wrote_it(app, runner, in_tmp, tmp_path):
    """No index serves imagekit: the workflow installs a wheel of this imagekit, committed beside it and checked
    against its sha256; the wheel installs and runs (its templates and in-image programs inside it)."""
    res = _init(app, runner)
    assert res.exit_code == 0, res.output
    text = (in_tmp / ".github" / "workflows" / "images.yml").read_text()
    [install] = _install_lines(text)  # the same in all four jobs
    assert text.count("      - name: Install imagekit\n") == 4
    sha, path = re.search(r'echo "([0-9a-f]{64})  (\S+)" \| sha256sum --check --strict -', install).groups()
    wheel = in_tmp / path
    assert path == ".github/imagekit/imagekit-0.1.0-py3-none-any.whl" and f'pip install "{path}"' in install
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == sha
    assert '      - ".github/imagekit/**"' in text  # a new wheel runs the workflow
    assert "pip install 'imagekit'" not in text
    first = wheel.read_bytes()
    assert _init(app, runner, "--force").exit_code == 0 and wheel.read_bytes() == first  # deterministic

    target = tmp_path / "installed"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target)]
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(target), "IMAGEKIT_DATA_DIR": str(tmp_path / "data")}
    probe = "import imagekit, imagekit.image.render as r; print(imagekit.__file__, r.sources().root)"
    where = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert where[0].startswith(str(target)) and where[1] == str(target / "imagekit" / "_templates")
    shutil.copytree(ROOT / "lockfiles", tmp_path / "lockfiles")
    rendered = subprocess.run(
        [sys.executable, "-m", "imagekit", "render", "--cuda", "12.4", "--source", "pypi", "--out", "out"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    assert list((tmp_path / "out").glob("*/rootfs/app/opt/imagekit/doctor/imagekit_doctor.py"))


def test_the_plan_locks_on_the_runner_and_filters_no_cell_by_where_its_torch_is(app, runner, in_tmp):
    """GitHub's runners reach the PyTorch index: no `--source pypi`; stale locks fail the plan with the diff, or
    (--locks commit) are committed on the default branch and built from that commit."""
    for args, commit in (([], False), (["--locks", "commit"], True)):
        res = _init(app, runner, "--force", *args)
        assert res.exit_code == 0, res.output
        written = in_tmp / ".github" / "workflows" / "images.yml"
        lint = actionlint(written)
        assert lint.returncode == 0 and lint.stdout == "", lint.stdout + lint.stderr
        text = written.read_text()
        assert "--source" not in text
        plan = _job(text, "plan")
        assert "          imagekit lock\n" in plan and "git status --porcelain -- lockfiles" in plan
        assert ("contents: write" in plan) is commit and ("git push" in plan) is commit
        assert ("git --no-pager diff -- lockfiles" in plan) is not commit
        assert "ref: ${{ needs.plan.outputs.sha }}" in _job(text, "build")
        assert "imagekit matrix --format github --locked-only" in plan


def test_the_registry_is_the_matrix_files_unless_given(app, runner, in_tmp):
    assert runner.invoke(app, ["init"]).exit_code == 0
    toml = in_tmp / "imagekit.toml"
    toml.write_text(toml.read_text().replace('"127.0.0.1:5000/imagekit/train"', '"docker.io/acme/train"'))
    res = _init(app, runner)
    assert res.exit_code == 0, res.output
    text = (in_tmp / ".github" / "workflows" / "images.yml").read_text()
    assert 'echo "registry=docker.io/acme/train"' in text and "secrets.REGISTRY_PASSWORD" in text
    assert "pushes to docker.io/acme/train" in res.output and "REGISTRY_USERNAME and REGISTRY_PASSWORD" in res.output
    assert "next: git add" in res.output
    res = _init(app, runner, "--force", "--registry", "ghcr.io/acme/other")
    text = (in_tmp / ".github" / "workflows" / "images.yml").read_text()
    assert 'echo "registry=ghcr.io/acme/other"' in text and "no secret to add" in res.output


@pytest.mark.parametrize(
    ("registry", "why"),
    [
        ("127.0.0.1:5000/acme/train", "is a loopback address"),
        ("localhost:5000/acme/train", "is a local name"),
        ("[::1]:5000/acme/train", "is a loopback address"),
        ("10.0.0.7:5000/acme/train", "is not a public address"),
        ("192.168.1.20/acme/train", "is not a public address"),
        ("registry.internal/acme/train", "is a local name"),
        ("kind-registry:5000/acme/train", "is a single-label name"),
    ],
)
def test_a_registry_no_hosted_runner_reaches_is_refused_and_nothing_is_written(app, runner, in_tmp, registry, why):
    """A workflow pushing to 127.0.0.1:5000 on a hosted runner pushes into that runner's own loopback, and its release
    job (always on a hosted runner) cannot verify a record: refused whether --registry or the matrix file names it."""
    res = _init(app, runner, "--registry", registry)
    assert res.exit_code == 2, res.output
    assert f"error: --registry {registry}: " in res.output and why in res.output and "nothing was written" in res.output
    assert "hint: pass --registry for a registry the runners reach" in res.output
    assert not (in_tmp / ".github").exists()  # neither the workflow nor the wheel
    assert runner.invoke(app, ["init"]).exit_code == 0
    toml = in_tmp / "imagekit.toml"
    toml.write_text(toml.read_text().replace('"127.0.0.1:5000/imagekit/train"', f'"{registry}"'))
    res = _init(app, runner)
    assert res.exit_code == 2 and "the matrix file's [image] repository" in res.output and why in res.output
    assert not (in_tmp / ".github").exists()
    res = _init(app, runner, "--registry", "ghcr.io/acme/train")  # the way out the hint names
    assert res.exit_code == 0 and "pushes to ghcr.io/acme/train" in res.output, res.output


@pytest.mark.seconds
def test_the_matrix_files_local_default_is_not_a_registry_for_ci(app, runner, in_tmp):
    """`imagekit init` writes the local demo registry (127.0.0.1:5000/imagekit/train): the workflow then pushes to
    ghcr.io/<owner>/<repo>, as before, never refused for a registry the user did not choose for CI."""
    assert runner.invoke(app, ["init"]).exit_code == 0
    res = _init(app, runner)
    assert res.exit_code == 0 and "pushes to ghcr.io/<owner>/<repo>" in res.output, res.output


@pytest.mark.loopback
def test_a_name_the_index_does_not_serve_is_refused(app, runner, in_tmp, monkeypatch):
    """`--install imagekit` wrote a workflow whose every job failed: the name is looked up on the index first."""
    with hostile_http.serve({"/simple/imagekit-mirror/": (200, {}, b"<a href='x.whl'>x</a>")}) as index:
        monkeypatch.setenv("PIP_INDEX_URL", f"{index.url}/simple")
        res = _init(app, runner, "--install", "imagekit")
        assert res.exit_code == 2 and "has no project 'imagekit'" in res.output and "hint:" in res.output
        assert not (in_tmp / ".github").exists()
        res = _init(app, runner, "--install", "imagekit-mirror==0.1.0")
        assert res.exit_code == 0, res.output
        assert "pip install 'imagekit-mirror==0.1.0'" in (in_tmp / ".github" / "workflows" / "images.yml").read_text()
        assert not (in_tmp / ".github" / "imagekit").exists()  # no wheel when --install names what to install
        assert [s.path for s in index.seen] == ["/simple/imagekit/", "/simple/imagekit-mirror/"]
    for spec in (".", "./dist/imagekit-0.1.0-py3-none-any.whl", "git+https://example.com/imagekit@v1"):
        assert ci.requirement_name(spec) is None, spec  # pip needs no index for these: nothing is asked
    assert ci.requirement_name("imagekit[extra]>=0.1") == "imagekit"


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
    assert not (in_tmp / ".github").exists()  # nor the wheel
    res = _init(app, runner, "--out", "wf.yml", "--force", "--gpu-runner", "gpu")
    assert res.exit_code == 0 and "--require-gpu" in out.read_text()
    assert sorted(p.name for p in in_tmp.iterdir()) == [".github", "wf.yml"]  # through temp files, none left
    assert [p.name for p in (in_tmp / ".github" / "imagekit").iterdir()] == ["imagekit-0.1.0-py3-none-any.whl"]


def test_a_file_where_the_wheel_folder_goes_is_a_usage_error(app, runner, in_tmp):
    (in_tmp / "afile").write_text("mine\n")
    res = _init(app, runner, "--wheel-dir", "afile")
    assert res.exit_code == 2 and "--wheel-dir afile is a file" in res.output and "hint:" in res.output
    assert (in_tmp / "afile").read_text() == "mine\n" and not (in_tmp / ".github").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--gpu-runner", "gpu; rm -rf /"], "invalid --gpu-runner"),
        (["--gpu-runner", "${{ secrets.X }}"], "invalid --gpu-runner"),
        (["--install", "imagekit' && curl x"], "invalid --install"),
        (["--install", "--index-url=http://x"], "invalid --install"),
        (["--registry", "not a repo"], "image repository"),
        (["--locks", "sometimes"], "invalid --locks"),
        (["--install", "-e."], "invalid --install"),
        (["--wheel-dir", "../outside"], "invalid --wheel-dir"),
        (["--wheel-dir", "/abs/path"], "invalid --wheel-dir"),
        (["--wheel-dir", 'a"; rm -rf /'], "invalid --wheel-dir"),
    ],
)
def test_ci_init_refuses_values_that_would_break_the_workflow(app, runner, in_tmp, args, needle):
    res = _init(app, runner, *args)
    assert res.exit_code == 2 and needle in res.output and "hint:" in res.output
    assert not (in_tmp / ".github").exists()


def test_a_hosted_runner_frees_disk_before_the_build(app, runner, in_tmp):
    """A hosted runner has about 14 GB free and a CUDA cell plans more: the build job frees the preinstalled
    toolchains first (self-hosted runners are left alone); `build` itself refuses, naming the numbers, if it is
    still short."""
    assert _init(app, runner).exit_code == 0
    build = _job((in_tmp / ".github" / "workflows" / "images.yml").read_text(), "build")
    free = build.index("- name: Free disk")
    assert free < build.index("- name: Build, self-test and push")
    assert "if: runner.environment == 'github-hosted'" in build[free:]
    assert "sudo rm -rf /usr/share/dotnet /usr/local/lib/android" in build[free:]


def test_an_arm64_runner_label_of_an_x86_64_hosted_runner_is_refused_and_labels_are_kept_once():
    for label in ("ubuntu-latest", "ubuntu-24.04", "windows-2025"):
        with pytest.raises(UsageError, match="runners are x86_64") as exc:
            ci.validated(None, None, ".", arm64_runner=[label])
        assert "ubuntu-24.04-arm" in exc.value.hint
    opts = ci.validated(None, ["gpu", "gpu"], ".", arm64_runner=["ubuntu-24.04-arm", "ubuntu-24.04-arm"])
    assert opts.gpu_runner == ("gpu",) and opts.arm64_runner == ("ubuntu-24.04-arm",)
    with pytest.raises(UsageError) as exc:
        ci.validated(None, None, ".", arm64_runner=["x" * 5000 + " y"])
    assert len(exc.value.message) < 120  # a 5,000-character value is not echoed whole


# ---- credentials never go into the workflow (a committed file, readable by everyone who reads the repository) -------
SECRET = "s3cretPassw0rd"
TOKEN = "ghp_0123456789abcdefABCDEF0123456789ab"  # a GitHub token's shape: token-like, as a user name or path


@pytest.mark.parametrize(
    "spec",
    [
        f"https://ci:{SECRET}@pkgs.example.com/imagekit-0.1.0-py3-none-any.whl",  # user:password
        f"https://__token__:{SECRET}@pkgs.example.com/simple/imagekit-0.1.0-py3-none-any.whl",
        f"git+https://{TOKEN}@github.com/acme/imagekit@v1",  # a token as the user name
        f"git+https://x-access-token:{TOKEN}@github.com/acme/imagekit",
        f"imagekit@https://ci:{SECRET}@pkgs.example.com/imagekit-0.1.0-py3-none-any.whl",  # PEP 508 direct reference
        f"https://pkgs.example.com/imagekit-0.1.0-py3-none-any.whl?token={SECRET}",  # a secret-looking query
        f"https://pkgs.example.com/imagekit-0.1.0-py3-none-any.whl?X-Amz-Signature={SECRET}&X-Amz-Credential=a",
        f"https://pypi.fury.io/{TOKEN}/acme/imagekit-0.1.0-py3-none-any.whl",  # a token as a path segment
        f"https://ci:{SECRET}@pkgs.example.com/a b.whl",  # also when the rest is invalid: never echoed
        f"https://ci:{SECRET}@[::1/imagekit.whl",  # an unparseable URL holding a password
        "x" * 5000 + f"https://ci:{SECRET}@h/x.whl",
    ],
)
def test_credentials_in_install_are_refused_and_never_written(app, runner, in_tmp, spec):
    """`--install URL` with a password (user-info, a token, a signed query) wrote it into the committed workflow three
    times (and `invalid --install` echoed it): refused, exit 2, nothing written, the secret in no output, and the
    hint says how a job gets it from a repository secret instead."""
    res = _init(app, runner, "--install", spec)
    assert res.exit_code == 2, res.output
    assert SECRET not in res.output and TOKEN not in res.output, res.output
    assert "Traceback" not in res.output and "error: --install" in res.output
    assert "hint:" in res.output and "${{ secrets." in res.output and "Settings > Secrets" in res.output
    assert not (in_tmp / ".github").exists()
    with pytest.raises(UsageError) as exc:
        ci.validated(None, None, spec)
    assert SECRET not in exc.value.message + (exc.value.hint or "") and TOKEN not in exc.value.message
    assert len(exc.value.message) < 400


@pytest.mark.seconds
@pytest.mark.parametrize(
    "spec",
    [
        "git+ssh://git@github.com/acme/imagekit@v1",  # a user name for SSH is no credential
        "git+https://github.com/acme/imagekit@0123456789abcdef0123456789abcdef01234567",  # a commit, not a token
        "https://pkgs.example.com/imagekit-0.1.0-py3-none-any.whl",
        # PyPI's content-addressed folder: a lowercase hex segment names content, it is no token
        "https://files.pythonhosted.org/packages/ab/cd/" + "0123456789abcdef" * 4 + "/imagekit-0.1-py3-none-any.whl",
        "./dist/imagekit-0.1.0-py3-none-any.whl",
    ],
)
def test_install_specs_without_credentials_are_written_as_given(app, runner, in_tmp, spec):
    res = _init(app, runner, "--install", spec)
    assert res.exit_code == 0, res.output
    text = (in_tmp / ".github" / "workflows" / "images.yml").read_text()
    assert f"python -m pip install '{spec}'" in text
