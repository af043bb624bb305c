"""A project as it is, in the image (pure): `[image] install`'s wheel (image/project_wheel.py: the build system, the
lock's checks, the code layer's requirements), `[image] env` (image/imageconfig.py: what a project may set, and why
the rest is refused) and `[image] smoke` (the manifest carries the commands), as the plan and the render hold them."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from imagekit.errors import UsageError
from imagekit.image import imageconfig, project_wheel, render, steps
from imagekit.image.buildplan import SMOKE_BUDGET, SMOKE_TIMEOUT, BuildPlan, bootstrap_base, manifest
from imagekit.image.code_layer import CodeLayer, CopySpec
from imagekit.image.image_options import ImageOptions
from imagekit.image.project_wheel import ProjectWheel
from imagekit.model import ARM64, Cell
from imagekit.services.locks.lock_cells import read_lock
from tests.conftest import ROOT

CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11", ("accelerate==1.2.1",))
CODE = CodeLayer("/opt/app", (("alignment/__init__.py", b"X = 1\n", 0o644), ("pyproject.toml", b"", 0o644),
                              ("scripts/run_sft.py", b"import alignment\n", 0o755)))  # fmt: skip
WHEEL = ProjectWheel("alignment-0.1.0-py3-none-any.whl", "ab" * 32, "alignment", "0.1.0", "acme")
PINS = {"numpy": "1.26.4", "filelock": "3.16.1", "setuptools": "75.1.0", "torch": "2.5.1"}


def _files(pyproject: str, *more: str) -> tuple[tuple[str, bytes, int], ...]:
    return (("pyproject.toml", pyproject.encode(), 0o644), *((m, b"", 0o644) for m in more))


# ---- the build system and the lock ---------------------------------------------------------------------------------
def test_the_build_system_is_pyprojects_or_pep_517s_fallback_for_a_setup_py():
    found = project_wheel.build_system(
        _files('[build-system]\nrequires = ["hatchling>=1.25"]\nbuild-backend = "hatchling.build"\n'), "acme"
    )
    assert found == project_wheel.BuildSystem("hatchling.build", ("hatchling>=1.25",))
    in_tree = '[build-system]\nrequires = []\nbuild-backend = "shim:hooks"\nbackend-path = ["tools"]\n'
    assert project_wheel.build_system(_files(in_tree), "acme").backend_path == ("tools",)
    legacy = project_wheel.build_system((("setup.py", b"", 0o644),), "acme")
    assert legacy == project_wheel.BuildSystem("setuptools.build_meta:__legacy__", ("setuptools>=40.8.0",))
    assert project_wheel.build_system(_files('[project]\nname = "x"\n'), "acme").backend == legacy.backend


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ((("train.py", b"", 0o644),), "has no pyproject.toml or setup.py"),
        (_files("[build-system"), "is not valid TOML"),
        (_files('[build-system]\nrequires = "setuptools"\n'), "unusable [build-system]"),
        (_files('[build-system]\nrequires = []\nbuild-backend = "x; rm -rf /"\n'), "unusable [build-system]"),
        (_files('[build-system]\nrequires = []\nbuild-backend = "b"\nbackend-path = ["../up"]\n'), "unusable"),
        (_files('[build-system]\nrequires = ["not a requirement!"]\n'), "is not a requirement"),
    ],
)
def test_a_project_imagekit_cannot_build_is_refused_saying_why(files, needle):
    with pytest.raises(UsageError) as exc:
        project_wheel.build_system(files, "acme")
    assert needle in exc.value.message and exc.value.exit_code == 2


def test_unmet_names_each_requirement_the_lock_does_not_meet_for_the_cells_platform():
    env = project_wheel.marker_env(CELL)
    found = project_wheel.unmet(
        ["numpy>=1.17", "numpy<1", "trl>=0.9", "Filelock", "peft; sys_platform == 'win32'",
         "flash-attn; platform_machine == 'x86_64'", "torch==2.5.1+cu124", "setuptools[core]>=61"],
        PINS, env, "here",
    )  # fmt: skip
    assert found == ["numpy<1 (the lock has numpy 1.26.4)", "trl>=0.9 (not in the lock)",
                     "flash-attn; platform_machine == 'x86_64' (not in the lock)",
                     "torch==2.5.1+cu124 (the lock has torch 2.5.1)"]  # fmt: skip
    arm = project_wheel.marker_env(Cell("12.4", "2.5.1", "4.48.2", "3.12", platform=ARM64))
    assert arm["platform_machine"] == "aarch64" and arm["python_version"] == "3.12"
    assert project_wheel.unmet(["flash-attn; platform_machine == 'x86_64'"], PINS, arm, "here") == []


def test_the_build_environment_is_the_backends_closure_in_the_lock():
    requires = {"hatchling": ("packaging>=24", "pathspec", "tomli; python_version < '3.11'"), "packaging": (),
                "pathspec": ("bad requirement!",)}  # fmt: skip
    got = project_wheel.closure(["hatchling>=1.25"], lambda n: requires.get(n, ()), project_wheel.marker_env(CELL))
    assert got == ["hatchling", "packaging", "pathspec"]  # tomli only below 3.11; unreadable metadata: nothing


def test_a_built_wheel_must_be_the_cells_and_its_dependencies_locked():
    meta = project_wheel.parse_metadata(
        "Metadata-Version: 2.1\nName: alignment-handbook\nVersion: 0.4.0.dev0\nRequires-Python: >=3.10\n"
        "Requires-Dist: numpy>=1.17\nRequires-Dist: trl>=0.9\nRequires-Dist: pytest; extra == 'dev'\n\nREADME\n"
    )
    assert meta.requires == ("numpy>=1.17", "trl>=0.9", "pytest; extra == 'dev'")
    name = "alignment_handbook-0.4.0.dev0-py3-none-any.whl"
    with pytest.raises(UsageError) as exc:
        project_wheel.check_built(meta, name, CELL, PINS)
    assert "does not hold: trl>=0.9 (not in the lock)" in exc.value.message and "pytest" not in exc.value.message
    assert "--no-deps" in exc.value.hint
    project_wheel.check_built(meta, name, CELL, {**PINS, "trl": "0.12.1"})  # every dependency locked: accepted
    with pytest.raises(UsageError, match=r"requires Python >=3\.12"):
        project_wheel.check_built(meta.__class__(meta.name, "1", (), ">=3.12"), name, CELL, PINS)
    with pytest.raises(UsageError, match="one would replace the other"):
        project_wheel.check_built(meta.__class__("NumPy", "1", ()), "numpy-1-py3-none-any.whl", CELL, PINS)
    with pytest.raises(UsageError, match="not a PEP 440 version"):
        project_wheel.check_built(meta.__class__("x", "latest", ()), "x-latest-py3-none-any.whl", CELL, PINS)
    for bad in ("../x-1-py3-none-any.whl", "x-1-py3-none-any.whl\nRUN x", "x.zip"):
        assert not project_wheel.wheel_file_ok(bad)


def test_install_is_the_copied_folder_or_below_it():
    assert project_wheel.sub_folder("acme", "acme") == "."
    assert project_wheel.sub_folder("acme", "acme/pkg/") == "pkg"
    with pytest.raises(UsageError, match="not inside the copied folder"):
        project_wheel.sub_folder("acme/src", "acme")
    assert project_wheel.source_files(CODE, "alignment") == (("__init__.py", b"X = 1\n", 0o644),)
    assert project_wheel.source_files(CODE, ".") == CODE.files


# ---- env -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("PATH", "/usr/bin", "the image's own: imagekit sets it"),
        ("VIRTUAL_ENV", "/venv", "the image's own"),
        ("PIP_CONSTRAINT", "", "lock's pins"),
        ("UV_CONSTRAINT", "", "lock's pins"),
        ("HF_HOME", "/data/hf", "pod's volume"),
        ("NVIDIA_VISIBLE_DEVICES", "0", "the image's own"),
        ("NVIDIA_REQUIRE_CUDA", "cuda>=12", "NVIDIA container runtime"),
        ("IMAGEKIT_MANIFEST", "/x", "the image's own"),
        ("IMAGEKIT_REQUIRE_GPU", "1", "per pod"),
        ("LD_LIBRARY_PATH", "/usr/local/cuda/lib64", "dynamic loader"),
        ("LD_PRELOAD", "/x.so", "dynamic loader"),
        ("PYTHONPATH", "/opt/app", "before the locked venv"),
        ("PYTHONHOME", "/x", "away from the venv"),
        ("HF_TOKEN", "hf_x", "looks like a secret"),
        ("WANDB_API_KEY", "x", "looks like a secret"),
        ("GITHUB_PAT", "ghp_x", "looks like a secret"),
        ("MY_KEY", "x", "looks like a secret"),
        ("PIP_TARGET", "/tmp/t", "beside the locked venv"),
        ("PIP_USER", "1", "user site"),
        ("AWS_SECRET_ACCESS_KEY", "x", "looks like a secret"),
        ("1ST", "x", "expected a variable name"),
        ("A-B", "x", "expected a variable name"),
        ("GREETING", "a\nb", "one line of printable ASCII"),
        ("GREETING", 'say "hi"', "one line of printable ASCII"),
        ("GREETING", "$HOME/x", "one line of printable ASCII"),
        ("GREETING", "back\\slash", "one line of printable ASCII"),
        ("GREETING", "é", "one line of printable ASCII"),
        ("GREETING", "x" * 1025, "at most 1024"),
        ("GREETING", 3, "expected a string value"),
    ],
)
def test_env_refuses_what_the_image_relies_on_secrets_and_values_a_dockerfile_cannot_carry(name, value, needle):
    problem = imageconfig.user_env_problem(name, value)
    assert problem is not None and needle in problem, problem


def test_env_takes_a_projects_own_settings_after_the_images():
    ok = (("HF_HUB_ENABLE_HF_TRANSFER", "1"), ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
          ("TOKENIZERS_PARALLELISM", "false"), ("WANDB_PROJECT", "sft [v2] #3"), ("EMPTY", ""))  # fmt: skip
    assert all(imageconfig.user_env_problem(n, v) is None for n, v in ok)
    runtime = imageconfig.runtime({"a": "b"}, (), ok)
    assert runtime.env[: len(imageconfig.ENV)] == imageconfig.ENV and runtime.env[len(imageconfig.ENV) :] == ok
    assert 'WANDB_PROJECT="sft [v2] #3"' in runtime.instructions()[0]
    with pytest.raises(UsageError, match="PATH is the image's own"):
        imageconfig.runtime({}, (), (("PATH", "/x"),))  # an ImageOptions made without the file is checked too
    with pytest.raises(UsageError, match="named twice"):
        imageconfig.runtime({}, (), (("A", "1"), ("A", "2")))
    inspect = {"RootFS": {"Layers": ["sha256:l1"]}, "Config": {"Env": ["PATH=/bin", "A=0"]}}
    runtime = imageconfig.runtime({}, (), (("A", "1"),))
    config = json.loads(imageconfig.config_json(inspect, [{"created": None}], runtime, 0, "x"))["config"]
    assert config["Env"][:2] == ["PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                 "A=1"]  # fmt: skip


# ---- the plan, the manifest and the render -------------------------------------------------------------------------
def _plan(data, options: ImageOptions, code=CODE, project=WHEEL) -> BuildPlan:  # type: ignore[no-untyped-def]
    lock = read_lock(ROOT / "lockfiles" / f"{CELL.id}.txt")
    base = bootstrap_base(data.bases["3.11"])
    return BuildPlan.make(CELL, lock, base, "r.example.com/x", data, options=options, code=code, project=project)


INSTALL = ImageOptions(copy=CopySpec("acme"), install="acme", env=(("WANDB_PROJECT", "sft"),),
                       smoke=("python -c 'import alignment'", "python /opt/app/scripts/run_sft.py --help"))  # fmt: skip


def test_the_manifest_holds_the_projects_wheel_and_smoke_commands_and_only_then(data):
    facts = manifest(_plan(data, INSTALL))
    assert facts["project"] == {"name": "alignment", "version": "0.1.0", "wheel": WHEEL.filename, "source": "acme"}
    assert facts["distributions"]["alignment"] == "0.1.0"  # what the venv holds (dists-match-lock reads it)
    assert facts["smoke"] == {"commands": list(INSTALL.smoke), "timeout": SMOKE_TIMEOUT, "budget": SMOKE_BUDGET}
    plain = manifest(_plan(data, ImageOptions(copy=CopySpec("acme")), project=None))
    assert "project" not in plain and "smoke" not in plain and "alignment" not in plain["distributions"]
    skipping = manifest(_plan(data, dataclasses.replace(INSTALL, skip_imports=("recipes",))))
    assert skipping["project"]["skip_imports"] == ["recipes"]  # what project-imports reads in the image


def test_the_code_layer_installs_the_wheel_by_its_sha256_without_its_dependencies_staged(data):
    files = render.render_plan(_plan(data, INSTALL))
    text = files["Dockerfile"][0].decode()
    requirements = files[project_wheel.REQUIREMENTS_FILE][0]
    assert requirements.decode() == f"alignment==0.1.0 \\\n    --hash=sha256:{WHEEL.sha256}\n"
    sha = hashlib.sha256(requirements).hexdigest()
    assert f"--requirements http://imagekit-wheels:8765/requirements-project.txt#sha256={sha}" in text
    assert "([image] install: alignment 0.1.0, built from acme" in text
    last = steps.cell_steps(text)[-1]  # the code layer: imagekit writes it from its staged files
    assert last.staged and "--venv /opt/venv --compile" in last.command and "--files " in last.command
    assert last.command.endswith("/opt/imagekit/bin/finalize-layer /opt/venv /opt/app")
    assert '#       WANDB_PROJECT="sft"' in text  # the runtime config the build sets, shown last
    # a code change (another wheel, the same version): only the code layer's step changes; the manifest (in the app
    # layer) names the project, not its wheel's bytes, so every layer below is the same step (cached)
    again = render.render_plan(_plan(data, INSTALL, project=ProjectWheel(WHEEL.filename, "cd" * 32, "alignment",
                                                                          "0.1.0", "acme")))  # fmt: skip
    a, b = text.splitlines(), again["Dockerfile"][0].decode().splitlines()
    changed = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    assert len(changed) == 1 and "requirements-project.txt" in a[changed[0]]


def test_without_the_keys_the_code_layer_and_config_render_as_before(data):
    text = render.render_plan(_plan(data, ImageOptions(copy=CopySpec("acme")), project=None))["Dockerfile"][0].decode()
    code_run = "RUN /opt/imagekit/bin/install-layer --files http://imagekit-wheels:8765/code.tar#sha256="
    assert f"{code_run}{CODE.sha256(1735689600)}\n" in text
    assert "requirements-project" not in text and "[image] install" not in text
    assert 'IMAGEKIT_MANIFEST="/etc/imagekit/manifest.json"\n#   WORKDIR' in text  # no variable after imagekit's


def test_install_renders_only_with_its_wheel_and_on_the_legacy_builder(data):
    with pytest.raises(UsageError) as exc:
        render.render_plan(_plan(data, INSTALL, project=None))
    assert "built by `imagekit build`" in exc.value.message and "imagekit render" in exc.value.hint
    with pytest.raises(UsageError, match="BuildKit"):
        render.render_plan(_plan(data, dataclasses.replace(INSTALL, builder="buildkit")))
    with pytest.raises(UsageError, match="refusing to render"):
        odd = ProjectWheel(WHEEL.filename, WHEEL.sha256, "alignment", "0.1.0", "acme\nRUN curl x")
        render.render_plan(_plan(data, INSTALL, project=odd))
