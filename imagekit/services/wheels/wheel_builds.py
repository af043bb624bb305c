"""The wheel-build stage: a package named in ``[matrix] from_source`` built once from its source archive into a wheel,
in a container of the cell's base with the network off, and kept in the wheel cache under its sha256 (where fetch
and build find it like any downloaded wheel). Keyed by everything the build reads (imagekit.locking.source_builds):
the same inputs reuse the wheel, and a lock whose wheel is missing here is built again from what it records."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.utils import parse_wheel_filename

from imagekit.compat.catalog import CompatData
from imagekit.effects import foreign_files, index_auth, process, resolver
from imagekit.effects.cache import cache_root
from imagekit.effects.files import write_atomic
from imagekit.errors import CheckFailed, ImagekitError
from imagekit.image.buildplan import BaseRef
from imagekit.locking import lockfile
from imagekit.locking import source_builds as sb
from imagekit.locking import wheel_choice as wheels
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.locking.resolution import LockRequest, LockSettings
from imagekit.model import Cell
from imagekit.services.ports import ContainerEngine
from imagekit.trust import untrusted

TIMEOUT = 3600  # one build's container (a CUDA extension compiles for tens of minutes on two cores)
SDIST_LIMIT = 512 << 20
WHEEL_LIMIT = 4 << 30
PYPROJECT_LIMIT = 1 << 20
LOG_LINES = 40
_NETWORK = ("Network is unreachable", "Temporary failure in name resolution", "No matching distribution found")

Log = Callable[[str], None]


@dataclass(frozen=True)
class Outcome:
    built: sb.Built
    path: Path  # the wheel, in the wheel cache
    reused: bool
    seconds: float


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


def built_dir() -> Path:
    return cache_root() / "built"


def sdist_path(sdist: sb.Sdist) -> Path:
    return cache_root() / "sdists" / sdist.sha256 / sdist.filename


def cached(built: sb.Built) -> Path | None:
    """The built wheel in the wheel cache, when its bytes still have the recorded sha256."""
    from imagekit.services.wheels.wheel_cache import sha256_of, wheel_cache

    path = wheel_cache() / built.wheel_sha256 / built.wheel
    if path.is_file() and not path.is_symlink() and sha256_of(path) == built.wheel_sha256:
        return path
    return None


def choose_sdist(name: str, cell: Cell, req: LockRequest, auth: index_auth.IndexAuth) -> sb.Sdist:
    """The newest source archive the cell's requirements allow, from the main index, else an extra one."""
    from imagekit.services.wheels.wheel_index import candidates

    spec = sb.specifier_of(name, req.requirements)
    indexes = [req.settings.index_url, *req.settings.extra_index_urls]
    last: CheckFailed | None = None
    for index in indexes:
        try:
            return sb.pick_sdist(name, spec, candidates(index, name, auth), f"the index {index}")
        except CheckFailed as exc:
            last = exc
    assert last is not None
    raise last


def fetch_sdist(sdist: sb.Sdist, auth: index_auth.IndexAuth, log: Log) -> Path:
    from imagekit.services.wheels.wheel_cache import download, sha256_of

    path = sdist_path(sdist)
    if path.is_file() and not path.is_symlink() and sha256_of(path) == sdist.sha256:
        return path
    log(f"downloading {sdist.filename}")
    cand = wheels.Candidate(sdist.filename, sdist.url, sdist.sha256, None)
    download(replace(cand, size=SDIST_LIMIT) if cand.size is None else cand, path, auth=auth)
    return path


