"""`[image] install`: the project's own wheel, built in a container of the cell's base (its Python) with the network
off, from the copied code and the locked wheels of its build backend only; kept by what it was built from, so a
rebuild of the same files over the same base and lock builds nothing. The checks are image/project_wheel.py's."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

from packaging.utils import canonicalize_name

from imagekit.effects import foreign_files
from imagekit.effects.cache import cache_root
from imagekit.effects.files import write_atomic
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.image import code_layer, project_wheel
from imagekit.image.buildplan import BaseRef
from imagekit.image.code_layer import CodeLayer
from imagekit.image.project_wheel import ProjectWheel
from imagekit.locking.lockfile import Lock
from imagekit.model import Cell
from imagekit.services.ports import ContainerEngine
from imagekit.services.wheels.fetch import FetchedWheel
from imagekit.trust import untrusted

CACHE = "project-wheels"
TIMEOUT = 600
ANSWER_LIMIT = 1 << 20
METADATA_LIMIT = 1 << 20
MOUNT = "/imagekit-project"  # read-only: the project's files as a tar, the build backend's wheels
OUT = "/imagekit-out"  # the one folder the build writes on the host: the wheel and the answer

# Runs in the base image under its Python (>= 3.8, standard library only), as the host's user, network off: the
# locked wheels of the backend unpacked into a folder on sys.path, the project unpacked into /tmp (a backend writes
# next to the sources: build/, *.egg-info), the backend's build_wheel called as PEP 517 says, its output in a log;
# the wheel and a JSON answer in /imagekit-out.
DRIVER = r"""
import glob, importlib, json, os, re, shutil, sys, tarfile, tempfile, traceback, zipfile
source, wheels, out, backend, paths = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
work = tempfile.mkdtemp(prefix="imagekit-build-")
site, src, built, logname = (os.path.join(work, n) for n in ("env", "imagekit-src", "wheel", "build.log"))

def done(doc, code):
    sys.stdout.flush()
    with open(logname, "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - 6000))
        doc["log"] = fh.read().decode("utf-8", "replace")
    shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(out, "answer.json"), "w") as fh:
        json.dump(doc, fh)
    sys.exit(code)

log = open(logname, "w")
os.dup2(log.fileno(), 1)
os.dup2(log.fileno(), 2)
for name in sorted(os.listdir(wheels)):
    with zipfile.ZipFile(os.path.join(wheels, name)) as zf:
        zf.extractall(site)
for data in glob.glob(site + "/*.data"):
    for kind in ("purelib", "platlib"):
        if os.path.isdir(os.path.join(data, kind)):
            for entry in os.listdir(os.path.join(data, kind)):
                shutil.move(os.path.join(data, kind, entry), os.path.join(site, entry))
with tarfile.open(source) as tar:
    tar.extractall(work, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
os.chdir(src)
sys.path[:0] = [os.path.join(src, p) for p in paths] + [site]
os.environ["PYTHONPATH"] = site
try:
    module, _, attr = backend.partition(":")
    hooks = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        hooks = getattr(hooks, part)
    asked = list(getattr(hooks, "get_requires_for_build_wheel", lambda config_settings=None: [])(None))
    from importlib import metadata
    have = {re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower() for d in metadata.distributions(path=[site])}
    wanted = [r for r in asked if re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9._-]*)", r).group(1)).lower()
              not in have]
    if wanted:
        done({"kind": "needs", "requires": wanted}, 2)
    os.mkdir(built)
    name = hooks.build_wheel(built)
    shutil.copyfile(os.path.join(built, name), os.path.join(out, os.path.basename(name)))
except SystemExit:
    raise
except BaseException:
    traceback.print_exc()
    done({"kind": "failed"}, 1)
