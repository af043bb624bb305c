"""`imagekit init --from` picks axes that lock: a transformers range the file leaves to imagekit is resolved with the
rest of the file for the candidate cell, the newest known release that resolves written, the pins that ruled the
newer ones out named; each torch's index said. Against a loopback PEP 503 index with uv, as `imagekit lock` runs."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from imagekit.matrix import project_axes, project_deps
from imagekit.services.locks import init_axes
from tests.wheelfactory import fake_pypi_wheels, serve, write_simple_index

pytestmark = [pytest.mark.resolver, pytest.mark.loopback]


def test_init_writes_the_newest_transformers_that_resolves_and_the_cell_locks_first_time(
    app, runner, data, in_tmp, monkeypatch
):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(in_tmp / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(in_tmp / "uv-cache"))
    file = "torch==2.5.1\ntransformers>=4.49\nhuggingface-hub<1.0\n"
    deps = project_deps.read_requirements("requirements.txt", lambda _: file)
    items = [i for i in project_axes.for_env(deps, "3.11") if i.name == "transformers"]
    newest = init_axes.candidates(items, "12.4", "2.5.1", "3.11", data)[0]  # what init took before: the lock failed
    assert newest != "4.49.0"
    wheels = fake_pypi_wheels(
        in_tmp / "w",
        extra=[
            ("transformers", newest, ["numpy>=1.17", "huggingface-hub>=1.0"]),
            ("huggingface-hub", "0.36.0", []),
            ("huggingface-hub", "1.1.0", []),
        ],
    )
    write_simple_index(in_tmp / "pypi", wheels)
    with serve(in_tmp / "pypi") as url:
        Path("requirements.txt").write_text(f"--index-url {url}/simple\n{file}")
        res = runner.invoke(app, ["init", "--from", "requirements.txt", "--repository", "127.0.0.1:5000/a/b"])
        assert res.exit_code == 0, res.output
        doc = tomllib.loads(Path("imagekit.toml").read_text())
        assert doc["matrix"]["transformers"] == ["4.49.0"] and doc["matrix"]["torch"] == ["2.5.1"]
        said = " ".join(res.stderr.split())
        assert (
            "transformers 4.49.0: the newest known release (>=4.49) that resolves with the file "
            "(torch 2.5.1 on CUDA 12.4" in said
        ), said
        assert f"transformers {newest} (newer) does not:" in said and "huggingface-hub" in said, said
        assert "requirements.txt:4: huggingface-hub<1.0" in said, said
        assert "torch 2.5.1 (CUDA 12.4): PyPI's default build (cu124)" in said, said

        lock = runner.invoke(app, ["lock"])
        assert lock.exit_code == 0, lock.output  # first time
    (path,) = (in_tmp / "lockfiles").glob("*.txt")
    assert path.stem == "cu124-torch2.5.1-py3.11-tf4.49.0"
    assert "huggingface-hub==0.36.0" in path.read_text()


def test_init_says_which_torch_the_rules_exclude_with_the_transformers_it_chose(app, runner, data, in_tmp, monkeypatch):
    """A transformers range that leaves both default torch releases: the release chosen for the newest torch is one
    the rules exclude with the older torch (transformers does not declare torch, so the resolver cannot tell). The
    note names only the cells it resolves in, and says the older torch's cells are dropped and why."""
    monkeypatch.setenv("IMAGEKIT_CACHE", str(in_tmp / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(in_tmp / "uv-cache"))
    file = "torch>=2.5\ntransformers>=5.0\n"
    deps = project_deps.read_requirements("requirements.txt", lambda _: file)
    items = [i for i in project_axes.for_env(deps, "3.11") if i.name == "transformers"]
    newest = init_axes.candidates(items, "12.8", "2.8.0", "3.11", data)[0]
    assert not init_axes._allowed("12.4", "2.5.1", newest, "3.11", data)  # the premise: a rule drops the pair
    wheels = fake_pypi_wheels(
        in_tmp / "w",
        extra=[
            ("torch", "2.8.0", ["filelock", "nvidia-cuda-runtime-cu12==12.8.90"]),
            ("nvidia-cuda-runtime-cu12", "12.8.90", []),
            ("transformers", newest, ["numpy>=1.17", "filelock"]),
        ],
    )
    write_simple_index(in_tmp / "pypi", wheels)
    with serve(in_tmp / "pypi") as url:
        Path("requirements.txt").write_text(f"--index-url {url}/simple\n{file}")
        res = runner.invoke(app, ["init", "--from", "requirements.txt", "--repository", "127.0.0.1:5000/a/b"])
        assert res.exit_code == 0, res.output
        doc = tomllib.loads(Path("imagekit.toml").read_text())
        assert doc["matrix"]["transformers"] == [newest], doc["matrix"]
        said = " ".join(res.stderr.split())
        assert (
            f"transformers {newest}: the newest known release (>=5.0) that resolves with the file "
            "(torch 2.8.0 on CUDA 12.8, Python 3.11)" in said
        ), said
        assert f"torch 2.5.1: excluded with transformers {newest} (transformers-torch: " in said, said
        lock = runner.invoke(app, ["lock"])
        assert lock.exit_code == 0, lock.output
    assert [p.stem for p in (in_tmp / "lockfiles").glob("*.txt")] == [f"cu128-torch2.8.0-py3.11-tf{newest}"]
