"""BuildPlan: everything one image needs, decided before any effect runs; and the manifest it bakes in. Pure."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from imagekit import __version__
from imagekit.compat import companions
from imagekit.compat import contract as contracts
from imagekit.compat.catalog import BaseSpec, CompatData
from imagekit.errors import UsageError
from imagekit.image import cuda_toolkit
from imagekit.image import layering as layers
from imagekit.image.code_layer import CodeLayer
from imagekit.image.image_options import ImageOptions
from imagekit.image.project_wheel import ProjectWheel
from imagekit.locking import uv_pin as tools
from imagekit.locking.lockfile import Lock
from imagekit.model import AMD64, DEBIAN_ARCH, Cell

DEFAULT_SOURCE_DATE_EPOCH = 1735689600  # 2025-01-01T00:00:00Z; any fixed value makes builds repeatable
DEFAULT_WHEELS_URL = "http://imagekit-wheels:8765/"  # each build points the name at its own server (wheelserver.py)
# `[image] smoke`: each command's time limit in the self-test, and all of them together (the self-test's own run has
# 900 s: its checks take a minute or two)
SMOKE_TIMEOUT, SMOKE_BUDGET = 300, 600
BOOTSTRAP_PACKAGES = ("ca-certificates", "passwd", "python3", "python3-venv")
# What a pod needs (design.md, "Pod runtime contract"): an SSH server with scp/sftp/rsync, and tini as PID 1.
POD_PACKAGES = ("openssh-server", "rsync", "tini")
# What working on a pod needs: fetch code and data, keep a session across disconnects, edit a file, see processes.
WORKING_PACKAGES = ("curl", "git", "less", "nano", "openssh-client", "procps", "tmux", "unzip", "vim-tiny", "wget")
# torch.compile: Inductor compiles C++ on the CPU, Triton builds its launcher with a C compiler and Python.h.
COMPILER_PACKAGES = ("g++", "gcc", "python3-dev")
# Files a run never reads, kept out by dpkg itself (path-exclude, in /etc/dpkg/dpkg.cfg.d/ of the base, so an apt layer
# and an `apt-get install` on the pod skip them too). The list is debuerreotype's for Debian's official -slim images
# (scripts/.slimify-excludes and .slimify-includes, after wiki.ubuntu.com/ReducingDiskFootprint): documentation,
# manuals and translations, keeping every package's copyright file. Plus libpython's static archive from python3-dev:
# only a program linking Python statically reads it; extensions, Inductor's C++ and Triton's launcher use the headers.
# The compiler's own .a files (libgcc.a, libstdc++.a) stay: gcc links them.
SLIM_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/groff/*",
    "/usr/share/info/*",
    "/usr/share/linda/*",
    "/usr/share/lintian/overrides/*",
    "/usr/share/locale/*",
    "/usr/share/man/*",
    "/usr/lib/*/libpython3*.a",
    "/usr/lib/python3*/config-*/libpython3*.a",
)
SLIM_INCLUDES = (
    "/usr/share/doc/*/copyright",
    "/usr/share/locale/locale.alias",
)


def dpkg_path_filters() -> tuple[str, ...]:
    """dpkg's path filters for a base, in the order dpkg applies them (the last match wins: includes after)."""
    return (*(f"path-exclude={p}" for p in SLIM_EXCLUDES), *(f"path-include={p}" for p in SLIM_INCLUDES))


def base_packages(compiler: bool = True) -> tuple[str, ...]:
    """The Debian packages a bootstrapped base is made of (sorted, so the bootstrap key is stable)."""
    extra = COMPILER_PACKAGES if compiler else ()
    return tuple(sorted({*BOOTSTRAP_PACKAGES, *POD_PACKAGES, *WORKING_PACKAGES, *extra}))


# What `python -m venv` seeds: pip, and setuptools up to Python 3.11 (ensurepip's bundle). Dockerfile.base makes the
# venv without pip (and so without either) when the lock pins pip, and removes setuptools when the lock pins it, so a
# layer installs each locked distribution where no seed lies: the venv holds one install of each name. A seed the
# lock does not pin stays: pip for users and the image's pip wrapper (in_image/pip_pins.py), setuptools because
# torch's compiler imports it (torch.utils.cpp_extension) where the torch release does not require it.
SEEDS_BEFORE_312 = ("pip", "setuptools")


