"""Behaviour that single-point bugs planted in the core, the doctor and the pod start changed unnoticed.

Each test names the planted bug it guards (docs/mutation.md, "Hand-planted bugs"); each was run with its bug
planted (and failed) and without it (and passed). Fast: no Docker, no resolver, no sshd. The start check runs the
real pod start and doctor in a child process, with a stand-in `nvidia-smi` on PATH and a stand-in `torch` on
PYTHONPATH, so what the host has installed does not decide the result.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from imagekit.clouds import runpod
from imagekit.compat import rules
from imagekit.effects.registry import Remote
from imagekit.errors import CheckFailed
from imagekit.image import naming, render
from imagekit.image.buildplan import BuildPlan, bootstrap_base, manifest
from imagekit.in_image import imagekit_doctor as doc
from imagekit.locking import lockfile, resolution
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.matrix import matrix_file as matrix
from imagekit.model import Cell, Query
from imagekit.oci import release_record
from imagekit.services.publishing import release, release_index
from tests.conftest import FIXTURES, ROOT
from tests.fakes import PASSED, RecordingRegistry
from tests.test_verify_truth import CU118, PYPI, ROOT_VIA, TORCH_118, uv_output

PODSTART = ROOT / "imagekit" / "in_image" / "podstart.py"
DOCTOR = ROOT / "imagekit" / "in_image" / "imagekit_doctor.py"
GPU = FIXTURES / "gpu"


# ---- rules and the doctor: a driver exactly at a floor is enough ----------------------------------------------
# Planted: rules.rule_gpu_arch `driver_key(q.driver) < driver_key(full)` -> `<=` (the GA driver itself refused).
def test_a_driver_exactly_at_the_toolkits_ga_driver_may_jit_ptx(data):
    ptx_only = dict(torch="2.8.0", cuda="12.9", archs=("sm_130",))  # sm_130 runs only via PTX JIT on cu129
    assert rules.driver_floor(data, "12.9").full == "575.51.03"  # CUDA 12.9's GA driver (compat-facts 2a)
    at = rules.evaluate(Query(**ptx_only, driver="575.51.03"), data)
    assert at.compatible, at.violations
    below = rules.evaluate(Query(**ptx_only, driver="575.51.02"), data)
    assert [v.rule for v in below.violations] == ["ptx-jit-driver"]


# Planted: imagekit_doctor.check_gpus `version_key(driver) < version_key(floor)` -> `<=`.
def test_the_doctor_passes_a_host_exactly_at_the_images_driver_floor():
    def floor_check(driver: str) -> dict:
        gpus = doc.parse_smi_query(f"0, NVIDIA H100 80GB HBM3, {driver}, 9.0, 81559 MiB\n")
        image = {"driver": {"minimum": "525.60.13"}, "torch": {"archs": ["sm_90"], "ptx": None, "variant": "cu124"}}
        checks = doc.check_gpus((gpus, None, True), image, True)
        return next(c for c in checks if c["id"] == "driver-floor")

    assert floor_check("525.60.13")["status"] == "pass"
    assert floor_check("525.60.12")["status"] == "fail"
    assert floor_check("525.60.100")["status"] == "pass"  # numeric, not text, order


# ---- selectors ------------------------------------------------------------------------------------------------
# Planted: matrix.Selector.matches `have.startswith(w + ".")` -> `have.startswith(w)` (2.1 matched 2.10-2.15).
def test_a_version_selector_matches_whole_components_only():
    cells = [Cell("12.4", t, "4.48.2", "3.11") for t in ("2.1.2", "2.10.0", "2.12.0", "2.1.0")]
    chosen = [c.torch for c in cells if matrix.Selector(torch=("2.1",)).matches(c)]
    assert chosen == ["2.1.2", "2.1.0"]
    assert [c.torch for c in cells if matrix.Selector(torch=("2.1.2",)).matches(c)] == ["2.1.2"]
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11")
    assert matrix.Selector(cuda=("12",)).matches(cell)  # a prefix of whole components still matches
    assert not matrix.Selector(python=("3.1",)).matches(cell)
    assert not matrix.Selector(transformers=("4.4",)).matches(cell)


# ---- locks and labels -----------------------------------------------------------------------------------------
CU118_VISION = Cell("11.8", "2.5.1", "4.48.2", "3.11", ("torchvision==0.20.1+cu118",))


def _vision_output(torchvision_from: str) -> str:
    """A cu118 resolution with torchvision pinned directly by the cell (so uv says it is via the project)."""
    return uv_output(
        ("filelock", "3.16.1", ("torch", "transformers"), PYPI),
        ("nvidia-cudnn-cu11", "9.1.0.70", ("torch",), TORCH_118),
        ("pillow", "11.0.0", ("torchvision",), PYPI),
        ("torch", "2.5.1+cu118", ("imagekit-cell (pyproject.toml)", "torchvision"), TORCH_118),
        ("torchvision", "0.20.1+cu118", ROOT_VIA, torchvision_from),
        ("transformers", "4.48.2", ROOT_VIA, PYPI),
    )


def _build(cell: Cell, output: str, data) -> Lock:
    req = resolution.request(cell, resolution.LockSettings(), data)
    return resolution.build_lock(req, output, None, data, "uv 0.5.3")


# Planted: lockfile.torch_closure `roots = {... if e.name in TORCH_FAMILY}` -> `if e.name == "torch"`.
@pytest.mark.seconds
def test_a_directly_pinned_torchvision_is_in_the_torch_layer(data):
    lock = _build(CU118_VISION, _vision_output(TORCH_118), data)
    assert {e.name for e in lock.torch} == {"torch", "torchvision", "nvidia-cudnn-cu11", "filelock", "pillow"}
    assert {e.name for e in lock.app} == {"transformers"}


# Same planted bug: the app layer is not index-checked, so torchvision from PyPI got into a cu118 image.
def test_a_directly_pinned_torchvision_from_pypi_is_refused_for_a_routed_cell(data):
    with pytest.raises(CheckFailed, match=re.escape(f"torchvision came from {PYPI}, not the PyTorch index")):
        _build(CU118_VISION, _vision_output(PYPI), data)
    req = resolution.request(CU118_VISION, resolution.LockSettings(), data)
    assert resolution.misrouted(req, _vision_output(PYPI)) == {"torchvision"}


def _plan(cell: Cell, lock: Lock, data) -> BuildPlan:
    return BuildPlan.make(cell, lock, bootstrap_base(data.bases[cell.python]), "r/x", data)


# Planted: naming.labels `"imagekit.torch.version": manifest["torch"]["version"]` -> `cell["torch"]` (no +cu118).
def test_the_torch_version_label_is_the_installed_build_with_its_local_label(data):
    output = uv_output(
        ("nvidia-cudnn-cu11", "9.1.0.70", ("torch",), TORCH_118),
        ("torch", "2.5.1+cu118", ROOT_VIA, TORCH_118),
        ("transformers", "4.48.2", ROOT_VIA, PYPI),
    )
    lock = _build(CU118, output, data)
    plan = _plan(CU118, lock, data)
    assert naming.labels(manifest(plan))["imagekit.torch.version"] == "2.5.1+cu118"
    dockerfile = render.render_plan(plan)["Dockerfile"][0].decode()
    assert '"imagekit.torch.version"="2.5.1+cu118"' in dockerfile
    assert '"imagekit.torch"="2.5.1"' in dockerfile  # the cell's version stays the release


# Planted: Lock.content_hash `f"{layer}:{e.pin}:..."` -> `f"{e.pin}:..."` (which layer a pin is in not covered).
def test_the_lock_hash_covers_which_layer_each_pin_is_in():
    def entry(name: str, version: str) -> LockEntry:
        return LockEntry(name, version, ("sha256:" + hashlib.sha256(name.encode()).hexdigest(),))

    filelock, torch, tf = entry("filelock", "3.16.1"), entry("torch", "2.5.1"), entry("transformers", "4.48.2")
    typing = entry("typing-extensions", "4.12.2")
    lock = Lock((filelock, torch, typing), (tf,), {"cell": "x"})
    # the last torch-layer pin moved to the front of the app layer: the same pins in the same order
    moved = Lock((filelock, torch), (typing, tf), {"cell": "x"})
    assert [e.pin for e in lock.entries] == [e.pin for e in moved.entries]
    assert lock.content_hash != moved.content_hash
    # the same move by hand in a written lock, under the original's body digest: refused as edited
    text = lock.render()
    block = typing.render() + "\n"
    edited = text.replace(block + lockfile.APP_MARK + "\n", lockfile.APP_MARK + "\n" + block)
    assert edited != text and lockfile.parse(edited).app[0].name == "typing-extensions"
    assert lockfile.integrity_problems(lockfile.parse(text), text) == []
    problems = lockfile.integrity_problems(lockfile.parse(edited), edited)
    assert any("edited by hand" in p for p in problems), problems


# ---- release --------------------------------------------------------------------------------------------------
def _record(folder: Path, registry: RecordingRegistry, published_at: str) -> dict:
    repo, cell = "r.example.com/acme/train", "cu124-torch2.5.1-py3.11-tf4.48.2"
    tag = f"{cell}-0123456789ab"
    inspect = {"Id": "sha256:" + "c" * 64, "RootFS": {"Layers": ["sha256:" + "d" * 64]}, "Config": {}}
    digest = registry.receive(Remote.parse(repo), tag, inspect)
    published = release_record.Published(f"{repo}:{tag}", f"{repo}:{cell}", digest, False, inspect["Id"])
    entry = release_index.release_entry(
        published, lock_hash="l" * 64, manifest={"cell": {"id": cell}}, report=PASSED, size=1, published_at=published_at
    )
    release_index.write_record(folder, entry)
    return entry


# Planted: release.merge `old.get("published_at") or entry.get(...)` -> `entry.get(...) or old.get(...)`.
def test_merging_a_tag_again_keeps_its_first_published_at(tmp_path):
    registry = RecordingRegistry(calls=[])
    index = tmp_path / "index.json"
    first = _record(tmp_path / "runner-1", registry, "2026-11-01T10:00:00Z")
    allowed = ([release.named_registry("r.example.com/acme/train")], "--registry")
    release.merge([tmp_path / "runner-1"], index, registry, allowed=allowed)
    # the same image published again later (a re-run job), its record merged into the same index
    _record(tmp_path / "runner-2", registry, "2026-11-30T18:00:00Z")
    merged = release.merge([tmp_path / "runner-2"], index, registry, allowed=allowed)
    assert merged.unchanged == [first["tag"]] and merged.added == []
    assert json.loads(index.read_text())["images"][first["tag"]]["published_at"] == "2026-11-01T10:00:00Z"


# ---- the start check (job mode) -------------------------------------------------------------------------------
def _stand_ins(tmp_path: Path, smi: str, torch: str) -> dict[str, str]:
    """PATH with a stand-in nvidia-smi (``smi``: "h100" lists one H100, "no-driver" fails as NVIDIA's does when
    the container has no driver) and PYTHONPATH with a stand-in torch (``torch``: "no-cuda" is a CUDA build that
    sees no GPU, "crash" kills the interpreter importing it, so the probe cannot report)."""
    bindir, site = tmp_path / "bin", tmp_path / "site" / "torch"
    bindir.mkdir()
    site.mkdir(parents=True)
    text = {
        "h100": (GPU / "nvidia-smi-query-h100x2.csv").read_text().splitlines()[0] + "\n",
        "no-driver": (GPU / "nvidia-smi-no-driver.txt").read_text(),
    }[smi]
    (tmp_path / "smi.txt").write_text(text)
    script = bindir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'smi.txt'}\nexit {0 if smi == 'h100' else 9}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    if torch == "crash":
        (site / "__init__.py").write_text("import os\nos._exit(1)\n")
    else:
        (site / "__init__.py").write_text(
            "import types\n__version__ = '2.5.1+cu124'\nversion = types.SimpleNamespace(cuda='12.4')\n"
            "cuda = types.SimpleNamespace(is_available=lambda: False, init=lambda: None)\n"
        )
    return {
        "PATH": f"{bindir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin",
        "PYTHONPATH": str(site.parent),
        "HOME": str(tmp_path / "home"),
        "HF_HOME": str(tmp_path / "hf"),
    }


def _job(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, bool]:
    """The image's entrypoint in job mode: (its result, whether the command ran)."""
    marker = tmp_path / "ran"
    res = subprocess.run(
        [sys.executable, str(PODSTART), "sh", "-c", f"touch {marker}"], capture_output=True, text=True, env=env
    )
    return res, marker.exists()


