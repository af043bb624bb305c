"""imagekit doctor: prove the environment is the pinned one, and block a launch when it is not.

Standard library only (this file and its sibling facts.py run as they are inside every image, under any Python
>= 3.8), no network except the
--deep tier, no telemetry. Tiers: quick (no torch import, no CUDA context), start (quick, plus the torch CUDA probe
whenever a GPU is expected: the image's start check), standard (the probe always, in a child process with a
timeout), deep (adds Hugging Face access checks).

Exit codes: 0 ok; 1 a blocker (or a warning under --strict); 2 bad usage; 3 a check could not run.
Usage: `imagekit_doctor.py [--tier quick|start|standard|deep] [--expect FILE] [--python PATH] [--json] [--strict]
[--require-gpu] [--path DIR ...] [--hf-repo ORG/NAME ...] [--no-launch] [-- LAUNCH COMMAND ...]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

if __package__:  # imported from the host's package, imagekit.in_image
    from . import facts, nofollow
else:  # a program in the image, or sent to a pod: its sibling modules (facts.py, nofollow.py) lie beside it
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import facts
    import nofollow

DEFAULT_MANIFEST = "/etc/imagekit/manifest.json"
EPHEMERAL_FS = {"overlay", "tmpfs", "aufs", "fuse-overlayfs", "ramfs", "squashfs"}
TIERS = ("quick", "start", "standard", "deep")

# Torch's own texts when CUDA cannot be used, and what each means (quoted from PyTorch / NVIDIA sources).
CUDA_CAUSES = [
    ("driver-too-old", r"The NVIDIA driver on your system is too old",
     "the host driver is older than this torch build's CUDA needs", "use a host with a newer driver, or an image "
     "with an older CUDA variant (imagekit explain --driver <version>)"),
    ("forward-compat-804", r"Error 804|forward compatibility was attempted on non supported HW",
     "CUDA forward compatibility was attempted on a GPU that does not support it (error 804)",
     "use a torch CUDA variant the host driver supports natively; remove cuda-compat libraries from the image"),
    ("driver-combination-803", r"Error 803|unsupported display driver / cuda driver combination",
     "the user-mode CUDA driver and the kernel driver do not match (error 803)",
     "restart the pod, or remove mismatched libcuda from the image"),
    ("no-driver", r"Found no NVIDIA driver on your system",
     "no NVIDIA driver is visible inside the container", "start the container with the NVIDIA runtime (--gpus all)"),
    ("no-kernel-image", r"no kernel image is available for execution on the device",
     "this torch build has no kernels for this GPU's architecture", "use a torch CUDA variant built for this GPU"),
]
SMI_FAILURES = [
    (r"Driver/library version mismatch", "the NVIDIA kernel module and user libraries differ (driver upgraded "
     "without reboot)", "reboot the host or reload the nvidia kernel module"),
    (r"couldn't communicate with the NVIDIA driver", "nvidia-smi cannot talk to the driver",
     "check that the NVIDIA driver is loaded on the host and the container runs with --gpus"),
    (r"No devices were found", "the driver is loaded but no GPU is attached", "check the GPU allocation"),
]


def result(cid, status, message, fix="", evidence=None):
    return {"id": cid, "status": status, "message": message, "fix": fix, "evidence": evidence or {}}


# ---------------------------------------------------------------------------------------------------------
# What is expected
# ---------------------------------------------------------------------------------------------------------
REQUIREMENT = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[[^\]]*\])?\s*([^;]*?)\s*(;.*)?$")
CLAUSE = re.compile(r"^\s*(===|==|!=|~=|>=|<=|>|<)\s*([A-Za-z0-9.*+!_-]+)\s*$")


def parse_requirements(text, path="<requirements>"):
    """[(name, specifier text, [(op, version)], marker)] from a requirements/lock file (hashes and options skipped)."""
    out = []
    logical = re.sub(r"\\\r?\n", " ", text)
    for number, raw in enumerate(logical.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        line = re.sub(r"\s--hash[= ]\S+", "", line).strip()
        if not line or line.startswith("-"):
            continue
        if "@" in line.split(";")[0] or "://" in line or line.startswith((".", "/")):
            name = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)", line)
            out.append((facts.canon(name.group(1)) if name else line, "@direct-reference", None, ""))
            continue
        m = REQUIREMENT.match(line)
        if not m:
            raise ValueError(f"{path}: line {number}: not a requirement: {line!r}")
        clauses = []
        for part in [p for p in m.group(2).split(",") if p.strip()]:
            c = CLAUSE.match(part)
            wildcard = c is not None and c.group(2).endswith(".*")
            if not c or (wildcard and c.group(1) not in ("==", "!=")) or (
                    c.group(1) != "===" and parse_version(c.group(2)[:-2] if wildcard else c.group(2)) is None):
                raise ValueError(f"{path}: line {number}: cannot read the version specifier {part.strip()!r}")
            clauses.append((c.group(1), c.group(2)))
        out.append((facts.canon(m.group(1)), m.group(2).replace(" ", ""), clauses, (m.group(3) or "")[1:].strip()))
    return out


MAX_FILE = 64 << 20  # bytes of a manifest, a lockfile or a config the doctor reads


def read_regular(path, limit=MAX_FILE):
    """A regular file's text (a link the user named is followed to it): a FIFO, a device, a folder or more than
    ``limit`` bytes is a :class:`nofollow.Refused` (an OSError), at once: never a read that blocks or never ends."""
    data = nofollow.read_bytes(path, limit, follow=True)
    if data is None:
        raise FileNotFoundError(2, "No such file or directory", path)
    return data.decode("utf-8")


MAX_JSON_DEPTH = 64  # a manifest nests 3 deep, an interpreter's description 3; json recurses once per level
MAX_JSON_DIGITS = 40


def load_json(text, what, max_depth=MAX_JSON_DEPTH):
    """JSON that another program or file hands the doctor, bounded: nested at most ``max_depth`` deep (deeper is
    a RecursionError inside json), numbers of at most 40 characters (a 5,000-digit one is a ValueError on every
    later use), no NaN or Infinity. Anything else is a ValueError saying what, without echoing it. (The doctor's
    own small copy of imagekit.trust.untrusted.load_json: it runs inside images with the standard library only.)"""
    deepest = facts.json_depth(text)
    if deepest > max_depth:
        raise ValueError(f"{what} is nested {deepest} levels deep (at most {max_depth})")

    def number(token):
        if len(token) > MAX_JSON_DIGITS:
            raise ValueError(f"{what} has a number of {len(token)} digits")
        return float(token) if any(c in token for c in ".eE") else int(token)

    def constant(name):
        raise ValueError(f"{what} has {name}, which JSON does not allow")

    try:
        return json.loads(text, parse_int=number, parse_float=number, parse_constant=constant)
    except RecursionError:
        raise ValueError(f"{what} is nested too deep") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not JSON ({exc.msg} at line {exc.lineno})") from None


def load_expectation(path):
    """A manifest (JSON), a lockfile (every line name==version), or a requirements file with ranges."""
    text = read_regular(path)
    if text.lstrip().startswith("{"):
        doc = load_json(text, f"{path}")
        if not isinstance(doc, dict) or "distributions" not in doc:
            raise ValueError(f"{path}: a JSON file without 'distributions' is not an imagekit manifest")
        problem = manifest_problem(doc)
        if problem:
            raise ValueError(f"{path}: not an imagekit manifest: {problem}")
        return doc
    reqs = parse_requirements(text, path)
    if not reqs:
        raise ValueError(f"{path}: neither an imagekit manifest nor a requirements/lock file")
    # A lock (pins with --hash) is compared exactly, local labels included; a requirements file by PEP 440.
    exact = "--hash" in text and all(
        c and len(c) == 1 and c[0][0] == "==" and "*" not in c[0][1] and not marker for _, _, c, marker in reqs)
    if exact:
        return {"distributions": {name: c[0][1] for name, _, c, _ in reqs}, "source": path}
    return {"requirements": reqs, "source": path}


def manifest_problem(doc):
    """The first field of a manifest whose type the checks could not read, or None."""
    dists = doc.get("distributions")
    if not isinstance(dists, dict):
        return "distributions: expected an object of name: version"
    for name, version in dists.items():
        if not isinstance(version, str) or not version or len(version) > 200:
            return f"distributions.{name[:80]}: expected a version string, not {type(version).__name__}"
    for key in ("cell", "python", "torch", "driver", "image"):
        if key in doc and not isinstance(doc[key], dict):
            return f"{key}: expected an object"
    for key, field, kind in (("python", "executable", str), ("driver", "minimum", str), ("torch", "variant", str),
                             ("torch", "archs", list), ("cell", "id", str)):
        value = (doc.get(key) or {}).get(field)
        if value is not None and not isinstance(value, kind):
            return f"{key}.{field}: expected a {kind.__name__}"
    if "driver" in doc and not isinstance(doc["driver"].get("minimum"), str):
        return "driver.minimum: expected a driver version string"
    if not all(isinstance(a, str) for a in (doc.get("torch") or {}).get("archs") or []):
        return "torch.archs: expected a list of strings"
    return None


# PEP 440 ordering with the standard library only (the doctor cannot assume `packaging` is installed).
VERSION = re.compile(
    r"^v?(?:(\d+)!)?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?"
    r"(?:-(\d+)|[-_.]?(post|rev|r)[-_.]?(\d*))?(?:[-_.]?(dev)[-_.]?(\d*))?(?:\+([a-z0-9]+(?:[-_.][a-z0-9]+)*))?$",
    re.I | re.ASCII,  # ASCII: '٣' is not a version (int() would read it)
)
PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


def parse_version(text):
    """(sort key, release tuple, local label) or None. The key orders public versions as PEP 440 does; the local
    label is normalised (`ubuntu-1` and `ubuntu.1` are one label, `01` is `1`)."""
    m = VERSION.match((text or "").strip())
    if not m:
        return None
    release = tuple(int(x) for x in m.group(2).split("."))
    trimmed = list(release)
    while len(trimmed) > 1 and trimmed[-1] == 0:
        trimmed.pop()
    pre = (PRE[m.group(3).lower()], int(m.group(4) or 0)) if m.group(3) else None
    post = int(m.group(5)) if m.group(5) else (int(m.group(7) or 0) if m.group(6) else None)
    dev = int(m.group(9) or 0) if m.group(8) else None
    if pre is None and post is None and dev is not None:
        pre_key = (-1, 0, 0)
    elif pre is None:
        pre_key = (1, 0, 0)
    else:
        pre_key = (0, *pre)
    key = (int(m.group(1) or 0), tuple(trimmed), pre_key, (-1, 0) if post is None else (0, post),
           (1, 0) if dev is None else (0, dev))
    local = ".".join(str(int(p)) if p.isdigit() else p for p in re.split(r"[-_.]", m.group(10).lower())) \
        if m.group(10) else ""
    return key, release, local


def version_satisfies(have, op, want):
    """Does installed version `have` meet `op want`? (Pre-releases count: the question is what is installed.)"""
    if op == "===":
        return have == want
    h = parse_version(have)
    if h is None:
        return False
    if want.endswith(".*") and op in ("==", "!="):
        w = parse_version(want[:-2])
        if w is None:
            return False
        prefix = w[1]
        match = h[0][0] == w[0][0] and h[1][:len(prefix)] + (0,) * max(0, len(prefix) - len(h[1])) == prefix
        return match if op == "==" else not match
    w = parse_version(want)
    if w is None:
        return False
    hk = h[0]
    if op in ("==", "!="):
        same = hk == w[0] and (not w[2] or h[2] == w[2])
        return same if op == "==" else not same
    if op == ">=":
        return hk >= w[0]
    if op == "<=":
        return hk <= w[0]
    same_release = hk[:2] == w[0][:2]
    if op == ">":  # PEP 440: >V excludes V's post-releases (those sharing its pre segment) unless V is one or a dev
        if not same_release or w[0][3] != (-1, 0) or w[0][4] != (1, 0):
            return hk > w[0]
        return hk > w[0] and (hk[2] if hk[2][0] == 0 else None) != (w[0][2] if w[0][2][0] == 0 else None)
    if op == "<":  # PEP 440: <V is <V.dev0 unless V is a pre-release or a dev release
        if not same_release or w[0][2][0] == 0 or w[0][4] != (1, 0):
            return hk < w[0]
        if w[0][3] == (-1, 0):  # a final V: all of its release below it is its pre-releases
            return False
        return hk < w[0] and not (hk[2:4] == w[0][2:4] and hk[4] != (1, 0))  # V.postN.devM is not below V.postN
    if op == "~=":
        prefix = w[1][:-1] if len(w[1]) > 1 else w[1]
        return hk >= w[0] and hk[0] == w[0][0] and h[1][:len(prefix)] + (0,) * max(0, len(prefix) - len(h[1])) == prefix
    return False


def check_requirements(env, expectation):
    """Each requirement of a requirements file (ranges allowed) against what is installed; a required name installed
    twice breaks it whatever the versions (which one a program imports depends on who asks)."""
    have = {facts.canon(k): v["version"] for k, v in env["dists"].items()}
    twice = {facts.canon(n): found for n, found in env["installs"].items() if len(found) > 1}
    broken, skipped, ok = [], [], 0
    for name, spec, clauses, marker in expectation["requirements"]:
        if marker or clauses is None:
            skipped.append(f"{name}{spec}" + (f"; {marker}" if marker else ""))
            continue
        if name not in have:
            broken.append(f"{name}{spec}: not installed")
        elif name in twice:
            broken.append(f"{name}{spec}: installed twice, " + " and ".join(f"{v} at {w}" for v, w in twice[name]))
        elif not all(version_satisfies(have[name], op, want) for op, want in clauses):
            broken.append(f"{name}{spec}: {have[name]} is installed")
        else:
            ok += 1
    ev = {"source": expectation.get("source"), "broken": broken, "not_checked": skipped, "satisfied": ok}
    if broken:
        return result("requirements", "fail", f"the environment breaks {len(broken)} requirement(s) of "
                      f"{expectation.get('source')}: " + "; ".join(broken[:8]),
                      "install what the requirements ask for, or use an image built for them", ev)
    return result("requirements", "pass", f"{ok} requirement(s) of {expectation.get('source')} are satisfied"
                  + (f" ({len(skipped)} with markers or direct references not checked)" if skipped else ""), "", ev)


# ---------------------------------------------------------------------------------------------------------
# The target interpreter
# ---------------------------------------------------------------------------------------------------------
ENV_DUMP = r"""
import json, sys, site, os
user_site = site.getusersitepackages() if hasattr(site, "getusersitepackages") else ""
print(json.dumps({"prefix": sys.prefix, "executable": sys.executable, "version": sys.version.split()[0],
                  "user_site": user_site, "enable_user_site": bool(site.ENABLE_USER_SITE), "path": sys.path}))
