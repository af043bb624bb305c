"""`[image] install`'s wheel (services/builds/project_build.py): the driver that runs in the base, here run by this
host's
Python in place of the container (the engine is the outer boundary: `HostEngine` maps its mounts to folders), the
refusals before anything runs, and the build that publishes a project's image whose self-test passed (over the
recording engine and registry). The same driver in a real base on a real engine: test_project_install_docker.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from imagekit.errors import CheckFailed, UsageError
from imagekit.image.buildplan import BaseRef
from imagekit.image.code_layer import CodeLayer, CopySpec
from imagekit.image.image_options import ImageOptions
from imagekit.locking import resolution
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.model import Cell
from imagekit.services import inputs
from imagekit.services.builds import project_build
from imagekit.services.builds.build import BuildOptions, build_cell
from imagekit.services.wheels.fetch import FetchedWheel
from tests.fakes import RecordingEngine, RecordingRegistry
from tests.wheelfactory import BACKEND, backend_wheel, build_wheel, fake_pypi_wheels, serve, write_simple_index

CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11")
BASE = BaseRef("debian-bookworm", "imagekit/base:debian-bookworm-test", None, "3.11", "2.36")
PYPROJECT = f"""[build-system]
requires = ["{BACKEND}>=1.0"]
build-backend = "imagekit_test_backend"

