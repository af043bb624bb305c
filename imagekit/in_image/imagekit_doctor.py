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
import shutil
import sys
import time

if __package__:  # imported from the host's package, imagekit.in_image
    from . import doctor_expect, doctor_gpu, doctor_hub, doctor_launch, doctor_python, nofollow
    from .doctor_expect import CLAUSE as CLAUSE
    from .doctor_expect import MAX_FILE as MAX_FILE
    from .doctor_expect import MAX_JSON_DEPTH as MAX_JSON_DEPTH
    from .doctor_expect import MAX_JSON_DIGITS as MAX_JSON_DIGITS
    from .doctor_expect import PRE as PRE
    from .doctor_expect import REQUIREMENT as REQUIREMENT
    from .doctor_expect import VERSION as VERSION
    from .doctor_expect import check_requirements as check_requirements
    from .doctor_expect import expectation_checks as expectation_checks
    from .doctor_expect import load_expectation as load_expectation
    from .doctor_expect import load_json as load_json
    from .doctor_expect import manifest_problem as manifest_problem
    from .doctor_expect import parse_requirements as parse_requirements
    from .doctor_expect import parse_version as parse_version
    from .doctor_expect import read_regular as read_regular
    from .doctor_expect import result as result
    from .doctor_expect import version_satisfies as version_satisfies
    from .doctor_gpu import CUDA_CAUSES as CUDA_CAUSES
    from .doctor_gpu import HIDING_CVD as HIDING_CVD
    from .doctor_gpu import MACHINES as MACHINES
    from .doctor_gpu import SMI_FAILURES as SMI_FAILURES
    from .doctor_gpu import TORCH_PROBE as TORCH_PROBE
    from .doctor_gpu import arch_runs as arch_runs
    from .doctor_gpu import check_gpus as check_gpus
    from .doctor_gpu import check_host_contract as check_host_contract
    from .doctor_gpu import check_torch_probe as check_torch_probe
    from .doctor_gpu import classify_cuda_failure as classify_cuda_failure
    from .doctor_gpu import classify_smi_failure as classify_smi_failure
    from .doctor_gpu import gpu_checks as gpu_checks
    from .doctor_gpu import parse_smi_query as parse_smi_query
    from .doctor_gpu import probe_checks as probe_checks
    from .doctor_gpu import probe_problem as probe_problem
    from .doctor_gpu import query_gpus as query_gpus
    from .doctor_gpu import runtime_contract as runtime_contract
    from .doctor_gpu import start_torch_probe as start_torch_probe
    from .doctor_gpu import usable_gpu_count as usable_gpu_count
    from .doctor_gpu import version_key as version_key
    from .doctor_hub import HF_REPO_ID as HF_REPO_ID
    from .doctor_hub import _hub_get as _hub_get
    from .doctor_hub import check_hf_repo as check_hf_repo
    from .doctor_hub import classify_hf_403 as classify_hf_403
    from .doctor_hub import hf_token as hf_token
    from .doctor_hub import hub_checks as hub_checks
    from .doctor_launch import EPHEMERAL_FS as EPHEMERAL_FS
    from .doctor_launch import LAUNCHERS as LAUNCHERS
    from .doctor_launch import MAX_SCRIPT as MAX_SCRIPT
    from .doctor_launch import SHELLS as SHELLS
    from .doctor_launch import UNKNOWN as UNKNOWN
    from .doctor_launch import check_accelerate as check_accelerate
    from .doctor_launch import check_disk as check_disk
    from .doctor_launch import check_paths as check_paths
    from .doctor_launch import check_shm as check_shm
    from .doctor_launch import check_writable as check_writable
    from .doctor_launch import detect_provider as detect_provider
    from .doctor_launch import existing_parent as existing_parent
    from .doctor_launch import find_accelerate_config as find_accelerate_config
    from .doctor_launch import hf_home as hf_home
    from .doctor_launch import launch_checks as launch_checks
    from .doctor_launch import launch_options as launch_options
    from .doctor_launch import mount_of as mount_of
    from .doctor_launch import parse_flat_config as parse_flat_config
    from .doctor_launch import parse_mountinfo as parse_mountinfo
    from .doctor_launch import path_checks as path_checks
    from .doctor_launch import provider_checks as provider_checks
    from .doctor_launch import script_launch as script_launch
    from .doctor_python import ENV_DUMP as ENV_DUMP
    from .doctor_python import check_apt as check_apt
    from .doctor_python import check_drift as check_drift
    from .doctor_python import check_interpreter_identity as check_interpreter_identity
    from .doctor_python import check_shadowing as check_shadowing
    from .doctor_python import describe_interpreter as describe_interpreter
    from .doctor_python import interpreter_checks as interpreter_checks
    from .doctor_python import interpreter_shape as interpreter_shape
