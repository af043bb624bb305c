"""Self-contained BuildKit contexts: `imagekit render` + `imagekit fetch --into` build with `docker buildx build` and
`docker buildx bake` (the `docker` driver on this engine), wheels bind-mounted and absent from every layer, the
base pulled by digest from a registry after `imagekit base bootstrap --push`."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile

import pytest

from tests import containers
from tests.conftest import REAL_CELL, ROOT
from tests.wheelfactory import fake_pypi_wheels, serve, write_simple_index

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        shutil.which("docker") is None
        or subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode != 0,
        reason="needs the docker buildx plugin (tools/install-buildx, run by `make setup`)",
    ),
]

FAKE = "cu124-torch2.5.1-py3.11-tf4.48.2"


def _imagekit(app, runner, *args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.stdout


def _layer_members(image: str, tmp) -> list[str]:
    """Every path in every layer of ``image`` (docker save: one tar per layer)."""
    saved = tmp / "image.tar"
    subprocess.run(["docker", "save", "-o", str(saved), image], check=True)
    names = []
    with tarfile.open(saved) as outer:
        for member in outer.getmembers():
            if member.name.endswith("layer.tar"):
                with tarfile.open(fileobj=outer.extractfile(member)) as layer:
                    names += layer.getnames()
    saved.unlink()
    return names


def test_bake_builds_a_locked_cell_from_a_pushed_base(app, runner, engine, registry, tmp_path, monkeypatch):
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "pypi"
    write_simple_index(root, fake_pypi_wheels(tmp_path / "w"))
    # the base (from the usual cache: bootstrapped once), pushed by digest: what a CI runner pulls
    snippet = _imagekit(app, runner, "base", "bootstrap", "--python", "3.11", "--push", f"{registry.address}/it/base")
    assert snippet.startswith('[bases."3.11"]\nreference = "') and "@sha256:" in snippet
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    repo = f"{registry.address}/it/bake"
    (tmp_path / "imagekit.toml").write_text(
        f'[image]\nrepository = "{repo}"\n\n[[matrix.include]]\ncuda = "12.4"\ntorch = "2.5.1"\n'
        f'transformers = "4.48.2"\npython = "3.11"\n\n{snippet}'
    )
    with serve(root) as url:
        _imagekit(app, runner, "lock", "--index-url", f"{url}/simple", "--dir", "lockfiles")
        _imagekit(app, runner, "render", "--out", "build")
        _imagekit(app, runner, "fetch", "--into", "build", "--quiet")
    dockerfile = (tmp_path / "build" / FAKE / "Dockerfile").read_text()
    reference = snippet.split('reference = "')[1].split('"')[0]
    assert f"FROM {reference} AS base" in dockerfile
    assert sorted(p.name for p in (tmp_path / "build" / FAKE / "wheels").iterdir())  # real files, not links
    assert not any(p.is_symlink() for p in (tmp_path / "build" / FAKE / "wheels").iterdir())
    bake = json.loads(_imagekit(app, runner, "matrix", "--format", "bake"))
    (tmp_path / "docker-bake.json").write_text(json.dumps(bake))
    (target,) = bake["target"].values()
    alias, immutable = target["tags"]
    try:
        res = subprocess.run(
            ["docker", "buildx", "bake", "-f", "docker-bake.json", "--load"], capture_output=True, text=True
        )
        assert res.returncode == 0, res.stderr[-3000:]
        assert engine.image(alias)["Id"] == engine.image(immutable)["Id"]
        names = _layer_members(immutable, tmp_path)
        assert any(n.endswith("site-packages/transformers/__init__.py") for n in names)
        wheels = tmp_path / "build" / FAKE / "wheels"
        fetched = {p.name for p in wheels.iterdir() if p.suffix == ".whl"}
        assert fetched and not [n for n in names if n.rsplit("/", 1)[-1] in fetched]  # mounted, never in a layer
        assert sorted(p.name for p in wheels.glob("requirements-*.txt")) == [  # each layer's, beside the wheels
            "requirements-app.txt",
            "requirements-cuda-toolkit.txt",
            "requirements-torch.txt",
        ]
        assert not [n for n in names if "/mnt/" in n]
        res = runner.invoke(app, ["selftest", immutable, "--gpus", "off", "--json"])
        status = {c["id"]: c["status"] for c in json.loads(res.stdout)["checks"]}
        # the fake torch installs exactly as locked; it is not a CUDA build, which the self-test says (exit 1)
        assert status["dists-match-lock"] == "pass" and status["torch-cuda-version"] == "fail"
        assert res.exit_code == 1 and "self-test FAILED (" in res.stderr
    finally:
        for tag in (alias, immutable):
            engine.remove(tag)


@pytest.mark.slow
@pytest.mark.images  # a second build of the torch cell (buildx): `make test-images`; the bake test covers BuildKit here
def test_buildx_builds_the_real_cell_and_its_self_test_passes(app, runner, engine, real_build, tmp_path):
    """The demo cell (real torch 2.1.2 with its CUDA wheels, cached by the real build) through `docker buildx
    build`: the self-test passes inside it and no wheel is in the image."""
    out = tmp_path / "build"
    sel = ["--cell", REAL_CELL.id, "--lock-dir", str(ROOT / "lockfiles"), "--matrix", str(tmp_path / "m.toml")]
    pkgs = ", ".join(f'"{p}"' for p in REAL_CELL.packages)
    (tmp_path / "m.toml").write_text(
        f'[[matrix.include]]\ncuda = "{REAL_CELL.cuda}"\ntorch = "{REAL_CELL.torch}"\n'
        f'transformers = "{REAL_CELL.transformers}"\npython = "{REAL_CELL.python}"\npackages = [{pkgs}]\n'
    )
    _imagekit(app, runner, "render", *sel, "--out", str(out))
    _imagekit(app, runner, "fetch", *sel, "--into", str(out), "--quiet")
    tag = f"imagekit-test/buildx:{REAL_CELL.id}"
    try:
        res = subprocess.run(
            ["docker", "buildx", "build", "--load", "-t", tag, str(out / REAL_CELL.id)], capture_output=True, text=True
        )
        assert res.returncode == 0, res.stderr[-3000:]
        res = runner.invoke(app, ["selftest", tag, "--json"])
        assert res.exit_code == 0, res.output
        report = json.loads(res.stdout)
        assert {c["id"] for c in report["checks"]} == {c["id"] for c in real_build[0].report["checks"]}
        assert "self-test passed: " in res.stderr
        found = containers.output(
            engine, tag, ["sh", "-c", "find / -xdev -name '*.whl' -not -path '/usr/share/python-wheels/*'; ls -A /mnt"]
        )
        assert found.strip() == ""  # no wheel anywhere, and the mount point is left as it was (empty)
    finally:
        engine.remove(tag)