"""


def describe_interpreter(python):
    """What ``python`` (None: this interpreter) says of itself (ENV_DUMP: its prefix, version, sys.path, user site),
    with what is installed on its sys.path read by the one reading the self-test uses too
    (facts.installed_distributions): ``installs`` ({name: [(version, where), ...]}) and ``dists`` (each name's first,
    the one it imports: {name: {version, location}})."""
    # in-process is fastest, but an isolated doctor (python -I, as images run it) does not see the user site or
    # PYTHONPATH that the environment's own runs would: then ask a plain child of the same interpreter
    if sys.flags.isolated and python is None:
        python = sys.executable
    if python is None or (os.path.realpath(python) == os.path.realpath(sys.executable) and python == sys.executable \
            and not sys.flags.isolated):
        ns = {}
        from io import StringIO

        buf, old = StringIO(), sys.stdout
        sys.stdout = buf
        try:
            exec(ENV_DUMP, ns)  # our own constant
        finally:
            sys.stdout = old
        env = interpreter_shape(load_json(buf.getvalue(), "this interpreter's description"), "this interpreter")
    else:
        res = subprocess.run([python, "-c", ENV_DUMP], capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise RuntimeError(f"{python} could not describe itself: {res.stderr.strip()[-500:]}")
        env = interpreter_shape(load_json(res.stdout, "its description of itself"), "it")
    env["installs"] = facts.installed_distributions(env["path"])  # the child ran in this working folder too
    env["dists"] = {n: {"version": found[0][0], "location": found[0][1]} for n, found in env["installs"].items()}
    return env


def interpreter_shape(env, who):
    """``env`` when it has the shape ENV_DUMP prints (what the checks read), else a ValueError naming the field:
    `--python` may name any program, and it may print anything."""
    def wrong(field, want):
        return ValueError(f"{who} described itself in the wrong shape: {field} is not {want}")

    if not isinstance(env, dict):
        raise wrong("the description", "an object")
    for field in ("prefix", "executable", "version", "user_site"):
        if not isinstance(env.get(field), str):
            raise wrong(field, "a string")
    if not isinstance(env.get("enable_user_site"), bool):
        raise wrong("enable_user_site", "true or false")
    if not isinstance(env.get("path"), list) or not all(isinstance(p, str) for p in env["path"]):
        raise wrong("path", "a list of strings")
    return env


def check_interpreter_identity(env, manifest):
    prefix = env["prefix"]
    bindir = os.path.join(prefix, "bin")
    pinned = {facts.canon(k) for k in (manifest or {}).get("distributions", {})}
    problems, evidence = [], {"prefix": prefix}
    for tool, dist in (("python", None), ("python3", None), ("pip", "pip"), ("accelerate", "accelerate"),
                       ("torchrun", "torch")):
        path = shutil.which(tool)
        if path is None:
            if dist is None or dist in pinned:
                problems.append(f"`{tool}` is not on PATH")
            continue
        target = os.path.realpath(path)
        if tool.startswith("python"):
            res = subprocess.run([path, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True,
                                 timeout=30)
            owner = res.stdout.strip()
        else:
            owner = _script_prefix(path)
        evidence[tool] = {"path": path, "resolves_to": target, "prefix": owner}
        if owner != prefix:
            problems.append(f"`{tool}` -> {path} belongs to {owner or 'another installation'}, not {prefix}")
    if problems:
        return result("interpreter-identity", "fail", "; ".join(problems),
                      f"put {bindir} first on PATH (export PATH={bindir}:$PATH)", evidence)
    return result("interpreter-identity", "pass", f"python, python3, pip (and accelerate/torchrun) are {prefix}",
                  "", evidence)


def _script_prefix(path):
    """The prefix of the interpreter named in a console script's shebang."""
    try:  # a console script on PATH: a FIFO or a device there is no script (and never blocks the doctor)
        fd, _ = nofollow.open_regular(path, follow=True)
    except OSError:
        return ""
    try:
        head = os.read(fd, 4096).decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    finally:
        os.close(fd)
    first = head[0].strip() if head else ""
    if not first.startswith("#!"):
        return ""
    words = first[2:].strip().split()
    interp = words[0] if words else ""
    if os.path.basename(interp) == "env" and len(words) > 1:
        interp = shutil.which(words[1]) or ""
    elif os.path.basename(interp) == "sh" and len(head) > 1 and head[1].startswith("'''exec' "):
        # pip and uv, for an interpreter path with a space or too long for a shebang, write
        # #!/bin/sh, then '''exec' "/path/bin/python" "$0" "$@", then ' '''
        try:
            words = shlex.split(head[1])
        except ValueError:
            words = []
        interp = words[1] if len(words) > 1 and words[0] == "exec" else ""
    if not os.path.basename(interp).startswith("python"):
        return ""  # a wrapper (pyenv shim, shell script): not a pinned environment's entry point
    return os.path.dirname(os.path.dirname(interp))


