"""Two CI runners on one machine, one registry: concurrent builds, concurrent publishers, one merged index.

The fake cells' self-test fails by design (their torch is a stub), so the builds below stop at the self-test and
push nothing; what they show is that two `imagekit build` processes run side by side (each its own wheel server)
and produce the same immutable tag and the same layers. Publishing is then driven through the publish and record
services directly, from two processes at once, on two real images pushed to a real registry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from imagekit.effects.registry import RegistryClient, Remote
from imagekit.services import inputs
from imagekit.services.builds.base_images import ensure_base
from tests.wheelfactory import fake_pypi_wheels, serve, write_simple_index

pytestmark = [pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[2]
CELL = "cu124-torch2.5.1-py3.11-tf4.48.2"
OTHER = "cu121-torch2.1.2-py3.11-tf4.48.2"


@pytest.fixture
def fake_index(tmp_path):
    root = tmp_path / "pypi"
    write_simple_index(root, fake_pypi_wheels(tmp_path / "w"))
    with serve(root) as url:
        yield f"{url}/simple"


def _runner(tmp_path: Path, name: str, index_url: str, repo: str) -> subprocess.Popen:
    """The workflow's build step, as one runner runs it: its own state, cache and lock folder."""
    home = tmp_path / name
    (home / "locks").mkdir(parents=True)
    (home / "imagekit.toml").write_text(  # the fake index has the cell's own packages only
        '[matrix]\ninclude = [{cuda = "12.4", torch = "2.5.1", transformers = "4.48.2", python = "3.11"}]\n'
    )
    env = {**os.environ, "IMAGEKIT_CACHE": str(home / "cache"), "UV_CACHE_DIR": str(home / "uv-cache")}
    argv = [sys.executable, "-m", "imagekit", "build", "--cell", CELL, "--registry", repo, "--push", "--json"]
    argv += ["--quiet", "--lock-dir", str(home / "locks"), "--state-dir", str(home / "state"), "--gpus", "off"]
    argv += ["--release-index", str(home / "index.json"), "--release-records", str(home / "records")]
    argv += ["--index-url", index_url]
    return subprocess.Popen(argv, cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _pip_layers(engine, image_id: str) -> list[str]:
    """The diff ids of the layers the install RUNs made (CUDA, torch closure, app). In the legacy builder's history
    every entry but a `#(nop)` one (COPY and ADD excepted) made a layer, in RootFS order; imagekit's own last entry
    (the runtime config) made none."""
    made = [
        h["CreatedBy"]
        for h in reversed(engine.api.history(image_id))
        if ("#(nop)" not in h["CreatedBy"] or "#(nop) COPY" in h["CreatedBy"] or "#(nop) ADD" in h["CreatedBy"])
        and not h["CreatedBy"].startswith("imagekit ")  # the runtime config imagekit sets: no layer
    ]
    layers = engine.image(image_id)["RootFS"]["Layers"]
    assert len(made) == len(layers), made
    return [layer for how, layer in zip(made, layers, strict=True) if "bin/install-layer" in how]


def test_two_runners_build_side_by_side_and_publish_into_one_index(engine, registry, fake_index, tmp_path, app, runner):
    repo = f"{registry.address}/imagekit-test/runners"
    procs = [_runner(tmp_path, name, fake_index, repo) for name in ("r1", "r2")]
    outs = [p.communicate(timeout=900) for p in procs]
    results = [json.loads(out)[0] for out, _ in outs]
    for (_, err), res in zip(outs, results, strict=True):
        # both got through docker build at once (port 8765 on two loopback addresses); the stub torch then fails
        assert res["step"] == "self-test" and res["status"] == "failed", err[-3000:]
        assert "127.0.0.1:8765 is in use" not in err
    assert results[0]["tag"] == results[1]["tag"]  # the wheel server's address is not in the build hash
    installed = [_pip_layers(engine, r["image_id"]) for r in results]
    assert len(installed[0]) == 3 and installed[0] == installed[1]  # what the two wheel servers fed: the same bytes

    # two publishers at once: the built image under its cell's tag, the base under another cell's tag
    base = ensure_base(inputs.compat_data().bases["3.11"], engine).reference
    images = {CELL: results[0]["image_id"], OTHER: engine.image(base)["Id"]}
    script = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        from imagekit.effects.docker import Engine
        from imagekit.effects.registry import RegistryClient
        from imagekit.services.publishing import publish, release_index
        from imagekit.services.builds.selftest_runner import SelfTestReport
        repo, cell, image, index, records = sys.argv[1:6]
        passed = {"passed": True, "failed": [], "checks": [{"id": "python", "status": "pass"}]}
        report = SelfTestReport(image, True, passed)
        p = publish.publish(Engine(), RegistryClient(), image_id=image, repository=repo,
                            immutable_tag=f"{cell}-0123456789ab", alias_tag=cell, report=report)
        release_index.record(Path(index), p, lock_hash="l" * 64, manifest={"cell": {"id": cell}}, report=report.report,
                       size=1, records_dir=Path(records))
        print(json.dumps([p.immutable, p.digest]))
        """
    )
    index = tmp_path / "shared" / "index.json"
    pubs = [
        subprocess.Popen(
            [sys.executable, "-c", script, repo, cell, image, str(index), str(tmp_path / f"records-{cell}")],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cell, image in images.items()
    ]
    answers = [p.communicate(timeout=600) for p in pubs]
    assert [p.returncode for p in pubs] == [0, 0], [err[-2000:] for _, err in answers]
    published = dict(json.loads(out) for out, _ in answers)
    assert sorted(json.loads(index.read_text())["images"]) == sorted(published)  # the shared index lost nothing

    # the release job: merge both runners' records into a fresh index, each digest checked with the registry
    res = runner.invoke(
        app,
        [
            "release",
            "merge",
            *(str(tmp_path / f"records-{c}") for c in images),
            "--index",
            str(tmp_path / "i.json"),
            "--registry",
            repo,
        ],
    )
    assert res.exit_code == 0, res.output
    merged = json.loads((tmp_path / "i.json").read_text())["images"]
    assert {t: e["digest"] for t, e in merged.items()} == published
    for tag, digest in published.items():
        assert (
            RegistryClient().oci_manifest(Remote.parse(tag.rsplit(":", 1)[0]), tag.rsplit(":", 1)[1]).digest == digest
        )
    for cell in images:
        engine.remove(f"{repo}:{cell}-0123456789ab")
