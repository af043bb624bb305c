"""BuildPlan -> build-context files (Dockerfile, split requirements, manifest, in-image scripts). Pure: never writes.

Templates live in the repository's ``templates/`` and ``Dockerfile.base`` (shipped in the wheel as
``imagekit/_templates``); the Python programs that run in the image in the ``imagekit.in_image`` package;
``sources()`` is the one lookup for both. The Jinja environment is strict: an undefined name fails, and the only
way a value enters a Dockerfile is through a filter that refuses anything that could start a new instruction.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import jinja2

from imagekit import __version__
from imagekit.errors import UsageError
from imagekit.image import cuda_toolkit, imageconfig, naming, pins, project_wheel
from imagekit.image import layering as layers
from imagekit.image.buildplan import BuildPlan, manifest
from imagekit.image.image_options import BUILDERS
from imagekit.locking import uv_pin as tools
from imagekit.model import MACHINES

_LABEL_SAFE = re.compile(r"[A-Za-z0-9 ._:/@+,()=<>~!*%-]*", re.ASCII)
EXECUTABLE = 0o755


def _dq(value: object) -> str:
    """Double-quote a value for LABEL/ENV; refuse quotes, backslashes, `$` and line breaks outright."""
    text = str(value)
    if not _LABEL_SAFE.fullmatch(text):
        raise UsageError(
            f"refusing to render {text!r} into a Dockerfile",
            "values must be printable ASCII without quotes, '$' or '\\'",
        )
    return f'"{text}"'


# The in-image package's programs and where each lies in the image, under /opt/imagekit (the paths a user of a
# published image sees; tests/test_core_mutants.py checks that every module of the package is listed).
IN_IMAGE = {
    "__init__.py": "doctor/__init__.py",
    "facts.py": "doctor/facts.py",
    "imagekit_doctor.py": "doctor/imagekit_doctor.py",
    "doctor_expect.py": "doctor/doctor_expect.py",  # the doctor's checks, a module per domain
    "doctor_python.py": "doctor/doctor_python.py",
    "doctor_gpu.py": "doctor/doctor_gpu.py",
    "doctor_launch.py": "doctor/doctor_launch.py",
    "doctor_hub.py": "doctor/doctor_hub.py",
    "gpu_checks.py": "doctor/gpu_checks.py",
    "selftest.py": "doctor/selftest.py",
    "podstart.py": "doctor/podstart.py",
    "guard.py": "doctor/guard.py",
    "guard_signs.py": "doctor/guard_signs.py",  # what the guard reads of the machine
    "guard_files.py": "doctor/guard_files.py",  # its log, state, outputs, runs, exits and leases
    "nofollow.py": "doctor/nofollow.py",  # the guard's, the doctor's and the start logic's safe reads and redaction
    "hygiene.py": "doctor/hygiene.py",
    "install_layer.py": "bin/install-layer",
}
# pip as the venv runs it, naming the way to a new cell when the image's pins refuse a version (image.pins): the app
# layer puts it over the venv's pip, pip3 and pip3.X scripts
PIP_WRAPPER = "pip_pins.py"
# `import torch` refused in every Python process of the image on a pod whose start check found torch without the GPU
# it expects: the module and the .pth line that installs it, in the venv's site-packages (in_image/cuda_guard.py)
CUDA_GUARD = "cuda_guard.py"
CUDA_GUARD_MODULE = "_imagekit_cuda_guard"


@dataclass(frozen=True)
class Sources:
    """Where what a build context is made of comes from: ``root`` holds ``templates/`` and ``Dockerfile.base``
    (rendered or copied verbatim), ``in_image`` the stdlib programs that run in the image."""

    root: Path
    in_image: Path

    def program(self, name: str) -> Path:
        """A program of the in-image package by its file name (``imagekit_doctor.py``)."""
        if name not in IN_IMAGE and name not in (PIP_WRAPPER, CUDA_GUARD):
            raise KeyError(name)
        return self.in_image / name


def sources() -> Sources:
    """The one lookup. Installed wheel: templates from imagekit/_templates; source checkout: the repository root.
    The in-image programs are a package of imagekit in both."""
    package = Path(str(resources.files("imagekit")))
    packaged = package / "_templates"
    return Sources(packaged if packaged.is_dir() else package.parent, package / "in_image")


@cache
def environment() -> jinja2.Environment:
    root = sources().root
    templates = root / "templates"
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(templates), str(root)]),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )
    env.filters["dq"] = _dq
    return env


# Every COPY is `COPY rootfs/<layer>/ /`: the context holds each layer's files at their image paths, so every folder
# the COPY touches comes from the context with its clamped mtime. (`COPY file /opt/imagekit/` would stamp
# /opt/imagekit with the build time: a new layer digest on every build, which breaks sharing the layers above.)
ROOTFS = "rootfs"
IMAGEKIT_DIR = "opt/imagekit"
APP_FILES = f"{ROOTFS}/app/{IMAGEKIT_DIR}"  # the doctor, the entrypoint, shell/sshd settings, manifest, app pins
MANIFEST = f"{APP_FILES}/manifest.json"
BASE_STAGE_SCRIPTS = ("finalize-layer", "install-layer")  # what the base stage's COPY brings: the layers run them
APP_TARBALL = "app-files.tar"  # the legacy builder's app layer gets rootfs/app/ as this tarball, beside the wheels
CODE_TARBALL = "code.tar"  # `[image] copy` on the legacy builder: the last layer's files, beside the wheels
CODE_FILES = f"{ROOTFS}/code"  # and on BuildKit, at their image paths in the context (one COPY, free there)


def app_tarball(files: dict[str, tuple[bytes, int]], epoch: int) -> bytes:
    """``rootfs/app/`` as a tarball the app layer's RUN unpacks into / (legacy builder: no COPY after the big layers).
    Deterministic: sorted, owned by root, dated ``epoch``; folders below the top level carry the same mode and date a
    COPY would give them."""
    prefix = f"{ROOTFS}/app/"
    members = {rel[len(prefix) :]: item for rel, item in files.items() if rel.startswith(prefix)}
    folders = {"/".join(rel.split("/")[:i]) for rel in members for i in range(2, rel.count("/") + 1)}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(folders | set(members)):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "root", "root"
            if name in members:
                content, info.mode = members[name]
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
            else:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
    return out.getvalue()


def layer_file(filename: str) -> str:
    """Where the context keeps a layer's requirements file (the image gets it with the app layer's COPY). The RUN
    that installs the layer reads it from the wheelhouse (`fetch.wheelhouse_files`), checked by its sha256."""
    return f"{APP_FILES}/{filename}"


def _context_files() -> dict[str, tuple[bytes, int]]:
    """What runs inside the image, shipped as real files: the shell scripts and settings of templates/context, the
    programs of the in-image package (bin/ executable)."""
    where = sources()
    root = where.root / "templates" / "context"
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            rel = path.relative_to(root).as_posix()
            out[f"{APP_FILES}/{rel}"] = (path.read_bytes(), EXECUTABLE if rel.startswith("bin/") else 0o644)
    for name, rel in sorted(IN_IMAGE.items(), key=lambda item: item[1]):
        out[f"{APP_FILES}/{rel}"] = (where.program(name).read_bytes(), EXECUTABLE if rel.startswith("bin/") else 0o644)
    for script in BASE_STAGE_SCRIPTS:
        out[f"{ROOTFS}/base/{IMAGEKIT_DIR}/bin/{script}"] = out[f"{APP_FILES}/bin/{script}"]
    return out


def render_plan(plan: BuildPlan) -> dict[str, tuple[bytes, int]]:
    """The build context of one cell: relative path -> (bytes, mode). Everything it renders is the plan's (its facts
    and its options: the template sees them as ``options``)."""
    facts = manifest(plan)
    labels = naming.labels(facts)
    layering, builder = plan.layering, _builder(plan.options.builder)
    files = {MANIFEST: ((json.dumps(facts, indent=2, sort_keys=True) + "\n").encode(), 0o644)}
    for name, text in layering.requirement_files.items():  # kept in the image; installed from the wheelhouse's copy
        files[layer_file(name)] = (text.encode(), 0o644)
    files.update(_context_files())
    files[f"{ROOTFS}/app{pins.PATH}"] = (pins.constraints(plan.lock, plan.cell.id).encode(), 0o644)
    wrapper = (sources().program(PIP_WRAPPER).read_bytes(), EXECUTABLE)
    for name in ("pip", "pip3", f"pip{plan.cell.python}"):
        files[f"{ROOTFS}/app/opt/venv/bin/{name}"] = wrapper
    site = f"{ROOTFS}/app/opt/venv/lib/python{plan.cell.python}/site-packages"
    files[f"{site}/{CUDA_GUARD_MODULE}.py"] = (sources().program(CUDA_GUARD).read_bytes(), 0o644)
    files[f"{site}/{CUDA_GUARD_MODULE}.pth"] = (
        f"import {CUDA_GUARD_MODULE}; {CUDA_GUARD_MODULE}.install()\n".encode(),
        0o644,
    )
    # `[image] cuda_toolkit` from wheels (CUDA 13): `-lcudart` links the runtime wheel's libcudart.so.N
    # (imagekit.image.cuda_toolkit); Debian's toolkit (CUDA 11, 12) has its own libcudart.so
    if plan.options.cuda_toolkit and cuda_toolkit.major(plan.cell.cuda) >= cuda_toolkit.FIRST_MAJOR:
        path, script = cuda_toolkit.cudart_script(layers.CUDA_PREFIX, plan.cell.cuda)
        files[f"{ROOTFS}/app{path}"] = (script, 0o644)
    app_files = hashlib.sha256(app_tarball(files, int(plan.source_date_epoch))).hexdigest()
    code = plan.code
    project = _project(plan, builder)
    if project is not None:  # the code layer's requirements: the wheel alone, by its sha256 (beside the wheels)
        files[project_wheel.REQUIREMENTS_FILE] = (project.requirements().encode(), 0o644)
    if code is not None and builder == "buildkit":
        for rel, content, mode in code.files:
            files[f"{CODE_FILES}{code.to}/{rel}"] = (content, 0o755 if mode & 0o100 else 0o644)
    for value in labels.values():
        _dq(value)  # refuse before anything is rendered
    env = environment()
    dockerfile = env.get_template("Dockerfile.j2").render(
        imagekit_version=__version__,
        cell=plan.cell,
        base=plan.base,
        lock_hash=plan.lock.content_hash,
        source_date_epoch=int(plan.source_date_epoch),
        wheels="/mnt" if builder == "buildkit" else _url(plan.wheels_url),
        builder=builder,
        options=plan.options,
        layers=layering.layers,
        apt=layering.apt,
        cuda_prefix=layers.CUDA_PREFIX,
        cuda_layers=len(layering.cuda),
        uv=tools.uv_for(MACHINES[plan.cell.platform]),
        runtime=imageconfig.runtime(labels, plan.options.command, plan.options.env, imageconfig.cuda_home(facts)),
        app_files=f"{APP_TARBALL}#sha256={app_files}",
        code=code,
        code_files=f"{CODE_TARBALL}#sha256={code.sha256(int(plan.source_date_epoch))}" if code else "",
        code_size=_size(code.size) if code else "",
        project=project,
        project_requirements=(
            f"{project_wheel.REQUIREMENTS_FILE}#sha256={hashlib.sha256(project.requirements().encode()).hexdigest()}"
            if project
            else ""
        ),
    )
    return {"Dockerfile": (dockerfile.encode(), 0o644), **files}


def _project(plan: BuildPlan, builder: str) -> project_wheel.ProjectWheel | None:
    """`[image] install`'s wheel, where the render can install it: built (`imagekit build` builds it in a container
    of the base before it renders), with the code it rides with, on the legacy builder."""
    if plan.options.install is None:
        return None
    if plan.project is None or plan.code is None:
        raise UsageError(
            "[image] install: the project's wheel is built by `imagekit build` (in a container of the cell's base), "
            "which renders the context with it",
            "build with `imagekit build`; `imagekit render` and `bake` render cells without [image] install",
        )
    if builder == "buildkit":
        raise UsageError(
            "[image] install: the BuildKit render has no project wheel to mount (it comes from `imagekit build`)",
            "build with `imagekit build` (the legacy builder), or leave [image] install out of this matrix",
        )
    if not re.fullmatch(r"[A-Za-z0-9._/-]{1,300}", plan.project.source, re.ASCII):  # a comment's text
        raise UsageError(f"[image] install: refusing to render {plan.project.source!r}", "name a plain folder path")
    return plan.project


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def _builder(value: str) -> str:
    if value not in BUILDERS:
        raise UsageError(f"invalid builder {value!r}", "use legacy or buildkit")
    return value


def _url(value: str) -> str:
    if not re.fullmatch(r"(https?://[A-Za-z0-9.:\[\]-]+(/[A-Za-z0-9._~/-]*)?|/[A-Za-z0-9._/-]+)", value, re.ASCII):
        raise UsageError(f"invalid wheelhouse location {value!r}", "use an http(s) URL or an absolute path")
    return value


def context_digest(files: dict[str, tuple[bytes, int]]) -> str:
    """sha256 over a build context (paths, modes, bytes): the lock, the base digest, templates, doctor, labels."""
    h = hashlib.sha256()
    for rel, (content, mode) in sorted(files.items()):
        h.update(f"{rel}\0{mode:o}\0{len(content)}\0".encode())
        h.update(content)
    return h.hexdigest()


def render_many(plans: list[BuildPlan]) -> dict[str, tuple[bytes, int]]:
    """One folder per cell: ``<cell id>/<file>`` (``<cell id>-arm64/`` for a linux/arm64 cell)."""
    out = {}
    for plan in sorted(plans, key=lambda p: p.cell.slug):
        for rel, content in render_plan(plan).items():
            out[f"{plan.cell.slug}/{rel}"] = content
    return out


def diff_tree(root: Path, expected: dict[str, tuple[bytes, int]]) -> list[str]:
    """Paths under ``root`` that differ from ``expected`` (changed, missing, or extra within rendered folders)."""
    problems = []
    for rel, (content, _mode) in sorted(expected.items()):
        path = root / rel
        if not path.is_file():
            problems.append(f"missing: {rel}")
        elif path.read_bytes() != content:
            problems.append(f"differs: {rel}")
    cell_dirs = {rel.split("/", 1)[0] for rel in expected}
    for cell_dir in sorted(cell_dirs):
        base = root / cell_dir
        if base.is_dir():
            for path in sorted(base.rglob("*")):
                rel = path.relative_to(root).as_posix()
                if rel.startswith(f"{cell_dir}/wheels/"):  # fetched wheels (`imagekit fetch --into`), not rendered
                    continue
                if path.is_file() and rel not in expected:
                    problems.append(f"extra: {rel}")
    return problems