# Planted: imagekit_doctor.exit_code `"fail" in statuses` -> `("fail" in statuses and "error" not in statuses)`.
@pytest.mark.programs
def test_a_blocker_with_a_check_that_could_not_run_is_exit_1_and_job_mode_does_not_start(tmp_path):
    env = {**_stand_ins(tmp_path, "no-driver", "crash"), "IMAGEKIT_REQUIRE_GPU": "1"}
    res = subprocess.run(
        [sys.executable, str(DOCTOR), "--tier", "start", "--json"], capture_output=True, text=True, env=env
    )
    report = json.loads(res.stdout)
    status = {c["id"]: c["status"] for c in report["checks"]}
    assert status["nvidia-driver"] == "fail" and status["torch-probe"] == "error"  # both at once
    assert res.returncode == 1 and report["exit_code"] == 1
    job, ran = _job(tmp_path, env)
    assert job.returncode == 1 and not ran, job.stderr
    assert "the start check found a blocker; not starting" in job.stderr
    assert "starting anyway" not in job.stderr


# Planted: podstart.start_check `["--tier", "start"]` -> `["--tier", "quick"]` (no torch CUDA probe).
@pytest.mark.programs
@pytest.mark.parametrize(
    ("smi", "seen"),
    [
        ("h100", "1 GPU(s) visible to the driver"),  # only the probe knows training would run on the CPU
        ("no-driver", "a GPU is required (IMAGEKIT_REQUIRE_GPU=1)"),  # the probe runs though nvidia-smi failed
    ],
)
def test_the_start_check_probes_torch_when_a_gpu_is_required(tmp_path, smi, seen):
    env = {**_stand_ins(tmp_path, smi, "no-cuda"), "IMAGEKIT_REQUIRE_GPU": "1"}
    res, ran = _job(tmp_path, env)
    assert res.returncode == 1 and not ran, res.stderr
    assert f"[FAIL] cpu-fallback: {seen} but torch sees none" in res.stderr