def check_shadowing(env, manifest):
    evidence = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "user_site": env.get("user_site")}
    pinned = {facts.canon(k) for k in (manifest or {}).get("distributions", {})}
    shadows = []
    user_site = env.get("user_site") or ""
    for name, info in env["dists"].items():
        loc = info.get("location", "")
        if user_site and loc.startswith(user_site) and facts.canon(name) in pinned:
            shadows.append(f"{name} {info['version']} in {user_site}")
    if os.environ.get("PYTHONPATH"):
        for entry in os.environ["PYTHONPATH"].split(os.pathsep):
            if not entry or not os.path.isdir(entry):
                continue
            root = os.path.join(os.path.abspath(entry), "")
            # installed there (dist-info: also when the import name differs, PyYAML -> yaml), or a bare package or
            # module of a pinned name (a checkout's alpha/ or alpha.py)
            held = sorted({n for n, info in ((facts.canon(k), v) for k, v in env["dists"].items())
                           if n in pinned and os.path.abspath(info.get("location", "")).startswith(root)}
                          | {n for n in pinned if any(os.path.exists(os.path.join(entry, n.replace("-", "_") + ext))
                                                      for ext in ("", ".py"))})
            if held:
                shadows.append(f"PYTHONPATH entry {entry} holds pinned {', '.join(held)}")
    if shadows:
        return result("shadowing", "fail", "packages shadow the pinned environment: " + "; ".join(shadows),
                      "remove them (pip uninstall --user ...), or unset PYTHONPATH; run with PYTHONNOUSERSITE=1",
                      evidence)
    if os.environ.get("PYTHONPATH"):
        return result("shadowing", "warn", f"PYTHONPATH is set ({os.environ['PYTHONPATH']})",
                      "unset PYTHONPATH unless you mean it", evidence)
    return result("shadowing", "pass", "no ~/.local or PYTHONPATH shadowing", "", evidence)


def check_drift(env, manifest, in_image=True):
    """`lock-drift` on a live environment: a pin missing or at another version blocks, and so does a name installed
    twice (which one a program imports depends on who asks); a distribution the lock does not have only warns (the
    user may have added it on purpose; untested with this stack)."""
    want = {facts.canon(k): v for k, v in manifest["distributions"].items()}
    installs = env["installs"]  # describe_interpreter: facts.installed_distributions, as the self-test reads
    drift = facts.lock_drift(want, installs, facts.declared_seeds(manifest))  # a lockfile declares no seeds: any
    have = {facts.canon(n): found[0][0] for n, found in installs.items()}
    missing, extra, different, twice = drift["missing"], drift["extra"], drift["different"], drift["duplicates"]
    lines = [f"installed twice: {d}" for d in twice]
    lines += [f"{n} {have[n]} (pinned {want[n]})" for n in different]
    lines += [f"{n} missing (pinned {want[n]})" for n in missing]
    evidence = {"different": {n: {"installed": have[n], "pinned": want[n]} for n in different}, "missing": missing,
                "extra": {n: have[n] for n in extra}, "duplicates": twice}
    if len(lines) > 8:
        lines = [*lines[:8], f"and {len(lines) - 8} more"]
    if lines:
        torch_drift = [n for n in different + missing if facts.is_torch_family(n)]
        head = "torch-family drift (the GPU stack is not the tested one): " if torch_drift else "drift from the lock: "
        fix = ("rebuild or re-pull the image; never `pip install -U` over a pinned environment" if in_image else
               "install the environment from the lock (uv pip sync LOCK, or pip install --require-hashes -r LOCK); "
               "never `pip install -U` over a pinned environment")
        if twice:
            fix = "remove the install the lock does not name (the path above), then " + fix
        return result("lock-drift", "fail", head + "; ".join(lines), fix, evidence)
    if extra:
        return result("lock-drift", "warn", "not in the lock: " + ", ".join(f"{n} {have[n]}" for n in extra),
                      "extra packages are untested with this stack; add them to the matrix's packages", evidence)
    return result("lock-drift", "pass", f"{len(want)} distributions match the lock exactly (local labels included)",
                  "", evidence)


def check_apt(manifest):
    """`apt-drift`: the image's `[image] apt` packages, at their pinned versions (dpkg's status file)."""
    want = (manifest.get("apt") or {}).get("packages") or {}
    try:
        with open(facts.DPKG_STATUS, encoding="utf-8", errors="replace") as fh:
            drift = facts.apt_drift(want, facts.dpkg_installed(fh.read()))
    except OSError as exc:
        return result("apt-drift", "fail", f"cannot read {facts.DPKG_STATUS}: {exc}",
                      "run the doctor inside the image (the manifest names Debian packages)")
    lines = [f"{n} missing" for n in drift["missing"]] + drift["different"]
    if lines:
        return result("apt-drift", "fail", "Debian packages differ from the image's lock: " + "; ".join(lines[:8]),
                      "rebuild or re-pull the image; apt-get upgrade over it is untested", drift)
    return result("apt-drift", "pass", f"{len(want)} Debian packages at their pinned versions", "", drift)


