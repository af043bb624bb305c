"""imagekit runs the cell stage's steps itself (staged_build) on a real engine: the image holds exactly what the
whole Dockerfile on the legacy builder makes (every path, type, mode, owner, date, link and file's bytes), the history
names each step, a rebuild is the step cache (the same image id), and a step that fails says why."""

from __future__ import annotations

import dataclasses

import pytest

from imagekit.image import naming
from imagekit.model import Cell
from imagekit.services import inputs
from imagekit.services.builds import prune, staged_build
from imagekit.services.builds.build import build_cell
from tests import containers
from tests.conftest import _log
from tests.test_docker_e2e import _fake_opts
from tests.wheelfactory import fake_pypi_wheels, serve, write_simple_index

pytestmark = [pytest.mark.docker]

CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11")
TREES = "/opt/venv /opt/cuda-libs /opt/imagekit /etc /root /home /workspace /usr/local"
LISTING = (
    f"find {TREES} -xdev -printf '%p %y %m %U %G %T@ %s %l\\n' | sort; "
    f"find {TREES} -xdev -type f -print0 | sort -z | xargs -0 sha256sum"
)


# what the engine mounts into a container, or dates when it starts one
RUNTIME = ("/etc", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/etc/mtab")


def _listing(engine, image: str) -> list[str]:
    lines = containers.output(engine, image, ["sh", "-c", LISTING]).splitlines()
    return [line for line in lines if line.split(" ")[0] not in RUNTIME and not line.endswith(RUNTIME)]


def test_staged_steps_make_what_the_dockerfile_makes_and_a_rebuild_is_the_step_cache(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    root = tmp_path / "pypi"
    write_simple_index(root, fake_pypi_wheels(tmp_path / "w"))
    data = inputs.compat_data()
    made: dict[str, tuple[str, str]] = {}
    try:
        with serve(root) as url:
            opts = _fake_opts(tmp_path, f"{url}/simple", "imagekit-test/staged", push=False)
            for way, env, nocache in (("staged", "staged", True), ("cached", "staged", False),
                                      ("dockerfile", "dockerfile", True)):  # fmt: skip
                monkeypatch.setenv("IMAGEKIT_BUILD_STEPS", env)
                res = build_cell(CELL, dataclasses.replace(opts, nocache=nocache), engine, data, _log)
                assert res.step == "self-test", res.error and res.error.render()  # fake torch: the self-test fails
                made[way] = (res.tag, res.image_id)
                if way != "dockerfile":  # the tag is the same for all three: keep each image under a tag of its own
                    engine.tag(res.image_id, "imagekit-test/staged", way)
        staged, cached, dockerfile = "imagekit-test/staged:staged", "imagekit-test/staged:cached", made["dockerfile"][0]
        assert made["staged"][1] == made["cached"][1]  # the step cache: the same layers and config, the same id
        # the step images are left for `imagekit prune` (another build may be running on one): each is recorded,
        # and prune lists every one no tag names
        steps = staged_build.recorded_step_images()
        assert len(steps) >= 3, steps
        left = [i for i in steps if (engine.image(i) or {}).get("RepoTags") == []]
        assert left and set(left) <= {item.ref for item in prune.leftovers(engine) if item.kind == "step"}
        assert engine.layers(staged) == engine.layers(cached)
        got, want = _listing(engine, staged), _listing(engine, dockerfile)
        assert len(got) > 50 and got == want, sorted(set(got) ^ set(want))[:20]
        assert engine.layers(staged)[:3] == engine.layers(dockerfile)[:3]  # the base and the base stage: docker build
        history = [h.get("Comment") or "" for h in engine.history(staged)]
        assert sum("written by imagekit" in c for c in history) == 3  # CUDA runtime, torch, app
        assert not list((tmp_path / "state" / "stage").glob("*/*"))  # nothing left staged
        # what prune does with each step image it lists: removed, the final images (tagged) untouched
        assert all(staged_build.drop_step_image(engine, i) for i in left)
        assert all(engine.image(i) is None for i in left) and engine.image(staged) is not None
    finally:
        for ref in ("imagekit-test/staged:staged", "imagekit-test/staged:cached", made.get("dockerfile", ("",))[0]):
            if ref:
                engine.remove(ref)
        engine.remove(naming.build_cache_tag(CELL))
        engine.remove(naming.build_cache_tag(CELL) + "-base")
        engine.remove(naming.refused_tag(CELL))


def test_a_failing_step_says_which_and_why_and_leaves_nothing_staged(engine, tmp_path, monkeypatch):
    """A wheel the index serves with other bytes than the lock pins: uv refuses it inside the staged step."""
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "pypi"
    write_simple_index(root, fake_pypi_wheels(tmp_path / "w"))
    data = inputs.compat_data()
    with serve(root) as url:
        opts = _fake_opts(tmp_path, f"{url}/simple", "imagekit-test/staged-fail", push=False)
        house = tmp_path / "state" / "wheelhouse" / CELL.slug
        build_cell(CELL, dataclasses.replace(opts, nocache=True), engine, data, _log)  # locks and fetches
        engine.remove(naming.build_cache_tag(CELL))
        # the wheel server serves the wheelhouse: replace the torch wheel there by other bytes of the same name
        from imagekit.services.wheels import wheel_folders

        real = wheel_folders.wheelhouse

        def tampered(wheels, into):
            out = real(wheels, into)
            torch = next(p for p in out.iterdir() if p.name.startswith("torch-"))
            data_ = torch.read_bytes()
            torch.unlink()
            torch.write_bytes(data_ + b"\0")
            return out

        monkeypatch.setattr(wheel_folders, "wheelhouse", tampered)
        res = build_cell(CELL, dataclasses.replace(opts, nocache=True), engine, data, _log)
    try:
        assert res.status == "failed" and res.step == "build", res.error and res.error.render()
        text = res.error.render()
        assert "step " in text and "failed (exit" in text and "hash" in text.lower(), text
        assert not list((tmp_path / "state" / "stage").glob("*/*"))
        assert house.exists()
    finally:
        engine.remove(naming.build_cache_tag(CELL))
        engine.remove(naming.build_cache_tag(CELL) + "-base")
        for image in engine.client.images.list(name="imagekit-test/staged-fail"):  # the first build's tags
            for tag in image.tags:
                engine.remove(tag)


# A hostile package: its .pth runs at every interpreter start in the image, so in the next step's install-layer too,
# where it makes the stage's root a link out of the stage (on the host, "../../.." is the build's own folders).
HOSTILE_PTH = (
    b'import os, shutil; s = os.environ.get("IMAGEKIT_STAGE", ""); r = os.path.join(s, "root"); '
    b'(s and os.path.isdir(r) and not os.path.islink(r)) and (shutil.rmtree(r), os.symlink("../../..", r))\n'
)


def test_a_package_whose_code_links_the_stage_root_out_fails_the_build_and_the_host_copies_nothing(
    engine, tmp_path, monkeypatch
):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("IMAGEKIT_BUILD_STEPS", "staged")
    (tmp_path / "host-secret.txt").write_text("HOST SECRET\n")  # where the link leads on the build host
    root = tmp_path / "pypi"
    write_simple_index(root, fake_pypi_wheels(tmp_path / "w", torch_files={"zz_hostile.pth": HOSTILE_PTH}))
    try:
        with serve(root) as url:
            opts = _fake_opts(tmp_path, f"{url}/simple", "imagekit-test/staged-hostile", push=False)
            res = build_cell(CELL, dataclasses.replace(opts, nocache=True), engine, inputs.compat_data(), _log)
        assert res.status == "failed" and res.step == "build", res.error and res.error.render()
        text = res.error.render()
        assert "left what no layer of installs holds: root is a symbolic link" in text, text
        assert "HOST SECRET" not in text
        assert engine.image(naming.build_cache_tag(CELL)) is None  # nothing tagged
        assert not list((tmp_path / "state" / "stage").iterdir())  # nothing left staged
        assert (tmp_path / "host-secret.txt").read_text() == "HOST SECRET\n"
    finally:
        engine.remove(naming.build_cache_tag(CELL))
        engine.remove(naming.build_cache_tag(CELL) + "-base")