# Planted: podstart.start_check `environ.get("IMAGEKIT_SKIP_DOCTOR") == "1"` -> `environ.get(...)` (any value).
@pytest.mark.programs
@pytest.mark.parametrize(("value", "skipped"), [("0", False), ("", False), ("no", False), ("1", True)])
def test_only_imagekit_skip_doctor_1_skips_the_start_check(tmp_path, value, skipped):
    env = {**_stand_ins(tmp_path, "no-driver", "no-cuda"), "IMAGEKIT_SKIP_DOCTOR": value}  # a blocker
    res, ran = _job(tmp_path, env)
    assert ran is skipped and res.returncode == (0 if skipped else 1), res.stderr
    assert ("start check skipped" in res.stderr) is skipped
    assert ("the start check found a blocker" in res.stderr) is not skipped


# ---- the manifest and the RunPod template ---------------------------------------------------------------------
# Planted: buildplan.manifest `"ports": ["22/tcp", *(["8888/http"] if "jupyterlab" in pins ...)]` -> 8888 always.
@pytest.mark.parametrize(("jupyter", "ports"), [(False, ["22/tcp"]), (True, ["22/tcp", "8888/http"])])
def test_the_manifest_and_runpod_template_list_8888_only_with_jupyterlab(data, jupyter, ports):
    def entry(name: str, version: str) -> LockEntry:
        return LockEntry(name, version, ("sha256:" + "e" * 64,))

    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11")
    app = (entry("jupyterlab", "4.3.4"),) if jupyter else ()
    lock = Lock((entry("torch", "2.5.1"),), (*app, entry("transformers", "4.48.2")))
    files = render.render_plan(_plan(cell, lock, data))
    baked = json.loads(files[render.MANIFEST][0])
    assert baked["image"]["ports"] == ports and baked["image"]["jupyter"] is jupyter
    tag = f"r/x:{cell.id}-0123456789ab"
    template = runpod.template({"tag": tag, "digest": "sha256:" + "a" * 64, "manifest": baked})
    assert template["ports"] == ",".join(ports)


