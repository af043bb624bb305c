"""A project as it is (`[image] install`, `env`, `smoke`) on a real engine and registry: its wheel built offline in a
container of the cell's base with the locked build backend, installed into the venv with --no-deps, its variables in
the image's config, its own commands run by the self-test; a command that fails blocks the publish.

The cell is a fake one (tests/wheelfactory.py: its torch is a stand-in, so the self-test's torch checks fail as they
do in `test_failing_selftest_pushes_nothing`); what this test reads is the project's part of the report. That a
passing self-test publishes the project's image is `test_project_publish.py`'s, over the recording engine."""

from __future__ import annotations

import dataclasses
import json

import pytest

from imagekit.effects.registry import RegistryClient, Remote
from imagekit.image import naming
from imagekit.image.code_layer import CopySpec
from imagekit.image.image_options import ImageOptions
from imagekit.locking import resolution
from imagekit.model import Cell
from imagekit.services import inputs
from imagekit.services.builds.build import BuildOptions, build_cell
from tests import containers
from tests.wheelfactory import BACKEND, backend_wheel, fake_pypi_wheels, serve, write_simple_index

pytestmark = [pytest.mark.docker]

CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11", (f"{BACKEND}==1.0",))
FAKE_TORCH_FAILS = {"torch-cuda-version", "torch-archs", "cuda-libraries", "numpy-interop", "tiny-model",
                    "torch-compile", "gpu-cuda-available"}  # fmt: skip
PYPROJECT = f"""[build-system]
requires = ["{BACKEND}>=1.0"]
build-backend = "imagekit_test_backend"

[project]
name = "alignment"
version = "0.1.0"
dependencies = ["numpy>=1.17", "filelock; sys_platform == 'linux'", "accelerate>=1; sys_platform == 'win32'"]
"""
RUN_SFT = """import argparse, os
import alignment
parser = argparse.ArgumentParser(description="fine-tune " + alignment.greet())
parser.parse_args()
print("project", os.environ["WANDB_PROJECT"])
"""
SMOKE = (
    "python -c 'import alignment; print(alignment.greet())'",
    "python /opt/app/scripts/run_sft.py --help && python /opt/app/scripts/run_sft.py",
    "python /opt/app/scripts/broken.py",  # fails on its first line, as a script whose dependency the lock lacks
)


def _project(root):
    (root / "alignment").mkdir(parents=True)
    (root / "alignment" / "__init__.py").write_text("import numpy\n\n\ndef greet():\n    return 'aligned'\n")
    (root / "scripts").mkdir()
    (root / "scripts" / "run_sft.py").write_text(RUN_SFT)
    (root / "scripts" / "broken.py").write_text("import trl\n")
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / ".dockerignore").write_text("data/\n")
    return root