done({"kind": "wheel", "wheel": os.path.basename(name)}, 0)
"""


def wheel_for(
    engine: ContainerEngine,
    base: BaseRef,
    code: CodeLayer,
    copy_source: str,
    install: str,
    cell: Cell,
    lock: Lock,
    wheels: list[FetchedWheel],
    epoch: int,
    say: Callable[[str], None],
) -> tuple[ProjectWheel, Path]:
    """The project's wheel for ``cell`` (checked against its lock) and where it lies: kept from an earlier build of
    the same files over the same base and backend, else built now in ``base``."""
    files = project_wheel.source_files(code, project_wheel.sub_folder(copy_source, install))
    system = project_wheel.build_system(files, install)
    pins, env = lock.pins(), project_wheel.marker_env(cell)
    requires = project_wheel.build_requires(system)
    missing = project_wheel.unmet(requires, pins, env, f"{install}/pyproject.toml [build-system] requires")
    if missing:
        raise UsageError(
            f"[image] install: {install}'s build backend ({system.backend}) needs what the lock of {cell.key} does "
            f"not hold: {'; '.join(missing)}",
            "run `imagekit lock`: each cell's packages take the project's [build-system] requires, and the wheel is "
            "built with the network off, from the lock's wheels only",
        )
    by_name = {canonicalize_name(w.name): w.path for w in wheels}
    needed = project_wheel.closure(requires, lambda name: _requires(by_name.get(name)), env)
    backend_wheels = {name: by_name[name] for name in needed if name in by_name}
    source = code_layer.tarball(files, "/imagekit-src", epoch)  # the driver unpacks it in a folder of its own
    key = _key(base, system, backend_wheels, source, epoch)
    folder = cache_root() / CACHE / key
    kept = _kept(folder)
    if kept is None:
        say(f"building the project's wheel from {install} in {base.name} (network off, {len(backend_wheels)} locked "
            f"wheels for {system.backend})")  # fmt: skip
        with foreign_files.scratch("imagekit-project-") as work:  # the one rule for a folder a container writes
            _build(engine, base, system, backend_wheels, source, epoch, folder, work)
        kept = _kept(folder)
        if kept is None:
            raise EnvironmentFailure(f"the project's wheel was not kept in {folder}", "check the disk, and build again")
    path, data = kept
    meta = project_wheel.parse_metadata(_metadata(data, path.name))
    project_wheel.check_built(meta, path.name, cell, pins)
    digest = hashlib.sha256(data).hexdigest()
    say(f"project wheel {path.name} (sha256 {digest[:12]}), its dependencies all in the lock")
    return ProjectWheel(path.name, digest, canonicalize_name(meta.name), meta.version, install), path


def forecast_problems(copy_source: str, install: str, cell: Cell, lock: Lock) -> list[str]:
    """What the build would refuse of `[image] install`'s wheel that the project's files and the cell's lock already
    show, before anything is fetched or built (`build --dry-run`, and the forecast that gates a build): build
    requirements the lock lacks, and `[project] dependencies` (when pyproject.toml states them, not dynamic) the lock
    does not meet (the wheel is installed with --no-deps)."""
    from imagekit.services.inputs import install_build_system

    try:
        system, text = install_build_system(copy_source, install)
    except UsageError as exc:
        return [exc.message]
    pins, env = lock.pins(), project_wheel.marker_env(cell)
    where = f"{install}/pyproject.toml"
    problems = []
    missing = project_wheel.unmet(project_wheel.build_requires(system), pins, env, f"{where} [build-system] requires")
    if missing:
        problems.append(f"its build backend ({system.backend}) needs what the lock does not hold: {'; '.join(missing)}")
    project = untrusted.load_toml(text, where).get("project") if text is not None else None
    deps = project.get("dependencies") if isinstance(project, dict) else None
    dynamic = project.get("dynamic") if isinstance(project, dict) else None
    if isinstance(deps, list) and all(isinstance(d, str) for d in deps) and "dependencies" not in (dynamic or []):
        try:
            unmet = project_wheel.unmet(deps, pins, env, f"{where} [project] dependencies")
        except UsageError as exc:
            return [*problems, exc.message]
        if unmet:
            problems.append(f"the project's wheel needs what the lock does not hold: {'; '.join(unmet)}")
    return problems


def _requires(path: Path | None) -> tuple[str, ...]:
    """A locked wheel's Requires-Dist (none for a distribution the lock has no wheel of here)."""
    if path is None:
        return ()
    return project_wheel.parse_metadata(_metadata(path, path.name)).requires  # a fetched wheel: checked by sha256


def _metadata(wheel: Path | bytes, name: str) -> str:
    """The METADATA of a wheel (a file, or its bytes), bounded; refused when there is none or more than one."""
    try:
        with zipfile.ZipFile(io.BytesIO(wheel) if isinstance(wheel, bytes) else wheel) as zf:
            found = [
                i for i in zf.infolist() if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/METADATA")
            ]
            if len(found) != 1 or found[0].file_size > METADATA_LIMIT:
                raise CheckFailed(f"{untrusted.printable(name, 120)} has no single METADATA", "build the wheel again")
            return zf.read(found[0]).decode("utf-8", "replace")
    except zipfile.BadZipFile:
        raise CheckFailed(f"{untrusted.printable(name, 120)} is not a wheel (zip)", "build it again") from None


