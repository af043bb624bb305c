"""What the build host and the image both need to know, defined once: which distributions are the GPU stack, how a
distribution name is canonicalised, which compiled GPU code runs on which GPU, and when an environment has drifted
from its lock.

Standard library only, Python >= 3.8: this file runs inside every image, beside the doctor (/opt/imagekit/doctor/),
and the host's pure core imports it (compat.rules, locking.*). It imports no sibling.
"""

from __future__ import annotations

import os
import re
import stat

# What `python -m venv` (or virtualenv) puts in an environment by itself: not "not in the lock" where nothing says
# which of them an environment holds (a lockfile given to the doctor, an image's manifest from before `seeds`).
VENV_SEEDS = frozenset({"pip", "setuptools", "wheel"})

# Torch and its companions: built together, from the PyTorch index, one version line.
TORCH_FAMILY = frozenset({"torch", "torchvision", "torchaudio", "triton", "pytorch-triton"})


def canon(name):
    """A distribution name as PEP 503 compares it: runs of ``-_.`` are one ``-``, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def is_torch_family(name):
    """Torch, its companions, and the CUDA libraries it pulls in (nvidia-*, cuda-*): the GPU stack."""
    return name in TORCH_FAMILY or name.startswith(("nvidia-", "cuda-"))


# ---- GPU architectures ------------------------------------------------------------------------------------------
# A compute capability as torch, nvcc and nvidia-smi write it: sm_90, sm_90a, sm_100f, compute_90 (PTX), 90, 9.0.
ARCH = re.compile(r"(?:(?:sm|compute)_)?(\d{1,2}?)(\d)([af]?)|(\d{1,2})\.(\d)([af]?)", re.ASCII)


def parse_arch(text):
    """(major, minor, suffix) of a compute capability ('sm_90a' -> (9, 0, 'a'), 'sm_100' -> (10, 0, ''),
    '8.6' -> (8, 6, '')); None if ``text`` is not one."""
    m = ARCH.fullmatch(str(text or "").strip())
    if not m:
        return None
    if m.group(1) is not None:
        return int(m.group(1)), int(m.group(2)), m.group(3)
    return int(m.group(4)), int(m.group(5)), m.group(6)


def arch_key(text):
    """(major, minor) of a compute capability ('sm_90a' -> (9, 0)); None if ``text`` is not one."""
    parsed = parse_arch(text)
    return None if parsed is None else parsed[:2]


def runs_on(arch, target, ptx=False):
    """Does code compiled for ``arch`` (a text) run on a GPU of compute capability ``target`` ((major, minor))?

    The one rule (CUDA's compatibility rules, docs/compat-facts.md): a cubin runs on the GPUs of its major
    version at or above its minor (sm_80 on 8.0, 8.6, 8.9; never on 9.0); PTX is compiled by the driver for any GPU
    at or above it (compute_90 on 9.0, 10.0, 12.0). An arch-specific build (``a``: sm_90a, compute_90a) runs on
    exactly its own GPU; a family build (``f``: sm_100f) is a cubin like any other."""
    parsed = parse_arch(arch)
    if parsed is None:
        return False
    major, minor, suffix = parsed
    if suffix == "a":
        return (major, minor) == tuple(target)
    if ptx:
        return (major, minor) <= tuple(target)
    return major == target[0] and minor <= target[1]


def best_kernel(target, cubins, ptx=None):
    """How code compiled for ``cubins`` (arch texts) plus PTX ``ptx`` (a text, several, or None) runs on a GPU of
    compute capability ``target`` ((major, minor), or a text): ("cubin", (major, minor)) of the highest cubin that
    runs on it (the one the CUDA driver loads, whatever order the list is in), else ("ptx", (major, minor)) of the
    highest PTX the driver can JIT for it, else None ('no kernel image is available for execution on the device')."""
    if not isinstance(target, tuple):
        target = arch_key(target)
        if target is None:
            return None
    ptxs = [] if ptx is None else [ptx] if isinstance(ptx, str) else list(ptx)
    usable = [arch_key(a) for a in cubins if runs_on(a, target)]
    if usable:
        return "cubin", max(usable)
    usable = [arch_key(p) for p in ptxs if runs_on(p, target, ptx=True)]
    if usable:
        return "ptx", max(usable)
    return None


def compiled_archs(flags):
    """(SASS archs, PTX archs) from torch's compiled arch flags (``torch._C._cuda_getArchFlags()``:
    'sm_75 sm_80 sm_90a compute_120'), each as sm_XY[a]."""
    words = str(flags or "").split()
    sass = [w for w in words if w.startswith("sm_") and parse_arch(w)]
    ptx = ["sm_" + w[len("compute_"):] for w in words if w.startswith("compute_") and parse_arch(w[len("compute_"):])]
    return sass, ptx


def arch_contract_problems(flags, sass, ptx):
    """What the image promises (``sass``: cubin archs, ``ptx``: the PTX arch or None, as sm_XY) and torch's compiled
    arch flags do not give: each promised cubin and the PTX must be there (a GPU sent to the image on that promise
    would otherwise fail with 'no kernel image'). Archs the wheel has beyond the promise are not problems."""
    have_sass, have_ptx = compiled_archs(flags)
    have = {arch_key(a) for a in have_sass}
    problems = [f"no {a} cubin" for a in sass if arch_key(a) not in have]
    if ptx and arch_key(ptx) not in {arch_key(p) for p in have_ptx}:
        problems.append(f"no PTX for {ptx}")
    return problems


# ---- what an environment holds, and its drift from the lock ---------------------------------------------------
METADATA_LIMIT = 1 << 16  # the header of a METADATA file (Name and Version come first): kilobytes


def installed_distributions(paths):
    """Every distribution installed on ``paths`` (an interpreter's sys.path, in order; '' is the working folder),
    found as importlib.metadata finds them: each ``*.dist-info`` or ``*.egg-info`` folder (or ``.egg-info`` file)
    directly in an entry, and an ``.egg`` entry's ``EGG-INFO``; the name and version from its METADATA (PKG-INFO),
    else from the folder's name. Returns {canonical name: [(version, metadata path), ...]}, each name's installs in
    the order Python finds them (the first is the one it imports; entries of one folder in name order).

    The one reading: the self-test's `dists-match-lock` (before publishing) and the doctor's `lock-drift` (the start
    check) both judge an environment by it, so they cannot read two different versions of one name. A FIFO or a
    device where METADATA should be is read as no metadata, never waited on."""
    out = {}
    for entry in paths:
        folder = entry or os.getcwd()
        try:
            names = sorted(os.listdir(folder))
        except OSError:  # not a folder (a zip, a missing entry), or not ours to read
            continue
        found = []
        for name in names:
            low = name.lower()
            if low.endswith((".dist-info", ".egg-info")):
                found.append((os.path.join(folder, name), low.rpartition(".")[0]))
            elif low == "egg-info" and os.path.basename(folder.rstrip("/")).lower().endswith(".egg"):
                found.append((os.path.join(folder, name), os.path.basename(folder.rstrip("/")).rpartition(".")[0]))
        for where, stem in found:
            name, version = _name_and_version(where)
            guess, _, guessed_version = stem.partition("-")
            name, version = name or guess, version or guessed_version.partition("-")[0]
            if name and version:
                out.setdefault(canon(name), []).append((version, where))
    return out


def _name_and_version(where):
    """(Name, Version) of the metadata at ``where`` (a .dist-info folder's METADATA, an .egg-info's PKG-INFO, or an
    .egg-info file itself); None for what it does not say."""
    for path in (os.path.join(where, "METADATA"), os.path.join(where, "PKG-INFO"), where):
        text = _read_head(path)
        if text is not None:
            break
    else:
        return None, None
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the headers end at the first empty line
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version") and key not in fields:
            fields[key] = value.strip()
    return fields.get("Name") or None, fields.get("Version") or None


def _read_head(path):
    """The first METADATA_LIMIT bytes of the regular file ``path`` as text; None if it is no regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, METADATA_LIMIT).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def declared_seeds(manifest):
    """The seeds of ``python -m venv`` an environment holds beyond its lock, as its manifest declares them
    (``python.seeds``: pip, when the lock does not pin it); VENV_SEEDS where nothing declares them."""
    python = (manifest or {}).get("python")
    seeds = python.get("seeds") if isinstance(python, dict) else None
    if not isinstance(seeds, list):
        return VENV_SEEDS
    return frozenset(canon(s) for s in seeds if isinstance(s, str))


