"""`pod run`'s launch check: before a run starts, the image's own doctor checks the launch on the pod, over the same
connection, as ``imagekit-doctor -- CMD`` does before it launches (``--no-launch``: checked, not started). A blocker
(an Accelerate config's ``num_processes`` above the GPUs present, drift from the lock, no GPU where one is required)
refuses the run before it can hang or crawl at GPU rates; nothing is started on the pod.

What cannot be checked is said, and the run starts: a pod with no ``imagekit-doctor`` (not an imagekit image: it has
no pinned environment to check against, and `pod run` starts commands on any pod, as `pod exec` does), an image whose
doctor predates ``--no-launch``, a check that could not finish. The doctor's report is untrusted text from the pod.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from imagekit.effects.ssh.ssh_transport import Transport
from imagekit.errors import CheckFailed
from imagekit.trust import untrusted

CHECK_SECONDS = 100  # the quick tier takes about 2 s (nvidia-smi, the interpreter's packages); a hung one is cut here
NO_DOCTOR = "IMAGEKIT-NO-DOCTOR"
SKIP_HINT = "pass --skip-launch-check to start it anyway"
_SEPARATOR = re.compile(r"[();<>|&\n]+")  # what ends a simple command in the shell
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.S)
_LAUNCHERS = ("accelerate", "torchrun")
_SHELLS = ("bash", "sh", "dash", "zsh")


@dataclass(frozen=True)
class Verdict:
    blockers: list[str] = field(default_factory=list)  # "id: message (fix: ...)", printable
    warnings: list[str] = field(default_factory=list)  # what to say while the run starts anyway
    checked: bool = True  # False: the launch could not be checked (warnings say why)


def launch_words(command: str, depth: int = 0) -> list[str]:
    """The launch in ``command`` as the doctor reads one (``accelerate launch ...``, ``torchrun ...``): the first
    simple command that runs a launcher, its leading ``VAR=value`` words left out; else the first that runs a shell
    script (``bash train.sh``, ``./train.sh``: the doctor reads the script for the launch it runs), or the launch in a
    ``bash -c "..."`` string. [] when there is none (the doctor then checks the default Accelerate config, as
    ``imagekit-doctor -- python train.py`` does)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: the pod's shell refuses it too
        return []
    segment: list[str] = []
    script: list[str] = []
    for token in [*tokens, ";"]:
        if not _SEPARATOR.fullmatch(token):
            segment.append(token)
            continue
        while segment and _ASSIGNMENT.fullmatch(segment[0]):
            segment.pop(0)
        if any(w.rsplit("/", 1)[-1] in _LAUNCHERS or w == "torch.distributed.run" for w in segment[:4]):
            return segment
        inner = _shell_string(segment)
        if inner is not None and depth < 2:
            found = launch_words(inner, depth + 1)
            if found:
                return found
        elif not script and _runs_script(segment):
            script = segment
        segment = []
    return script


def _shell_string(words: list[str]) -> str | None:
    """The string of ``bash -c STRING`` (or sh, dash, zsh), else None."""
    if words and words[0].rsplit("/", 1)[-1] in _SHELLS and "-c" in words[1:3]:
        at = words.index("-c")
        return words[at + 1] if at + 1 < len(words) else None
    return None


def _runs_script(words: list[str]) -> bool:
    """Does the simple command ``words`` run a shell script (``bash train.sh``, ``sh -x run.sh``, ``./train.sh``)?"""
    if not words:
        return False
    if words[0].rsplit("/", 1)[-1] in _SHELLS:
        return any(not w.startswith("-") for w in words[1:])
    return words[0].endswith(".sh")


def script(words: list[str]) -> str:
    """The pod's side: the image's doctor, quick tier (the start check already probed torch), its report as JSON on
    stdout, bounded in time; ``NO_DOCTOR`` where there is none."""
    doctor = "imagekit-doctor --tier quick --json --no-launch" + (f" -- {shlex.join(words)}" if words else "")
    return (
        "if command -v imagekit-doctor >/dev/null 2>&1; then "
        f"if command -v timeout >/dev/null 2>&1; then timeout -k 5 {CHECK_SECONDS} {doctor} 2>/dev/null; "
        f"else {doctor} 2>/dev/null; fi; else echo {NO_DOCTOR}; fi"
    )


def _report(out: str) -> list[dict]:
    """The doctor's checks from its JSON report (what precedes the first ``{`` line is left out); [] if unreadable."""
    start = out.find("{")
    try:
        doc = untrusted.load_json(out[start:] if start >= 0 else "", "the launch check's report")
    except ValueError:
        return []
    checks = doc.get("checks") if isinstance(doc, dict) else None
    return [c for c in checks if isinstance(c, dict)] if isinstance(checks, list) else []


def _line(check: dict) -> str:
    text = f"{check.get('id')}: {check.get('message')}"
    if check.get("fix"):
        text += f" (fix: {check.get('fix')})"
    return untrusted.printable(text, 600)


def judge(code: int, out: str) -> Verdict:
    """What the doctor's exit code and report mean for the run (its exit codes: 0 ok, 1 a blocker, 2 bad usage,
    3 a check could not run; 124/137 from ``timeout``)."""
    if NO_DOCTOR in out and code == 0:
        why = "the pod has no imagekit-doctor (not an imagekit image?): the launch was not checked"
        return Verdict(warnings=[f"{why}; `imagekit pod doctor TARGET` checks the pod"], checked=False)
    checks = _report(out)
    warned = [_line(c) for c in checks if c.get("status") == "warn"][:6]
    if code == 1:
        found = [_line(c) for c in checks if c.get("status") == "fail"][:8]
        return Verdict(blockers=found or ["a blocker (its report could not be read)"], warnings=warned)
    if code == 0:
        return Verdict(warnings=warned)
    if code == 2:
        why = "this image's imagekit-doctor predates --no-launch (it cannot check a launch without starting it)"
        hint = "rebuild the image, or check first: imagekit pod exec TARGET -- imagekit-doctor"
        return Verdict(warnings=[f"{why}: the launch was not checked; {hint}"], checked=False)
    errors = [_line(c) for c in checks if c.get("status") == "error"][:4]
    why = f"did not finish in {CHECK_SECONDS} s" if code in (124, 137) else f"could not run every check (exit {code})"
    found = "; ".join(errors) or "no report"
    return Verdict(warnings=[f"the check {why} ({found}): the launch was not checked"], checked=False)


def enforce(t: Transport, command: str, warn: Callable[[str], None], ignore_blockers: bool = False) -> Verdict:
    """Check the launch of ``command`` on the pod; a blocker refuses (:class:`CheckFailed`, exit 1) unless
    ``ignore_blockers`` (then it is said and the run starts)."""
    code, out = t.capture(script(launch_words(command)), CHECK_SECONDS + 30.0)
    verdict = judge(code, out)
    for text in verdict.warnings:
        warn(f"warning: launch check: {text}")
    if verdict.blockers and not ignore_blockers:
        found = "\n".join(f"  {b}" for b in verdict.blockers)
        raise CheckFailed(
            f"the launch check found {len(verdict.blockers)} blocker(s); nothing was started on the pod:\n{found}",
            f"fix it and run again, or {SKIP_HINT} (imagekit pod doctor TARGET shows every check)",
        )
    if verdict.blockers:
        warn("warning: launch check: starting anyway (--ignore-blockers): " + "; ".join(verdict.blockers))
    return verdict
