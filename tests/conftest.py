from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from imagekit.cli import build_app
from imagekit.compat import catalog as compat
from imagekit.model import Cell
from imagekit.services import inputs
from tests.recording import RecordingProgress

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def pytest_configure(config: pytest.Config) -> None:
    """Tests run as in an activated virtual environment: `python` and `python3` on PATH are the interpreter running
    them (a version manager's shim first on PATH costs 0.2 s a call, and the doctor asks each for its prefix)."""
    bindir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != bindir:
        os.environ["PATH"] = bindir + os.pathsep + path
    from tests import containers

    containers.configure()
    _build_each_app_once()
    # A property test's verdict is what it checks, never how long an example took: Hypothesis's default 200 ms
    # deadline failed a 1 ms example that took 267 ms once on a machine busy with the Docker tests
    from hypothesis import settings

    settings.register_profile("imagekit", deadline=None)
    settings.load_profile("imagekit")


def _build_each_app_once() -> None:
    """typer's CliRunner turns the Typer app into its click command on every invoke (0.1-0.2 s for imagekit's ~30
    commands, most of a CLI test's time): here once per app object, as the `imagekit` process itself does once."""
    import typer.testing

    built: dict[int, tuple[object, object]] = {}
    make = typer.testing._get_command

    def once(app):  # type: ignore[no-untyped-def]
        found = built.get(id(app))
        if found is None or found[0] is not app:
            found = built[id(app)] = (app, make(app))
        return found[1]

    typer.testing._get_command = once


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden from the current templates")


@pytest.fixture(scope="session", autouse=True)
def no_user_compat_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test reads the compatibility data shipped with imagekit, never a copy this machine's user refreshed
    (`imagekit compat refresh` writes to the user data folder, which `inputs.compat_data` prefers): IMAGEKIT_DATA_DIR is
    an empty folder for the whole session, subprocesses included. Tests that want user data set their own."""
    empty = tmp_path_factory.mktemp("user-data-empty")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMAGEKIT_DATA_DIR", str(empty))
        yield empty
    assert not any(empty.iterdir()), "a test wrote into the session's empty user data folder"


@pytest.fixture(scope="session", autouse=True)
def no_user_pod_records(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`pod create` records each pod it makes under the user's state folder (`effects.pod_records`): for the whole
    session, subprocesses included, that is a folder of the session's, never this machine's user's."""
    state = tmp_path_factory.mktemp("user-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMAGEKIT_STATE", str(state))
        yield state


@pytest.fixture(scope="session")
def data() -> compat.CompatData:
    return inputs.compat_data()


@pytest.fixture(scope="session")
def app():
    return build_app()


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder, so ./pyproject.toml of the repo is not picked up as a matrix."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden")) or os.environ.get("IMAGEKIT_UPDATE_GOLDEN") == "1"


# ---- the real torch image, built, self-tested and published once per session (docker tests) -------------
REAL_CELL = Cell("12.1", "2.1.2", "4.48.2", "3.11", ("accelerate==1.2.1", "numpy<2"))
REPO = "imagekit-test/train"
REAL_BUILD_PROGRESS = RecordingProgress()  # what the real build reported while it ran


def _log(cid: str, msg: str) -> None:
    print(f"{cid}: {msg}", flush=True)


@pytest.fixture
def no_internet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request that would leave the machine goes to a dead proxy (refused at once); loopback stays direct. For
    tests whose command would otherwise ask the internet (a ghcr.io tag checked before a RunPod template is made)."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")


@pytest.fixture(scope="session")
def engine():
    from imagekit.effects.docker import Engine

    return Engine()


@pytest.fixture(scope="session")
def registry(tmp_path_factory, engine):
    from tests.registry import Registry, free_port

    reg = Registry(tmp_path_factory.mktemp("registry"), free_port()).start()
    yield reg
    reg.stop()
    shutil.rmtree(reg.root, ignore_errors=True)  # gigabytes of pushed blobs: pytest keeps its last tmp dirs
    for image in engine.client.images.list():  # drop this session's tags; the layers stay cached
        for tag in image.tags:
            if tag.startswith(f"{reg.address}/"):
                engine.remove(tag)