def venv_seeds(pins: Mapping[str, str], python: str = "3.11") -> list[str]:
    """The seeds the image's venv holds that the lock ``pins`` does not (the manifest's ``python.seeds``: the
    self-test and the doctor do not count them as extra), for a venv of Python ``python``."""
    if "pip" in pins:
        return []
    seeds = SEEDS_BEFORE_312 if tuple(int(p) for p in python.split(".")[:2]) < (3, 12) else ("pip",)
    return [seed for seed in seeds if seed not in pins]


@dataclass(frozen=True)
class BaseRef:
    """The image a cell starts FROM: a registry reference by digest, or a locally bootstrapped base."""

    name: str  # e.g. debian-bookworm
    reference: str  # what FROM names
    digest: str | None  # sha256:... when known (registry digest, or the imported image id)
    python: str
    glibc: str
    python_exe: str | None = None  # where the base's interpreter lives, when not /usr/bin/pythonX.Y
    registry: bool = False  # pulled by digest from a registry (else bootstrapped locally)
    compiler: bool | None = None  # has gcc/g++ and Python headers (None: a registry base, not known)
    platform: str = AMD64  # the CPU architecture its files are for (Docker's platform name)

    @property
    def python_bin(self) -> str:
        return self.python_exe or f"/usr/bin/python{self.python}"


def bootstrap_key(spec: BaseSpec, epoch: int, compiler: bool = True, platform: str = AMD64) -> str:
    """A stable id for a bootstrap's inputs: identical inputs give a byte-identical tarball (the dpkg path filters
    are inputs too: a base bootstrapped before them is another base)."""
    mirror = spec.mirror_for(platform)
    text = f"{spec.vendor}|{spec.suite}|{mirror}|{','.join(base_packages(compiler))}|{epoch}|no-host-keys"
    text += "|slim:" + hashlib.sha256("\n".join(dpkg_path_filters()).encode()).hexdigest()[:12]
    if platform != AMD64:
        text += f"|{DEBIAN_ARCH[platform]}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def bootstrap_base(
    spec: BaseSpec,
    epoch: int = DEFAULT_SOURCE_DATE_EPOCH,
    digest: str | None = None,
    compiler: bool = True,
    platform: str = AMD64,
) -> BaseRef:
    name = spec.name if compiler else f"{spec.name}-nocc"
    if platform != AMD64:
        name += f"-{DEBIAN_ARCH[platform]}"
    return BaseRef(
        name,
        f"imagekit/base:{name}-{bootstrap_key(spec, epoch, compiler, platform)}",
        digest,
        spec.python,
        spec.glibc,
        compiler=compiler,
        platform=platform,
    )


def base_for(
    python: str,
    data: CompatData,
    bases: Mapping[str, BaseRef],
    options: ImageOptions,
    *,
    platform: str = AMD64,
    epoch: int = DEFAULT_SOURCE_DATE_EPOCH,
) -> BaseRef:
    """The base a cell of Python ``python`` on ``platform`` starts FROM: the matrix's registry base for that Python
    (``bases``, `[bases]`; pulled for the platform), else imagekit's own, bootstrapped (with the compilers unless
    ``options.compiler`` is false). The one rule: ``services.base_images.present`` makes the chosen base present."""
    if python in bases:
        return replace(bases[python], platform=platform)
    spec = data.bases.get(python)
    if spec is None:
        raise UsageError(f"no base image known for Python {python}", f"known: {', '.join(sorted(data.bases))}")
    return bootstrap_base(spec, epoch, compiler=options.compiler, platform=platform)