def _key(base: BaseRef, system: project_wheel.BuildSystem, wheels: dict[str, Path], source: bytes, epoch: int) -> str:
    """What a wheel depends on: the driver, the base, the backend and its wheels, the project's files, the date."""
    h = hashlib.sha256()
    for part in (
        DRIVER,
        base.reference,
        base.digest or "",
        system.backend,
        json.dumps(system.backend_path),
        str(epoch),
    ):
        h.update(part.encode() + b"\0")
    for name, path in sorted(wheels.items()):
        h.update(f"{name}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\0".encode())
    h.update(hashlib.sha256(source).digest())
    return h.hexdigest()[:32]


def _kept(folder: Path) -> tuple[Path, bytes] | None:
    """The wheel kept in ``folder`` and its bytes, or None."""
    if not folder.is_dir():
        return None
    found = sorted(p for p in folder.iterdir() if p.name.endswith(".whl"))
    if len(found) != 1:
        return None
    try:
        return found[0], foreign_files.read_bytes(found[0], project_wheel.MAX_WHEEL)
    except foreign_files.Refused:
        return None


def _build(
    engine: ContainerEngine,
    base: BaseRef,
    system: project_wheel.BuildSystem,
    wheels: dict[str, Path],
    source: bytes,
    epoch: int,
    folder: Path,
    work: Path,
) -> None:
    """Build the wheel in ``base`` and keep it in ``folder`` (written whole: a failed build keeps nothing); the build
    writes only ``work``'s out/ (a folder of foreign_files.scratch: private, removed whatever it leaves)."""
    try:
        inputs, out = work / "in", work / "out"
        (inputs / "wheels").mkdir(parents=True)
        out.mkdir()
        (inputs / "project.tar").write_bytes(source)
        for name, path in wheels.items():
            shutil.copyfile(path, inputs / "wheels" / f"{name}.whl")
        code, stdout, stderr = engine.run(
            base.reference,
            ["-I", "-c", DRIVER, f"{MOUNT}/project.tar", f"{MOUNT}/wheels", OUT, system.backend,
             json.dumps(list(system.backend_path))],
            entrypoint=[base.python_bin],
            env={"SOURCE_DATE_EPOCH": str(epoch), "HOME": "/tmp", "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0"},
            user=f"{os.getuid()}:{os.getgid()}",
            timeout=TIMEOUT,
            volumes={str(inputs): {"bind": MOUNT, "mode": "ro"}, str(out): {"bind": OUT, "mode": "rw"}},
            network=False,
        )  # fmt: skip
        doc = _answer(out, code, stdout, stderr, base)
        log = untrusted.printable(str(doc.get("log", "")).strip(), 6000, lines=True)
        if doc.get("kind") == "needs":
            asked = ", ".join(untrusted.printable(str(r), 80) for r in doc.get("requires") or [])
            raise UsageError(
                f"[image] install: the build backend {system.backend} asks for {asked} too "
                "(get_requires_for_build_wheel), which the lock does not hold",
                "add them to the cell's packages ([matrix] packages) and run `imagekit lock`",
            )
        wheel = str(doc.get("wheel", ""))
        if doc.get("kind") != "wheel" or not project_wheel.wheel_file_ok(wheel):
            raise CheckFailed(
                f"the project's wheel did not build in {base.name} (exit {code}); the build's log:\n{log}",
                "build it yourself to see why (`pip wheel --no-deps --no-build-isolation .`); imagekit builds it "
                "with the network off, from the copied files (.dockerignore applies) and the locked backend only",
            )
        data = foreign_files.read_bytes(out / wheel, project_wheel.MAX_WHEEL)
        staged = folder.with_name(folder.name + ".part")
        shutil.rmtree(staged, ignore_errors=True)
        write_atomic(staged / wheel, data)
        shutil.rmtree(folder, ignore_errors=True)
        staged.rename(folder)
    except foreign_files.Refused as exc:
        raise CheckFailed(f"the project's wheel was refused: {exc}", "build it again") from None


def _answer(out: Path, code: int, stdout: str, stderr: str, base: BaseRef) -> dict:
    try:
        doc = untrusted.load_json(foreign_files.read_bytes(out / "answer.json", ANSWER_LIMIT), "the build's answer")
    except (foreign_files.Refused, untrusted.UntrustedData) as exc:
        said = untrusted.printable((stderr or stdout).strip()[-1500:], 1500, lines=True)
        raise EnvironmentFailure(
            f"building the project's wheel in {base.reference} gave no answer (exit {code}; {exc})"
            + (f":\n{said}" if said else ""),
            "check that the base image runs (docker run IMAGE python3 -V); bootstrap it again if it repeats",
        ) from None
    if not isinstance(doc, dict):
        raise CheckFailed("the project's wheel build answered no object", "build again")
    return doc