else:  # a program in the image, or sent to a pod: its sibling modules (facts.py, nofollow.py) lie beside it
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import doctor_expect
    import doctor_gpu
    import doctor_hub
    import doctor_launch
    import doctor_python
    import nofollow
    from doctor_expect import CLAUSE as CLAUSE
    from doctor_expect import MAX_FILE as MAX_FILE
    from doctor_expect import MAX_JSON_DEPTH as MAX_JSON_DEPTH
    from doctor_expect import MAX_JSON_DIGITS as MAX_JSON_DIGITS
    from doctor_expect import PRE as PRE
    from doctor_expect import REQUIREMENT as REQUIREMENT
    from doctor_expect import VERSION as VERSION
    from doctor_expect import check_requirements as check_requirements
    from doctor_expect import expectation_checks as expectation_checks
    from doctor_expect import load_expectation as load_expectation
    from doctor_expect import load_json as load_json
    from doctor_expect import manifest_problem as manifest_problem
    from doctor_expect import parse_requirements as parse_requirements
    from doctor_expect import parse_version as parse_version
    from doctor_expect import read_regular as read_regular
    from doctor_expect import result as result
    from doctor_expect import version_satisfies as version_satisfies
    from doctor_gpu import CUDA_CAUSES as CUDA_CAUSES
    from doctor_gpu import HIDING_CVD as HIDING_CVD
    from doctor_gpu import MACHINES as MACHINES
    from doctor_gpu import SMI_FAILURES as SMI_FAILURES
    from doctor_gpu import TORCH_PROBE as TORCH_PROBE
    from doctor_gpu import arch_runs as arch_runs
    from doctor_gpu import check_gpus as check_gpus
    from doctor_gpu import check_host_contract as check_host_contract
    from doctor_gpu import check_torch_probe as check_torch_probe
    from doctor_gpu import classify_cuda_failure as classify_cuda_failure
    from doctor_gpu import classify_smi_failure as classify_smi_failure
    from doctor_gpu import gpu_checks as gpu_checks
    from doctor_gpu import parse_smi_query as parse_smi_query
    from doctor_gpu import probe_checks as probe_checks
    from doctor_gpu import probe_problem as probe_problem
    from doctor_gpu import query_gpus as query_gpus
    from doctor_gpu import runtime_contract as runtime_contract
    from doctor_gpu import start_torch_probe as start_torch_probe
    from doctor_gpu import usable_gpu_count as usable_gpu_count
    from doctor_gpu import version_key as version_key
    from doctor_hub import HF_REPO_ID as HF_REPO_ID
    from doctor_hub import _hub_get as _hub_get
    from doctor_hub import check_hf_repo as check_hf_repo
    from doctor_hub import classify_hf_403 as classify_hf_403
    from doctor_hub import hf_token as hf_token
    from doctor_hub import hub_checks as hub_checks
    from doctor_launch import EPHEMERAL_FS as EPHEMERAL_FS
    from doctor_launch import LAUNCHERS as LAUNCHERS
    from doctor_launch import MAX_SCRIPT as MAX_SCRIPT
    from doctor_launch import SHELLS as SHELLS
    from doctor_launch import UNKNOWN as UNKNOWN
    from doctor_launch import check_accelerate as check_accelerate
    from doctor_launch import check_disk as check_disk
    from doctor_launch import check_paths as check_paths
    from doctor_launch import check_shm as check_shm
    from doctor_launch import check_writable as check_writable
    from doctor_launch import detect_provider as detect_provider
    from doctor_launch import existing_parent as existing_parent
    from doctor_launch import find_accelerate_config as find_accelerate_config
    from doctor_launch import hf_home as hf_home
    from doctor_launch import launch_checks as launch_checks
    from doctor_launch import launch_options as launch_options
    from doctor_launch import mount_of as mount_of
    from doctor_launch import parse_flat_config as parse_flat_config
    from doctor_launch import parse_mountinfo as parse_mountinfo
    from doctor_launch import path_checks as path_checks
    from doctor_launch import provider_checks as provider_checks
    from doctor_launch import script_launch as script_launch
    from doctor_python import ENV_DUMP as ENV_DUMP
    from doctor_python import check_apt as check_apt
    from doctor_python import check_drift as check_drift
    from doctor_python import check_interpreter_identity as check_interpreter_identity
    from doctor_python import check_shadowing as check_shadowing
    from doctor_python import describe_interpreter as describe_interpreter
    from doctor_python import interpreter_checks as interpreter_checks
    from doctor_python import interpreter_shape as interpreter_shape