@pytest.fixture(scope="session")
def real_build(engine, registry, tmp_path_factory):
    """The real torch cell, built, self-tested and published once for the session."""
    state = tmp_path_factory.mktemp("state")
    from imagekit.services.builds.build import BuildOptions, build_cell

    opts = BuildOptions(
        repository=f"{registry.address}/{REPO}",
        lock_dir=ROOT / "lockfiles",
        state_dir=state,
        release_index=state / "releases.json",
        push=True,
    )
    result = build_cell(REAL_CELL, opts, engine, inputs.compat_data(), _log, progress=REAL_BUILD_PROGRESS)
    assert result.status == "published", result.error and result.error.render()
    engine.tag(result.image_id, "imagekit-test/train", REAL_CELL.id)  # a stable local tag keeps the layer cache
    return result, opts


# ---- a user's own project, as a new user makes one (tests/test_user_project.py) -----------------------------------
PROJECT_USER, PROJECT_PASSWORD = "acme-ci", "registry-s3cret"  # the registry's (`docker login`)
INDEX_USER, INDEX_PASSWORD = "acme-pkgs", "index-s3cret"  # the private package index's (IMAGEKIT_INDEX_*)
KERNELS = "acme-kernels", "1.0+cu12torch2.1"  # a release-asset wheel, by URL (as flash-attn's are)