def lock_drift(want, have, seeds=VENV_SEEDS):
    """The lock ``want`` ({name: version}) against what is installed ``have`` (:func:`installed_distributions`'s
    {name: [(version, where), ...]}, or {name: version}): names canonicalised, versions compared as text (a local
    label is part of the version: 2.5.1+cu118 is not 2.5.1+cu121), a name installed more than once by the version
    Python imports. Returns {"missing": [names], "extra": [names], "different": [names], "duplicates": [texts]},
    each sorted; ``seeds`` (the venv's own, :func:`declared_seeds`) are never extra. A duplicate ("setuptools:
    66.1.1 at /opt/venv/.../setuptools-66.1.1.dist-info and 84.2.1 at ...") is a finding of its own: which one a
    program sees depends on who asks. The self-test (`dists-match-lock`, before publishing) and the doctor
    (`lock-drift`, on a live pod) both judge by this; each says what a finding means where it runs."""
    installs = {canon(k): (v if isinstance(v, list) else [(v, "")]) for k, v in have.items()}
    want = {canon(k): v for k, v in want.items()}
    have = {k: v[0][0] for k, v in installs.items()}
    seeds = frozenset(canon(s) for s in seeds)
    return {
        "missing": sorted(set(want) - set(have)),
        "extra": sorted(set(have) - set(want) - seeds),
        "different": sorted(n for n in set(want) & set(have) if want[n] != have[n]),
        "duplicates": [
            n + ": " + " and ".join(f"{version} at {where}" for version, where in installs[n])
            for n in sorted(installs) if len(installs[n]) > 1
        ],
    }


