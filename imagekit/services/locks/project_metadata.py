"""A setup.py's or setup.cfg's dependencies, as its build backend (setuptools) answers them: the metadata hook run in
a container of the cell's base, never on the host, with the network off, the project mounted read-only, its 256 MB
/tmp the only place to write, and the answer on the container's output (bounded). No folder of the host is writable
from the container: a setup.py can leave nothing on the host (a setuid program, a tree too deep to remove, a disk
filled). The answer is kept, keyed by the folder's files and the base."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from imagekit.compat.catalog import BaseSpec
from imagekit.effects import foreign_files
from imagekit.effects.cache import cache_root
from imagekit.effects.files import write_atomic
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.image.buildplan import BaseRef
from imagekit.matrix import backend_metadata, project_deps
from imagekit.matrix.matrix_file import MATRIX_FILE
from imagekit.matrix.project_deps import DepsSource, ProjectDeps
from imagekit.services.ports import ContainerEngine
from imagekit.trust import untrusted

SETUPTOOLS = ("setuptools.build_meta", "setuptools.build_meta:__legacy__")
TIMEOUT = 300  # the container's; the hook itself gets HOOK_TIMEOUT of it
HOOK_TIMEOUT = 180
ANSWER_LIMIT = 8 << 20
KEY_FILE_LIMIT = 1 << 20  # a file of the folder larger than this is keyed by its size, not its bytes
KEY_ENTRIES = 2000
CACHE = "project-metadata"
LOG_LINES = 40  # of the hook's log, shown when it fails: the end, where the traceback says why
_NETWORK = (
    "Network is unreachable",
    "Temporary failure in name resolution",
    "Name or service not known",
    "No address associated with hostname",
    "urlopen error",
    "Failed to establish a new connection",
)
_WRITES = ("Read-only file system", "Permission denied")

# Runs in the base image under its Python (>= 3.8, standard library only): setuptools from the base, else from the
# wheel Debian's python3-venv keeps for ensurepip; the hook in a process of its own whose output goes to a log in
# /tmp; the answer as one line of JSON after MARK on the container's output, which the host reads (bounded: the
# sandbox caps a container's log). setuptools writes the egg-info its hook converts into /tmp, never into the
# project; without the `wheel` package (Debian's bases) the conversion fails, and the egg-info it wrote first is the
# answer. What the hook leaves in /tmp is read as another party's files: a FIFO or a link where a file belongs is
# refused at once (O_NONBLOCK, O_NOFOLLOW, then fstat), never waited on until the container's time is up.
MARK = "imagekit-metadata-answer: "
DRIVER = r"""
import glob, json, os, stat, subprocess, sys, zipfile
folder, mark, backend, timeout = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
LIMIT = 4 << 20
tmp = os.environ.get("TMPDIR") or "/tmp"  # the container's own /tmp (a test runs the driver with a folder of its own)

def done(doc, code):
    sys.stdout.write("\n" + mark + json.dumps(doc) + "\n")
    sys.stdout.flush()
    sys.exit(code)

def read(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        done({"kind": "failed", "code": "unreadable", "log": path + ": " + str(exc.strerror)}, 1)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            done({"kind": "failed", "code": "not-a-file", "log": path + " is not a regular file"}, 1)
        data = fh.read(LIMIT + 1)
    if len(data) > LIMIT:
        done({"kind": "failed", "code": "too-large", "log": path + " is over " + str(LIMIT) + " bytes"}, 1)
    return data.decode("utf-8", "replace")

env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LC_ALL": "C.UTF-8",
       "PYTHONDONTWRITEBYTECODE": "1"}
try:
    import setuptools  # noqa: F401
except ImportError:
    wheels = sorted(glob.glob("/usr/share/python-wheels/setuptools-*.whl"))
    if not wheels:
        done({"kind": "no-backend"}, 2)
    zipfile.ZipFile(wheels[-1]).extractall(os.path.join(tmp, "imagekit-backend"))
    env["PYTHONPATH"] = os.path.join(tmp, "imagekit-backend")
meta = os.path.join(tmp, "imagekit-metadata")
os.mkdir(meta)
module, _, attr = backend.partition(":")
hook = ("import importlib, sys; b = importlib.import_module(%r)%s; b.prepare_metadata_for_build_wheel(sys.argv[1])"
        % (module, "." + attr if attr else ""))