def test_the_project_is_built_installed_configured_and_its_failing_command_blocks_the_publish(
    engine, registry, tmp_path, monkeypatch
):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    index = tmp_path / "pypi"
    write_simple_index(index, [*fake_pypi_wheels(tmp_path / "w"), backend_wheel(tmp_path / "w")])
    project = _project(tmp_path / "acme")
    repo = f"{registry.address}/imagekit-test/project"
    options = ImageOptions(
        copy=CopySpec(str(project), project=str(project)),
        install=str(project),
        env=(("TOKENIZERS_PARALLELISM", "false"), ("WANDB_PROJECT", "sft-demo")),
        smoke=SMOKE,
    )
    lines: list[str] = []
    tags: list[str] = []
    try:
        with serve(index) as url:
            opts = BuildOptions(
                repository=repo,
                lock_dir=tmp_path / "locks",
                state_dir=tmp_path / "state",
                release_index=tmp_path / "releases.json",
                push=True,
                settings=resolution.LockSettings(index_url=f"{url}/simple"),
                options=options,
            )
            res = build_cell(CELL, opts, engine, inputs.compat_data(), lambda _c, m: lines.append(m))
            refused = naming.refused_tag(CELL)  # the refused image: under no tag it would be published as
            tags.append(refused)
            assert res.tag == refused and engine.image(naming.alias_tag(repo, CELL)) is None
            assert engine.image(refused)["Id"] == res.image_id
            assert (refused, res.image_id) in [(t, i) for t, i, _ in engine.images_named(naming.REFUSED)]  # prune's
            # the failing command blocks the publish at the self-test: nothing pushed, no record
            assert (res.status, res.step) == ("failed", "self-test"), res.error and res.error.render()
            checks = {c["id"]: c for c in res.report["checks"]}
            assert set(res.report["failed"]) == FAKE_TORCH_FAILS | {"smoke-3"}, res.report["failed"]
            assert checks["smoke-1"]["status"] == "pass" and checks["smoke-1"]["evidence"]["exit"] == 0
            assert checks["smoke-1"]["evidence"]["output_tail"].strip() == "aligned"
            assert checks["smoke-2"]["status"] == "pass"
            assert "fine-tune aligned" in checks["smoke-2"]["evidence"]["output_tail"]
            assert "project sft-demo" in checks["smoke-2"]["evidence"]["output_tail"]  # [image] env, in the image
            broken = checks["smoke-3"]
            assert (
                broken["evidence"]["exit"] == 1 and "ModuleNotFoundError: No module named 'trl'" in (broken["message"])
            ), broken
            # the lock and the wheel: the project is in the image's distributions, exactly once, from its wheel
            assert checks["dists-match-lock"]["status"] == "pass", checks["dists-match-lock"]
            assert checks["pip-check"]["status"] == "pass", checks["pip-check"]
            imports = checks["project-imports"]  # the wheel's top-level module, imported in the image's Python
            assert imports["status"] == "pass" and imports["evidence"]["imported"] == ["alignment"], imports
            assert any(line.startswith("building the project's wheel from") for line in lines), lines
            assert not [t for t in engine.image(refused).get("RepoTags") or [] if t.startswith(f"{repo}:")]
            assert RegistryClient().oci_manifest(Remote.parse(repo), CELL.id) is None
            assert not (tmp_path / "releases.json").exists()
            # the image: the wheel installed into the venv, byte-compiled, without its dependencies; the code beside
            manifest = json.loads(containers.output(engine, refused, ["cat", "/opt/imagekit/manifest.json"]))
            wheel = manifest["project"]
            context = tmp_path / "state" / "build" / CELL.slug
            first_wheel = (context / "requirements-project.txt").read_text()
            assert first_wheel.startswith("alignment==0.1.0 \\\n    --hash=sha256:")
            assert wheel["name"] == "alignment" and wheel["wheel"] == "alignment-0.1.0-py3-none-any.whl"
            assert manifest["distributions"]["alignment"] == "0.1.0" and manifest["smoke"]["commands"] == list(SMOKE)
            found = containers.output(
                engine, refused, ["sh", "-c", "cd /opt/venv/lib/python3.11/site-packages && ls -d alignment* "
                                  "alignment/__pycache__ && cat alignment-0.1.0.dist-info/INSTALLER; ls /opt/app"],
            )  # fmt: skip
            assert "alignment-0.1.0.dist-info" in found and "alignment/__pycache__" in found, found
            assert "pyproject.toml" in found and "scripts" in found and "build" not in found.split(), found
            env = engine.image(refused)["Config"]["Env"]
            assert "WANDB_PROJECT=sft-demo" in env and "TOKENIZERS_PARALLELISM=false" in env
            assert env.index("IMAGEKIT_MANIFEST=/etc/imagekit/manifest.json") < env.index("WANDB_PROJECT=sft-demo")
            assert checks["labels-match-contents"]["status"] == "pass"  # the config holds what imagekit set

            # a fixed command, built again: the wheel is the kept one (not built again), the same sha256
            lines.clear()
            fixed = dataclasses.replace(opts, options=dataclasses.replace(options, smoke=SMOKE[:2]))
            again = build_cell(CELL, fixed, engine, inputs.compat_data(), lambda _c, m: lines.append(m))
            tags.append(again.tag or "")
        assert not any(line.startswith("building the project's wheel") for line in lines), lines
        assert again.step == "self-test" and set(again.report["failed"]) == FAKE_TORCH_FAILS  # the project's pass
        assert (context / "requirements-project.txt").read_text() == first_wheel  # the same wheel, by its sha256
    finally:
        for tag in tags:
            if tag:
                engine.remove(tag)
        engine.remove(naming.alias_tag(repo, CELL))
        engine.remove(naming.build_cache_tag(CELL))
        engine.remove(naming.build_cache_tag(CELL) + "-base")
