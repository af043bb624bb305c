"""The doctor's expectation (standard library only, Python >= 3.8): how a check's result is said, the files it
reads as another party's (bounded, JSON of bounded depth), what the environment should hold (the image's manifest, a
lockfile, a requirements file with ranges), and PEP 440 ordering without `packaging`."""

from __future__ import annotations

import json
import os
import re
import sys

if __package__:  # imported from the host's package, imagekit.in_image
    from . import facts, nofollow
else:  # a program in the image, or sent to a pod: its sibling modules lie beside it
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import facts
    import nofollow


def result(cid, status, message, fix="", evidence=None):
    return {"id": cid, "status": status, "message": message, "fix": fix, "evidence": evidence or {}}


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


def expectation_checks(ctx):
    """What the environment is held to (the image's manifest, or --expect), and which interpreter is checked."""
    return list(ctx.expected)