@pytest.fixture(scope="session")
def user_project(real_build, engine, registry, tmp_path_factory):
    """A fine-tuning project of its own, built and pushed once for the session the way its user would: `imagekit
    init` for the real cell with a Debian package (jq), a wheel by URL (a release-asset server on loopback) and a
    package from a private index (basic auth on loopback, credentials from IMAGEKIT_INDEX_*), then the file edited
    by hand (JupyterLab, the project folder copied in, the private index), `imagekit lock`, `imagekit build --push`
    to a registry that asks for credentials, given by `docker login`. The registry starts as a copy of the session's
    (its blobs hard-linked), so the layers the real build pushed are there already, as on a registry a project has
    pushed to before."""
    import hashlib
    import json
    import subprocess

    from tests.registry import Registry, free_port
    from tests.wheelfactory import build_wheel, serve, serve_with_auth, write_simple_index

    work = tmp_path_factory.mktemp("user-project")
    project = work / "acme-train"
    project.mkdir()
    assets = work / "assets"
    kernels = build_wheel(assets, *KERNELS, tag="cp311-cp311-linux_x86_64", payload="def fused():\n    return 42\n")
    index = work / "private-index"
    write_simple_index(index, [build_wheel(work / "w", "acme-utils", "0.3.0", payload="NAME = 'acme'\n")])
    auth_reg = Registry(work / "registry", free_port(), auth=(PROJECT_USER, PROJECT_PASSWORD))
    (work / "registry").mkdir()
    subprocess.run(["cp", "-al", str(registry.root / "data"), str(work / "registry" / "data")], check=True)
    # ... and the project's repository holds them, as after an earlier push of its own (a registry checks a blob's
    # presence per repository; Docker then skips what is there, as a re-publish of a project does)
    repos = work / "registry" / "data" / "docker" / "registry" / "v2" / "repositories"
    shutil.copytree(repos / REPO / "_layers", repos / "acme" / "train" / "_layers")
    auth_reg.start()
    docker_config = work / "docker-config"
    docker_config.mkdir()
    env = {
        **os.environ,
        "DOCKER_CONFIG": str(docker_config),
        "IMAGEKIT_INDEX_USER": INDEX_USER,
        "IMAGEKIT_INDEX_PASSWORD": INDEX_PASSWORD,
        "NETRC": str(work / "no-netrc"),
        "NO_COLOR": "1",
    }
    login = subprocess.run(
        ["docker", "login", "-u", PROJECT_USER, "--password-stdin", auth_reg.address],
        input=PROJECT_PASSWORD, text=True, capture_output=True, env=env,
    )  # fmt: skip
    assert login.returncode == 0, login.stderr
    transcript: list[str] = []

    def imagekit(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
        res = subprocess.run(
            [sys.executable, "-m", "imagekit", *args], cwd=project, env=env, capture_output=True, text=True
        )
        transcript.append(f"$ imagekit {' '.join(args)}\n{res.stdout}{res.stderr}")
        if ok:
            assert res.returncode == 0, transcript[-1]
        return res

    repo = f"{auth_reg.address}/acme/train"
    with serve(assets) as asset_url, serve_with_auth(index, INDEX_USER, INDEX_PASSWORD) as (index_url, seen):
        sha = hashlib.sha256(kernels.read_bytes()).hexdigest()
        kernels_ref = f"{KERNELS[0]} @ {asset_url}/{kernels.name}#sha256={sha}"
        c = REAL_CELL
        imagekit("init", "--cuda", c.cuda, "--torch", c.torch, "--transformers", c.transformers, "--python", c.python,
                 "--package", kernels_ref, "--package", "acme-utils==0.3.0", "--apt", "jq",
                 "--repository", repo)  # fmt: skip
        toml = project / "imagekit.toml"
        text = toml.read_text().replace("# jupyter = true", "jupyter = true").replace('# copy = "."', 'copy = "."')
        text = text.replace("# [lock]", "[lock]").replace(
            '# extra_index_urls = ["https://pkgs.example.com/simple"]', f'extra_index_urls = ["{index_url}/simple"]'
        )
        toml.write_text(text)
        (project / "train.py").write_text("import acme_kernels\nprint('training with', acme_kernels.fused())\n")
        (project / "acme").mkdir()
        (project / "acme" / "__init__.py").write_text("VERSION = 1\n")
        (project / "data").mkdir()
        (project / "data" / "shard-0.bin").write_bytes(b"\0" * 4096)
        (project / ".dockerignore").write_text("data/\n*.env\n")
        (project / "wandb.env").write_text("WANDB_API_KEY=not-for-the-image\n")
        (project / ".git").mkdir()
        (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
        # the torch layers stay the real build's: the committed lock is the preference the resolver keeps
        (project / "lockfiles").mkdir()
        shutil.copy(ROOT / "lockfiles" / f"{c.id}.txt", project / "lockfiles")
        imagekit("lock")
        imagekit("build", "--dry-run", "--push")
        built = imagekit("build", "--push", "--json")
        assert any(h for h in seen)  # the private index was asked with its credentials
    lock_text = (project / "lockfiles" / f"{c.id}.txt").read_text()
    (result,) = json.loads(built.stdout)
    assert result["status"] == "published", transcript[-1]
    yield {
        "project": project,
        "repo": repo,
        "registry": auth_reg,
        "env": env,
        "imagekit": imagekit,
        "transcript": transcript,
        "lock": lock_text,
        "built": built,
        "kernels_url": f"{asset_url}/{kernels.name}",
        "result": result,
    }
    # kept with pytest's temporary folders: what a user of this project saw (docs and closing notes quote it)
    (tmp_path_factory.getbasetemp() / "user-project-transcript.txt").write_text("\n".join(transcript))
    auth_reg.stop()
    for image in engine.client.images.list():
        for t in image.tags:
            if t.startswith(f"{auth_reg.address}/"):
                engine.remove(t)
    shutil.rmtree(work / "registry", ignore_errors=True)


# ---- a PyPI-shaped index on loopback serving small wheels the tests build (fast cells; no network) ---------
@pytest.fixture
def fake_index(tmp_path, monkeypatch):
    """The index URL; the wheel and resolver caches are this test's own."""
    from tests.wheelfactory import fake_pypi_wheels, serve, write_simple_index

    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    root = tmp_path / "pypi"
    write_simple_index(root, fake_pypi_wheels(tmp_path / "w"))
    with serve(root) as url:
        yield f"{url}/simple"


# ---- test tiers: what a test needs, marked from the fixtures it uses, and checked while it runs --------------
# `make test-fast` runs what needs only Python in this process (no server, no program: `programs` marks a test that
# starts Python programs as processes); `make test` runs all.
FIXTURE_MARKS = {
    "engine": "docker",
    "registry": "docker",
    "real_build": "docker",
    "user_project": "docker",
    "gateway": "sshd",
    "full": "sshd",
    "sshd_server": "sshd",
    "evil_full": "sshd",
    "evil_gateway": "sshd",
    # servers on 127.0.0.1 in threads or as processes
    "honest_registry": "loopback",
    "release_registry": "loopback",
    "any_index": "loopback",
    "runpod_graphql": "loopback",
    "runpod_api": "loopback",
    "hub_server": "loopback",
    "answering": "loopback",
}
# A process a test starts tells what it needs; a test in the fast tier that starts one of these is mis-marked.
PROGRAM_MARKS = {
    "uv": "resolver",
    "pip-compile": "resolver",
    "sshd": "sshd",
    "docker": "docker",
    "dockerd": "docker",
    "mmdebstrap": "docker",
    "skopeo": "docker",
    "docker-registry": "loopback",
    "chromium": "programs",  # the release page in a real browser (tests/browser.py: DevTools on a pipe, no port)
    "chromium-browser": "programs",
}
# Outside the fast tier (`make test-fast` deselects these): a test marked with one may listen on a loopback port.
SLOW_TIERS = ("loopback", "docker", "sshd", "resolver", "network", "slow", "sweep")
_running: list[pytest.Item] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            mark = FIXTURE_MARKS.get(fixture)
            if mark and not item.get_closest_marker(mark):
                item.add_marker(mark)
        if "real_build" in getattr(item, "fixturenames", ()):  # `make test` runs these beside the other Docker tests
            item.add_marker("real_image")
        if item.get_closest_marker("pip_tools") and shutil.which("pip-compile") is None:
            item.add_marker(pytest.mark.skip(reason="needs the pip-tools extra: pip install -e '.[pip-tools]'"))


def _needed_mark(args: object) -> str | None:
    argv = args if isinstance(args, list | tuple) else [args]
    if not argv:
        return None
    words = [str(a) for a in argv]
    program = os.path.basename(words[0])
    if program.startswith("python") and len(words) > 2 and words[1] == "-m":
        program = {"piptools": "pip-compile", "uv": "uv"}.get(words[2].split(".")[0], program)
    if program == "uv" and not {"compile", "lock", "sync"} & set(words):
        return None  # `uv venv`, `uv pip install` of local wheels: tools of a fast test, not a resolution
    if program.startswith(("python", "imagekit")) or words[0] == sys.executable:
        return "programs"  # a Python program as a process: the CLI, an in-image program, a venv's interpreter
    return PROGRAM_MARKS.get(program)


@pytest.fixture(scope="session", autouse=True)
def tier_guard() -> Iterator[None]:
    """Fail a test that starts a program of a tier it is not marked for, or listens on a port without a tier that
    allows servers (so the fast tier stays fast and honest)."""
    import socket
    import subprocess

    original = subprocess.Popen.__init__
    original_listen = socket.socket.listen

    def checked(self, args, *a, **kw):  # type: ignore[no-untyped-def]
        mark = _needed_mark(args)
        item = _running[-1] if _running else None
        broadest = item is not None and item.get_closest_marker("docker")  # the Docker tier runs with everything
        if mark == "programs" and item is not None and any(item.get_closest_marker(m) for m in SLOW_TIERS):
            mark = None  # outside the fast tier a test may start Python programs too
        if mark and item is not None and not broadest and not item.get_closest_marker(mark):
            item.stash.setdefault(_MISMARKED, set()).add(mark)
        return original(self, args, *a, **kw)

    def listening(self, *a, **kw):  # type: ignore[no-untyped-def]
        item = _running[-1] if _running else None
        if item is not None and not any(item.get_closest_marker(m) for m in SLOW_TIERS):
            item.stash.setdefault(_MISMARKED, set()).add("loopback")
        return original_listen(self, *a, **kw)

    subprocess.Popen.__init__ = checked  # type: ignore[method-assign]
    socket.socket.listen = listening  # type: ignore[method-assign]
    yield
    subprocess.Popen.__init__ = original  # type: ignore[method-assign]
    socket.socket.listen = original_listen  # type: ignore[method-assign]


_MISMARKED = pytest.StashKey[set]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # type: ignore[no-untyped-def]
    report = yield
    missing = item.stash.get(_MISMARKED, set())
    if call.when == "teardown" and missing and report.passed and os.environ.get("IMAGEKIT_TIER_AUDIT") != "report":
        report.outcome = "failed"
        tiers = ", ".join(sorted(missing))
        report.longrepr = f"{item.nodeid} starts a program (or a server) of the {tiers} tier: mark it so"
    if call.when == "teardown" and missing:
        item.config.stash.setdefault(_AUDIT, {})[item.nodeid] = sorted(missing)
    return report


_AUDIT = pytest.StashKey[dict]()


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    found = config.stash.get(_AUDIT, {})
    if found and os.environ.get("IMAGEKIT_TIER_AUDIT") == "report":
        path = Path(os.environ.get("IMAGEKIT_TIER_AUDIT_FILE", "/tmp/tier-audit.txt"))
        path.write_text("".join(f"{k}\t{','.join(v)}\n" for k, v in sorted(found.items())))
        terminalreporter.write_line(f"tier audit: {len(found)} mis-marked tests listed in {path}")