# ---- Debian packages (`[image] apt`) ----------------------------------------------------------------------------
DPKG_STATUS = "/var/lib/dpkg/status"


def dpkg_installed(text):
    """{"name:arch": version} of the packages dpkg's status file (``text``) says are installed."""
    out = {}
    for stanza in re.split(r"\n\s*\n", text):
        fields = {}
        for line in stanza.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Status", "").endswith(" installed") and fields.get("Package"):
            out[fields["Package"] + ":" + fields.get("Architecture", "")] = fields.get("Version", "")
    return out


def apt_drift(want, have):
    """The image's pinned .debs ``want`` ({name: {"version", "arch"}}, the manifest's ``apt.packages``) against
    ``have`` (:func:`dpkg_installed`): {"missing": [names], "different": ["name have (pinned want)"]}, sorted.
    Packages dpkg has beyond the pins are the base's, not drift."""
    missing, different = [], []
    for name, pin in sorted(want.items()):
        got = have.get(name + ":" + pin.get("arch", ""))
        if got is None:
            missing.append(name)
        elif got != pin.get("version"):
            different.append(name + " " + got + " (pinned " + str(pin.get("version")) + ")")
    return {"missing": missing, "different": different}


# ---- the lifetime guard's settings (guard.py reads them in the image; `imagekit pod create` writes them) ------------
GUARD_ACTIONS = ("stop", "terminate")
# IMAGEKIT_ON_EXIT: `terminate` ends the pod for good after a successful exit only (a failed one stops it: the volume,
# the checkpoints and the run's log survive); `terminate-always` after any exit
EXIT_ACTIONS = (*GUARD_ACTIONS, "terminate-always")
_DURATION = re.compile(r"^([0-9]{1,7})(s|m|h|d)?$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


class SettingError(ValueError):
    """A setting that cannot be used."""


def parse_duration(text, name):
    """Seconds of ``90s``, ``30m``, ``6h``, ``1d`` (a bare number is seconds)."""
    m = _DURATION.match(str(text).strip())
    if not m:
        raise SettingError(f"{name}={str(text)[:40]!r} is not a duration such as 90s, 30m or 6h")
    if int(m.group(1)) == 0:
        raise SettingError(f"{name}={str(text)[:40]!r} is no time at all: give a duration such as 90s, 30m or 6h, "
                           "or leave it unset for none")
    return int(m.group(1)) * _UNIT[m.group(2)]


# A string as one match, unrolled (runs of plain characters, then an escape): twice as fast as an alternation per
# character on a release index of tens of MiB
_JSON_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.S)


def json_depth(text):
    # type: (str) -> int
    """The deepest nesting of ``[`` and ``{`` outside strings in a JSON text: a linear scan, so what a far side
    sends can be refused before ``json`` recurses once per level (the doctor and the host read JSON through it)."""
    depth = deepest = 0
    for m in _JSON_STRUCTURE.finditer(text):
        token = m.group(0)
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