# ---- reading a project's files ----------------------------------------------------------------------------------
# Planted: project_deps.parse_lines `raw.endswith("\\") and not whole_comment` -> `raw.endswith("\\")` (a line that
# is only a comment continued into the next). pip's req_file.join_lines never continues a comment line (pip 26.3).
def test_a_comment_line_ending_in_a_backslash_does_not_swallow_the_next_requirement():
    from imagekit.matrix import project_deps

    text = "# torch comes from the matrix \\\nnumpy\n    # indented \\\nfilelock\n"
    deps = project_deps.read_requirements("requirements.txt", lambda _: text)
    assert [(d.requirement, d.where) for d in deps.declared] == [
        ("numpy", "requirements.txt:2"),
        ("filelock", "requirements.txt:4"),
    ]


# Planted: project_deps.leave_out `if not d.constraint and any(...)` -> `if any(...)` (a constraint counted as
# something the file states, so `without` silently leaves out a name no image would install).
def test_without_refuses_a_name_the_file_states_only_as_a_constraint():
    from dataclasses import replace

    from imagekit.errors import UsageError
    from imagekit.matrix import project_deps

    files = {"requirements.txt": "numpy\ndeepspeed ; sys_platform == 'win32'\n-c c.txt\n", "c.txt": "deepspeed<1\n"}
    deps = project_deps.read_requirements("requirements.txt", files.__getitem__)
    source = project_deps.DepsSource("requirements.txt", without=("deepspeed",))
    with pytest.raises(UsageError) as info:
        project_deps.leave_out(replace(deps, source=source))
    assert info.value.message == "without: deepspeed is not among what requirements.txt states (numpy)"


