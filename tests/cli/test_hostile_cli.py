"""Every command, every option, hostile values: no traceback, an exit code from the README table, no stray writes.

The commands are found by walking the real typer app (and `doctor`'s argparse parser), so a new command or option
is covered without touching this file. Each example runs the command in-process in its own sandbox: HOME, the
caches and TMPDIR inside it, every proxy pointed at a dead loopback port (connection refused at once: no real
network), DOCKER_HOST at a socket path that does not exist. Per-command counts are written to
``<basetemp>/hostile-counts.json`` and printed at the end (docs/hostile-inputs.md quotes them).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from imagekit.cli import build_app
from imagekit.in_image import imagekit_doctor
from tests import loopback

ROOT = Path(__file__).resolve().parents[2]
CELL = "cu121-torch2.1.2-py3.11-tf4.48.2"
DEAD = "http://127.0.0.1:9"  # the discard port: nothing listens, so a connection is refused at once
EXAMPLES = 80  # per command; the whole file (fast part) stays under two minutes on two cores
TIME_LIMIT_S = 60  # one invocation that runs longer than this is a hang (a FIFO read, a retry loop)

# ---- the commands and their options, from the app itself ---------------------------------------------------


@dataclass(frozen=True)
class Opt:
    flag: str  # "--out", or "" for a positional argument
    kind: str  # "bool", "int", "float", "path", "str"
    multiple: bool = False
    choices: tuple[str, ...] = ()


def _kind(annotation: object) -> str:
    text = str(annotation)  # "<class 'int'>", "pathlib.Path | None", "list[str] | None"
    for name, kind in (("'bool'", "bool"), ("'int'", "int"), ("'float'", "float"), ("Path", "path")):
        if name in text:
            return kind
    return "str"


def _param_kind(p) -> str:
    if getattr(p, "is_flag", False):
        return "bool"
    descriptor = getattr(p, "type_descriptor", None)  # typer >= 0.29; before, click's parameter types
    if descriptor is not None:
        return _kind(descriptor.annotation)
    by_name = {"integer": "int", "float": "float", "path": "path", "boolean": "bool"}
    return by_name.get(getattr(p.type, "name", ""), "str")


def _click_commands() -> dict[str, list[Opt]]:
    group = typer.main.get_command(build_app())
    found: dict[str, list[Opt]] = {}

    def walk(cmd, path: list[str]) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
            return
        opts = []
        for p in cmd.params:
            kind = _param_kind(p)
            flag = max(p.opts, key=len) if p.param_type_name == "option" else ""
            opts.append(Opt(flag, kind, bool(getattr(p, "multiple", False))))
        found[" ".join(path)] = opts

    walk(group, [])
    return found


def _doctor_options() -> list[Opt]:
    """`doctor` hands its words to the image's argparse parser: its options are that parser's."""
    opts = []
    for action in imagekit_doctor.parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue  # the positional launch command is never drawn: it would run whatever it names
        flag = max(action.option_strings, key=len)
        if action.nargs == 0:
            kind = "bool"
        elif action.type is float:
            kind = "float"
        elif action.dest in ("expect", "python", "path", "accelerate_config"):
            kind = "path"
        else:
            kind = "str"
        opts.append(Opt(flag, kind, action.__class__.__name__ == "_AppendAction", tuple(action.choices or ())))
    return opts


COMMANDS = _click_commands()
assert COMMANDS.pop("doctor") == [], "doctor takes its options from argparse"
COMMANDS["doctor"] = _doctor_options()

# What each command runs with when an option is not drawn: one cell, dead URLs, outputs in the sandbox.
BASELINE: dict[str, list[str]] = {
    "matrix": [],
    "explain": ["--cuda", "12.1", "--torch", "2.1.2"],
    "lock": [
        "--cell",
        CELL,
        "--dir",
        "lockfiles",
        "--index-url",
        f"{DEAD}/simple",
        "--torch-index-url",
        f"{DEAD}/whl",
        "--jobs",
        "1",
    ],
    "render": ["--cell", CELL, "--out", "build", "--lock-dir", "lockfiles"],
    "build": [
        "--cell",
        CELL,
        "--lock-dir",
        "lockfiles",
        "--state-dir",
        "state",
        "--release-index",
        "releases/index.json",
        "--index-url",
        f"{DEAD}/simple",
        "--torch-index-url",
        f"{DEAD}/whl",
        "--registry",
        "127.0.0.1:9/imagekit/train",
    ],
    "fetch": ["--cell", CELL, "--lock-dir", "lockfiles"],
    "init": ["--out", "imagekit.toml"],
    "runpod-template": [CELL, "--release-index", "releases/index.json", "--api-url", f"{DEAD}/graphql"],
    "vast-template": [CELL, "--release-index", "releases/index.json", "--api-url", f"{DEAD}/api/v0/template/"],
    "doctor": ["--tier", "quick", "--timeout", "20"],
    "base bootstrap": [],
    "compat refresh": ["--out", "meta.json", "--index", f"{DEAD}/simple"],
    "compat show": [],
    # `pod`: an SSH target on the dead port (refused at once), RunPod's API on it too
    "pod exec": ["root@127.0.0.1:9", "--key", "afile", "--timeout", "5", "--", "nvidia-smi"],
    "pod doctor": ["root@127.0.0.1:9", "--key", "afile", "--timeout", "5"],
    "pod run": ["root@127.0.0.1:9", "--key", "afile", "--", "python", "train.py"],
    "pod logs": ["root@127.0.0.1:9", "--key", "afile", "--run", "20261202T130501Z-42"],
    "pod wait": ["root@127.0.0.1:9", "--key", "afile", "--timeout", "5"],
    "pod cp": ["afile", "root@127.0.0.1:9:/workspace/afile", "--key", "afile"],
    "pod create": ["acell", "--gpu", "NVIDIA A100", "--release-index", "releases/index.json"],
    "pod start": ["abc123xyz456", "--api-url", f"{DEAD}/v2"],
    "pod stop": ["abc123xyz456", "--api-url", f"{DEAD}/v2"],
    "pod terminate": ["abc123xyz456", "--api-url", f"{DEAD}/v2"],
    "pod reap": ["--api-url", f"{DEAD}/v2", "--watch", "0s"],
    "release merge": ["adir", "--index", "releases/index.json"],  # an empty records folder: nothing to verify
    "release page": ["--release-index", "releases/index.json", "--out", "site"],
    "ci init": ["--out", "wf/images.yml"],
    "selftest": ["127.0.0.1:9/imagekit/train:" + CELL, "--gpus", "off"],  # no engine: exit 3
    "audit": [CELL, "--osv-db", "adir", "--lock-dir", "lockfiles", "--fail-on", "high"],  # no records: exit 2
    "sign": ["127.0.0.1:9/imagekit/train:" + CELL, "--key", "afile"],  # not a key: exit 2
    "verify": ["127.0.0.1:9/imagekit/train:" + CELL, "--key", "afile"],
    "prune": [],  # DOCKER_HOST is a dead socket: exit 3 (--dry-run and the other flags are drawn)
}
# Where each command may write (its named outputs); the sandbox's home and tmp are open to all.
OUTPUTS: dict[str, tuple[str, ...]] = {
    "lock": ("--dir",),
    "render": ("--out",),
    "build": ("--lock-dir", "--state-dir", "--release-index", "--release-records"),
    "release merge": ("--index",),
    "release page": ("--out",),
    "ci init": ("--out", "--wheel-dir"),
    "compat refresh": ("--out",),
    "init": ("--out",),
    "doctor": ("--path",),  # its writable-output check makes (and removes) a probe file there
}
DEFAULT_OUTPUTS = {
    ("lock", "--dir"): "lockfiles",
    ("render", "--out"): "build",
    ("build", "--lock-dir"): "lockfiles",
    ("build", "--state-dir"): ".imagekit",
    ("build", "--release-index"): "releases/index.json",
    ("build", "--release-records"): "releases/records",
    ("release merge", "--index"): "releases/index.json",
    ("release page", "--out"): "site",
    ("ci init", "--out"): ".github/workflows/images.yml",
    ("ci init", "--wheel-dir"): ".github/imagekit",
    ("init", "--out"): "imagekit.toml",
}

# ---- hostile values ----------------------------------------------------------------------------------------

TEXT = [
    "",
    " ",
    "\t",
    "\n",
    "a\nb",
    "\r\n",
    "\x1b[31mred",
    "\x07\x08\x7f",
    "\u202egnp.exe",
    "é",
    "\udcff\udcfe",  # what non-UTF-8 argv bytes become (surrogateescape)
    "\ufeff",
    "x" * 10_000,
    "1" * 10_000,
    "9" * 5000 + ".0",
    "-",
    "--",
    "--help",
    "-x",
    "$(touch pwned)",
    "`touch pwned`",
    "; touch pwned",
    "a|b&&c>out",
    "*",
    "'\"",
    "%s%n%x",
    "{{ 7*7 }}",
    "${HOME}",
    "~",
    "..",
    "../x",
    "../../x",
    "/dev/null",
    "/proc/none",
    "file:///etc/passwd",
    f"http://user:hunter2@{DEAD[7:]}/simple",
    "http://",
    "https://[::1",
    "ftp://127.0.0.1:9/x",
    f"{DEAD}/{'a' * 5000}",
    "127.0.0.1:9/a/b:tag",
    "127.0.0.1:9/a@sha256:" + "0" * 64,
    "a:b@sha256:zz",
]
NUMBERS = ["-1", "0", "nan", "-nan", "inf", "-inf", "1e309", "99999999999999999999999", "0x10", "1.5", " 1", "١"]
VERSIONS = ["0.0", "12.", "v2", "2.5.1 ", " 2.5.1", "2.5.1\n", "==2.5", "2..5", "1.2.3.4.5.6.7.8.9", "2.5.1+cu121"]
CUDA = ["cu", "cu1", "cu99999", "12", "12.4.1", "-12.4", "12,4", "CU124"]
DATES = ["nan", "-1", "2024-13-45", "P-3D", "yesterday", "2024-01-01T00:00:00+99:00", "0" * 5000]
# Files the sandbox holds: a file where a folder is wanted and back, a FIFO (a read would block), a dangling link,
# JSON of the wrong shape, and paths that climb out of the working folder (but stay in the sandbox).
PATHS = [
    "afile",
    "adir",
    "adir/",
    "fifo",
    "dangling",
    "missing/deeper/x",
    "notjson.json",
    "list.json",
    "wrongtypes.json",
    "empty.json",
    "afile/below",
    "../up",
    "../../up/x",
    "/dev/null",
    "/proc/none",
]


def _contained(text: str) -> str:
    """Drawn text never names a path outside the sandbox (we run as root: `--out /x` would write there)."""
    text = text.replace("\x00", "")  # argv cannot carry NUL
    if text.startswith(("/", "~")) or ".." in text:
        return "./" + text.replace("..", "_.").lstrip("/~")
    return text


random_text = st.text(min_size=0, max_size=40).map(_contained)


def _curated(opt: Opt) -> list[str]:
    name = opt.flag
    if opt.kind in ("int", "float"):
        return NUMBERS
    if opt.kind == "path":
        return [*PATHS, "x" * 300, *TEXT]  # TEXT has image references too: `doctor --expect` reads those
    extra: list[str] = list(opt.choices and [c.upper() for c in opt.choices] + [c + " " for c in opt.choices])
    if name in ("--torch", "--transformers", "--python", "--driver", ""):
        extra += VERSIONS
    if name in ("--cuda",):
        extra += VERSIONS + CUDA
    if "url" in name or name in ("--index", "--registry", "--repository"):
        extra += ["http://127.0.0.1:0/simple", "http://127.0.0.1:99999/simple", "HTTP://127.0.0.1:9/SIMPLE", "//x"]
    if name == "--exclude-newer":
        extra += DATES
    if name in ("--shard",):
        extra += ["0/0", "1/0", "-1/2", "2/1", "1/nan", "1/2/3", "a/b", "1/" + "9" * 5000]
    if name in ("--package", "--upgrade-package"):
        extra += ["a==1; python_version>'3'", "a @ file:///etc/passwd", "a[", "a==", "-e .", "--hash=sha256:00"]
    return TEXT + extra


def values_for(opt: Opt) -> st.SearchStrategy[str]:
    if opt.kind == "int":
        numbers = st.integers(min_value=-(2**70), max_value=2**70).map(str)
        return st.one_of(st.sampled_from(_curated(opt)), numbers, random_text)
    if opt.kind == "float":
        floats = st.floats(allow_nan=True, allow_infinity=True).map(repr)
        return st.one_of(st.sampled_from(_curated(opt)), floats, random_text)
    return st.one_of(st.sampled_from(_curated(opt)), random_text)


@st.composite
def invocations(draw: st.DrawFn, command: str) -> tuple[list[str], list[tuple[str, str]]]:
    """argv for ``command``: the baseline with 1-3 options replaced by hostile values, flags switched at random."""
    opts = COMMANDS[command]
    valued = [o for o in opts if o.kind != "bool"]
    flags = [o for o in opts if o.kind == "bool" and o.flag not in ("--help",)]
    chosen = (  # a command with flags only (`compat show --json`) runs its baseline with flags drawn
        draw(st.lists(st.sampled_from(valued), min_size=1, max_size=min(3, len(valued)), unique=True)) if valued else []
    )
    drawn: list[tuple[str, str]] = []
    overridden: dict[str, list[str]] = {}
    for opt in chosen:
        count = draw(st.integers(1, 2)) if opt.multiple else 1
        values = [draw(values_for(opt)) for _ in range(count)]
        overridden[opt.flag] = values
        drawn += [(opt.flag or "ARG", v) for v in values]
    argv = command.split()
    base = BASELINE[command]
    tail = base[base.index("--") :] if "--" in base else []  # `pod exec TARGET ... -- COMMAND`: kept last
    base = base[: len(base) - len(tail)]
    count = next((i for i, w in enumerate(base) if w.startswith("-")), len(base))
    positional = base[:count]
    pairs = _pairs(base[count:])
    positional = overridden.pop("", positional)
    for flag, value in pairs:
        if flag not in overridden:
            argv += [flag, value]
    for flag, values in overridden.items():
        for v in values:
            argv.append(f"{flag}={v}" if v.startswith("-") else flag)  # "--x=-1": a value, not an option
            if not v.startswith("-"):
                argv.append(v)
    for f in flags:
        if draw(st.booleans()):
            argv.append(f.flag)
    if positional:  # after "--", so "-x" is the argument's value and not an option
        argv += ["--", *positional] if any(p.startswith("-") for p in positional) else positional
    if tail:
        argv += tail[1:] if "--" in argv else tail
    return argv, drawn


def _pairs(words: list[str]) -> list[tuple[str, str]]:
    return list(zip(words[::2], words[1::2], strict=True))


# ---- the sandbox -------------------------------------------------------------------------------------------

ISOLATED_PREFIXES = ("IMAGEKIT_", "RUNPOD_", "DOCKER_", "HF_", "UV_", "PIP_", "XDG_", "REQUESTS_", "SSL_", "CURL_")
PROXIES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def _index_doc() -> dict:
    tag = f"ghcr.io/acme/train:{CELL}-0123456789ab"
    entry = {
        "tag": tag,
        "alias": tag.rsplit("-", 1)[0],
        "digest": "sha256:" + "a" * 64,
        "size_bytes": 5_318_482_994,
        "lock_hash": "b" * 64,
        "published_at": "2026-11-29T21:00:00Z",
        "selftest": {"passed": True},
        "manifest": {
            "cell": {"id": CELL, "torch": "2.1.2", "variant": "cu121", "transformers": "4.48.2", "python": "3.11"},
            "driver": {"minimum": "525.60.13"},
            "torch": {"archs": ["sm_80", "sm_90"]},
        },
    }
    return {"schema": 1, "images": {tag: entry}}


def make_sandbox(root: Path) -> tuple[Path, Path]:
    """sandbox/{home,tmp,w1/w2/work}; the command runs in work, so `../..` stays inside the sandbox."""
    work = root / "w1" / "w2" / "work"
    for d in (root / "home" / ".cache", root / "tmp", work / "adir", work / "lockfiles", work / "releases"):
        d.mkdir(parents=True)
    shutil.copy(ROOT / "lockfiles" / f"{CELL}.txt", work / "lockfiles")
    (work / "releases" / "index.json").write_text(json.dumps(_index_doc()))
    (work / "afile").write_text("not a folder\n")
    os.mkfifo(work / "fifo")
    (work / "dangling").symlink_to(work / "nowhere")
    (work / "notjson.json").write_text("{not json")
    (work / "list.json").write_text("[1, 2]")
    (work / "empty.json").write_text("")
    wrong = {"schema": "1", "images": {"t": {"tag": 5, "alias": [], "manifest": {"cell": {"id": 7}}}}}
    wrong["distributions"] = {"torch": 2.1, "numpy": ["1"], "x": None}
    (work / "wrongtypes.json").write_text(json.dumps(wrong))
    return root, work


def environment(sandbox: Path) -> dict[str, str | None]:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(ISOLATED_PREFIXES)}
    env.update(
        {
            "HOME": str(sandbox / "home"),
            "XDG_CACHE_HOME": str(sandbox / "home" / ".cache"),
            "XDG_CONFIG_HOME": str(sandbox / "home" / ".config"),
            "TMPDIR": str(sandbox / "tmp"),
            "DOCKER_HOST": f"unix://{sandbox}/dead.sock",
            "NO_PROXY": "",
            "no_proxy": "",
            "UV_HTTP_RETRIES": "0",
            "UV_NO_CONFIG": "1",
            "UV_PYTHON_DOWNLOADS": "never",
            "RUNPOD_API_KEY": "rp_hostile_test",
            "IMAGEKIT_REGISTRY_USER": "u",
            "IMAGEKIT_REGISTRY_PASSWORD": "p",
        }
    )
    env.update(dict.fromkeys(PROXIES, DEAD))
    return env


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root (links not followed, FIFOs not opened): type, size, mtime, mode."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st_ = os.lstat(p)
            seen[p] = (st_.st_mode, st_.st_size, st_.st_mtime_ns, st_.st_ino)
    return seen


class Hang(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def fire(*_: object) -> None:
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def inside(sandbox: Path, work: Path) -> Iterator[None]:
    old_tmp = tempfile.tempdir
    tempfile.tempdir = str(sandbox / "tmp")
    try:
        with contextlib.chdir(work):
            yield
    finally:
        tempfile.tempdir = old_tmp


APP = build_app()
COUNTS: dict[str, Counter] = {}


def run_hostile(command: str, argv: list[str], base: Path) -> str | None:
    """Run argv in a fresh sandbox; what broke one of the three promises, or None."""
    sandbox, work = make_sandbox(Path(tempfile.mkdtemp(dir=base)))
    before = snapshot(sandbox)
    shown = f"imagekit {' '.join(repr(a)[:80] for a in argv)}"
    try:
        with inside(sandbox, work), time_limit(TIME_LIMIT_S):
            res = CliRunner().invoke(APP, argv, env=environment(sandbox))
        exc = res.exception
        if exc is not None and not isinstance(exc, SystemExit):
            tb = "".join(traceback.format_exception(exc))
            return f"{shown}\nraised {type(exc).__name__}: {exc!s:.300}\n{tb[-2500:]}"
        output = res.output
        if "Traceback (most recent call last)" in output:
            return f"{shown}\nprinted a traceback\n{output[-2500:]}"
        if res.exit_code not in (0, 1, 2, 3):
            return f"{shown}\nexit {res.exit_code}\n{output[-2000:]}"
        allowed = [sandbox / "home", sandbox / "tmp", *named_outputs(command, argv, work)]
        after = snapshot(sandbox)
        changed = sorted(p for p in after.keys() | before.keys() if before.get(p) != after.get(p))
        stray = [p for p in changed if not any(_under(Path(p), a) for a in allowed) and not _parent_of(p, allowed)]
        if stray:
            return f"{shown}\nwrote outside its named output: {stray[:5]}\n{output[-1000:]}"
        return None
    finally:
        shutil.rmtree(sandbox, ignore_errors=True)


def _parent_of(path: str, outputs: list[Path]) -> bool:
    """A folder made (or its entries changed) on the way to a named output: `--out missing/deeper/x` makes two."""
    return os.path.isdir(path) and not os.path.islink(path) and any(_under(o, Path(path)) for o in outputs)


def _under(path: Path, top: Path) -> bool:
    path, top = Path(os.path.normpath(path)), Path(os.path.normpath(top))
    return path == top or top in path.parents


def named_outputs(command: str, argv: list[str], work: Path) -> list[Path]:
    found = []
    for flag in OUTPUTS.get(command, ()):
        values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
        values += [a.split("=", 1)[1] for a in argv if a.startswith(f"{flag}=")]
        default = DEFAULT_OUTPUTS.get((command, flag))
        for v in values or ([default] if default else []):
            p = work / v
            found += [p, p.parent / f".{p.name}.tmp"]  # atomic writes go through a sibling
            found += [p.parent / n for n in (f"{p.name}.tmp",)]
            if command == "ci init" and "--reap" in argv:  # the reaper's workflow, a file of its own beside it
                found += [p.parent / n for n in ("reap.yml", ".reap.yml.tmp", "reap.yml.tmp")]
    return found


@pytest.fixture(scope="module")
def hostile_base(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("hostile")

    def status() -> str | None:  # the repository itself must not change (None: not a git checkout)
        if not shutil.which("git") or not (ROOT / ".git").exists():
            return None
        return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout

    before = status()
    yield base
    assert status() == before, "the hostile runs changed the repository"
    rows = {cmd: dict(c) for cmd, c in sorted(COUNTS.items())}
    (tmp_path_factory.getbasetemp() / "hostile-counts.json").write_text(json.dumps(rows, indent=2) + "\n")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or not rows:
        return
    with capture.global_and_fixture_disabled():  # teardown output is captured otherwise
        reporter.write_line("")
        reporter.write_line("hostile CLI inputs: command | invocations | hostile values | options drawn/with a value")
        for cmd, c in rows.items():
            valued = sum(o.kind != "bool" for o in COMMANDS[cmd])
            reporter.write_line(
                f"  {cmd:<16} {c.get('invocations', 0):>4} {c.get('values', 0):>5} {c.get('options', 0):>3}/{valued}"
            )


def test_every_command_is_covered() -> None:
    """A command without a baseline would silently be left out of the property test."""
    assert set(COMMANDS) == set(BASELINE)
    assert len(COMMANDS) >= 10
    assert all(COMMANDS[c] for c in COMMANDS)


@pytest.mark.slow  # Hypothesis over every command: under a minute on two cores (the click command built once)
@pytest.mark.resolver  # a hostile value may still lock (against a dead index: uv refuses at once)
@pytest.mark.parametrize("command", sorted(BASELINE))
def test_hostile_values_fail_well(command: str, hostile_base: Path) -> None:
    counts = COUNTS.setdefault(command, Counter())
    options_seen: set[str] = set()

    @settings(
        derandomize=True,
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(invocations(command))
    def check(drawn: tuple[list[str], list[tuple[str, str]]]) -> None:
        argv, values = drawn
        counts["invocations"] += 1
        counts["values"] += len(values)
        options_seen.update(flag for flag, _ in values)
        counts["options"] = len(options_seen)
        problem = run_hostile(command, argv, hostile_base)
        assert problem is None, problem

    check()


def sweep(command: str) -> list[tuple[list[str], list[tuple[str, str]]]]:
    """Every curated hostile value in every option of ``command``, one at a time, on the baseline."""
    runs = []
    for opt in COMMANDS[command]:
        if opt.kind == "bool":
            continue
        for value in _curated(opt):
            argv = command.split()
            base = BASELINE[command]
            tail = base[base.index("--") + 1 :] if "--" in base else []
            base = base[: len(base) - len(tail) - (1 if tail else 0)]
            count = next((i for i, w in enumerate(base) if w.startswith("-")), len(base))
            positional = base[:count]
            pairs = [(f, v) for f, v in _pairs(base[count:]) if f != opt.flag]
            for f, v in pairs:
                argv += [f, v]
            if opt.flag:
                argv += [f"{opt.flag}={value}"]
            else:
                positional = [value]
            argv += ["--", *positional, *tail] if positional or tail else []
            runs.append((argv, [(opt.flag or "ARG", value)]))
    return runs


@pytest.mark.sweep
@pytest.mark.resolver
@pytest.mark.parametrize("command", sorted(BASELINE))
def test_sweep_every_curated_value(command: str, hostile_base: Path) -> None:
    """The exhaustive companion (minutes): each curated value in each option, all failures reported at once."""
    problems = [p for argv, _ in sweep(command) if (p := run_hostile(command, argv, hostile_base))]
    assert not problems, f"{len(problems)} failure(s):\n\n" + "\n\n".join(problems)


# ---- the named cases, by hand ------------------------------------------------------------------------------


@dataclass
class Box:
    sandbox: Path
    work: Path

    def run(self, *argv: str, proxies: bool = True) -> tuple[int, str]:
        """Run ``imagekit argv`` in the sandbox; a traceback or an uncaught exception fails the test here."""
        env = environment(self.sandbox)
        if not proxies:  # a real local server answers: reach it directly
            env.update(dict.fromkeys(PROXIES))
            env.update({"NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"})
        with inside(self.sandbox, self.work), time_limit(TIME_LIMIT_S):
            res = CliRunner().invoke(APP, list(argv), env=env)
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            pytest.fail("".join(traceback.format_exception(res.exception))[-3000:])
        assert "Traceback" not in res.output, res.output[-3000:]
        return res.exit_code, res.output

    def write(self, name: str, doc: object) -> str:
        (self.work / name).write_text(doc if isinstance(doc, str) else json.dumps(doc))
        return name


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(*make_sandbox(tmp_path / "sandbox"))


def _index_with(**changes: object) -> dict:
    doc = _index_doc()
    entry = next(iter(doc["images"].values()))
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        target = entry
        for key in path:
            target = target[key]
        target[last] = value
    return doc


BAD_INDEXES = {
    "top-level list": [1, 2],
    "images a list": {"schema": 1, "images": []},
    "entry a string": {"schema": 1, "images": {"t": "x"}},
    "tag a number": _index_with(tag=5),
    "tag not a reference": _index_with(tag="not a tag\n"),
    "alias a list": _index_with(alias=["a"]),
    "digest missing": _index_with(digest=None),
    "cell id a number": _index_with(manifest__cell__id=7),
    "cell a list": _index_with(manifest__cell=[]),
    "manifest a string": _index_with(manifest="m"),
    "size a string": _index_with(size_bytes="5 GB"),
    "size negative": _index_with(size_bytes=-1),
    "size nan": _index_with(size_bytes=float("nan")),
    "published_at a number": _index_with(published_at=3),
    "ports a string": _index_with(manifest__image={"ports": "22/tcp"}),
}


@pytest.mark.parametrize("name", sorted(BAD_INDEXES))
def test_runpod_template_refuses_a_release_index_of_wrong_types(box: Box, name: str) -> None:
    path = box.write("bad-index.json", BAD_INDEXES[name])
    code, out = box.run("runpod-template", CELL, "--release-index", path)
    assert code == 2 and "is not a release index" in out, out


@pytest.mark.parametrize("name", ["tag a number", "size nan", "top-level list"])
def test_build_refuses_a_broken_release_index_before_any_work(box: Box, name: str) -> None:
    path = box.write("bad-index.json", BAD_INDEXES[name])
    code, out = box.run("build", "--cell", CELL, "--release-index", path)
    assert code == 2 and "is not a release index" in out and "Docker" not in out, out


@pytest.mark.seconds
@pytest.mark.parametrize(
    "toml",
    [
        "[matrix]\ntorch = [2.1]\n",
        "[matrix]\ncuda = 12.4\n",
        "[matrix]\ntransformers = [['4.48.2']]\n",
        "[matrix]\npython = [3.11]\n",
        "[[matrix.include]]\ncuda = '12.4'\ntorch = 2.5\ntransformers = '4.48.2'\npython = '3.11'\n",
        f"[matrix]\ntorch = ['{'1' * 10_000}']\n",
        "[image]\nrepository = 5\n",
    ],
)
@pytest.mark.parametrize("command", ["matrix", "lock", "render", "build", "fetch"])
def test_a_matrix_of_wrong_types_is_a_usage_error(box: Box, command: str, toml: str) -> None:
    path = box.write("m.toml", toml)
    extra = ["--out", "o"] if command == "render" else []
    code, out = box.run(command, "--matrix", path, *extra)
    assert code == 2 and "error:" in out, out


WRONG_MANIFESTS = {
    "version a number": {"distributions": {"torch": 2.1}},
    "version a list": {"distributions": {"numpy": ["1.26.4"]}},
    "version null": {"distributions": {"numpy": None}},
    "distributions a list": {"distributions": ["torch==2.1.2"]},
    "distributions a string": {"distributions": "torch"},
    "cell a string": {"distributions": {"torch": "2.1.2"}, "cell": "x"},
    "python a list": {"distributions": {"torch": "2.1.2"}, "python": ["3.11"]},
    "10k-digit version": {"distributions": {"torch": "1" * 10_000}},
    "10k-char version": {"distributions": {"torch": "x" * 10_000}},
}


@pytest.mark.programs  # the doctor asks the environment's python
@pytest.mark.parametrize("name", sorted(WRONG_MANIFESTS))
def test_doctor_reports_a_manifest_of_wrong_types(box: Box, name: str) -> None:
    path = box.write("manifest.json", WRONG_MANIFESTS[name])
    code, out = box.run("doctor", "--tier", "quick", "--expect", path, "--json")
    assert code in (1, 3), out


@pytest.mark.programs
def test_doctor_reads_a_lockfile_with_a_10k_digit_pin(box: Box) -> None:
    path = box.write("lock.txt", f"torch=={'1' * 10_000} --hash=sha256:{'0' * 64}\n")
    code, out = box.run("doctor", "--tier", "quick", "--expect", path)
    assert code in (1, 3), out


@pytest.mark.parametrize("flag", ["--torch", "--transformers", "--cuda", "--python", "--driver"])
@pytest.mark.parametrize("value", ["1" * 10_000, "x" * 10_000, "1." * 5000])
def test_a_10k_character_version_is_a_short_usage_error(box: Box, flag: str, value: str) -> None:
    code, out = box.run("explain", flag, value)
    assert code == 2 and "error:" in out and len(out) < 2000, out[:500]


@pytest.mark.seconds
@pytest.mark.parametrize("command", ["lock", "render", "build", "fetch"])
def test_a_10k_character_selector_selects_nothing(box: Box, command: str) -> None:
    extra = ["--out", "o"] if command == "render" else []
    code, out = box.run(command, "--torch", "1" * 10_000, *extra)
    assert code == 2 and "no compatible cell" in out, out[:500]


FOLDER_IS_A_FILE = [
    ("render", "--out", "afile", ["--cell", CELL]),
    ("render", "--out", "dangling", ["--cell", CELL]),
    ("render", "--out", "afile", ["--cell", CELL, "--check"]),
    ("render", "--lock-dir", "afile", ["--cell", CELL, "--out", "o"]),
    ("lock", "--dir", "afile", ["--cell", CELL]),
    ("lock", "--dir", "afile/below", ["--cell", CELL, "--check"]),
    ("lock", "--dir", "fifo", ["--cell", CELL]),
    ("build", "--state-dir", "afile", ["--cell", CELL]),
    ("build", "--lock-dir", "afile", ["--cell", CELL]),
    ("build", "--release-index", "adir", ["--cell", CELL]),
    ("build", "--release-index", "fifo", ["--cell", CELL]),
    ("fetch", "--lock-dir", "afile", ["--cell", CELL]),
    ("compat refresh", "--out", "adir", ["--index", f"{DEAD}/simple"]),
    ("compat refresh", "--out", "afile/below", ["--index", f"{DEAD}/simple"]),
    ("compat refresh", "--out", "fifo", ["--index", f"{DEAD}/simple"]),
]


@pytest.mark.parametrize(("command", "flag", "value", "rest"), FOLDER_IS_A_FILE)
def test_outputs_of_the_wrong_kind_are_usage_errors(
    box: Box, command: str, flag: str, value: str, rest: list[str]
) -> None:
    code, out = box.run(*command.split(), flag, value, *rest)
    assert code == 2 and flag in out, out


NUMBERS_OUT_OF_RANGE = [
    *[("lock", "--jobs", v, ["--cell", CELL]) for v in ("0", "-1", "nan", "inf", "1e9", "65")],
    *[("runpod-template", "--volume-gb", v, [CELL]) for v in ("-5", "0", "nan", "inf", "-inf", "1e9", "10" * 20)],
    *[("doctor", "--timeout", v, []) for v in ("nan", "-nan", "-1", "0", "inf", "1e999", "86400")],
]


@pytest.mark.parametrize(("command", "flag", "value", "rest"), NUMBERS_OUT_OF_RANGE)
def test_nan_negative_and_huge_numbers_are_usage_errors(
    box: Box, command: str, flag: str, value: str, rest: list[str]
) -> None:
    code, out = box.run(command, *rest, f"{flag}={value}")
    assert code == 2, out


UNREADABLE = [
    ("matrix", "--matrix", "fifo", []),
    ("matrix", "--matrix", "dangling", []),
    ("matrix", "--matrix", "adir", []),
    ("matrix", "--matrix", "afile/below", []),
    ("matrix", "--matrix", "/dev/null", []),
    ("runpod-template", "--release-index", "fifo", [CELL]),
    ("runpod-template", "--release-index", "adir", [CELL]),
    ("runpod-template", "--release-index", "notjson.json", [CELL]),
    ("runpod-template", "--release-index", "empty.json", [CELL]),
    ("runpod-template", "--release-index", "/dev/null", [CELL]),
    ("vast-template", "--release-index", "fifo", [CELL]),
    ("vast-template", "--release-index", "notjson.json", [CELL]),
    ("vast-template", "--release-index", "/dev/null", [CELL]),
]


@pytest.mark.parametrize(("command", "flag", "value", "rest"), UNREADABLE)
def test_unreadable_inputs_are_usage_errors_without_blocking(
    box: Box, command: str, flag: str, value: str, rest: list[str]
) -> None:
    code, out = box.run(command, *rest, flag, value)
    assert code == 2 and ("error:" in out or "Invalid value" in out), out


@pytest.mark.parametrize("value", ["fifo", "adir", "dangling", "/dev/null"])
def test_doctor_does_not_block_on_an_expectation_that_is_not_a_file(box: Box, value: str) -> None:
    code, out = box.run("doctor", "--tier", "quick", "--expect", value)
    assert code == 2 and "cannot read" in out, out  # bad usage, whatever the checks say


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--exclude-newer", v) for v in ("nan", "-1", "2024-13-45", "yesterday", "3 days", "--help", "")]
    + [("--index-url", v) for v in ("", "file:///etc/passwd", "ftp://127.0.0.1:9/x", "http://", "\n")]
    + [("--resolver", "pip"), ("--upgrade-package", "a b")],
)
def test_lock_settings_are_checked_before_any_resolution(box: Box, flag: str, value: str) -> None:
    code, out = box.run("lock", "--cell", CELL, f"{flag}={value}")
    assert code == 2 and "error:" in out and "pins conflict" not in out, out


@pytest.mark.parametrize("value", ["", "file:///etc/passwd", "ftp://127.0.0.1:9/x", "//x", "http://a b"])
def test_bad_urls_for_refresh_and_runpod_are_usage_errors(box: Box, value: str) -> None:
    code, out = box.run("compat", "refresh", "--out", "m.json", f"--index={value}")
    assert code == 2, out
    code, out = box.run("runpod-template", CELL, "--create", f"--api-url={value}")
    assert code == 2, out
    code, out = box.run("vast-template", CELL, "--create", f"--api-url={value}")
    assert code == 2, out


# ---- indexes and APIs that answer, but not as they should: a real local server -----------------------------


class _Answers(http.server.BaseHTTPRequestHandler):
    mode = "401"

    def _answer(self) -> None:
        if self.mode in ("401", "403", "500"):
            self.send_response(int(self.mode))
            self.send_header("WWW-Authenticate", 'Basic realm="index"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = {
            "html": b"<html><body>a login page</body></html>",
            "shape": b'{"files": 5, "name": 3}',
            "list": b"[1, 2, 3]",
        }[self.mode]
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[Callable[[str], str]]:
    servers = []

    def start(mode: str) -> str:
        handler = type("Handler", (_Answers,), {"mode": mode})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        loopback.start(server)
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for s in servers:
        loopback.stop(s)


@pytest.mark.resolver
@pytest.mark.parametrize("mode", ["401", "403", "html", "shape"])
def test_an_index_that_refuses_or_garbles_is_an_environment_failure(box: Box, answering, mode: str) -> None:
    """Exit 3, not 1: a 401 or a login page says nothing about the pins."""
    url = answering(mode)
    (box.work / "lockfiles" / f"{CELL}.txt").unlink()
    code, out = box.run(
        "lock", "--cell", CELL, "--index-url", f"{url}/simple", "--torch-index-url", f"{url}/whl", proxies=False
    )
    assert code == 3 and "pins conflict" not in out, out
    code, out = box.run("compat", "refresh", "--out", "m.json", "--index", f"{url}/simple", proxies=False)
    assert code == 3, out
    assert not (box.work / "m.json").exists()


@pytest.mark.parametrize("mode", ["html", "list"])
def test_runpod_create_against_an_api_answering_garbage(box: Box, answering, mode: str) -> None:
    url = answering(mode)
    code, out = box.run("runpod-template", CELL, "--create", "--api-url", f"{url}/graphql", proxies=False)
    assert code == 3, out


@pytest.mark.parametrize("repo", ["$(touch pwned)", "a b", "org/../../etc", "org/name?x=1", "/org", "", "a/b/c/d"])
def test_doctor_refuses_an_hf_repo_that_is_not_a_repo_id(box: Box, repo: str) -> None:
    code, out = box.run("doctor", "--deep", "--timeout", "20", f"--hf-repo={repo}")
    assert code == 2 and "--hf-repo" in out, out


@pytest.mark.seconds
@pytest.mark.parametrize("ref", ["127.0.0.1:9/imagekit/train:cell", "localhost:9/a@sha256:" + "0" * 64])
def test_doctor_expect_an_image_on_an_unreachable_registry_is_exit_3(box: Box, ref: str) -> None:
    code, out = box.run("doctor", "--tier", "quick", "--expect", ref)
    assert code == 3 and "error:" in out, out


@pytest.mark.parametrize(
    "mode",
    [
        "401",
        "500",
        "html",
        "list",
    ],
)
def test_doctor_expect_an_image_on_a_registry_answering_garbage(box: Box, answering, mode: str) -> None:
    host = answering(mode).removeprefix("http://")
    code, out = box.run("doctor", "--tier", "quick", "--expect", f"{host}/imagekit/train:cell", proxies=False)
    assert code in (2, 3) and "error:" in out, out


@pytest.mark.parametrize("flag", ["--path", "--hf-repo", "--expect", "--python", "--accelerate-config"])
def test_doctor_option_given_a_bare_double_dash(box: Box, flag: str) -> None:
    """argparse turns `--path=--` into an empty list; the doctor says so instead of failing on it later."""
    code, out = box.run("doctor", "--tier", "quick", "--timeout", "20", f"{flag}=--")
    assert code == 2 and flag in out, out
