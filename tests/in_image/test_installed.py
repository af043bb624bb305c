"""What a venv holds, read once (facts.installed_distributions) for both the self-test's `dists-match-lock` and the
start check's `lock-drift`: on venv-shaped trees, a name installed twice is a finding in both, naming both versions
and where each lies; the reading finds what importlib.metadata finds; the image's seeds are declared, not guessed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from imagekit.image import render
from imagekit.image.buildplan import BaseRef, BuildPlan, manifest, venv_seeds
from imagekit.in_image import facts, selftest
from imagekit.in_image import imagekit_doctor as doctor
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.model import Cell
from tests.conftest import ROOT

SITE = "lib/python3.11/site-packages"
LOCK = {"pip": "25.0", "setuptools": "84.2.1", "filelock": "3.16.1", "nvidia-cuda-runtime-cu12": "12.4.127"}


def dist_info(folder: Path, name: str, version: str, meta: str | None = None) -> Path:
    """A ``<name>-<version>.dist-info`` as an installer leaves it (METADATA, RECORD), in ``folder``."""
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    text = meta if meta is not None else f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n"
    (info / "METADATA").write_text(text)
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n")
    return info


def image_tree(root: Path, staged_twice: bool) -> tuple[Path, Path]:
    """/opt/venv and /opt/cuda-libs of an image whose lock pins setuptools and pip, under ``root``: as the staged build
    left it before each name was installed once (``staged_twice``: the seeds of `python -m venv` beside the locked
    ones), or as it is now. Returns (site-packages, the CUDA prefix)."""
    site, cuda = root / "opt/venv" / SITE, root / "opt/cuda-libs"
    site.mkdir(parents=True)
    (site / "imagekit-cuda-libs.pth").write_text(f"{cuda}\n")
    for name in ("pip", "setuptools", "filelock"):
        dist_info(site, name, LOCK[name])
        (site / name).mkdir()
    if staged_twice:
        dist_info(site, "pip", "23.0.1")
        dist_info(site, "setuptools", "66.1.1")
    dist_info(cuda, "nvidia-cuda-runtime-cu12", LOCK["nvidia-cuda-runtime-cu12"])
    (cuda / "nvidia").mkdir()
    return site, cuda


def test_a_venv_with_two_installs_of_a_name_reads_as_both(tmp_path):
    site, cuda = image_tree(tmp_path, staged_twice=True)
    installs = facts.installed_distributions([str(site), str(cuda)])
    assert installs["setuptools"] == [
        ("66.1.1", str(site / "setuptools-66.1.1.dist-info")),
        ("84.2.1", str(site / "setuptools-84.2.1.dist-info")),
    ]
    assert [v for v, _ in installs["pip"]] == ["23.0.1", "25.0"]
    assert installs["nvidia-cuda-runtime-cu12"] == [
        ("12.4.127", str(cuda / "nvidia_cuda_runtime_cu12-12.4.127.dist-info"))
    ]
    drift = facts.lock_drift(LOCK, installs, seeds=())
    assert drift["duplicates"] == [
        f"pip: 23.0.1 at {site}/pip-23.0.1.dist-info and 25.0 at {site}/pip-25.0.dist-info",
        f"setuptools: 66.1.1 at {site}/setuptools-66.1.1.dist-info and 84.2.1 at {site}/setuptools-84.2.1.dist-info",
    ]
    # the version Python imports (the first found) is the one compared: here the seed's, so it differs too
    assert drift["different"] == ["pip", "setuptools"] and not drift["missing"] and not drift["extra"]
    clean = facts.installed_distributions([str(p) for p in image_tree(tmp_path / "now", staged_twice=False)])
    assert facts.lock_drift(LOCK, clean, seeds=()) == {"missing": [], "extra": [], "different": [], "duplicates": []}


def test_the_first_path_entry_is_the_one_python_imports(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    dist_info(first, "alpha", "2.0")
    dist_info(second, "alpha", "1.0")
    installs = facts.installed_distributions([str(first), str(second)])
    assert [v for v, _ in installs["alpha"]] == ["2.0", "1.0"]
    assert facts.lock_drift({"alpha": "2.0"}, installs)["different"] == []
    assert facts.lock_drift({"alpha": "2.0"}, installs)["duplicates"] == [
        f"alpha: 2.0 at {first}/alpha-2.0.dist-info and 1.0 at {second}/alpha-1.0.dist-info"
    ]


def test_every_form_importlib_finds_and_nothing_it_does_not(tmp_path, monkeypatch):
    site = tmp_path / "site"
    dist_info(site, "Foo.Bar_baz", "1.0")  # the name from METADATA, canonicalised
    dist_info(site, "renamed", "9.9", meta="Metadata-Version: 2.1\nName: Other\nVersion: 3.0\n")  # METADATA says
    (site / "legacy-1.2-py3.11.egg-info").write_text("Metadata-Version: 1.1\nName: legacy\nVersion: 1.2\n")  # a file
    (site / "Old_Pkg-0.5.egg-info").mkdir()
    (site / "Old_Pkg-0.5.egg-info" / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: Old_Pkg\nVersion: 0.5\n")
    (site / "broken-4.0.dist-info").mkdir()  # no METADATA (a half-removed install): its folder's name says
    (site / "headers-only.dist-info").mkdir()
    (site / "headers-only.dist-info" / "METADATA").write_text("Name: headers\nVersion: 7\n\nVersion: 8\nName: body\n")
    (site / "fifo-1.0.dist-info").mkdir()
    os.mkfifo(site / "fifo-1.0.dist-info" / "METADATA")  # never waited on: read as no metadata
    (site / "notes.txt").write_text("not a distribution\n")
    egg = tmp_path / "eggy-2.0-py3.11.egg"
    (egg / "EGG-INFO").mkdir(parents=True)
    (egg / "EGG-INFO" / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: eggy\nVersion: 2.0\n")
    cwd = tmp_path / "cwd"
    dist_info(cwd, "here", "0.1")
    monkeypatch.chdir(cwd)
    paths = ["", str(site), str(egg), str(tmp_path / "missing"), str(tmp_path / "python311.zip")]
    found = {n: [v for v, _ in f] for n, f in facts.installed_distributions(paths).items()}
    assert found == {
        "here": ["0.1"],
        "foo-bar-baz": ["1.0"],
        "other": ["3.0"],
        "legacy": ["1.2"],
        "old-pkg": ["0.5"],
        "broken": ["4.0"],
        "headers": ["7"],
        "fifo": ["1.0"],
        "eggy": ["2.0"],
    }
    # what importlib.metadata finds there (all but the FIFO's and the folder-named one, whose metadata it cannot read:
    # it would wait on the FIFO forever, so the FIFO goes first and its folder is then one without METADATA)
    os.unlink(site / "fifo-1.0.dist-info" / "METADATA")
    theirs = {facts.canon(d.metadata["Name"]) for d in metadata.distributions(path=paths) if d.metadata["Name"]}
    assert theirs == set(found) - {"broken", "fifo"}


def test_the_reading_is_importlibs_on_this_interpreters_real_environment():
    """Every distribution of the venv running the tests, at the version importlib.metadata gives for it."""
    installs = facts.installed_distributions(sys.path)
    theirs = {}
    for dist in metadata.distributions():
        if dist.metadata["Name"]:
            theirs.setdefault(facts.canon(dist.metadata["Name"]), dist.version)
    assert len(theirs) > 50 and {n: found[0][0] for n, found in installs.items()} == theirs


def test_the_seeds_an_image_keeps_are_declared_by_its_manifest_or_guessed_for_anything_else():
    assert facts.declared_seeds({"python": {"seeds": ["pip"]}}) == {"pip"}
    assert facts.declared_seeds({"python": {"seeds": []}}) == frozenset()
    # a lockfile given to the doctor, or a manifest from before `seeds`: any seed of `python -m venv`
    for manifest_doc in ({"distributions": {}}, {"python": {"version": "3.11"}}, {"python": "3.11"}, None):
        assert facts.declared_seeds(manifest_doc) == facts.VENV_SEEDS


def in_image(monkeypatch, root: Path, site: Path, cuda: Path) -> dict:
    """This process as the image's interpreter sees itself (sys.prefix the venv, sys.path its stdlib, site-packages and
    the CUDA prefix the .pth adds): the self-test and the doctor read it as they do in the image."""
    monkeypatch.setattr(sys, "prefix", str(root / "opt/venv"))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p.startswith(sys.base_prefix)] + [str(site), str(cuda)])
    return {"distributions": dict(LOCK), "layers": {"cuda_prefix": str(cuda)}, "python": {"seeds": []}}


def test_the_self_test_and_the_start_check_both_fail_a_name_installed_twice_and_name_both(tmp_path, monkeypatch):
    """The image of the bug: the self-test passed it and the start check blocked it, each reading another
    setuptools. Read once, both fail it, with the same words."""
    site, cuda = image_tree(tmp_path, staged_twice=True)
    manifest_doc = in_image(monkeypatch, tmp_path, site, cuda)
    tested = selftest.check_distributions(manifest_doc)
    live = doctor.check_drift(doctor.describe_interpreter(None), manifest_doc)
    monkeypatch.undo()
    assert tested["status"] == live["status"] == "fail", (tested, live)
    assert tested["evidence"]["duplicates"] == live["evidence"]["duplicates"]
    both = f"setuptools: 66.1.1 at {site}/setuptools-66.1.1.dist-info and 84.2.1 at {site}/setuptools-84.2.1.dist-info"
    assert both in tested["message"] and both in live["message"], (tested["message"], live["message"])
    assert "installed twice" in tested["message"] and "installed twice" in live["message"]
    assert "remove the install the lock does not name" in live["fix"] and "rebuild with this imagekit" in tested["fix"]


def test_an_image_holding_each_name_once_passes_both(tmp_path, monkeypatch):
    site, cuda = image_tree(tmp_path, staged_twice=False)
    manifest_doc = in_image(monkeypatch, tmp_path, site, cuda)
    tested = selftest.check_distributions(manifest_doc)
    live = doctor.check_drift(doctor.describe_interpreter(None), manifest_doc)
    monkeypatch.undo()
    assert (tested["status"], live["status"]) == ("pass", "pass"), (tested, live)
    assert tested["evidence"]["count"] == len(LOCK) and not live["evidence"]["duplicates"]


def test_the_seed_the_image_keeps_is_not_extra_and_an_undeclared_one_is(tmp_path, monkeypatch):
    """pip kept unpinned and declared (python.seeds): not extra in either check; a setuptools the manifest does not
    declare (the seed a venv made before this fix still held) is extra in both."""
    site, cuda = image_tree(tmp_path, staged_twice=False)
    manifest_doc = in_image(monkeypatch, tmp_path, site, cuda)
    del manifest_doc["distributions"]["pip"], manifest_doc["distributions"]["setuptools"]
    manifest_doc["python"]["seeds"] = ["pip"]
    tested = selftest.check_distributions(manifest_doc)
    live = doctor.check_drift(doctor.describe_interpreter(None), manifest_doc)
    monkeypatch.undo()
    assert tested["evidence"]["extra"] == list(live["evidence"]["extra"]) == ["setuptools"]
    assert (tested["status"], live["status"]) == ("fail", "warn")


@pytest.mark.programs
def test_the_start_check_in_a_real_venv_reads_what_the_self_test_reads(tmp_path):
    """A real venv (`python -m venv`) with a second setuptools beside its own: the doctor, asking the venv's
    interpreter for its sys.path as the start check does, and the self-test, run by that interpreter, both fail it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    site = Path(purelib)
    for name, version in (("setuptools", "66.1.1"), ("setuptools", "84.2.1"), ("filelock", "3.16.1")):
        dist_info(site, name, version)
    manifest_path = tmp_path / "manifest.json"
    doc = {"distributions": {"setuptools": "84.2.1", "filelock": "3.16.1"}, "python": {"seeds": []}}
    manifest_path.write_text(json.dumps({**doc, "cell": {"id": "x"}}))
    in_image_dir = ROOT / "imagekit" / "in_image"
    res = subprocess.run(
        [sys.executable, str(in_image_dir / "imagekit_doctor.py"), "--tier", "quick", "--json",
         "--python", str(venv / "bin" / "python"), "--expect", str(manifest_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    live = next(c for c in json.loads(res.stdout)["checks"] if c["id"] == "lock-drift")
    script = (
        f"import json, sys; sys.path.insert(0, {str(in_image_dir)!r}); import selftest; "
        f"print(json.dumps(selftest.check_distributions(json.load(open({str(manifest_path)!r})))))"
    )
    tested = json.loads(subprocess.run([str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True,
                                       check=True).stdout)  # fmt: skip
    both = f"setuptools: 66.1.1 at {site}/setuptools-66.1.1.dist-info and 84.2.1 at {site}/setuptools-84.2.1.dist-info"
    assert res.returncode == 1 and live["status"] == "fail" and both in live["message"], live
    assert tested["status"] == "fail" and both in tested["message"], tested
    assert tested["evidence"]["duplicates"] == live["evidence"]["duplicates"] == [both]


@pytest.mark.programs
@pytest.mark.parametrize("mode", ["lockfile", "requirements"])
def test_off_an_image_a_lockfile_or_requirements_fails_a_name_installed_twice(tmp_path, mode):
    """`imagekit doctor --expect LOCKFILE` (or a requirements file with ranges) on a real venv where a second
    install of a pinned name lies beside the first (installed on its own and laid over site-packages, as a staged
    layer was over the venv's seed): the version Python imports agrees with the lock, and the name installed twice
    is still a blocker naming both."""
    import shutil

    from imagekit.effects.resolver import uv_binary
    from tests.in_image.test_doctor import make_venv
    from tests.wheelfactory import build_wheel

    wheels = tmp_path / "wheels"
    for version in ("1.0", "2.0"):
        build_wheel(wheels, "alpha", version)
    venv = make_venv(tmp_path / "v", wheels, "alpha==1.0")
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    layer = tmp_path / "layer"
    subprocess.run([uv_binary(), "pip", "install", "-q", "--python", python, "--no-index", "--find-links",
                    str(wheels), "--target", str(layer), "alpha==2.0"], check=True, capture_output=True)  # fmt: skip
    shutil.copytree(layer, site, dirs_exist_ok=True)
    expect = tmp_path / "expect.txt"
    lines = {"lockfile": "alpha==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n", "requirements": "alpha>=1.0\n"}
    expect.write_text(lines[mode])
    res = subprocess.run(
        [python, "-I", str(ROOT / "imagekit/in_image/imagekit_doctor.py"), "--tier", "quick", "--json",
         "--expect", str(expect)],
        capture_output=True, text=True, timeout=120, env={"PATH": str(venv / "bin"), "HOME": str(tmp_path)},
    )  # fmt: skip
    checks = {c["id"]: c for c in json.loads(res.stdout)["checks"]}
    both = f"1.0 at {site}/alpha-1.0.dist-info and 2.0 at {site}/alpha-2.0.dist-info"
    check = checks["lock-drift" if mode == "lockfile" else "requirements"]
    assert res.returncode == 1 and check["status"] == "fail" and both in check["message"], check
    if mode == "lockfile":  # a lockfile declares no seeds; the fix says which install to remove, then to sync
        assert check["evidence"]["duplicates"] == [f"alpha: {both}"] and not check["evidence"]["different"]
        assert check["fix"].startswith("remove the install the lock does not name") and "uv pip sync" in check["fix"]


@pytest.mark.programs
def test_a_layer_stops_before_installing_a_name_the_venv_below_already_holds(tmp_path):
    """install-layer, as the image runs it, with a layer that locks setuptools: over a venv that still holds the
    setuptools `python -m venv` seeded (the base before the fix), it stops before installing anything and names
    both, so the venv keeps one setuptools; over a venv made without seeds, the same layer installs."""
    import hashlib
    import zipfile

    from imagekit.effects.resolver import uv_binary
    from tests.wheelfactory import build_wheel

    def ref(path: Path) -> str:
        return f"{path}#sha256={hashlib.sha256(path.read_bytes()).hexdigest()}"

    wheels = tmp_path / "wheels"
    wheel = build_wheel(wheels, "setuptools", "99.0")
    uv = wheels / "uv-0.13.9-py3-none-any.whl"  # the real uv, in a wheel as install-layer takes it from a wheelhouse
    with zipfile.ZipFile(uv, "w") as zf:
        zf.write(uv_binary(), "uv-0.13.9.data/scripts/uv")
    layer = tmp_path / "app.txt"
    layer.write_text(f"setuptools==99.0 \\\n    --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMAGEKIT_STAGE", "VIRTUAL_ENV"))}
    for seeded in (True, False):
        venv = tmp_path / ("seeded" if seeded else "bare")
        subprocess.run([sys.executable, "-m", "venv", *([] if seeded else ["--without-pip"]), str(venv)], check=True)
        argv = [sys.executable, str(ROOT / "imagekit/in_image/install_layer.py"), "--wheels", str(wheels),
                "--uv", ref(uv).rpartition("/")[2], "--requirements", ref(layer), "--venv", str(venv)]  # fmt: skip
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        held = sorted(p.name for p in venv.glob("lib/python*/site-packages/setuptools-*.dist-info"))
        if seeded:
            assert res.returncode != 0 and len(held) == 1 and held != ["setuptools-99.0.dist-info"], (res, held)
            seed = held[0].removesuffix(".dist-info").split("-")[1]
            assert f"already holds setuptools {seed} (this layer: 99.0)" in res.stderr, res.stderr
        else:
            assert res.returncode == 0 and held == ["setuptools-99.0.dist-info"], (res.stderr, held)


def _plan(pins: dict[str, str]) -> BuildPlan:
    from imagekit.services import inputs

    entries = tuple(LockEntry(n, v, ("sha256:" + "a" * 64,)) for n, v in sorted(pins.items()))
    torch = (LockEntry("torch", "2.5.1", ("sha256:" + "b" * 64,)),)
    base = BaseRef("debian", "imagekit/base:x", None, "3.11", "2.36")
    return BuildPlan.make(
        Cell("12.4", "2.5.1", "4.48.2", "3.11"), Lock(torch, entries), base, "r/x", inputs.compat_data()
    )


@pytest.mark.parametrize(
    "pins", [{"filelock": "3.16.1"}, {"setuptools": "84.2.1", "pip": "25.0"}, {"setuptools": "84.2.1"}]
)
def test_the_base_venv_and_the_manifest_agree_on_the_seeds(pins):
    """The venv is made with no seed the lock pins (pip: without pip, and so without setuptools; setuptools: removed);
    the seeds it keeps when the lock does not pin them (pip, and setuptools on Python 3.11) are what the manifest
    declares."""
    plan = _plan(pins)
    dockerfile = render.render_plan(plan)["Dockerfile"][0].decode()
    base_stage = dockerfile.split("# ---- cell stage")[0]
    declared = manifest(plan)["python"]["seeds"]
    assert declared == venv_seeds(plan.lock.pins(), "3.11")
    if "pip" in pins:
        assert declared == [] and "-m venv --without-pip /opt/venv" in base_stage
        assert "pip uninstall" not in base_stage
    elif "setuptools" in pins:
        assert declared == ["pip"] and "-m venv /opt/venv" in base_stage
        assert "pip uninstall --yes -qq setuptools \\" in base_stage
    else:
        assert declared == ["pip", "setuptools"] and "-m venv /opt/venv" in base_stage
        assert "pip uninstall" not in base_stage


def test_python_3_12_seeds_pip_alone():
    assert venv_seeds({}, "3.12") == ["pip"] and venv_seeds({}, "3.11") == ["pip", "setuptools"]
    assert venv_seeds({"pip": "25.0"}, "3.11") == [] and venv_seeds({"setuptools": "80"}, "3.13") == ["pip"]
