"""The doctor's checks of the interpreter a training command runs (standard library only, Python >= 3.8): which
Python it is, what shadows the pinned packages, drift from the lock or the requirements, the Debian packages."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

if __package__:  # imported from the host's package, imagekit.in_image
    from . import facts, nofollow
    from .doctor_expect import check_requirements, load_json, result
else:  # a program in the image, or sent to a pod: its sibling modules lie beside it
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import facts
    import nofollow
    from doctor_expect import check_requirements, load_json, result


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


def interpreter_checks(ctx):
    """The interpreter's identity, what shadows the pinned packages, drift from the lock or the requirements, the
    Debian packages: one description of the interpreter, shared."""
    manifest = ctx.manifest
    try:
        env = describe_interpreter(ctx.python if ctx.python != sys.executable else None)
        out = [check_interpreter_identity(env, manifest), check_shadowing(env, manifest)]
        if manifest and manifest.get("distributions"):
            out.append(check_drift(env, manifest, ctx.in_image))
        if manifest and manifest.get("requirements"):
            out.append(check_requirements(env, manifest))
        if manifest and (manifest.get("apt") or {}).get("packages"):
            out.append(check_apt(manifest))
        return out
    except (OSError, RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
        return [result("interpreter", "error", f"cannot inspect {ctx.python}: {exc}", "pass --python PATH")]