# ---------------------------------------------------------------------------------------------------------
# NVIDIA driver and GPUs (no torch)
# ---------------------------------------------------------------------------------------------------------
def parse_smi_query(text):
    """`nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total,uuid --format=csv,noheader`."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4 and re.match(r"^\d+$", parts[0]):
            gpus.append({"index": int(parts[0]), "name": parts[1], "driver": parts[2], "compute_cap": parts[3],
                         "memory": parts[4] if len(parts) > 4 else "", "uuid": parts[5] if len(parts) > 5 else ""})
    return gpus


def usable_gpu_count(gpus, cuda_visible_devices):
    """GPUs a CUDA process can use: CUDA_VISIBLE_DEVICES (indices or GPU-/MIG- UUID prefixes) filters the driver's
    list, and CUDA stops reading it at the first entry that names no GPU (so "" or "-1" hides them all)."""
    if cuda_visible_devices is None:
        return len(gpus)
    if "MIG-" in cuda_visible_devices:
        return None  # MIG instances are not in nvidia-smi's GPU list: unknown
    seen = []
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        if re.fullmatch(r"\d+", entry):
            match = [g for g in gpus if g["index"] == int(entry)]
        elif entry.startswith(("GPU-", "MIG-")):
            match = [g for g in gpus if g.get("uuid") and g["uuid"].startswith(entry)]
        else:
            match = []
        if len(match) != 1 or match[0]["index"] in seen:
            break
        seen.append(match[0]["index"])
    return len(seen)


def classify_smi_failure(text):
    for pattern, what, fix in SMI_FAILURES:
        if re.search(pattern, text, re.I):
            return what, fix
    return None


def query_gpus():
    """(gpus, error text or None, ran) from nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return [], None, False
    try:
        res = subprocess.run([smi, "--query-gpu=index,name,driver_version,compute_cap,memory.total,uuid",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], str(exc), True
    if res.returncode != 0:
        return [], (res.stdout + res.stderr).strip(), True
    return parse_smi_query(res.stdout), None, True


def version_key(v):
    return tuple(int(x) for x in re.findall(r"\d+", v))


def check_gpus(gpu_state, manifest, require_gpu):
    gpus, error, ran = gpu_state
    if error:
        cls = classify_smi_failure(error)
        what, fix = cls if cls else ("nvidia-smi failed", "check the NVIDIA driver on the host")
        return [result("nvidia-driver", "fail", f"{what}: {error[-300:]}", fix, {"nvidia_smi": error[-1000:]})]
    if not gpus:
        status = "fail" if require_gpu else "skip"
        why = "nvidia-smi is not available" if not ran else "nvidia-smi lists no GPU"
        return [result("nvidia-driver", status, f"no GPU: {why}",
                       "run with the NVIDIA runtime (docker run --gpus all)" if require_gpu else "", {})]
    out = [result("nvidia-driver", "pass", f"{len(gpus)} GPU(s), driver {gpus[0]['driver']}: "
                  + ", ".join(g["name"] for g in gpus), "", {"gpus": gpus})]
    contract = runtime_contract(manifest)
    if contract.get("driver_min"):
        floor = contract["driver_min"]
        driver = gpus[0]["driver"]
        ev = {"driver": driver, "minimum": floor, "variant": (manifest.get("torch") or {}).get("variant")}
        if version_key(driver) < version_key(floor):
            out.append(result("driver-floor", "fail", f"driver {driver} is below {floor}, the floor of this image's "
                              f"{ev['variant']} torch: CUDA init will fail and training would fall back to the CPU",
                              "pick a host with a newer driver or an image with an older CUDA variant", ev))
        else:
            out.append(result("driver-floor", "pass", f"driver {driver} >= {floor}", "", ev))
    if contract.get("sass"):
        archs = contract["sass"]
        ptx = contract.get("ptx")
        for g in gpus:
            ok, how = arch_runs(g["compute_cap"], archs, ptx)
            ev = {"gpu": g["name"], "compute_cap": g["compute_cap"], "archs": archs, "ptx": ptx, "via": how}
            if ok:
                out.append(result("gpu-arch", "pass", f"{g['name']} (sm_{g['compute_cap'].replace('.', '')}) runs "
                                  f"via {how}", "", ev))
            else:
                out.append(result("gpu-arch", "fail", f"{g['name']} is sm_{g['compute_cap'].replace('.', '')} but this "
                                  f"torch has kernels for {' '.join(archs)}: 'no kernel image is available'",
                                  "use an image whose torch CUDA variant supports this GPU", ev))
    return out


def runtime_contract(manifest):
    """What the image needs of its host (driver floor, GPU architectures, CPU architecture, glibc): the manifest's
    ``runtime`` object, or for a manifest from before it, the same facts from its driver and torch sections."""
    manifest = manifest or {}
    runtime = manifest.get("runtime")
    if isinstance(runtime, dict):
        return runtime
    return {"driver_min": (manifest.get("driver") or {}).get("minimum"),
            "sass": (manifest.get("torch") or {}).get("archs"), "ptx": (manifest.get("torch") or {}).get("ptx")}


# platform.machine() -> the OCI architecture an image is built for
MACHINES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def check_host_contract(manifest, machine=None, glibc=None):
    """The host's CPU architecture and C library against the image's contract: an amd64 image on an arm64 host
    runs (if at all) under emulation with no GPU, and wheels built for a newer glibc fail to load."""
    contract = runtime_contract(manifest)
    want_platform, want_glibc = contract.get("platform"), contract.get("glibc_min")
    if not want_platform and not want_glibc:
        return [result("host-contract", "skip", "the manifest names no CPU architecture or glibc floor")]
    machine = platform.machine() if machine is None else machine
    if glibc is None:
        try:
            glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]  # "glibc 2.36"
        except (AttributeError, ValueError, OSError, IndexError):
            glibc = None
    have = MACHINES.get(machine, machine)
    ev = {"machine": machine, "glibc": glibc, "platform": want_platform, "glibc_min": want_glibc}
    problems = []
    if want_platform and want_platform.split("/")[-1] != have:
        problems.append(f"this host is {machine} ({have}) but the image is built for {want_platform}")
    if want_glibc and glibc and version_key(glibc) < version_key(want_glibc):
        problems.append(f"glibc {glibc} is older than {want_glibc}, the floor of this image's torch wheels")
    if problems:
        return [result("host-contract", "fail", "; ".join(problems),
                       f"run it on a {want_platform or 'matching'} host (or use an image built for this one)", ev)]
    return [result("host-contract", "pass", f"{have} host, glibc {glibc or '?'}: inside the image's contract "
                   f"({want_platform or '?'}, glibc >= {want_glibc or '?'})", "", ev)]


def arch_runs(cc, archs, ptx):
    how = facts.best_kernel(cc, archs, ptx)
    if how is None:
        return False, None
    if how[0] == "cubin":
        return True, "cubin sm_{}{}".format(*how[1])
    return True, f"PTX JIT from {ptx}"


# ---------------------------------------------------------------------------------------------------------
# Standard tier: one torch probe in a child process
# ---------------------------------------------------------------------------------------------------------
TORCH_PROBE = r"""
import json, warnings
out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        import torch
    except Exception as exc:
        print(json.dumps({"import_error": repr(exc)})); raise SystemExit(0)
    out["version"] = torch.__version__
    out["cuda"] = torch.version.cuda
    try:
        out["available"] = torch.cuda.is_available()
        out["count"] = torch.cuda.device_count() if out["available"] else 0
    except Exception as exc:
        out["available"] = False; out["init_error"] = repr(exc)
    if not out.get("available") and "init_error" not in out and out["cuda"]:
        try:
            torch.cuda.init()  # is_available() hides why; init() raises torch's own text
        except Exception as exc:
            out["init_error"] = repr(exc)
    if out.get("available"):
        out["arch_list"] = torch.cuda.get_arch_list()
        try:
            x = torch.ones(1024, device="cuda")
            out["kernel_sum"] = float((x * 2).sum().item())
        except Exception as exc:
            out["kernel_error"] = repr(exc)
out["warnings"] = [str(w.message) for w in caught]
print(json.dumps(out))
"""


HIDING_CVD = ("", "-1", "none", "void", "nodevfiles")


def classify_cuda_failure(text, torch_cuda, cuda_visible_devices=None):
    if torch_cuda is None:
        return ("cpu-only-wheel", "this torch is a CPU-only build (torch.version.cuda is None)",
                "install the CUDA build the image pins; a CPU wheel replaced it")
    if cuda_visible_devices is not None and cuda_visible_devices.strip().lower() in HIDING_CVD:
        return ("cuda-visible-devices", f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} hides every GPU from torch",
                "unset CUDA_VISIBLE_DEVICES, or list the GPUs to use (e.g. CUDA_VISIBLE_DEVICES=0,1)")
    for cid, pattern, what, fix in CUDA_CAUSES:
        if re.search(pattern, text or "", re.I):
            return cid, what, fix
    return ("unknown", "CUDA could not be initialised", "read the warnings in the evidence")


def start_torch_probe(python):
    """Start the probe in a child now (importing torch is most of its time) and read it later. It may import torch
    where the image refuses it (cuda_guard.py, IMAGEKIT_ALLOW_CPU): it is what says why."""
    return subprocess.Popen([python, "-c", TORCH_PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "IMAGEKIT_ALLOW_CPU": "1"})