# the log's tail is read back through this descriptor, whatever the hook does to the name
with open(os.path.join(tmp, "imagekit-hook.log"), "w+b") as log:
    try:
        code = subprocess.run([sys.executable, "-c", hook, meta], cwd=folder, stdin=subprocess.DEVNULL, stdout=log,
                              stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    log.seek(0, 2)
    log.seek(max(0, log.tell() - 6000))
    tail = log.read(6000).decode("utf-8", "replace")
dist = sorted(glob.glob(meta + "/*.dist-info/METADATA"))
egg = sorted(glob.glob(meta + "/*.egg-info/PKG-INFO"))
if code == 0 and dist:
    done({"kind": "metadata", "metadata": read(dist[0])}, 0)
if egg and "invalid command 'bdist_wheel'" in tail:
    requires = os.path.join(os.path.dirname(egg[0]), "requires.txt")
    done({"kind": "egg-info", "pkg_info": read(egg[0]),
          "requires": read(requires) if os.path.lexists(requires) else ""}, 0)
done({"kind": "failed", "code": code, "log": tail}, 1)
"""


def read_setup(
    root: Path,
    source: DepsSource,
    base: BaseRef,
    backend: str,
    data_bases: Mapping[str, BaseSpec],
    *,
    engine: ContainerEngine | None = None,
    log: Callable[[str], None] = lambda line: sys.stderr.write(line + "\n"),
) -> ProjectDeps:
    """What ``source``'s build backend declares, from the kept answer when the folder's files, the base and this
    driver are those it was made for, else from the hook run in ``base`` (made present first: pulled, reused or
    bootstrapped)."""
    if backend not in SETUPTOOLS:
        raise UsageError(
            f"{source.file}: its build backend {untrusted.printable(backend, 80)} is not in the base image, and "
            "imagekit reads a project's metadata with the network off",
            "declare the dependencies statically: [project] dependencies in pyproject.toml, or a requirements file "
            "(`imagekit init --from requirements.txt`)",
        )
    folder = _folder(root, source)
    cached = cache_root() / CACHE / f"{_key(folder, base, backend)}.json"
    if cached.is_file():
        try:
            return _deps(foreign_files.read_bytes(cached, ANSWER_LIMIT), source)
        except (foreign_files.Refused, UsageError, untrusted.UntrustedData):
            cached.unlink(missing_ok=True)  # a damaged entry is made again
    if engine is None:
        from imagekit.effects.docker import Engine

        engine = Engine()
    from imagekit.services.builds.base_images import present

    log(f"reading {source.file}'s metadata in {base.name} (no network, the project read-only)")
    ready = present(base, engine, data_bases, log=log)
    raw = _run(engine, ready, folder, source, backend)
    try:
        deps = _deps(raw, source)  # refused before it is kept
    except untrusted.UntrustedData as exc:
        raise CheckFailed(f"{source.file}: its metadata answer was refused: {exc}", project_deps.HINT) from None
    write_atomic(cached, raw)
    return deps


def read_name(
    folder: Path,
    base: BaseRef,
    backend: str,
    data_bases: Mapping[str, BaseSpec],
    *,
    engine: ContainerEngine | None = None,
    log: Callable[[str], None] = lambda line: sys.stderr.write(line + "\n"),
) -> str:
    """The distribution name a source tree's setuptools hook states (``Name``), run as for a project's setup.py: in
    ``base``, network off, the tree read-only. For a VCS line without a name whose tree says it only in setup.py."""
    from email.parser import HeaderParser

    if backend not in SETUPTOOLS:
        raise UsageError(
            f"the tree's build backend {untrusted.printable(backend, 80)} is not in the base image",
            "name the package on the line: append #egg=NAME",
        )
    if engine is None:
        from imagekit.effects.docker import Engine

        engine = Engine()
    from imagekit.services.builds.base_images import present

    source = DepsSource("setup.py")
    log(f"reading the name of {folder.name} in {base.name} (no network, the tree read-only)")
    raw = _run(engine, present(base, engine, data_bases, log=log), folder, source, backend)
    doc = untrusted.load_json(raw, "the metadata answer", max_bytes=ANSWER_LIMIT)
    text = doc.get("metadata") or doc.get("pkg_info") if isinstance(doc, dict) else None
    name = HeaderParser().parsestr(text).get("Name", "") if isinstance(text, str) else ""
    return str(name or "")


def _folder(root: Path, source: DepsSource) -> Path:
    folder = foreign_files.inside(root, root / source.folder)
    if folder is None or not folder.is_dir():
        raise UsageError(f"{source.file}: its folder is not a folder inside the project ({root})", project_deps.HINT)
    return folder


def _run(engine: ContainerEngine, base: BaseRef, folder: Path, source: DepsSource, backend: str) -> bytes:
    """The hook's answer: the last MARK line of the container's output. Nothing of the host is writable from the
    container (the project is read-only, the rest of its filesystem too, /tmp a 256 MB tmpfs of its own)."""
    code, stdout, stderr = engine.run(
        base.reference,
        ["-I", "-c", DRIVER, "/project", MARK, backend, str(HOOK_TIMEOUT)],
        entrypoint=[base.python_bin],
        env={"HOME": "/tmp"},
        user=f"{os.getuid()}:{os.getgid()}",
        timeout=TIMEOUT,
        volumes={str(folder): {"bind": "/project", "mode": "ro"}},
        network=False,
        sandbox=True,
    )
    raw = answer_of(stdout)
    if raw is None:
        said = untrusted.printable((stderr or stdout).strip()[-1500:], 1500, lines=True)
        raise EnvironmentFailure(
            f"reading {source.file}'s metadata in {base.reference} gave no answer (exit {code})"
            + (f":\n{said}" if said else ""),
            "check that the base image runs (docker run IMAGE python3 -V); bootstrap it again if it repeats",
        )
    _refuse_failure(raw, source, base)
    return raw


def answer_of(stdout: str) -> bytes | None:
    """The answer the driver printed last (a line after MARK, at most ANSWER_LIMIT), or None."""
    found = stdout.rfind("\n" + MARK)
    if found < 0:
        return None
    line = stdout[found + 1 + len(MARK) :].split("\n", 1)[0]
    raw = line.encode("utf-8", "replace")
    return raw if len(raw) <= ANSWER_LIMIT else None


def _refuse_failure(raw: bytes, source: DepsSource, base: BaseRef) -> None:
    try:
        doc = untrusted.load_json(raw, "the metadata answer", max_bytes=ANSWER_LIMIT)
    except untrusted.UntrustedData as exc:
        raise CheckFailed(f"{source.file}: its metadata answer was refused: {exc}", project_deps.HINT) from None
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind == "no-backend":
        raise EnvironmentFailure(
            f"{base.reference} has no setuptools (neither installed nor as Debian's python3-setuptools-whl wheel)",
            "use imagekit's own base for this Python, or declare the dependencies statically",
        )
    if kind != "failed":
        return
    lines = str(doc.get("log", "")).strip().splitlines()[-LOG_LINES:]
    said = untrusted.printable("\n".join(lines), 6000, lines=True)
    code = untrusted.printable(str(doc.get("code")), 20)
    if any(sign in said for sign in _NETWORK):
        why = "it tried to reach the network, which imagekit turns off while it reads a project's metadata"
        hint = (
            "declare the dependencies without downloading anything: install_requires in setup.py or setup.cfg, "
            "[project] dependencies, or a requirements file (`imagekit init --from requirements.txt`)"
        )
    elif any(sign in said for sign in _WRITES):
        why = "it wrote outside /tmp: the project is mounted read-only and the rest of the filesystem too"
        hint = "make setup.py write nothing but its metadata (scratch files under /tmp), or use a requirements file"
    else:
        why = "the metadata hook failed"
        hint = (
            "run `python setup.py egg_info` in the project to see why; imagekit runs setuptools' hook in the cell's "
            "base with no network, the project read-only and /tmp the only place to write"
        )
    raise CheckFailed(f"{source.file}: {why} (exit {code}); its log:\n{said}", hint)


def _deps(raw: bytes, source: DepsSource) -> ProjectDeps:
    doc = untrusted.load_json(raw, "the metadata answer", max_bytes=ANSWER_LIMIT)
    if not isinstance(doc, dict):
        raise untrusted.UntrustedData("the metadata answer is not an object")
    files = (source.file,)
    if doc.get("kind") == "metadata" and isinstance(doc.get("metadata"), str):
        return backend_metadata.from_metadata(doc["metadata"], source, files)
    if doc.get("kind") == "egg-info" and isinstance(doc.get("pkg_info"), str) and isinstance(doc.get("requires"), str):
        return backend_metadata.from_egg_info(doc["pkg_info"], doc["requires"], source, files)
    raise untrusted.UntrustedData(f"the metadata answer's kind {untrusted.printable(doc.get('kind'), 40)} is unknown")


# Beside setup.py, what imagekit itself writes: the matrix file, `imagekit lock`'s folder and the build's state folder
# (made by the first lock and the first build, which would otherwise read setup.py again).
NOT_KEYED = frozenset({MATRIX_FILE, "lockfiles", ".imagekit"})


def _key(folder: Path, base: BaseRef, backend: str) -> str:
    """What an answer depends on: the driver, the base, the backend, and the folder's own files (those a setup.py
    reads: setup.cfg, pyproject.toml, a README, a requirements file beside it; a deeper one is not keyed)."""
    h = hashlib.sha256()
    for part in (DRIVER, base.reference, base.digest or "", backend):
        h.update(part.encode() + b"\0")
    with os.scandir(folder) as entries:  # imagekit's own files are not the project's: they do not count
        listed = sorted((e for e in entries if e.name not in NOT_KEYED), key=lambda e: e.name)[:KEY_ENTRIES]
    for entry in listed:
        h.update(entry.name.encode("utf-8", "surrogateescape") + b"\0")
        try:
            info = entry.stat(follow_symlinks=False)
            link = os.readlink(entry.path) if stat.S_ISLNK(info.st_mode) else None
        except OSError as exc:
            h.update(f"unreadable:{exc.errno}".encode())
            continue
        if link is not None:
            h.update(b"link:" + link.encode("utf-8", "surrogateescape"))
        elif stat.S_ISREG(info.st_mode) and info.st_size <= KEY_FILE_LIMIT:
            try:
                h.update(hashlib.sha256(foreign_files.read_bytes(entry.path, KEY_FILE_LIMIT)).digest())
            except foreign_files.Refused:
                h.update(b"unreadable")
        elif stat.S_ISDIR(info.st_mode):
            h.update(b"folder")  # by its name: what is in it is deeper (and .git's time moves with every commit)
        else:
            h.update(f"{stat.S_IFMT(info.st_mode)}:{info.st_size}:{info.st_mtime_ns}".encode())
    return h.hexdigest()