[project]
name = "alignment"
version = "0.1.0"
dependencies = {{deps}}
"""


class HostEngine:
    """Runs the project build's driver with this host's Python, its mounts mapped to the host folders they bind."""

    def __init__(self) -> None:
        self.runs: list[dict] = []

    def run(self, image, argv, *, entrypoint=None, env=None, user=None, timeout=900, volumes=None, network=False,
            **_kw):  # type: ignore[no-untyped-def]  # fmt: skip
        assert argv[:3] == ["-I", "-c", project_build.DRIVER], argv[:2]
        binds = {spec["bind"]: host for host, spec in (volumes or {}).items()}
        modes = {spec["bind"]: spec["mode"] for spec in (volumes or {}).values()}
        self.runs.append({"image": image, "network": network, "env": dict(env or {}), "modes": modes})

        def host(arg: str) -> str:
            mount = next((m for m in binds if arg == m or arg.startswith(m + "/")), None)
            return binds[mount] + arg[len(mount) :] if mount else arg

        res = subprocess.run([sys.executable, *argv[:3], *(host(a) for a in argv[3:])], env=dict(env or {}),
                             capture_output=True, text=True, timeout=timeout)  # fmt: skip
        return res.returncode, res.stdout, res.stderr


def _project(files: dict[str, str]) -> CodeLayer:
    return CodeLayer("/opt/app", tuple((rel, text.encode(), 0o644) for rel, text in sorted(files.items())))


def _alignment(deps: str = '["numpy>=1.17"]', **more: str) -> CodeLayer:
    return _project({"pyproject.toml": PYPROJECT.replace("{deps}", deps),
                     "alignment/__init__.py": "def greet():\n    return 'aligned'\n", **more})  # fmt: skip


def _entry(name: str, version: str) -> LockEntry:
    return LockEntry(name, version, ("sha256:" + hashlib.sha256(name.encode()).hexdigest(),))


def _lock(*entries: tuple[str, str]) -> Lock:
    return Lock(torch=(), app=tuple(_entry(n, v) for n, v in entries))


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[FetchedWheel]:
    """The locked wheels of the test backend and its dependency, as `fetch` leaves them."""
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    return [
        FetchedWheel(BACKEND, backend_wheel(tmp_path / "wheels"), False),
        FetchedWheel("filelock", build_wheel(tmp_path / "wheels", "filelock", "3.16.1"), False),
        FetchedWheel("numpy", build_wheel(tmp_path / "wheels", "numpy", "1.26.4"), False),
    ]


LOCKED = ((BACKEND, "1.0"), ("filelock", "3.16.1"), ("numpy", "1.26.4"))


def _wheel_for(engine, code, lock, wheels, lines=None):  # type: ignore[no-untyped-def]
    said = lines if lines is not None else []
    return project_build.wheel_for(engine, BASE, code, "acme", "acme", CELL, lock, wheels, 1735689600, said.append)


def test_a_backend_the_lock_lacks_is_refused_naming_it_before_anything_runs(backend):
    engine = HostEngine()
    with pytest.raises(UsageError) as exc:
        _wheel_for(engine, _alignment(), _lock(("numpy", "1.26.4")), backend)
    assert exc.value.exit_code == 2 and not engine.runs
    assert f"build backend (imagekit_test_backend) needs what the lock of {CELL.key} does not hold" in exc.value.message
    assert f"{BACKEND}>=1.0 (not in the lock)" in exc.value.message
    hint = exc.value.hint
    assert "imagekit lock" in hint and "[build-system] requires" in hint and "network off" in hint
    with pytest.raises(UsageError) as exc:  # locked, at a version the requirement refuses
        _wheel_for(engine, _alignment(), _lock((BACKEND, "0.9"), ("numpy", "1.26.4")), backend)
    assert f"{BACKEND}>=1.0 (the lock has {BACKEND} 0.9)" in exc.value.message and not engine.runs


@pytest.mark.programs
def test_the_wheel_is_built_offline_from_the_locked_backend_and_kept(backend):
    engine, lines = HostEngine(), []
    wheel, path = _wheel_for(engine, _alignment(), _lock(*LOCKED), backend, lines)
    assert (wheel.name, wheel.version, wheel.filename) == ("alignment", "0.1.0", "alignment-0.1.0-py3-none-any.whl")
    assert wheel.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and wheel.source == "acme"
    (run,) = engine.runs
    assert run["network"] is False and run["env"]["SOURCE_DATE_EPOCH"] == "1735689600"
    assert run["modes"] == {project_build.MOUNT: "ro", project_build.OUT: "rw"}
    assert any(line.startswith("building the project's wheel from acme") for line in lines)
    # the same files over the same base and backend: the kept wheel, nothing run
    again, _ = _wheel_for(engine, _alignment(), _lock(*LOCKED), backend)
    assert again == wheel and len(engine.runs) == 1
    # a changed file: built again (the code is an input of the wheel)
    changed, _ = _wheel_for(engine, _alignment(**{"alignment/extra.py": "X = 1\n"}), _lock(*LOCKED), backend)
    assert changed.sha256 != wheel.sha256 and len(engine.runs) == 2


@pytest.mark.programs
def test_a_dependency_the_lock_lacks_is_refused_naming_each(backend):
    deps = '["numpy>=2", "trl>=0.9", "filelock; sys_platform == \'linux\'", "peft; sys_platform == \'win32\'"]'
    with pytest.raises(UsageError) as exc:
        _wheel_for(HostEngine(), _alignment(deps), _lock(*LOCKED), backend)
    message = exc.value.message
    assert "needs what the lock of" in message and exc.value.exit_code == 2
    assert "numpy>=2 (the lock has numpy 1.26.4)" in message and "trl>=0.9 (not in the lock)" in message
    assert "filelock" not in message and "peft" not in message  # locked; for another platform
    assert "--no-deps" in exc.value.hint and "[matrix] packages" in exc.value.hint


@pytest.mark.programs
def test_a_project_that_does_not_build_says_why_with_the_backends_log(backend):
    broken = _project({"pyproject.toml": PYPROJECT.replace('version = "0.1.0"\n', "").replace("{deps}", "[]")})
    with pytest.raises(CheckFailed) as exc:
        _wheel_for(HostEngine(), broken, _lock(*LOCKED), backend)
    assert "the project's wheel did not build" in exc.value.message and "KeyError: 'version'" in exc.value.message
    assert "pip wheel" in exc.value.hint


@pytest.mark.programs
def test_a_backend_that_asks_for_more_names_what_it_asked_for(backend):
    """An in-tree backend (backend-path) whose get_requires_for_build_wheel asks for `wheel`, as setuptools < 70.1
    does: refused, naming it, rather than built without it."""
    in_tree = (
        "from imagekit_test_backend import build_wheel\n\n\n"
        "def get_requires_for_build_wheel(config_settings=None):\n    return ['wheel>=0.38']\n"
    )
    pyproject = PYPROJECT.replace("{deps}", "[]").replace(
        'build-backend = "imagekit_test_backend"', 'build-backend = "shim"\nbackend-path = ["tools"]'
    )
    with pytest.raises(UsageError) as exc:
        _wheel_for(HostEngine(), _alignment(**{"pyproject.toml": pyproject, "tools/shim.py": in_tree}),
                   _lock(*LOCKED), backend)  # fmt: skip
    assert "asks for wheel>=0.38 too" in exc.value.message and "[matrix] packages" in exc.value.hint


# ---- the build that publishes: a passing self-test, over the recording engine and registry ---------------------
@dataclass
class WheelEngine(RecordingEngine):
    """The recording engine, with the project wheel's build run by the driver on this host."""

    host: HostEngine = field(default_factory=HostEngine)

    def run(self, image, argv, **kw):  # type: ignore[no-untyped-def,override]
        if argv[:3] == ["-I", "-c", project_build.DRIVER]:
            self._record("run", image, "project-wheel")
            return self.host.run(image, argv, **kw)
        return super().run(image, argv, **kw)