def probe_problem(probe):
    """The first field of the probe's answer that is not of the type TORCH_PROBE prints, or None."""
    if not isinstance(probe, dict):
        return "not an object"
    for field, kinds in (("import_error", str), ("init_error", str), ("kernel_error", str), ("version", str),
                         ("cuda", (str, type(None))), ("available", bool), ("count", int), ("kernel_sum", float)):
        if field in probe and not isinstance(probe[field], kinds):
            return f"{field} has the wrong type"
    for field in ("warnings", "arch_list"):
        if field in probe and not (isinstance(probe[field], list) and all(isinstance(w, str) for w in probe[field])):
            return f"{field} is not a list of strings"
    if "import_error" not in probe and not isinstance(probe.get("version"), str):
        return "version is missing"
    if probe.get("available") and not isinstance(probe.get("count"), int):
        return "count is missing"
    return None


def check_torch_probe(python, gpu_state, timeout, gpu_required=False, proc=None, in_image=True):
    """The torch CUDA probe. GPUs visible to the driver (or required) while torch sees none is a blocker."""
    gpus = gpu_state[0]
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    proc = proc or start_torch_probe(python)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return result("torch-probe", "error", f"the torch probe did not finish in {timeout} s",
                      "a hung CUDA init often means a wedged GPU; check nvidia-smi", {})
    try:
        probe = load_json(stdout.strip().splitlines()[-1], "the torch probe's answer")
    except (ValueError, IndexError):
        return result("torch-probe", "error", f"the torch probe crashed: {stderr.strip()[-500:]}", "", {})
    problem = probe_problem(probe)
    if problem:
        return result("torch-probe", "error", f"the torch probe answered in the wrong shape: {problem}",
                      f"check that {python} is a Python interpreter (--python)", {})
    if "import_error" in probe:
        fix = ("the environment is broken; rebuild or re-pull the image" if in_image else
               f"install torch into {python}'s environment, or pass --python for the one your training runs")
        return result("torch-probe", "fail", f"import torch failed: {probe['import_error']}", fix, probe)
    text = " ".join(probe.get("warnings", [])) + " " + probe.get("init_error", "") + " " + probe.get("kernel_error", "")
    if probe.get("available"):
        if "kernel_error" in probe:
            cid, what, fix = classify_cuda_failure(text, probe.get("cuda"), cvd)
            return result("torch-probe", "fail", f"a CUDA kernel failed: {what}", fix, probe)
        return result("torch-probe", "pass", f"torch {probe['version']} sees {probe['count']} GPU(s); a kernel ran",
                      "", probe)
    if gpus or gpu_required:
        cid, what, fix = classify_cuda_failure(text, probe.get("cuda"), cvd)
        probe["cause"] = cid
        probe["cuda_visible_devices"] = cvd
        seen = f"{len(gpus)} GPU(s) visible to the driver" if gpus else "a GPU is required (IMAGEKIT_REQUIRE_GPU=1)"
        return result("cpu-fallback", "fail", f"{seen} but torch sees none: {what}. Training would silently run "
                      "on the CPU", fix, probe)
    return result("torch-probe", "skip", f"torch {probe['version']} imports; no GPU to probe", "", probe)


# ---------------------------------------------------------------------------------------------------------
# Accelerate config, persistent paths, disk, shm, provider
# ---------------------------------------------------------------------------------------------------------
def hf_home():
    return os.path.expanduser(os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))


def find_accelerate_config(explicit=None):
    """As accelerate finds it: --config_file, else $HF_HOME/accelerate/default_config.yaml (or .json)."""
    if explicit:
        return explicit
    base = os.path.join(hf_home(), "accelerate")
    for name in ("default_config.yaml", "default_config.json"):
        if os.path.isfile(os.path.join(base, name)):
            return os.path.join(base, name)
    return None


def parse_flat_config(text):
    """The top-level scalars of an accelerate YAML (or JSON) config, without a YAML library."""
    if text.lstrip().startswith("{"):
        return json.loads(text)
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.*?)\s*$", line)
        if not m:
            continue
        value = m.group(2).strip("'\"")
        if value.lower() in ("true", "false"):
            value = value.lower() == "true"
        elif re.fullmatch(r"-?\d+", value):
            value = int(value)
        elif value in ("", "null", "~"):
            value = None
        out[m.group(1)] = value
    return out


SHELLS = ("bash", "sh", "dash", "zsh")
LAUNCHERS = ("accelerate", "torchrun")
MAX_SCRIPT = 1 << 20  # bytes of a launch script read


def _launcher(argv):
    words = [os.path.basename(a) for a in argv[:4]]
    if "accelerate" in words and "launch" in argv[:4]:
        return "accelerate"
    if any(w in ("torchrun", "torch.distributed.run") for w in argv[:4]):
        return "torchrun"
    return None


def _script_of(argv):
    """The script ``argv`` runs with a shell (``bash train.sh``, ``sh -x run.sh``, ``./train.sh``), or None."""
    if not argv:
        return None
    if os.path.basename(argv[0]) in SHELLS:
        rest = argv[1:]
        while rest and rest[0].startswith("-") and rest[0] not in ("-c", "--"):
            rest = rest[1:]
        if rest and rest[0] == "--":
            rest = rest[1:]
        return rest[0] if rest and rest[0] != "-c" else None
    return argv[0] if argv[0].endswith(".sh") else None


UNKNOWN = "\0"  # in a launch word: a variable neither the script nor the env sets here


def _expand(word, values):
    """``$NAME`` and ``${NAME}`` from the script's own assignments, then the env; one neither sets is ``UNKNOWN``."""

    def one(m):
        name = m.group(1) or m.group(2)
        return values.get(name, os.environ.get(name, UNKNOWN))

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", one, word)


def script_launch(argv, cwd=None):
    """(launch argv, the script's path) when ``argv`` runs a shell script whose lines start ``accelerate launch`` or
    ``torchrun``: its first such line, continuation lines joined, leading ``VAR=value``, ``exec``, ``nohup`` and
    ``time`` left out, ``$VAR`` filled in from the script's own assignments (then the env); a relative
    ``--config_file`` taken against the folder of a ``cd DIR`` line before it. (None, None) when it runs none (or
    the script cannot be read as a regular file)."""
    path = _script_of(argv)
    if path is None:
        return None, None
    cwd = cwd or os.getcwd()
    full = path if os.path.isabs(path) else os.path.join(cwd, path)
    try:
        text = read_regular(full, MAX_SCRIPT)
    except (OSError, ValueError):
        return None, None
    values, here = {}, cwd
    for line in re.sub(r"\\\r?\n", " ", text).splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0], re.S):
            name, _, value = words.pop(0).partition("=")
            if not words:  # an assignment on its own line: the script's variable
                values[name] = _expand(value, values)
        while words and words[0] in ("exec", "nohup", "time", "command"):
            words = words[1:]
        if len(words) == 2 and words[0] == "cd":
            target = _expand(words[1], values)
            here = here if UNKNOWN in target else os.path.normpath(os.path.join(here, target))
            continue
        if words and _launcher(words):
            return [_expand(w, values) for w in words], (full, here)
    return None, None


def launch_options(command, cwd=None):
    """What a launch command decides for itself: accelerate's --config_file/--num_processes/--num_machines/--cpu,
    torchrun's --nproc_per_node; a shell script (``bash train.sh``) is read for the launch it runs
    (:func:`script_launch`). {} for other commands."""
    argv = list(command or [])
    script = None
    if _launcher(argv) is None:
        argv, script = script_launch(argv, cwd)
        if argv is None:
            return {}
    tool = _launcher(argv)
    if tool == "accelerate":
        names = {"--config_file": "config_file", "--num_processes": "num_processes",
                 "--num_machines": "num_machines", "--cpu": "use_cpu"}
    else:
        names = {"--nproc_per_node": "num_processes", "--nnodes": "num_machines"}
    opts = {"tool": tool}
    if script:
        opts["script"] = script[0]
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.endswith(".py") or word == "-m" or (i > 1 and word in ("--", "--no_python")):
            break  # the script and its own options start here
        key, _, inline = word.partition("=")
        key = "--" + key[2:].replace("-", "_") if key.startswith("--") else key
        if key in names:
            if names[key] == "use_cpu":
                opts["use_cpu"] = True
            else:
                value = inline if inline else (argv[i + 1] if i + 1 < len(argv) else "")
                i += 0 if inline else 1
                if UNKNOWN in value:  # a variable the script's lines and the env do not say
                    opts.setdefault("unresolved", []).append(key)
                else:
                    opts[names[key]] = int(value) if re.fullmatch(r"\d+", value) else value
        i += 1
    if script and isinstance(opts.get("config_file"), str) and opts["config_file"] \
            and not os.path.isabs(opts["config_file"]):
        opts["config_file"] = os.path.join(script[1], opts["config_file"])
    return opts