# ---- GPU clouds: what a pod knows of the provider it runs on --------------------------------------------------------
# One table, read by the doctor (which cloud, where data survives) and the guard (how a pod ends itself); the host adds
# what only it uses (its account key, template endpoint and command) in imagekit/clouds/<name>.py, which
# imagekit/clouds/providers.py finds by the row's name. Sources: docs/pods.md, "Provider APIs" (RunPod's REST API v2,
# `POST /v2/pods/{id}/action`: v1 was retired on 2026-11-15; Vast's `PUT /api/v0/instances/{id}/` with a state, its
# in-instance CONTAINER_ID and CONTAINER_API_KEY).
class PodCall:
    """A call a pod makes to its provider's API: ``path`` lies under the API base, ``{id}`` is the pod's id; ``body``
    is sent as JSON (None: no body)."""

    __slots__ = ("body", "method", "path")

    def __init__(self, method, path, body=None):
        self.method, self.path, self.body = method, path, body


class ProviderFacts:
    """A GPU cloud as its pods see it: ``detect``, env variables any one of which set says the container runs there
    (the first row wins); ``volume_hint``, the doctor's fix for data on a path that does not survive. Where the guard
    can end a pod: ``pod_id`` and ``pod_key``, the variables with the pod's id and its pod-scoped key; ``api``, the
    REST base of the ``stop`` call (the GPU's billing ends, the volume stays) and the ``terminate`` call (the pod and
    its volume disk are deleted), the ``start`` call (a stopped pod runs again: `imagekit pod start`, from the host);
    ``api_override``, the variable that replaces ``api`` (a proxy, a test)."""

    __slots__ = ("api", "api_override", "detect", "name", "pod_id", "pod_key", "start", "stop", "terminate",
                 "volume_hint")

    def __init__(self, name, detect, volume_hint, pod_id="", pod_key="", api="", api_override="", stop=None,
                 terminate=None, start=None):
        self.name, self.detect, self.volume_hint = name, tuple(detect), volume_hint
        self.pod_id, self.pod_key, self.api, self.api_override = pod_id, pod_key, api, api_override
        self.stop, self.terminate, self.start = stop, terminate, start

    def __repr__(self):
        return "ProviderFacts(" + repr(self.name) + ")"


PROVIDERS = (
    ProviderFacts(
        "runpod", detect=("RUNPOD_POD_ID",),
        volume_hint="on RunPod, the pod volume at /workspace survives a stop (billed while stopped), not a terminate, "
                    "which deletes it with the pod: only a network volume outlives the pod",
        pod_id="RUNPOD_POD_ID", pod_key="RUNPOD_API_KEY",
        api="https://api.runpod.io/v2", api_override="IMAGEKIT_RUNPOD_API",
        stop=PodCall("POST", "/pods/{id}/action", {"action": "stop"}),
        terminate=PodCall("POST", "/pods/{id}/action", {"action": "terminate"}),
        start=PodCall("POST", "/pods/{id}/action", {"action": "start"}),
    ),
    ProviderFacts(
        "vast", detect=("CONTAINER_ID", "VAST_CONTAINERLABEL"),
        volume_hint="on Vast.ai, a stopped instance keeps its disk (storage still billed); destroying it deletes the "
                    "disk and everything on it",
        pod_id="CONTAINER_ID", pod_key="CONTAINER_API_KEY",
        api="https://console.vast.ai/api/v0", api_override="IMAGEKIT_VAST_API",
        stop=PodCall("PUT", "/instances/{id}/", {"state": "stopped"}), terminate=PodCall("DELETE", "/instances/{id}/"),
        start=PodCall("PUT", "/instances/{id}/", {"state": "running"}),
    ),
    ProviderFacts(
        "lambda", detect=("LAMBDA_INSTANCE_ID",), volume_hint="on Lambda, keep data on an attached filesystem",
    ),
)


def say(seconds):
    """A duration as the guard's settings write it (5400 -> '1h30m'), the inverse of ``parse_duration``."""
    out, rest = "", int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            out += f"{rest // size}{unit}"
            rest %= size
    return out + (f"{rest}s" if rest or not out else "")


def provider_named(name):
    """The row of ``PROVIDERS`` called ``name`` (KeyError if none is)."""
    for row in PROVIDERS:
        if row.name == name:
            return row
    raise KeyError(name)


def detect_provider(environ):
    """The row of the GPU cloud this container runs on (the first whose ``detect`` variables has one set), or None:
    the doctor names it and the guard ends pods through it, so the two never disagree."""
    for row in PROVIDERS:
        if any(environ.get(var) for var in row.detect):
            return row
    return None