DEFAULT_MANIFEST = "/etc/imagekit/manifest.json"
TIERS = ("quick", "start", "standard", "deep")


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


class Context:
    """What the checks share, found once: the expectation (its check results too), the interpreter a training command
    would run, the GPUs nvidia-smi lists, whether a GPU is required, the torch probe started now so it runs while the
    other checks do."""

    def __init__(self, args):
        self.args, self.manifest, self.expected = args, None, []
        expect = args.expect or (DEFAULT_MANIFEST if os.path.isfile(DEFAULT_MANIFEST) else None)
        if expect:
            try:
                self.manifest = load_expectation(expect)
                count = len(self.manifest.get("distributions") or self.manifest.get("requirements") or ())
                self.expected.append(result("manifest", "pass", f"expecting {expect}", "",
                                            {"cell": (self.manifest.get("cell") or {}).get("id"), "count": count}))
            except (OSError, ValueError) as exc:
                self.expected.append(result("manifest", "error", f"cannot read {expect}: {exc}", "pass --expect FILE"))
        else:
            self.expected.append(result("manifest", "warn", f"no manifest at {DEFAULT_MANIFEST} and no --expect",
                                        "pass --expect MANIFEST_OR_LOCKFILE to check drift"))
        self.python, chosen_by = choose_python(args.python, self.manifest)
        self.expected.append(result("python", "pass", f"checking {self.python} ({chosen_by})", "",
                                    {"python": self.python, "chosen_by": chosen_by}))
        self.in_image = self.manifest is not None and expect == DEFAULT_MANIFEST
        self.gpu_state = query_gpus()
        self.gpu_results = []
        self.require_gpu = args.require_gpu or os.environ.get("IMAGEKIT_REQUIRE_GPU") == "1"
        gpu_expected = self.require_gpu or bool(self.gpu_state[0])
        probing = args.tier in ("standard", "deep") or (args.tier == "start" and gpu_expected)
        self.probe_proc = start_torch_probe(self.python) if probing else None


ALL = TIERS
# The doctor's checks, in the order the report lists them: (name, the tiers it runs in, the check: Context -> the
# results it adds). A new check is a function in the module of its domain (doctor_<domain>.py) and a line here.
CHECKS = (
    ("expectation", ALL, doctor_expect.expectation_checks),
    ("interpreter", ALL, doctor_python.interpreter_checks),
    ("gpus", ALL, doctor_gpu.gpu_checks),
    ("provider", ALL, doctor_launch.provider_checks),
    ("launch", ALL, doctor_launch.launch_checks),
    ("paths", ALL, doctor_launch.path_checks),
    ("torch-probe", ALL, doctor_gpu.probe_checks),  # only where the probe was started (Context)
    ("hub", ("deep",), doctor_hub.hub_checks),
)


def run_checks(args):
    """Every check of the registry the tier runs, over one Context."""
    ctx, checks = Context(args), []
    for _name, tiers, check in CHECKS:
        if args.tier in tiers:
            checks += check(ctx)
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
