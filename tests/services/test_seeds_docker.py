"""One environment per venv, on a real engine: a cell whose lock pins pip and setuptools (real wheels from PyPI, as
tensorboard's closure pins setuptools) is built with `imagekit build` and started as a pod platform starts it (the
image's own entrypoint and command, pod mode and job mode). Every sys.path entry in the container holds one
dist-info per distribution, the locked version; the self-test's `dists-match-lock` and the start check's
`lock-drift` pass. A lock that does not pin pip keeps `python -m venv`'s pip (and, on Python 3.11, its setuptools
unless the lock pins it), declared in the manifest (`python.seeds`), and nothing is extra. The seed laid back
beside the locked setuptools (the image before the fix) fails both checks, each naming both installs.

The cell's torch is a stand-in (tests/wheelfactory.py), so the self-test's torch checks fail as in
`test_project_install_docker.py`; every other check passes, and the start check (no GPU: no torch probe) has no
blocker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imagekit.image import naming
from imagekit.model import Cell
from tests import containers
from tests.wheelfactory import PYPI_WHEELS, fake_pypi_wheels, pypi_wheel, serve, write_simple_index

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.loopback, pytest.mark.programs]

CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11")
PIP, SETUPTOOLS = "24.3.1", "75.6.0"  # PYPI_WHEELS: versions no seed of the base has (bookworm: 23.0.1, 66.1.1)
FAKE_TORCH_FAILS = {"torch-cuda-version", "torch-archs", "cuda-libraries", "numpy-interop", "tiny-model",
                    "torch-compile", "gpu-cuda-available"}  # fmt: skip
# Every *.dist-info / *.egg-info directly in each sys.path entry, by its folder's name (not imagekit's reading), and
# what importlib.metadata finds: the two must say the same, one install per name.
WALK = r"""
import json, os, re, sys
from importlib import metadata
found = {}
for entry in sys.path:
    folder = entry or os.getcwd()
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if name.endswith((".dist-info", ".egg-info")):
                dist, version = name.rsplit(".", 1)[0].split("-")[:2]
                found.setdefault(re.sub(r"[-_.]+", "-", dist).lower(), []).append([version, os.path.join(folder, name)])
names = sorted(re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in metadata.distributions())
print(json.dumps({"path": sys.path, "found": found, "importlib": names}))
"""
SECOND_SETUPTOOLS = (  # the seed of `python -m venv` laid over the venv, as a layer over an unremoved seed was
    "site=$(/opt/venv/bin/python -c \"import sysconfig; print(sysconfig.get_paths()['purelib'])\") && "
    "wheel=$(ls /usr/share/python-wheels/setuptools-*.whl) && /opt/venv/bin/python -c "
    '"import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$wheel" "$site" && echo "$wheel"'
)


def _build(home: Path, index_url: str, repo: str, packages: list[str]) -> dict:
    """`imagekit build` of the cell with ``packages``, in a project folder of its own: its JSON result, its
    self-test report and its lock."""
    (home / "locks").mkdir(parents=True)
    include = {"cuda": CELL.cuda, "torch": CELL.torch, "transformers": CELL.transformers, "python": CELL.python}
    entry = ", ".join(f'{k} = "{v}"' for k, v in include.items()) + f", packages = {json.dumps(packages)}"
    (home / "imagekit.toml").write_text(f"[matrix]\ninclude = [{{{entry}}}]\n")
    env = {**os.environ, "IMAGEKIT_CACHE": str(home / "cache"), "UV_CACHE_DIR": str(home / "uv-cache")}
    argv = [sys.executable, "-m", "imagekit", "build", "--cell", CELL.id, "--registry", repo, "--json", "--quiet"]
    argv += ["--lock-dir", str(home / "locks"), "--state-dir", str(home / "state"), "--gpus", "off"]
    argv += ["--release-index", str(home / "index.json"), "--index-url", index_url]
    res = subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True, timeout=1200)
    try:
        (result,) = json.loads(res.stdout)
    except ValueError:
        raise AssertionError(
            f"imagekit build printed no result (exit {res.returncode}):\n{res.stderr[-4000:]}"
        ) from None
    assert result.get("tag") and result["step"] == "self-test", (result, res.stderr[-4000:])
    report = json.loads((home / "state" / "reports" / f"{CELL.slug}.json").read_text())
    return {"result": result, "report": report, "lock": (home / "locks" / f"{CELL.id}.txt").read_text()}


def _walk(run) -> dict:  # type: ignore[no-untyped-def]
    """What the container's python finds on its sys.path (WALK), checked: each name once, as importlib sees it."""
    doc = json.loads(run(WALK))
    twice = {n: f for n, f in doc["found"].items() if len(f) != 1}
    assert not twice, twice
    assert sorted(doc["found"]) == doc["importlib"], doc
    assert "/opt/venv/lib/python3.11/site-packages" in doc["path"] and "/opt/cuda-libs" in doc["path"], doc["path"]
    return {n: f[0][0] for n, f in doc["found"].items()}