def check_accelerate(path, gpu_count, launch=None):
    launch = launch or {}
    if launch.get("unresolved"):
        where = f" in {launch['script']}" if launch.get("script") else ""
        return result("accelerate-config", "warn", f"the launch{where} gives {', '.join(launch['unresolved'])} from a "
                      "variable neither the script nor the env sets here: not checked",
                      "run the check with the variable set, or give the value itself", {"launch": launch})
    if launch.get("config_file"):
        path = launch["config_file"]
    if not path and not launch.get("num_processes"):
        return result("accelerate-config", "skip", "no accelerate config found", "", {"searched": hf_home()})
    cfg = {}
    if path:
        try:
            cfg = parse_flat_config(read_regular(path))
            if not isinstance(cfg, dict):
                raise ValueError("expected a mapping of settings")
        except (OSError, ValueError) as exc:
            return result("accelerate-config", "fail", f"cannot read {path}: {exc}",
                          "rewrite it with `accelerate config`")
    cfg.update({k: v for k, v in launch.items() if k in ("num_processes", "num_machines", "use_cpu")})
    path = path or "the launch command"
    if launch.get("script"):
        path = f"{path} (the launch in {launch['script']})"
    ev = {"path": path, "num_processes": cfg.get("num_processes"), "use_cpu": cfg.get("use_cpu"),
          "distributed_type": cfg.get("distributed_type"), "gpus": gpu_count, "num_machines": cfg.get("num_machines"),
          "launch": launch}
    procs = cfg.get("num_processes")
    machines = cfg.get("num_machines") or 1
    if cfg.get("use_cpu"):
        return result("accelerate-config", "warn", f"{path} sets use_cpu: true: training runs on the CPU",
                      "set use_cpu: false (accelerate config)", ev)
    if gpu_count is None:
        return result("accelerate-config", "pass", f"{path}: num_processes {procs}; the GPU count is unknown here "
                      "(MIG instances in CUDA_VISIBLE_DEVICES), so it is not compared", "", ev)
    if isinstance(procs, int) and machines == 1:
        if procs > max(gpu_count, 1):  # one process never waits for ranks
            return result("accelerate-config", "fail", f"{path} asks for num_processes: {procs} but this machine has "
                          f"{gpu_count} GPU(s): the launch would hang waiting for ranks",
                          f"set num_processes: {max(gpu_count, 1)} or pass --num_processes", ev)
        if procs < gpu_count:
            return result("accelerate-config", "warn", f"num_processes: {procs} uses {procs} of {gpu_count} GPU(s)",
                          f"set num_processes: {gpu_count} to use them all", ev)
    return result("accelerate-config", "pass", f"{path}: num_processes {procs} on {gpu_count} GPU(s)", "", ev)