@dataclass(frozen=True)
class BuildPlan:
    """Everything one image needs, decided before any effect runs: made by :meth:`make`, which decides its facts (the
    runtime contract, the layering) once; the render and the build read them here."""

    cell: Cell
    lock: Lock
    base: BaseRef
    repository: str
    contract: contracts.Contract  # what a host must offer to run the image (compat.contract.of_cell)
    layering: layers.Layering  # which locked distributions go into which layer (layering.split)
    options: ImageOptions = field(default_factory=ImageOptions)  # `[image]` and the command's flags over it
    code: CodeLayer | None = None  # `[image] copy`, as read: the last layer
    project: ProjectWheel | None = None  # `[image] install`: the project's wheel, built, in the code layer
    source_revision: str = "unknown"
    source_date_epoch: int = DEFAULT_SOURCE_DATE_EPOCH
    wheels_url: str = DEFAULT_WHEELS_URL  # the legacy builder's wheel server
    # torch's companions the lock holds, each with what the table asks of it and what the self-test imports
    # (compat/companions.py; the manifest's `companions`)
    companions: tuple[Mapping[str, object], ...] = ()

    @classmethod
    def make(
        cls,
        cell: Cell,
        lock: Lock,
        base: BaseRef,
        repository: str,
        data: CompatData,
        *,
        options: ImageOptions | None = None,
        code: CodeLayer | None = None,
        project: ProjectWheel | None = None,
        source_revision: str = "unknown",
        source_date_epoch: int = DEFAULT_SOURCE_DATE_EPOCH,
        wheels_url: str = DEFAULT_WHEELS_URL,
    ) -> BuildPlan:
        """The plan of ``cell`` over ``lock`` and ``base``, its facts decided from ``data`` now."""
        opts = options if options is not None else ImageOptions()
        if opts.cuda_toolkit:
            _toolkit_problem(cell, lock, data, base)
        return cls(
            cell=cell,
            lock=lock,
            base=base,
            repository=repository,
            contract=contracts.of_cell(cell, data),
            layering=layers.split(lock, opts.cuda_toolkit),
            options=opts,
            code=code,
            project=project,
            source_revision=source_revision,
            source_date_epoch=source_date_epoch,
            wheels_url=wheels_url,
            companions=held_companions(cell, lock, data),
        )


def held_companions(cell: Cell, lock: Lock, data: CompatData) -> tuple[Mapping[str, object], ...]:
    """Each name of the companion table the lock pins that the self-test can check by importing it: a companion
    (``torchaudio``), or what torch imports undeclared (``setuptools``: ``pkg_resources``)."""
    pins = lock.pins()
    out = []
    for c in companions.constraints(data, cell.torch):
        modules = companions.modules_of(c.name, data.undeclared)
        if c.name in pins and modules:
            out.append({"name": c.name, "version": pins[c.name], "requires": c.spec, "why": c.why,
                        "source": c.source, "import": modules})  # fmt: skip
    return tuple(out)


NVCC = "nvidia-cuda-nvcc"


def _toolkit_problem(cell: Cell, lock: Lock, data: CompatData, base: BaseRef) -> None:
    """`[image] cuda_toolkit`: refused for a cell without a CUDA compiler (NVIDIA's wheels for CUDA 13, Debian's
    package for the CUDA 11 and 12 cells [[cuda_compiler_deb]] names), or whose lock has none."""
    problem = cuda_toolkit.problem(cell, data, None if base.registry else base.name)
    if problem:
        have = cuda_toolkit.have_one(data)
        raise UsageError(f"[image] cuda_toolkit: {problem}",
                         f"leave cuda_toolkit out for this cell; the cells that have one: {have}")  # fmt: skip
    held = NVCC if cuda_toolkit.major(cell.cuda) >= cuda_toolkit.FIRST_MAJOR else cuda_toolkit.DEB_PACKAGE
    if held not in lock.pins() and held not in {p.name for p in lock.apt}:
        raise UsageError(f"[image] cuda_toolkit: {cell.id}'s lock has no {held}",
                         "re-lock the cell (`imagekit lock`): the matrix's cuda_toolkit adds it")  # fmt: skip