@pytest.mark.resolver
def test_a_project_whose_self_test_passes_is_published_with_its_wheel_env_and_smoke(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    index = tmp_path / "pypi"
    write_simple_index(index, [*fake_pypi_wheels(tmp_path / "w"), backend_wheel(tmp_path / "w")])
    project = tmp_path / "acme"
    (project / "alignment").mkdir(parents=True)
    (project / "alignment" / "__init__.py").write_text("def greet():\n    return 'aligned'\n")
    (project / "pyproject.toml").write_text(PYPROJECT.replace("{deps}", '["numpy>=1.17"]'))
    engine = WheelEngine()
    registry = RecordingRegistry(engine.calls)
    engine.registry = registry
    smoke = ("python -c 'import alignment'",)
    cell = replace(CELL, packages=(f"{BACKEND}==1.0",))
    copy = CopySpec(str(project), project=str(project))
    options = ImageOptions(copy=copy, install=str(project), env=(("WANDB_PROJECT", "sft"),), smoke=smoke)
    with serve(index) as url:
        opts = BuildOptions(
            repository="registry.test:5000/acme/train",
            lock_dir=tmp_path / "locks",
            state_dir=tmp_path / "state",
            release_index=tmp_path / "releases.json",
            release_records=tmp_path / "records",
            push=True,
            settings=resolution.LockSettings(index_url=f"{url}/simple"),
            options=options,
        )
        res = build_cell(cell, opts, engine, inputs.compat_data(), lambda _c, _m: None, registry=registry)
    assert res.status == "published", res.error and res.error.render()
    kinds = [c[0] if c[0] != "run" or c[-1] != "project-wheel" else "project-wheel" for c in engine.calls]
    assert kinds.index("project-wheel") < kinds.index("build") < kinds.index("push")  # built before the render
    assert res.steps["project"] >= 0 and list(res.steps).index("project") == list(res.steps).index("fetch") + 1
    entry = json.loads(opts.release_index.read_text())["images"][res.tag]
    manifest = entry["manifest"]
    assert manifest["project"]["name"] == "alignment" and manifest["smoke"]["commands"] == list(smoke)
    assert manifest["distributions"]["alignment"] == "0.1.0"
    config = json.loads(engine.configs[res.image_id])["config"]
    assert "WANDB_PROJECT=sft" in config["Env"]
    # the code layer installs the wheel the wheelhouse holds, by the sha256 of its requirements
    house = opts.state_dir / "wheelhouse" / cell.slug
    wanted = (house / "requirements-project.txt").read_text()
    wheel_sha = hashlib.sha256((house / manifest["project"]["wheel"]).read_bytes()).hexdigest()
    assert wanted == f"alignment==0.1.0 \\\n    --hash=sha256:{wheel_sha}\n"
    dockerfile = (opts.state_dir / "build" / cell.slug / "Dockerfile").read_text()
    assert f"requirements-project.txt#sha256={hashlib.sha256(wanted.encode()).hexdigest()}" in dockerfile