def archive_pyproject(path: Path, filename: str) -> str | None:
    """The top folder's pyproject.toml of a source archive, read without unpacking anything (bounded)."""
    try:
        if filename.endswith(".zip"):
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    if info.filename.count("/") == 1 and info.filename.endswith("/pyproject.toml"):
                        if info.file_size > PYPROJECT_LIMIT:
                            raise CheckFailed(f"{filename}: its pyproject.toml is too large", "a damaged archive")
                        return zf.read(info).decode("utf-8", "replace")
            return None
        with tarfile.open(path, "r:gz") as tf:
            for member in tf:
                if member.isfile() and member.name.count("/") == 1 and member.name.endswith("/pyproject.toml"):
                    if member.size > PYPROJECT_LIMIT:
                        raise CheckFailed(f"{filename}: its pyproject.toml is too large", "a damaged archive")
                    fh = tf.extractfile(member)
                    return fh.read(PYPROJECT_LIMIT).decode("utf-8", "replace") if fh else None
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as exc:
        raise CheckFailed(f"{filename}: not a readable source archive ({exc})", "delete it from the cache") from None
    return None


def resolve_build_requires(
    requires: list[str], torch_layer: tuple[LockEntry, ...], req: LockRequest, name: str
) -> list[LockEntry]:
    """The build requirements, hash-pinned for the image's Python and platform by uv, agreeing with the cell's torch
    layer (those it pins are installed from it and not resolved again). Each is checked before uv sees it: one
    naming a URL is refused here, never fetched (sb.build_requirement_problem)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    for r in requires:
        problem = sb.build_requirement_problem(r)
        if problem:
            raise CheckFailed(
                f"{req.cell.id}: {name}'s build requirement {untrusted.printable(r, 80)!r} {problem}; nothing was "
                "fetched",
                "imagekit resolves build requirements by name from the cell's indexes; build the package elsewhere "
                f"and name its wheel by URL with its sha256 if {name} needs one from a URL",
            )
    have = {e.name for e in torch_layer}
    wanted = [r for r in requires if canonicalize_name(Requirement(r).name) not in have]
    if not wanted:
        return []
    with tempfile.TemporaryDirectory(prefix="imagekit-build-requires-") as tmp:
        work = Path(tmp)
        (work / "requirements.in").write_text("\n".join(wanted) + "\n")
        (work / "constraints.txt").write_text("".join(f"{e.name}=={e.version}\n" for e in torch_layer))
        args = [resolver.uv_binary(), "pip", "compile", "requirements.in", "-c", "constraints.txt",
                "--generate-hashes", "--no-header", "--no-annotate", "--python-version", req.cell.python,
                "--python-platform", req.platform, "--index-url", req.settings.index_url, "--no-config",
                "--only-binary", ":all:", "-o", "out.txt"]  # fmt: skip
        for url in req.settings.extra_index_urls:
            args += ["--extra-index-url", url]
        if req.settings.exclude_newer:
            args += ["--exclude-newer", req.settings.exclude_newer]
        res = process.run(args, cwd=work, timeout=600)
        if not res.ok:
            tail = untrusted.printable(res.stderr.strip()[-1500:], 1500, lines=True)
            raise CheckFailed(
                f"{req.cell.id}: {name}'s build requirements ({', '.join(wanted)}) do not resolve:\n{tail}",
                "each build requirement must have a wheel for the image's Python and platform",
            )
        return lockfile.parse_requirements((work / "out.txt").read_text(), f"{name}'s build requirements")


def build_one(
    name: str,
    cell: Cell,
    req: LockRequest,
    prelock: Lock,
    base: BaseRef,
    engine: ContainerEngine,
    *,
    expect: sb.Built | None = None,
    log: Log = _stderr,
) -> Outcome:
    """``name`` built (or found built) for ``cell``: its torch layer from ``prelock`` (the cell resolved without the
    packages built from source). ``expect``: what a lock records, to build that exact archive and requirements
    again (on a machine whose cache lacks the wheel) and to say when the wheel differs."""
    from imagekit.services.wheels.fetch import fetch_lock

    started = time.monotonic()
    auth = index_auth.for_indexes([req.settings.index_url, *req.settings.extra_index_urls])
    sdist, archive = _source(name, cell, req, auth, expect, log)
    requires, _backend = sb.build_requires(archive_pyproject(archive, sdist.filename))
    if expect is not None:
        build_entries = [_entry(p) for p in expect.requires if _entry(p).name not in {e.name for e in prelock.torch}]
    else:
        build_entries = resolve_build_requires(requires, prelock.torch, req, name)
    # Keyed by the pins as locked (every hash of each): a build found built needs no wheel read again.
    keyed = [f"{e.name}=={e.version} {' '.join(e.hashes)}" for e in (*prelock.torch, *build_entries)]
    key = sb.build_key(sdist.sha256, f"{base.reference}@{base.digest}", cell.python, req.platform, keyed, {})
    record = built_dir() / f"{key}.json"
    known = _known(record, name)
    if known is not None and (path := cached(known)) is not None:
        return Outcome(known, path, True, time.monotonic() - started)
    kit = Lock(prelock.torch, tuple(build_entries), dict(prelock.meta), prelock.header)
    glibc = ".".join(req.platform.rsplit("_", 2)[-2:])
    fetched = fetch_lock(kit, cell.python, glibc, log=log)
    versions = {e.name: e.version for e in kit.entries}
    pins = sorted(sb.pin_line(w.name, versions[w.name], w.path.parent.name) for w in fetched)
    build_pins = tuple(p for p in pins if p.split("==", 1)[0] in {e.name for e in build_entries})
    log(f"building {sdist.filename} in {base.name} (network off)")
    path = _run_build(engine, base, archive, sdist, fetched, pins, name)
    sha = path.parent.name
    version = str(parse_wheel_filename(path.name)[1])  # a git commit's version is the one its wheel says
    built = sb.Built(name, version, sdist.url, sdist.sha256, path.name, sha, build_pins)
    if expect is not None and sha != expect.wheel_sha256:
        raise CheckFailed(
            f"{name} {sdist.version} built from {sdist.filename} gave a wheel with sha256 {sha}; the lock records "
            f"{expect.wheel_sha256} (the same archive and build requirements): this package's build is not "
            "reproducible here",
            f"run `imagekit lock` to record this machine's wheel (kept at {path}), and report the difference to "
            f"{name}'s maintainers",
        )
    write_atomic(record, sb.Built.meta(built)[1])
    return Outcome(built, path, False, time.monotonic() - started)


def _source(
    name: str, cell: Cell, req: LockRequest, auth: index_auth.IndexAuth, expect: sb.Built | None, log: Log
) -> tuple[sb.Sdist, Path]:
    """The archive to build: a git commit's tree (a VCS requirement, or a lock's record of one), the archive a lock
    records, or the newest one the index has that the requirements allow."""
    from imagekit.effects import git
    from imagekit.locking import vcs_refs
    from imagekit.services.wheels.wheel_cache import sha256_of

    url = expect.sdist if expect is not None else sb.git_sources(cell.packages).get(name)
    if url is not None and vcs_refs.is_vcs(url):
        ref = vcs_refs.parse(name, url)
        if not ref.pinned:
            raise _refusal(vcs_refs.unpinned(name, ref, git.ls_remote(ref)))
        folder = cache_root() / "git" / ref.ref
        archive = folder / f"{name}-{ref.ref[:12]}.tar.gz"
        if not archive.is_file() or archive.is_symlink():
            log(f"reading {ref.repo} at {ref.ref[:12]}")
            archive = git.archive(ref, name, folder)
        sha = sha256_of(archive)
        if expect is not None and sha != expect.sdist_sha256:
            raise CheckFailed(
                f"{name}: the tree of {ref.url} gave an archive with sha256 {sha}; the lock records "
                f"{expect.sdist_sha256}",
                "run `imagekit lock` to record this machine's archive",
            )
        return sb.Sdist(name, "", archive.name, ref.url, sha), archive
    if expect is not None:
        sdist = sb.Sdist(name, expect.version, expect.sdist.rsplit("/", 1)[-1], expect.sdist, expect.sdist_sha256)
    else:
        sdist = choose_sdist(name, cell, req, auth)
    return sdist, fetch_sdist(sdist, auth, log)


def _refusal(exc: ValueError) -> CheckFailed:
    return CheckFailed(str(exc), getattr(exc, "hint", "pin a commit"))


def _known(record: Path, name: str) -> sb.Built | None:
    try:
        raw = foreign_files.read_bytes(record, 1 << 20).decode()
        return sb.recorded({sb.META_PREFIX + name: raw})[name]
    except (foreign_files.Refused, CheckFailed, UnicodeDecodeError, KeyError):
        return None


def _entry(pin: str) -> LockEntry:
    m = sb._PIN.fullmatch(pin)
    if m is None:
        raise CheckFailed(f"not a build pin: {untrusted.printable(pin, 80)}", "run `imagekit lock` again")
    return LockEntry(m["name"], m["version"], (f"sha256:{m['sha']}",))


def _run_build(
    engine: ContainerEngine, base: BaseRef, archive: Path, sdist: sb.Sdist, fetched: list, pins: list[str], name: str
) -> Path:
    """The build in a container: wheels and the archive read-only, a scratch folder of this user's (0700) as
    /build, the network off, the root filesystem read-only; the one wheel it leaves is read without following links
    and kept in the wheel cache under its sha256."""
    from imagekit.services.wheels.wheel_folders import link_wheels

    with foreign_files.scratch("imagekit-wheel-build-") as scratch:
        house = link_wheels(fetched, scratch / "wheels")
        given = scratch / "in"
        given.mkdir()
        shutil.copyfile(archive, given / sdist.filename)
        write_atomic(given / "build-requirements.txt", sb.requirements_text(pins))
        work = scratch / "build"
        work.mkdir()
        env = {"SOURCE_DATE_EPOCH": sb.SOURCE_DATE_EPOCH, "PYTHONHASHSEED": "0", "LC_ALL": "C.UTF-8", "TZ": "UTC"}
        code, out, err = engine.run(
            base.reference,
            ["/bin/sh", "-c", sb.BUILD_SCRIPT, "build", base.python_bin, sdist.filename],
            entrypoint=[],
            env=env,
            user=f"{os.getuid()}:{os.getgid()}",
            timeout=TIMEOUT,
            volumes={
                str(house): {"bind": "/wheels", "mode": "ro"},
                str(given): {"bind": "/in", "mode": "ro"},
                str(work): {"bind": "/build", "mode": "rw"},
            },
            network=False,
            sandbox=True,
        )
        log = untrusted.printable("\n".join((out + err).strip().splitlines()[-LOG_LINES:]), 8000, lines=True)
        if code != 0:
            raise CheckFailed(
                f"building {name} from {sdist.filename} failed (exit {code}); the end of its log:\n{log}",
                _hint(log, name),
            )
        return _keep_wheel(work / "out", sdist, log)


def _hint(log: str, name: str) -> str:
    if any(sign in log for sign in _NETWORK):
        return (
            f"{name}'s build reached for the network, which is off: every build requirement must be declared in its "
            "pyproject.toml's [build-system] requires (or the cell's torch layer)"
        )
    return f"read the log above; a package that needs a compiler or CUDA headers says so there ({name}'s docs)"


def _keep_wheel(out: Path, sdist: sb.Sdist, log: str) -> Path:
    """The one wheel the build left in ``out`` (a regular file named for the package and version), copied into the
    wheel cache under its sha256."""
    from imagekit.services.wheels.wheel_cache import wheel_cache

    try:
        with foreign_files.folder(out) as fd:
            names = sorted(os.listdir(fd))
            if len(names) != 1 or not sb.wheel_named(names[0], sdist.name, sdist.version):
                shown = ", ".join(untrusted.printable(n, 80) for n in names[:5]) or "nothing"
                raise CheckFailed(
                    f"building {sdist.name} {sdist.version} left {shown}, not one wheel of {sdist.name} "
                    f"{sdist.version}:\n{log}",
                    "the archive's version and the wheel it builds must agree",
                )
            digest, tmp = hashlib.sha256(), io.BytesIO()
            with foreign_files.open_regular(names[0], dir_fd=fd, limit=WHEEL_LIMIT) as fh:
                while block := fh.read(1 << 22):
                    digest.update(block)
                    tmp.write(block)
    except foreign_files.Refused as exc:
        raise CheckFailed(
            f"building {sdist.name} from {sdist.filename}: its output was refused: {exc}; the end of its log:\n{log}",
            "the build planted a link or a special file where the wheel goes: nothing of it was kept",
        ) from None
    sha = digest.hexdigest()
    dest = wheel_cache() / sha / names[0]
    write_atomic(dest, tmp.getvalue())
    return dest


def placeholders(names: list[str], req: LockRequest) -> tuple[Path, list[str]]:
    """A folder for the resolver's --find-links holding a placeholder wheel (source_builds.placeholder_wheel) for
    each version of each of ``names`` the cell's indexes list a source archive of, and the names none was found for.
    The caller removes the folder."""
    from imagekit.services.wheels.wheel_index import candidates

    auth = index_auth.for_indexes([req.settings.index_url, *req.settings.extra_index_urls])
    folder = Path(tempfile.mkdtemp(prefix="imagekit-placeholders-"))
    missing = []
    for name in names:
        versions: list[str] = []
        for index in [req.settings.index_url, *req.settings.extra_index_urls]:
            try:
                versions = sb.sdist_versions(name, candidates(index, name, auth))
            except ImagekitError:
                continue  # not on this index (a 404): the next one
            if versions:
                break
        if not versions:
            missing.append(name)
        for version in versions:
            filename, data = sb.placeholder_wheel(name, version)
            (folder / filename).write_bytes(data)
    return folder, missing


def find_links(paths: list[Path]) -> Path:
    """A folder of its own holding these wheels (hard links), for the resolver's --find-links."""
    folder = Path(tempfile.mkdtemp(prefix="imagekit-built-"))
    for p in paths:
        try:
            os.link(p, folder / p.name)
        except OSError:
            shutil.copyfile(p, folder / p.name)
    return folder