def _toolkit_facts(plan: BuildPlan) -> dict[str, str]:
    """CUDA_HOME and nvcc's version; with Debian's toolkit (CUDA 11.8, 12.4) its package too."""
    facts = {"home": cuda_toolkit.home(layers.CUDA_PREFIX, plan.cell.cuda), "nvcc": nvcc_release(plan)}
    if cuda_toolkit.major(plan.cell.cuda) < cuda_toolkit.FIRST_MAJOR:
        facts["package"] = cuda_toolkit.DEB_PACKAGE
    return facts


def nvcc_release(plan: BuildPlan) -> str:
    """The compiler's version as the lock pins it: nvidia-cuda-nvcc's (CUDA 13), or Debian's nvidia-cuda-toolkit's."""
    deb = next((p.version for p in plan.lock.apt if p.name == cuda_toolkit.DEB_PACKAGE), None)
    return deb or plan.lock.pins().get(NVCC, "")


def _project(wheel: dict, skip_imports: tuple[str, ...]) -> dict:
    """The manifest's `project`: the wheel, and with `[image] skip_imports` the modules `project-imports` leaves out."""
    return {**wheel, "skip_imports": list(skip_imports)} if skip_imports else wheel


def manifest(plan: BuildPlan) -> dict:
    """The facts baked into /etc/imagekit/manifest.json and mirrored in OCI labels."""
    cell, contract = plan.cell, plan.contract
    pins = plan.lock.pins()
    project, smoke = plan.project, plan.options.smoke
    # what the venv holds: the lock, and the project's own wheel (`[image] install`) beside it
    installed = {**pins, project.name: project.version} if project is not None else pins
    return {
        "schema": 1,
        "imagekit_version": __version__,
        "cell": cell.to_json(),
        "lock": {
            "hash": plan.lock.content_hash,
            "input_hash": plan.lock.meta.get("input-hash", ""),
            "torch_layer": [e.name for e in plan.lock.torch],
        },
        "layers": plan.layering.to_json(),
        "installer": f"{tools.UV.name} {tools.UV.version}",  # the same release on every platform
        "distributions": dict(sorted(installed.items())),
        "torch": {
            "version": pins.get("torch", cell.torch),
            "cuda": cell.cuda,
            "variant": cell.variant,
            "archs": list(contract.sass),
            "ptx": contract.ptx,
        },
        "driver": {"minimum": contract.driver_min, "full_feature": contract.driver_full},
        "runtime": contract.to_json(),
        "python": {
            "version": cell.python,
            "executable": "/opt/venv/bin/python",
            "seeds": venv_seeds(pins, cell.python),
        },
        "base": {"name": plan.base.name, "reference": plan.base.reference, "digest": plan.base.digest},
        "image": {
            "user": "root",
            "workspace": "/workspace",
            "ssh": True,
            "jupyter": "jupyterlab" in pins,
            "compiler": plan.base.compiler,
            "ports": ["22/tcp", *(["8888/http"] if "jupyterlab" in pins else [])],
        },
        "source_revision": plan.source_revision,
        "source_date_epoch": plan.source_date_epoch,
        # `[image] apt`: what was asked for and every .deb installed for it (the self-test and the doctor check dpkg)
        **(
            {
                "apt": {
                    "requested": list(cell.apt),
                    "packages": {p.name: {"version": p.version, "arch": p.arch} for p in plan.lock.apt},
                }
            }
            if plan.lock.apt
            else {}
        ),
        # `[image] install`: the wheel built from the project's code and installed with --no-deps
        **({"project": _project(project.to_json(), plan.options.skip_imports)} if project is not None else {}),
        # `[image] cuda_toolkit`: CUDA_HOME (nvcc, the headers) and nvcc's version (the self-test's cuda-extension)
        **({"cuda_toolkit": _toolkit_facts(plan)} if plan.options.cuda_toolkit else {}),
        # torch's companions the lock holds (compat/companions.py): the self-test imports each
        **({"companions": [dict(c) for c in plan.companions]} if plan.companions else {}),
        # `[image] smoke`: the commands the self-test runs in the image, each within its time limit
        **({"smoke": {"commands": list(smoke), "timeout": SMOKE_TIMEOUT, "budget": SMOKE_BUDGET}} if smoke else {}),
    }
