"""Lock planning and verification: what to ask the resolver, and whether its answer tells the truth. Pure."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field, replace

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from imagekit import __version__
from imagekit.compat import companions
from imagekit.compat.catalog import CompatData
from imagekit.compat.pypi_metadata import image_marker_env
from imagekit.errors import CheckFailed
from imagekit.in_image.facts import is_torch_family as is_torch_family  # one definition, shared with the image
from imagekit.locking.lockfile import TORCH_FAMILY, Lock, LockEntry, split, torch_closure
from imagekit.model import MACHINES, Cell
from imagekit.trust import untrusted, validate
from imagekit.trust.redact import redact

LOCK_FORMAT = 1
PYPI = "https://pypi.org/simple"
PYTORCH_INDEX = "https://download.pytorch.org/whl"
_FROM = re.compile(r"^\s*# from (?P<url>\S+)\s*$")


@dataclass(frozen=True)
class LockSettings:
    index_url: str = PYPI
    extra_index_urls: tuple[str, ...] = ()
    torch_index_base: str = PYTORCH_INDEX  # + "/cu118"
    exclude_newer: str | None = None
    resolver: str = "uv"
    # The project's folder (the matrix file's): where `NAME @ file:wheels/...whl` wheels lie. Not a resolver input:
    # the lock names them relative to it, so it is in no hash and no header.
    project: str = field(default=".", compare=False)

    def __post_init__(self) -> None:  # validated before anything runs: a newline here would inject pins
        validate.index_url(self.index_url, "--index-url")
        for url in self.extra_index_urls:
            validate.index_url(url, "--extra-index-url")
        validate.index_url(self.torch_index_base, "--torch-index-url")
        if self.exclude_newer is not None:
            validate.exclude_newer(self.exclude_newer)

    def public(self) -> dict[str, object]:
        """Settings with credentials removed: what goes into hashes and headers."""
        return {
            "index_url": redact(self.index_url),
            "extra_index_urls": [redact(u) for u in self.extra_index_urls],
            "torch_index_base": redact(self.torch_index_base),
            "exclude_newer": self.exclude_newer,
            "resolver": self.resolver,
        }


@dataclass(frozen=True)
class LockRequest:
    cell: Cell
    settings: LockSettings
    routed: bool  # the torch family from the PyTorch index: not data.torch_from_pypi(torch, variant)
    torch_index: str | None
    platform: str
    input_hash: str
    requirements: tuple[str, ...]
    # Torch-closure packages found by a first pass (nvidia-*, triton...): uv applies an index source only to
    # direct dependencies, so these are named directly to pin them to the PyTorch index too.
    routed_extra: tuple[str, ...] = ()
    # Folders of wheels built from source archives (services/wheels/wheel_builds.py), read by the resolver beside the
    # indexes; a host path, so never part of the input hash.
    find_links: tuple[str, ...] = ()
    # What the companion table asks for this torch (compat/companions.py: torchaudio==2.7.1, numpy<2 ...), handed to
    # the resolver as constraints: each binds only a name the resolution holds. Not in the input hash: a lock read
    # back is held to them instead (`companion_drift`), so a table that moves re-resolves only the locks it contradicts.
    constraints: tuple[str, ...] = ()

    def with_routed(self, names: set[str]) -> LockRequest:
        return replace(self, routed_extra=tuple(sorted(set(self.routed_extra) | names)))

    def routed_names(self) -> list[str]:
        return sorted(TORCH_FAMILY | set(self.routed_extra))

    def pyproject(self) -> str:
        """The throwaway project uv resolves: direct requirements, and the torch index pinned per package."""
        deps = ",\n".join(f"    {json.dumps(r)}" for r in (*self.requirements, *self.routed_extra))
        text = (
            '[project]\nname = "imagekit-cell"\nversion = "0"\n'
            f'requires-python = "=={self.cell.python}.*"\ndependencies = [\n{deps},\n]\n'
        )
        if self.routed:
            text += "\n[tool.uv.sources]\n"
            for name in self.routed_names():
                text += f'{name} = {{ index = "pytorch" }}\n'
            text += f'\n[[tool.uv.index]]\nname = "pytorch"\nurl = {json.dumps(self.torch_index)}\nexplicit = true\n'
        return text

    def uv_args(self) -> list[str]:
        args = [
            "pip",
            "compile",
            "pyproject.toml",
            "--generate-hashes",
            "--emit-index-annotation",
            "--no-header",
            "--python-version",
            self.cell.python,
            "--python-platform",
            self.platform,
            "--index-url",
            self.settings.index_url,
            "--no-config",
            "--only-binary",  # images install wheels only: a source build is refused at lock time, with the fix
            ":all:",
        ]
        for url in self.settings.extra_index_urls:
            args += ["--extra-index-url", url]
        for folder in self.find_links:
            args += ["--find-links", folder]
        if self.constraints:
            args += ["--constraint", CONSTRAINTS_FILE]
        if self.settings.exclude_newer:
            args += ["--exclude-newer", self.settings.exclude_newer]
        return args

    def regenerate_command(self, matrix: str | None) -> str:
        c = self.cell
        argv = [
            "imagekit",
            "lock",
            "--cuda",
            c.cuda,
            "--torch",
            c.torch,
            "--transformers",
            c.transformers,
            "--python",
            c.python,
        ]
        if c.platform != "linux/amd64":
            argv += ["--platform", c.platform]
        if matrix:
            argv += ["--matrix", matrix]
        return shlex.join(argv + self.settings_args())

    def settings_args(self) -> list[str]:
        """The resolver settings that differ from the defaults, as `imagekit lock` options (URLs redacted: a lock
        never carries a credential, so a private index's token must be given again)."""
        s, default, args = self.settings, LockSettings(), []
        if s.index_url != default.index_url:
            args += ["--index-url", redact(s.index_url)]
        for url in s.extra_index_urls:
            args += ["--extra-index-url", redact(url)]
        if s.torch_index_base != default.torch_index_base:
            args += ["--torch-index-url", redact(s.torch_index_base)]
        if s.exclude_newer:
            args += ["--exclude-newer", s.exclude_newer]
        if s.resolver != default.resolver:
            args += ["--resolver", s.resolver]
        return args


def _platform(cell: Cell, data: CompatData) -> str:
    """The wheel platform a cell resolves for (uv's --python-platform), whatever the host: its CPU architecture and
    the glibc of its base."""
    base = data.bases.get(cell.python)
    machine = MACHINES[cell.platform]
    return (
        f"{machine}-manylinux_2_28"
        if base is None or Version(base.glibc) >= Version("2.28")
        else (f"{machine}-manylinux_2_17")
    )


def _requirements(cell: Cell, routed: bool) -> tuple[str, ...]:
    torch_pin = f"torch=={cell.torch}+{cell.variant}" if routed else f"torch=={cell.torch}"
    return (torch_pin, f"transformers=={cell.transformers}", *cell.packages)


def _input_hash(cell: Cell, public: dict[str, object], routed: bool, platform: str, data: CompatData) -> str:
    """The hash of everything a resolution depends on, from the settings without credentials (``public()``)."""
    torch_index = f"{str(public['torch_index_base']).rstrip('/')}/{cell.variant}" if routed else None
    doc = {
        "format": LOCK_FORMAT,
        "cell": cell.to_json(),
        "requirements": list(_requirements(cell, routed)),
        "settings": public,
        "torch_index": redact(torch_index) if torch_index else None,
        "platform": platform,
        "data_version": data.data_version,
    }
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def request(cell: Cell, settings: LockSettings, data: CompatData) -> LockRequest:
    routed = not data.torch_from_pypi(cell.torch, cell.variant, cell.platform)
    platform = _platform(cell, data)
    torch_index = f"{settings.torch_index_base.rstrip('/')}/{cell.variant}" if routed else None
    input_hash = _input_hash(cell, settings.public(), routed, platform, data)
    held = tuple(c.requirement for c in companions.constraints(data, cell.torch) if c.binding)
    return LockRequest(
        cell, settings, routed, torch_index, platform, input_hash, _requirements(cell, routed), constraints=held
    )


CONSTRAINTS_FILE = "imagekit-companion-table.txt"  # beside the throwaway project; a lock says "# via -c" it


def constraints_text(req: LockRequest) -> str:
    """The resolver's constraints file: one requirement a line."""
    return "".join(f"{c}\n" for c in req.constraints)


def companion_conflicts(cell: Cell, data: CompatData) -> CheckFailed | None:
    """A requirement of the cell (its packages) that contradicts the companion table for its torch: the error naming
    both and the table's source; None when there is none. Said before the resolver runs, in imagekit's words."""
    env = image_marker_env(cell.python, MACHINES[cell.platform])
    found = companions.conflicts(cell.packages, companions.constraints(data, cell.torch), env)
    if not found:
        return None
    lines = [
        f"{text} contradicts imagekit's companion table: {c.why}, so the lock holds {c.requirement} "
        f"(source: {data.source(c.source)})"
        for text, c in found
    ]
    names = ", ".join(c.name for _, c in found)
    return CheckFailed(
        f"{cell.id}: " + "; ".join(lines),
        f"drop the pin on {names} (the lock then picks the release that goes with torch {cell.torch}), or choose the "
        f"torch release your pin was built for",
    )


def companion_drift(lock: Lock, cell: Cell, data: CompatData) -> list[str]:
    """Each pin of ``lock`` the companion table for the cell's torch does not allow (a lock made before the table
    said so): ``torchaudio 2.11.0 (the table: torchaudio==2.7.1, ...)``."""
    found = companions.drift(lock.pins(), companions.constraints(data, cell.torch))
    return [f"{name} {version} (the table: {c.requirement}: {c.why}; {c.source})" for name, version, c in found]


def companion_hint(req: LockRequest, text: str, data: CompatData) -> str | None:
    """What to add to a resolver's failure that names a name the companion table held: the constraint and its
    source, so a "no version of torchvision>0.29.2" says why it was asked."""
    held = [
        c
        for c in companions.constraints(data, req.cell.torch)
        if c.binding and re.search(rf"(?<![A-Za-z0-9._-]){re.escape(c.name)}(?![A-Za-z0-9_])", text)
    ]
    if not held:
        return None
    return "; ".join(f"imagekit held {c.requirement} ({c.why}; source: {data.source(c.source)})" for c in held)


def recorded_settings(lock: Lock) -> dict[str, object]:
    """The resolver settings (credentials removed) a lock was made with; locks older than the header line were
    made with the defaults."""
    raw = lock.meta.get("settings")
    if raw is None:
        return LockSettings().public()
    try:
        doc = untrusted.load_json(raw, "the imagekit-settings line", max_bytes=1 << 16, max_depth=4)
    except untrusted.UntrustedData:
        doc = None
    if not isinstance(doc, dict) or set(doc) != set(LockSettings().public()):
        shown = untrusted.printable(raw[:80], 80)
        raise CheckFailed(f"unreadable imagekit-settings line: {shown!r}", "run `imagekit lock` to rewrite it")
    return doc


def stale_reason(lock: Lock, cell: Cell, data: CompatData) -> str | None:
    """Why a lock no longer answers this cell's inputs (a package added to the matrix, new compatibility data, a
    new base), judged by the settings it was made with; None when it is current."""
    routed = not data.torch_from_pypi(cell.torch, cell.variant, cell.platform)
    want = _input_hash(cell, recorded_settings(lock), routed, _platform(cell, data), data)
    got = lock.meta.get("input-hash")
    drift = companion_drift(lock, cell, data)
    if drift:
        return f"pins what imagekit's companion table does not allow with torch {cell.torch}: {'; '.join(drift)}"
    if got == want:
        return None
    changed = []
    if lock.meta.get("data-version") != data.data_version:
        changed.append(f"compatibility data {lock.meta.get('data-version')} -> {data.data_version}")
    if lock.meta.get("platform") != _platform(cell, data):
        changed.append(f"platform {lock.meta.get('platform')} -> {_platform(cell, data)}")
    detail = "; ".join(changed) or "the cell's requirements or packages changed"
    return f"was locked for other inputs ({detail}): its input hash is {got}, this cell's is {want}"


def index_of_entries(uv_output: str) -> dict[str, str]:
    """name -> index URL from uv's ``# from`` annotations."""
    out, current = {}, None
    for line in uv_output.splitlines():
        if line and not line.startswith((" ", "#", "-")):
            current = line.split("==")[0].strip().lower().replace("_", "-")
        m = _FROM.match(line)
        if m and current:
            out[current] = m["url"]
    return out


def misrouted(req: LockRequest, uv_output: str) -> set[str]:
    """Torch-closure packages of a routed cell that did not come from the PyTorch index (first pass)."""
    from imagekit.locking.lockfile import parse_requirements

    if not req.routed:
        return set()
    entries = parse_requirements(uv_output)
    sources = index_of_entries(uv_output)
    want = redact(req.torch_index or "").rstrip("/")
    return {n for n in torch_closure(entries) if is_torch_family(n) and redact(sources.get(n, "")).rstrip("/") != want}


def missing_family_package(req: LockRequest, uv_error: str) -> str | None:
    """A torch-family package uv could not find on the default index (only the PyTorch index has it)."""
    if not req.routed:
        return None
    for name in re.findall(r"([A-Za-z0-9._-]+) was not found in the package registry", uv_error):
        if is_torch_family(name) and name not in req.routed_extra:
            return name
    return None


def unmet_requirements(req: LockRequest, pins: dict[str, LockEntry]) -> list[str]:
    """Each direct requirement of the cell (torch, transformers, the matrix's packages) that no pin satisfies."""
    env = image_marker_env(req.cell.python)
    unmet = []
    for text in req.requirements:
        try:
            r = Requirement(text)
        except InvalidRequirement:
            unmet.append(f"{text!r} is not a requirement")
            continue
        if r.marker is not None and not r.marker.evaluate(env):
            continue
        pin = pins.get(canonicalize_name(r.name))
        if pin is None:
            unmet.append(f"{r.name} is not pinned")
        elif r.url and is_vcs(text):  # built from the commit: the lock's record of it says from where
            continue
        elif r.url and (pin.url or "").split("#", 1)[0] != r.url.split("#", 1)[0]:
            unmet.append(f"{r.name} is not pinned to the wheel URL the cell names")
        elif not r.specifier.contains(pin.version, prereleases=True):
            unmet.append(f"{r.name} {pin.version} does not satisfy {r.specifier}")
    return unmet


def verify(req: LockRequest, entries: list[LockEntry], sources: dict[str, str] | None, data: CompatData) -> None:
    """Refuse a resolution whose torch is not the build the cell names (the "tag says cu128, has cu124" bug), or
    that misses one of the cell's requirements. ``sources`` (uv's ``# from`` annotations) exist only right after
    resolving; a lock read back has none."""
    _verify_torch(req, entries, sources)
    check_direct_wheels(req, [e.spec for e in entries if e.url], data)
    unmet = unmet_requirements(req, {e.name: e for e in entries})
    if unmet:
        raise CheckFailed(
            f"{req.cell.id}: the pins do not meet the cell's requirements: {'; '.join(unmet)}",
            "the lock is another cell's or out of date: run `imagekit lock` for this cell",
        )


def is_direct(requirement: str) -> bool:
    """A direct reference (``name @ url``), not an index requirement (whose marker may hold an `@`)."""
    try:
        return Requirement(requirement).url is not None
    except InvalidRequirement:
        return False


def is_vcs(requirement: str) -> bool:
    """A VCS requirement (``name @ git+https://...@commit``): the wheel-build stage builds it."""
    from imagekit.locking.vcs_refs import is_vcs as vcs_url

    try:
        url = Requirement(requirement).url
    except InvalidRequirement:
        return False
    return url is not None and vcs_url(url)


def check_direct_wheels(req: LockRequest, references: list[str], data: CompatData | None = None) -> None:
    """Each wheel named by URL (``name @ url``, as the matrix file or a lock has it) runs in the cell: its tags fit
    the image's Python and platform, and the torch and CUDA its local version names (``+cu12torch2.5``, ``+pt25cu124``)
    are the cell's; with ``data``, its C++ ABI tag (``cxx11abiFALSE``) is the cell's torch build's, where a curated
    fact says which that is."""
    from imagekit.locking import direct_wheels
    from imagekit.locking import wheel_choice as wheels

    glibc = req.platform.rsplit("_", 2)
    supported = wheels.supported_tags(req.cell.python, f"{glibc[-2]}.{glibc[-1]}")
    cell = req.cell
    abi = data.torch_cxx11_abi(cell.torch, cell.variant, cell.platform) if data is not None else None
    for ref in (r for r in references if not is_vcs(r)):  # a git requirement is built: no wheel to check
        r = Requirement(ref)
        wheel = direct_wheels.parse(r.name, r.url or "", hashed=False)
        problems = direct_wheels.cell_problems(wheel, supported, cell.torch, cell.cuda, abi)
        if problems:
            built = f" with cxx11abi{str(abi[0]).upper()}" if abi is not None else ""
            raise CheckFailed(
                f"{cell.id}: {wheel.filename} cannot run in this cell: {'; '.join(problems)}",
                f"name the {wheel.name} wheel built for Python {cell.python}, torch {cell.torch} and CUDA "
                f"{cell.cuda}{built} (its release page lists one per combination), or drop the cell",
            )


def _verify_torch(req: LockRequest, entries: list[LockEntry], sources: dict[str, str] | None) -> None:
    pins = {e.name: e for e in entries}
    torch = pins.get("torch")
    cell = req.cell
    if torch is None:
        raise CheckFailed(f"{cell.id}: the resolution has no torch", "check the index settings")
    missing_hashes = [e.name for e in entries if not e.hashes]
    if missing_hashes:
        raise CheckFailed(
            f"{cell.id}: no hashes for {', '.join(missing_hashes)}", "the index must publish sha256 hashes"
        )
    if req.routed:
        want = f"{cell.torch}+{cell.variant}"
        if torch.version != want:
            raise CheckFailed(
                f"{cell.id}: resolved torch {torch.version}, expected {want}",
                f"the index {redact(req.torch_index or '')} does not serve {want}",
            )
        closure = torch_closure(entries) if sources is not None else set()
        for name in sorted(n for n in closure if is_torch_family(n)):
            src = sources.get(name, "")
            if redact(src).rstrip("/") != redact(req.torch_index or "").rstrip("/"):
                raise CheckFailed(
                    f"{cell.id}: {name} came from {redact(src) or 'an unknown index'}, not the PyTorch index",
                    "torch-family packages must come from the variant's index",
                )
        return
    if torch.version != cell.torch:
        raise CheckFailed(
            f"{cell.id}: resolved torch {torch.version}, expected {cell.torch} (PyPI default {cell.variant})",
            "an extra index supplied a different torch build; remove it or pin the variant",
        )
    runtime = [e for e in entries if re.fullmatch(r"nvidia-cuda-runtime-cu\d+|cuda-toolkit", e.name)]
    if not runtime:
        raise CheckFailed(f"{cell.id}: torch {torch.version} pulled no CUDA runtime", "is this a CPU-only torch build?")
    got = ".".join(runtime[0].version.split(".")[:2])
    if got != cell.cuda:
        raise CheckFailed(
            f"{cell.id}: torch {torch.version} brings CUDA runtime {runtime[0].version}, not {cell.cuda}",
            "the PyPI default variant changed; run `imagekit compat refresh` and pick the right --cuda",
        )


def verify_lock(lock: Lock, text: str, cell: Cell, data: CompatData, origin: str, *, current: bool = False) -> None:
    """Before a lock is used: it is intact (its own digest, hashes on every pin, no duplicates) and it is this
    cell's (the header names it, and the resolver's checks pass again on what it pins). ``current``: also refuse a
    lock made for other inputs (what render, fetch and build need; `lock` re-resolves those instead)."""
    from imagekit.locking.lockfile import integrity_problems

    problems = [f"{origin}: {p}" for p in integrity_problems(lock, text)]
    named = lock.meta.get("cell")
    if named != cell.id:
        problems.append(f"{origin}: is the lock of {named or 'an unnamed cell'}, not of {cell.id}")
    if "settings" in lock.meta and not problems:  # the index line fetch reads must be the one resolved against
        try:
            resolved = recorded_settings(lock).get("index_url")
        except CheckFailed:  # an unreadable settings line: stale (below, when current), re-resolved by `lock`
            resolved = lock.meta.get("index")
        if resolved != lock.meta.get("index"):
            problems.append(f"{origin}: its index line is not the index it was resolved against (edited by hand)")
    if not problems:
        try:
            # Not current: the matrix's extra packages may have changed since (`lock` re-resolves such a lock).
            judged = cell if current else replace(cell, packages=())
            verify(request(judged, LockSettings(), data), list(lock.entries), None, data)
        except CheckFailed as exc:
            problems.append(f"{origin}: {exc.message}")
    if not problems and current:
        problems += [f"{origin}: {p}" for p in _build_record_problems(lock, cell)]
    if not problems and current:
        try:
            reason = stale_reason(lock, cell, data)
        except CheckFailed as exc:
            reason = exc.message
        if reason:
            problems.append(f"{origin}: {reason}")
    if problems:
        raise CheckFailed(
            "\n".join(problems),
            f"never build from it: delete {origin} and run `imagekit lock --cell {cell.id}` to resolve it again",
        )


def _build_record_problems(lock: Lock, cell: Cell) -> list[str]:
    """Each package the cell builds from source (`from_source`, git requirements) pinned to the wheel the lock's
    record of its build names, and each git requirement's record naming its commit."""
    from imagekit.locking.source_builds import built_names, git_sources, recorded

    try:
        records = recorded(lock.meta)
    except CheckFailed as exc:
        return [exc.message]
    pins = {e.name: e for e in lock.entries}
    problems = []
    for name in built_names(cell):
        record, pin = records.get(name), pins.get(name)
        if record is None or pin is None or pin.hashes != (f"sha256:{record.wheel_sha256}",):
            problems.append(f"{name} is built from source, and the lock does not pin the wheel its record names")
        elif name in git_sources(cell.packages) and record.sdist != git_sources(cell.packages)[name]:
            problems.append(f"{name}'s record names {record.sdist}, not the commit the cell names")
    return problems


def header(
    req: LockRequest, matrix: str | None, data: CompatData, resolver_version: str
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The lock's header lines (``resolver_version``: what made it, ``uv 0.5.1`` or ``pip-tools``) and metadata."""
    lines = (
        "#",
        f"# This file is autogenerated by imagekit {__version__} ({resolver_version}) for {req.cell.id}.",
        "# To update, run:",
        "#",
        f"#    {req.regenerate_command(matrix)}",
        "#",
        "# Install with: pip install --require-hashes --no-deps -r <this file>",
        "#",
    )
    meta = {
        "cell": req.cell.id,
        "input-hash": req.input_hash,
        "index": redact(req.settings.index_url),
        "torch-index": redact(req.torch_index) if req.torch_index else f"PyPI default ({req.cell.variant})",
        "platform": req.platform,
        "python": req.cell.python,
        "data-version": data.data_version,
        "settings": json.dumps(req.settings.public(), sort_keys=True, separators=(",", ":")),
    }
    return lines, meta


def build_lock(req: LockRequest, uv_output: str, matrix: str | None, data: CompatData, resolver_version: str) -> Lock:
    """The lock of ``req`` from a resolver's ``uv pip compile``-style output (pip-compile's has the same form),
    verified first (:func:`verify`); the header names ``resolver_version``."""
    from imagekit.locking.lockfile import parse_requirements

    entries = parse_requirements(uv_output, f"uv output for {req.cell.id}")
    verify(req, entries, index_of_entries(uv_output), data)
    drift = companions.drift({e.name: e.version for e in entries}, companions.constraints(data, req.cell.torch))
    if drift:  # the resolver did not hold a constraint it was given
        raise CheckFailed(
            f"{req.cell.id}: the resolution pins "
            + "; ".join(f"{n} {v}, which the companion table does not allow ({c.requirement})" for n, v, c in drift),
            "report this: the resolver was given the table's constraints",
        )
    torch_part, app_part = split(entries)
    lines, meta = header(req, matrix, data, resolver_version)
    return Lock(torch_part, app_part, meta, lines)