def builder_in(engine: ContainerEngine, base: BaseRef, log: Log = _stderr) -> Callable:
    """A cell's builder (services/locks/lock_cells.SourceBuilder) in a base already present."""

    def run(cell: Cell, req: LockRequest, prelock: Lock) -> list[tuple[sb.Built, Path]]:
        out = []
        for name in sb.built_names(cell):
            done = build_one(name, cell, req, prelock, base, engine, log=log)
            how = "reused" if done.reused else f"built in {done.seconds:.0f} s"
            log(f"{cell.id}: {name} {done.built.version} from {done.built.sdist.rsplit('/', 1)[-1]}: {how}, "
                f"wheel sha256:{done.built.wheel_sha256[:16]}…")  # fmt: skip
            out.append((done.built, done.path))
        return out

    return run


def builder_for(engine: ContainerEngine, base_of: Callable[[str], BaseRef], log: Log = _stderr) -> Callable:
    """The lock step's builder (services/locks/lock_cells.SourceBuilder): each Python's base made present once
    (``base_of``:
    bootstrapped or pulled), then each of the cell's from_source packages built, or found built, in it."""
    bases: dict[str, BaseRef] = {}
    guard = threading.Lock()

    def run(cell: Cell, req: LockRequest, prelock: Lock) -> list[tuple[sb.Built, Path]]:
        with guard:
            if cell.python not in bases:
                bases[cell.python] = base_of(cell.python)
        return builder_in(engine, bases[cell.python], log)(cell, req, prelock)

    return run


def ensure_built(
    lock: Lock, cell: Cell, settings: LockSettings, data: CompatData, base: BaseRef, engine: ContainerEngine, log: Log
) -> int:
    """Each wheel the lock records as built from source, present in the wheel cache: built again from the lock's
    record (the same archive, build requirements and torch layer) where it is missing, and refused when the build
    gives other bytes. Returns how many were built."""
    from imagekit.locking.resolution import request

    count = 0
    for name, built in sb.recorded(lock.meta).items():
        if cached(built) is None:
            log(f"{name} {built.version} was built from source when the cell was locked; building it again here")
            build_one(name, cell, request(cell, settings, data), lock, base, engine, expect=built, log=log)
            count += 1
    return count