def _job_mode(engine, tag: str) -> dict:  # type: ignore[no-untyped-def]
    """`docker run IMAGE python -c WALK`: the image's entrypoint runs the start check, then the command."""
    code, out, err = engine.run(tag, ["python", "-c", WALK])
    assert code == 0, err[-3000:]
    assert "start check took" in err and "blocker" not in err.lower(), err[-3000:]
    return _walk(lambda _script: out)


def _doctor(pod: containers.Running) -> tuple[int, dict]:
    """The start check again, as a user runs it in the pod: `imagekit-doctor --tier start`."""
    _, out = pod.exec("sh", "-c", "imagekit-doctor --tier start --json > /tmp/doctor.json 2>/dev/null; echo $?")
    _, report = pod.exec("cat", "/tmp/doctor.json")
    return int(out.strip()), {c["id"]: c for c in json.loads(report)["checks"]}


def _selftest_dists(pod: containers.Running) -> dict:
    """The image's self-test, run in the pod as the build runs it: its `dists-match-lock`."""
    _, out = pod.exec("sh", "-c", "/opt/venv/bin/python /opt/imagekit/doctor/selftest.py 2>/dev/null")
    return next(c for c in json.loads(out)["checks"] if c["id"] == "dists-match-lock")


@pytest.fixture
def index(tmp_path):  # type: ignore[no-untyped-def]
    root = tmp_path / "pypi"
    # the stand-in torch has torch's console script (the start check wants `torchrun` from the venv when torch is
    # pinned), and the real pip and setuptools beside it
    torchrun = {"torch-2.5.1.dist-info/entry_points.txt": b"[console_scripts]\ntorchrun = torch.distributed.run:main\n"}
    wheels = fake_pypi_wheels(tmp_path / "w", torch_files=torchrun)
    wheels += [pypi_wheel(tmp_path / "w", f) for f in PYPI_WHEELS]
    write_simple_index(root, wheels)
    with serve(root) as url:
        yield f"{url}/simple"