# Planted: project_deps.read_requirements `constraint or kind == "-c"` -> `kind == "-c"` (a `-r` inside a `-c` file
# read as requirements: what pip only constrains would be installed).
def test_a_requirements_include_inside_a_constraints_file_is_read_as_constraints():
    from imagekit.errors import UsageError
    from imagekit.matrix import project_deps

    files = {"requirements.txt": "numpy\n-c c.txt\n", "c.txt": "-r more.txt\n", "more.txt": "numpy<2\n"}
    deps = project_deps.read_requirements("requirements.txt", files.__getitem__)
    assert [(d.requirement, d.where, d.constraint) for d in deps.declared] == [
        ("numpy", "requirements.txt:1", False),
        ("numpy<2", "more.txt:1", True),
    ]
    files["more.txt"] = "numpy<2\nscipy<1.14\n"  # constrains what the project does not require: refused, not installed
    with pytest.raises(UsageError) as info:
        project_deps.read_requirements("requirements.txt", files.__getitem__)
    assert info.value.message.startswith("more.txt:2: scipy<1.14: constrains scipy, which the project does not")


# Planted: project_deps.from_pyproject `(source.extras and "optional-dependencies" in dynamic)` ->
# `"optional-dependencies" in dynamic` (the build backend run, in a container, when no extra is chosen).
def test_dynamic_optional_dependencies_need_the_build_backend_only_when_an_extra_is_chosen():
    from imagekit.matrix import project_deps

    text = (
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
        '[project]\nname = "app"\ndependencies = ["numpy"]\ndynamic = ["optional-dependencies"]\n'
    )
    deps = project_deps.from_pyproject(text, project_deps.DepsSource("pyproject.toml"))
    assert [d.requirement for d in deps.declared] == ["numpy"]
    with pytest.raises(project_deps.NeedsBackend) as info:
        project_deps.from_pyproject(text, project_deps.DepsSource("pyproject.toml", extras=("train",)))
    assert info.value.backend == "hatchling.build"