def parse_mountinfo(text):
    """(mount point, fstype, source) from /proc/self/mountinfo lines."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rfields = right.split()
        if len(fields) >= 5 and rfields:
            point = fields[4].replace("\\040", " ")
            mounts.append((point, rfields[0], rfields[1] if len(rfields) > 1 else ""))
    return mounts


def mount_of(path, mounts):
    path = os.path.realpath(path)
    best = None
    for point, fstype, source in mounts:
        if path == point or path.startswith(point.rstrip("/") + "/") or point == "/":
            if best is None or len(point) > len(best[0]):
                best = (point, fstype, source)
    return best


def existing_parent(path):
    path = os.path.abspath(path)
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path or "/"


def check_paths(paths, mountinfo_text, provider_hint):
    mounts = parse_mountinfo(mountinfo_text)
    out = []
    for label, path in paths:
        m = mount_of(path, mounts)  # by path prefix: a folder not created yet still lands on its mount
        ev = {"path": path, "mount": m[0] if m else None, "fstype": m[1] if m else None}
        if m is None:
            out.append(result(f"persistent-{label}", "error", f"{path}: mount not found in mountinfo", "", ev))
        elif m[1] in EPHEMERAL_FS or "overlay" in m[1]:  # also fuse.fuse-overlayfs: a container's own layer
            out.append(result(f"persistent-{label}", "warn", f"{path} is on {m[1]} ({m[0]}): lost when the pod stops",
                              provider_hint or "put it on a persistent volume (e.g. /workspace)", ev))
        else:
            out.append(result(f"persistent-{label}", "pass", f"{path} is on {m[1]} mounted at {m[0]}", "", ev))
    return out


def check_writable(paths):
    """The runtime user must be able to write each path (or the folder it will be created in): a root-owned volume
    on /workspace refuses a non-root user, and HF downloads and the first checkpoint save then fail mid-run."""
    out = []
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    for label, path in paths:
        probe = existing_parent(path)
        ev = {"path": path, "probe": probe, "uid": uid}
        try:
            st = os.stat(probe)
            ev.update(owner_uid=st.st_uid, mode=oct(st.st_mode & 0o7777))
            fd, tmp = tempfile.mkstemp(prefix=".imagekit-write-test-", dir=probe)
            os.close(fd)
            os.unlink(tmp)
        except OSError as exc:
            if exc.errno == 30:  # EROFS
                fix = f"mount the volume at {probe} read-write"
            else:
                fix = (f"run as root (pod platforms mount volumes root-owned), or give uid {uid} the folder: "
                       f"chown -R {uid} {probe}")
            out.append(result(f"writable-{label}", "fail", f"{path}: the runtime user (uid {uid}) cannot write "
                              f"{probe}: {exc.strerror}", fix, ev))
            continue
        out.append(result(f"writable-{label}", "pass", f"{path} is writable (uid {uid})", "", ev))
    return out


def check_disk(paths, min_free_gb=10.0):
    out = []
    seen = set()
    for label, path in paths:
        probe = existing_parent(path)
        st = os.statvfs(probe)
        key = st.f_fsid if hasattr(st, "f_fsid") else probe
        if key in seen:
            continue
        seen.add(key)
        free_gb = st.f_bavail * st.f_frsize / 1e9
        inodes = st.f_favail / st.f_files if st.f_files else 1.0
        ev = {"path": probe, "free_gb": round(free_gb, 2), "inodes_free_fraction": round(inodes, 4)}
        if free_gb < 1 or inodes < 0.01:
            out.append(result(f"disk-{label}", "fail", f"{probe}: {free_gb:.1f} GB free, {inodes:.1%} inodes free",
                              "free space or attach a larger volume before training", ev))
        elif free_gb < min_free_gb or inodes < 0.05:
            out.append(result(f"disk-{label}", "warn", f"{probe}: only {free_gb:.1f} GB free ({inodes:.1%} inodes)",
                              "checkpoints and model downloads need tens of GB", ev))
        else:
            out.append(result(f"disk-{label}", "pass", f"{probe}: {free_gb:.0f} GB free", "", ev))
    return out


def check_shm(min_bytes=1 << 30):
    if not os.path.isdir("/dev/shm"):
        return result("shm", "skip", "no /dev/shm")
    st = os.statvfs("/dev/shm")
    size = st.f_blocks * st.f_frsize
    ev = {"bytes": size}
    if size < min_bytes:
        return result("shm", "warn", f"/dev/shm is {size / 2**20:.0f} MiB: DataLoader workers crash with 'bus error'",
                      "start the container with --shm-size=8g (or --ipc=host)", ev)
    return result("shm", "pass", f"/dev/shm is {size / 2**30:.1f} GiB", "", ev)


def detect_provider(environ=None):
    """(name, where data survives there) of the GPU cloud this runs on, or (None, None): the row of facts.PROVIDERS the
    guard ends pods through too."""
    found = facts.detect_provider(os.environ if environ is None else environ)
    return (found.name, found.volume_hint) if found else (None, None)


# ---------------------------------------------------------------------------------------------------------
# Deep tier: Hugging Face access (network)
# ---------------------------------------------------------------------------------------------------------
def hf_token(environ=None):
    """(token, where it came from) as huggingface_hub finds it: HF_TOKEN, else the file `hf auth login` saved
    ($HF_TOKEN_PATH, default $HF_HOME/token)."""
    env = os.environ if environ is None else environ
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if env.get(var, "").strip():
            return env[var].strip(), var
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface")
    path = os.path.expanduser(env.get("HF_TOKEN_PATH") or os.path.join(home, "token"))
    try:
        token = (nofollow.read_bytes(path, 1 << 16, follow=True) or b"").decode("utf-8", "replace").strip()
    except OSError:
        return None, None
    return (token, path) if token else (None, None)


def _origin(url):
    """(scheme, host, port) with the default port made explicit."""
    parts = urllib.parse.urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def _same_origin_redirect():
    """A redirect handler that follows a redirect within the origin (a renamed repo), token and all, and stops at one
    to another origin (the Hub sends file downloads to its CDN): the token never travels there, and the redirect
    itself already means the Hub granted access. Stopping surfaces the 3xx as an HTTPError, read as the answer.
    (urllib.request is imported here, when the Hub is asked: it costs every other command's start-up.)"""
    import urllib.request

    class SameOriginRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            if _origin(newurl) != _origin(req.full_url):
                return None
            return urllib.request.HTTPRedirectHandler.redirect_request(self, req, fp, code, msg, headers, newurl)

    return SameOriginRedirect


def _hub_get(url, token, timeout, extra=None):
    """(status, headers, body text, final url): same-origin redirects followed, others not (see above)."""
    import urllib.error
    import urllib.request

    headers = dict(extra or {})
    if token:
        headers["Authorization"] = "Bearer " + token
    req = urllib.request.Request(url, headers=headers)
    opener = urllib.request.build_opener(_same_origin_redirect())
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.headers, resp.read(1 << 20).decode("utf-8", "replace"), resp.geturl()
    except urllib.error.HTTPError as exc:
        body = exc.read(1 << 16).decode("utf-8", "replace") if exc.fp else ""
        return exc.code, exc.headers, body, exc.geturl() or url


def _hub_message(headers, body):
    text = (headers.get("X-Error-Message") if headers else None) or ""
    if not text:
        try:
            text = json.loads(body).get("error", "")
        except (ValueError, AttributeError):
            text = body
    return (text or "").strip()[:300]


def classify_hf_403(message):
    """The two 403s users meet on gated repos, told apart by the Hub's own message."""
    m = message.lower()
    if "fine-grained" in m or "public gated repositories" in m or ("token" in m and "scope" in m):
        return ("token-scope", "the token is fine-grained and lacks access to public gated repos",
                "enable 'Read access to contents of all public gated repos you can access' on the token "
                "(huggingface.co/settings/tokens), or use a read token")
    if any(k in m for k in ("authorized list", "awaiting", "accept", "ask for access", "request access",
                            "rejected", "restricted", "gated")):
        return ("licence", "the licence is not accepted (or the access request is pending) for this account",
                "accept the licence on the repo's page with the account that owns the token")
    return ("unknown", "the licence is not accepted for this account, or a fine-grained token lacks gated-repo access",
            "accept the licence on the repo's page, or enable 'public gated repos' on the token")


HF_REPO_ID = re.compile(r"((datasets|spaces)/)?([A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}", re.ASCII)


def check_hf_repo(repo, endpoint, token, timeout=15, token_source=None):
    """Can this token read the repo? Models, `datasets/ORG/NAME` and `spaces/ORG/NAME`; any files (adapters and
    GGUF repos have no config.json). The repo's info first, then, for a gated repo, one of its files."""
    import urllib.error

    cid = f"hf-access:{repo}"
    kind, name, prefix = "models", repo, ""
    for plural in ("datasets", "spaces"):
        if repo.startswith(plural + "/"):
            kind, name, prefix = plural, repo[len(plural) + 1:], plural + "/"
    base = endpoint.rstrip("/")
    sent = token_source or ("set" if token else "absent")
    ev = {"repo": repo, "token": sent}
    try:
        info_url = f"{base}/api/{kind}/{name}"
        code, headers, body, final = _hub_get(info_url, token, timeout)
        ev["info_status"] = code
        moved = ""
        if final != info_url:  # a renamed repo: followed within the Hub
            ev["moved_to"] = final
            moved = f" (moved to {final}; use the new id)"
        if code in (301, 302, 303, 307, 308):  # to another origin: not followed, the token stays here
            ev["moved_to"] = headers.get("Location")
            return result(cid, "pass", f"{repo}: moved to {headers.get('Location')} (readable; use the new id)", "",
                          ev)
        if code == 200:
            info = json.loads(body or "{}")
            if not isinstance(info, dict):
                raise ValueError("the Hub's repo info is not a JSON object")
            ev["gated"] = info.get("gated", False)
            if not info.get("gated"):
                return result(cid, "pass", f"{repo}: readable" + (" (private, the token has access)"
                                                                 if info.get("private") else "") + moved, "", ev)
            files = [f.get("rfilename") for f in info.get("siblings") or [] if f.get("rfilename")]
            pick = next((f for f in ("config.json", "README.md", ".gitattributes") if f in files),
                        files[0] if files else ".gitattributes")
            url = f"{base}/{prefix}{name}/resolve/main/{urllib.parse.quote(pick)}"
            code, headers, body, _ = _hub_get(url, token, timeout, {"Range": "bytes=0-0"})
            ev.update(file=pick, file_status=code)
            if code in (200, 206, 301, 302, 303, 307, 308):
                return result(cid, "pass", f"{repo}: gated, and this token has access" + moved, "", ev)
    except UnicodeError:
        return result(cid, "fail", f"{repo}: the token from {sent} has characters no HTTP header can carry",
                      "copy the token again (huggingface.co/settings/tokens)", ev)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return result(cid, "error", f"cannot reach {endpoint}: {exc}", "check network access", ev)
    message = _hub_message(headers, body)
    ev.update(status=code, hub_message=message)
    if code == 401:
        if not token:
            return result(cid, "fail", f"{repo}: HTTP 401, no token was sent (gated or private)",
                          "log in (`hf auth login`) or set HF_TOKEN (huggingface.co/settings/tokens)", ev)
        return result(cid, "fail", f"{repo}: HTTP 401, the token from {sent} was rejected (expired or revoked), "
                      "or the repo is private and not yours", "create a new token and `hf auth login` again", ev)
    if code == 403:
        cause, what, fix = classify_hf_403(message)
        ev["cause"] = cause
        return result(cid, "fail", f"{repo}: HTTP 403, {what}" + (f" (Hub: {message})" if message else ""), fix, ev)
    if code == 404:
        return result(cid, "fail", f"{repo}: HTTP 404, no such repo (or private and not yours)", "check the repo id",
                      ev)
    return result(cid, "error", f"{repo}: unexpected HTTP {code}", "", ev)


# ---------------------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------------------
def choose_python(given, manifest):
    """(interpreter, why it): --python; else the manifest's (the image's venv); else the `python` (then `python3`) on
    PATH, the one a training command would run; else this one. Off an image the doctor checks the user's
    environment, never imagekit's own."""
    if given:
        return given, "--python"
    pinned = ((manifest or {}).get("python") or {}).get("executable")
    if isinstance(pinned, str) and os.path.exists(pinned):
        return pinned, "the manifest's interpreter"
    for name in ("python", "python3"):
        found = shutil.which(name)
        if found:
            if os.path.dirname(os.path.abspath(found)) == os.path.dirname(sys.executable):
                return sys.executable, f"the {name} on PATH"
            return found, f"the {name} on PATH"
    return sys.executable, "the doctor's own interpreter: no python on PATH"


def run_checks(args):
    checks = []
    manifest = None
    expect = args.expect or (DEFAULT_MANIFEST if os.path.isfile(DEFAULT_MANIFEST) else None)
    if expect:
        try:
            manifest = load_expectation(expect)
            count = len(manifest.get("distributions") or manifest.get("requirements") or ())
            checks.append(result("manifest", "pass", f"expecting {expect}", "",
                                 {"cell": (manifest.get("cell") or {}).get("id"), "count": count}))
        except (OSError, ValueError) as exc:
            checks.append(result("manifest", "error", f"cannot read {expect}: {exc}", "pass --expect FILE"))
    else:
        checks.append(result("manifest", "warn", f"no manifest at {DEFAULT_MANIFEST} and no --expect",
                             "pass --expect MANIFEST_OR_LOCKFILE to check drift"))
    python, chosen_by = choose_python(args.python, manifest)
    checks.append(result("python", "pass", f"checking {python} ({chosen_by})", "",
                         {"python": python, "chosen_by": chosen_by}))
    in_image = manifest is not None and expect == DEFAULT_MANIFEST
    gpu_state = query_gpus()
    require_gpu = args.require_gpu or os.environ.get("IMAGEKIT_REQUIRE_GPU") == "1"
    gpu_expected = require_gpu or bool(gpu_state[0])
    probing = args.tier in ("standard", "deep") or (args.tier == "start" and gpu_expected)
    probe_proc = start_torch_probe(python) if probing else None  # runs while the other checks do
    try:
        env = describe_interpreter(python if python != sys.executable else None)
        checks.append(check_interpreter_identity(env, manifest))
        checks.append(check_shadowing(env, manifest))
        if manifest and manifest.get("distributions"):
            checks.append(check_drift(env, manifest, in_image))
        if manifest and manifest.get("requirements"):
            checks.append(check_requirements(env, manifest))
        if manifest and (manifest.get("apt") or {}).get("packages"):
            checks.append(check_apt(manifest))
    except (OSError, RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
        checks.append(result("interpreter", "error", f"cannot inspect {python}: {exc}", "pass --python PATH"))
    gpu_checks = check_gpus(gpu_state, manifest, require_gpu)
    checks += gpu_checks
    checks += check_host_contract(manifest)
    provider, provider_hint = detect_provider()
    checks.append(result("provider", "pass" if provider else "skip",
                         f"provider: {provider}" if provider else "no known GPU cloud detected", provider_hint or ""))
    launch = launch_options(args.command)
    usable = usable_gpu_count(gpu_state[0], os.environ.get("CUDA_VISIBLE_DEVICES"))
    checks.append(check_accelerate(find_accelerate_config(args.accelerate_config), usable, launch))
    paths = [("hf-home", hf_home())]
    for p in args.path or (["/workspace"] if os.path.isdir("/workspace") else []):
        paths.append(("output" if p != "/workspace" else "workspace", p))
    try:
        mountinfo = nofollow.read_bytes("/proc/self/mountinfo", MAX_FILE)
        if mountinfo is None:
            raise FileNotFoundError(2, "No such file or directory", "/proc/self/mountinfo")
        checks += check_paths(paths, mountinfo.decode("utf-8", "replace"), provider_hint)
    except OSError:
        checks.append(result("persistent-paths", "skip", "no /proc/self/mountinfo (not Linux)"))
    checks += check_writable(paths)
    checks += check_disk(paths)
    checks.append(check_shm())
    if probe_proc is not None:
        probe = check_torch_probe(python, gpu_state, args.timeout, require_gpu, probe_proc, in_image)
        checks.append(probe)
        driver = gpu_checks[0]
        if probe["status"] == "pass" and driver["status"] == "fail" and not gpu_state[2]:
            # no nvidia-smi in the container (NVIDIA_DRIVER_CAPABILITIES without utility), yet torch runs kernels
            driver.update(status="warn", message=f"nvidia-smi is not available, but torch sees "
                          f"{probe['evidence'].get('count')} GPU(s)",
                          fix="add utility to NVIDIA_DRIVER_CAPABILITIES to get driver and architecture checks")
    if args.tier == "deep":
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
        token, source = hf_token()
        for repo in args.hf_repo or []:
            checks.append(check_hf_repo(repo, endpoint, token, token_source=source))
    return checks


def exit_code(checks, strict):
    statuses = {c["status"] for c in checks}
    if "fail" in statuses or (strict and "warn" in statuses):
        return 1
    if "error" in statuses:
        return 3
    return 0


MARK = {"pass": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip", "error": "ERR "}


def printable(text):
    """Control characters escaped: a hostile manifest or package name cannot forge `[ok  ]` lines or move the
    cursor."""
    return "".join(ch if ch.isprintable() or ch == " " else repr(ch)[1:-1] for ch in str(text))


def summary(checks):
    """One line: `2 blockers, 1 warning` (and the checks that could not run)."""
    count = {k: sum(c["status"] == k for c in checks) for k in ("fail", "warn", "error")}
    words = [f"{count['fail'] or 'no'} blocker{'' if count['fail'] == 1 else 's'}",
             f"{count['warn'] or 'no'} warning{'' if count['warn'] == 1 else 's'}"]
    if count["error"]:
        words.append(f"{count['error']} check{'' if count['error'] == 1 else 's'} could not run")
    return ", ".join(words)


def render_text(checks, verbose=True):
    lines = []
    for c in checks:
        if not verbose and c["status"] in ("pass", "skip"):
            continue
        lines.append(f"[{MARK[c['status']]}] {printable(c['id'])}: {printable(nofollow.redact(c['message']))}")
        if c["fix"] and c["status"] in ("warn", "fail", "error"):
            lines.append(f"       fix: {printable(nofollow.redact(c['fix']))}")
    return "\n".join(lines)


def redacted(value):
    """``value`` (a report: dicts, lists, strings) with credentials taken out of every string in it."""
    if isinstance(value, str):
        return nofollow.redact(value)
    if isinstance(value, dict):
        return {redacted(k): redacted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redacted(v) for v in value]
    return value


def parser():
    p = argparse.ArgumentParser(
        prog="imagekit doctor", description=__doc__.split("\n\n")[0],
        epilog="Examples: imagekit doctor && python train.py; imagekit doctor --expect lockfiles/CELL.txt "
        "--python .venv/bin/python --json; imagekit doctor --expect requirements.txt (ranges allowed); "
        "imagekit doctor --deep --hf-repo meta-llama/Llama-3.2-1B; "
        "imagekit-doctor -- accelerate launch --config_file cfg.yaml train.py (check, then launch)")
    p.add_argument("--tier", choices=TIERS, default="standard")
    p.add_argument("--deep", action="store_const", const="deep", dest="tier", help="same as --tier deep")
    p.add_argument("--expect", help="manifest JSON or lockfile to compare against (default: the image's manifest)")
    p.add_argument("--python", help="interpreter whose environment to check (default: the pinned one)")
    p.add_argument("--json", action="store_true", help="print every check as JSON")
    p.add_argument("--strict", action="store_true", help="warnings fail too")
    p.add_argument("--require-gpu", action="store_true", help="no GPU is a blocker")
    p.add_argument("--path", action="append", help="an output path that must be persistent (repeatable)")
    p.add_argument("--hf-repo", action="append", help="deep tier: a Hugging Face repo that must be readable")
    p.add_argument("--accelerate-config", help="accelerate config file (default: where accelerate looks)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for the torch probe")
    p.add_argument("--entrypoint", action="store_true", help="quiet unless something is wrong (image entrypoint)")
    p.add_argument("--no-launch", action="store_true",
                   help="check the launch command after -- as before launching it, but do not run it (`imagekit pod "
                   "run` checks a launch this way before it starts it)")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="after --: a launch command (accelerate launch / torchrun) to check with its own options and "
                   "run when nothing blocks it")
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not (args.timeout > 0 and args.timeout < 86400):  # also refuses nan
        p.error(f"--timeout {args.timeout}: give seconds between 0 and 86400 (hint: the default is 120)")
    for name in ("expect", "python", "accelerate_config", "path", "hf_repo"):  # argparse makes `--path=--` a list
        value = getattr(args, name)
        values = value if name in ("path", "hf_repo") else [value]
        if not all(v is None or isinstance(v, str) for v in values or []):
            p.error(f"--{name.replace('_', '-')}: give a value (not '--')")
    for repo in args.hf_repo or []:  # it becomes part of a URL path: only what a repo id can be
        if not HF_REPO_ID.fullmatch(repo) or ".." in repo:
            p.error(f"--hf-repo {repo[:100]!r}: give a repo id such as meta-llama/Llama-3.2-1B (or datasets/ORG/NAME)")
    for path in args.path or []:
        if not path.strip() or os.path.isfile(path):
            p.error(f"--path {printable(path)[:200]!r}: give an output folder (hint: it need not exist yet, e.g. "
                    "--path /workspace/out)")
    if args.python and not (os.path.isfile(args.python) and os.access(args.python, os.X_OK)):
        p.error(f"--python {printable(args.python)[:200]}: no such executable (give the interpreter of the "
                "environment to check, e.g. .venv/bin/python)")
    if args.expect is not None:  # a file named here that cannot be read is bad usage, whatever a check would say
        try:
            read_regular(args.expect)
        except OSError as exc:
            why = exc.reason if isinstance(exc, nofollow.Refused) else (exc.strerror or str(exc))
            p.error(f"--expect {printable(nofollow.redact(args.expect))[:200]}: cannot read it: {why} (hint: give a "
                    "manifest JSON or a lockfile, a regular file)")
    start = time.time()
    checks = run_checks(args)
    code = exit_code(checks, args.strict)
    if args.json:
        print(json.dumps({"tier": args.tier, "exit_code": code, "seconds": round(time.time() - start, 3),
                          "checks": redacted(checks)}, indent=2, sort_keys=True))
    else:
        text = render_text(checks, verbose=not args.entrypoint)
        if text and not args.entrypoint:
            text += "\n" + summary(checks)
        if text:
            print(text, file=sys.stderr if args.entrypoint or args.command else sys.stdout)
    if args.command and not args.no_launch:
        if code != 0:
            print(f"imagekit doctor: not launching `{printable(nofollow.redact(' '.join(args.command)))}` (exit "
                  f"{code})", file=sys.stderr)
            return code
        sys.stdout.flush()
        try:
            os.execvp(args.command[0], args.command)
        except OSError as exc:
            print(f"imagekit doctor: cannot run {printable(nofollow.redact(args.command[0]))}: {exc.strerror}",
                  file=sys.stderr)
            return 127
    return code


if __name__ == "__main__":
    sys.exit(main())