def test_a_lock_pinning_pip_and_setuptools_is_one_environment_started_as_a_pod(engine, registry, index, tmp_path):
    repo = f"{registry.address}/imagekit-test/seeds"
    built = _build(tmp_path / "pinned", index, repo, [f"pip=={PIP}", f"setuptools=={SETUPTOOLS}"])
    tag, report = built["result"]["tag"], built["report"]
    try:
        assert f"\npip=={PIP} " in built["lock"] and f"\nsetuptools=={SETUPTOOLS} " in built["lock"]
        checks = {c["id"]: c for c in report["checks"]}
        assert set(report["failed"]) <= FAKE_TORCH_FAILS, report["failed"]
        dists = checks["dists-match-lock"]
        assert dists["status"] == "pass" and not dists["evidence"]["duplicates"] and not dists["evidence"]["extra"]
        manifest = json.loads(containers.output(engine, tag, ["cat", "/opt/imagekit/manifest.json"]))
        assert manifest["python"]["seeds"] == [], manifest["python"]  # the lock pins pip: the venv was made without

        # job mode: the start check lets the command run; one dist-info per name, each the locked version
        held = _job_mode(engine, tag)
        assert held["pip"] == PIP and held["setuptools"] == SETUPTOOLS and "wheel" not in held, held
        assert set(held) == set(manifest["distributions"]), set(held) ^ set(manifest["distributions"])
        assert all(held[n] == v for n, v in manifest["distributions"].items()), held

        # pod mode: no command; the start check runs, the pod is ready and not blocked
        with containers.started(engine, tag) as pod:
            logs = pod.logs()
            assert "BLOCKED" not in logs and "start check took" in logs, logs[-3000:]
            code, live = _doctor(pod)
            assert code == 0 and live["lock-drift"]["status"] == "pass", live["lock-drift"]
            assert _walk(lambda script: pod.exec("python", "-c", script)[1]) == held

            # the image before the fix: the seed's setuptools beside the locked one. Both checks fail, naming both.
            rc, seed = pod.exec("sh", "-c", SECOND_SETUPTOOLS)
            assert rc == 0, seed
            code, live = _doctor(pod)
            tested = _selftest_dists(pod)
            site = "/opt/venv/lib/python3.11/site-packages"
            version = Path(seed.strip()).name.split("-")[1]
            both = (f"setuptools: {version} at {site}/setuptools-{version}.dist-info and {SETUPTOOLS} at "
                    f"{site}/setuptools-{SETUPTOOLS}.dist-info")  # fmt: skip
            assert code == 1 and live["lock-drift"]["status"] == "fail", live["lock-drift"]
            assert both in live["lock-drift"]["message"] and both in tested["message"], (live, tested)
            assert tested["status"] == "fail" and tested["evidence"]["duplicates"] == [both], tested
            broken = pod.container.commit(repository="imagekit-test/seeds-twice", tag="latest").id
        # that image started as a job: its start check blocks the command, as the first start was blocked
        code, out, err = engine.run(broken, ["echo", "trained"])
        assert code == 1 and "trained" not in out and both in err and "found a blocker" in err, err[-3000:]
    finally:
        engine.remove(tag)
        engine.remove(naming.alias_tag(repo, CELL))
        engine.remove("imagekit-test/seeds-twice:latest")


@pytest.mark.parametrize(
    ("packages", "seeds"),
    [
        ([f"setuptools=={SETUPTOOLS}"], ["pip"]),  # tensorboard's case: setuptools locked, the venv's pip kept
        pytest.param(  # neither locked: Python 3.11's venv keeps both of its seeds (`make test-images`)
            [], ["pip", "setuptools"], marks=pytest.mark.images
        ),
    ],
    ids=["setuptools-locked", "neither-locked"],
)
def test_a_lock_without_pip_keeps_its_seeds_declared_and_nothing_extra(
    engine, registry, index, tmp_path, packages, seeds
):
    repo = f"{registry.address}/imagekit-test/seeds-kept"
    built = _build(tmp_path / "kept", index, repo, packages)
    tag, report = built["result"]["tag"], built["report"]
    try:
        assert "\npip==" not in built["lock"] and ("\nsetuptools==" in built["lock"]) == bool(packages)
        checks = {c["id"]: c for c in report["checks"]}
        assert set(report["failed"]) <= FAKE_TORCH_FAILS, report["failed"]
        dists = checks["dists-match-lock"]
        assert dists["status"] == "pass" and not dists["evidence"]["extra"] and not dists["evidence"]["duplicates"]
        manifest = json.loads(containers.output(engine, tag, ["cat", "/opt/imagekit/manifest.json"]))
        assert manifest["python"]["seeds"] == seeds and not set(seeds) & set(manifest["distributions"])

        # one install of each name: the lock's, and the seeds the manifest declares (the base Python's own)
        held = _job_mode(engine, tag)
        assert set(held) == {*manifest["distributions"], *seeds} and "wheel" not in held, held
        assert held["pip"] != PIP and (held["setuptools"] == SETUPTOOLS) == bool(packages), held  # else the seed's
        with containers.started(engine, tag) as pod:
            assert "BLOCKED" not in pod.logs()
            code, live = _doctor(pod)
            drift = live["lock-drift"]
            assert code == 0 and drift["status"] == "pass" and not drift["evidence"]["extra"], drift  # not "warn"
    finally:
        engine.remove(tag)
        engine.remove(naming.alias_tag(repo, CELL))
