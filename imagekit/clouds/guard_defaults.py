"""The lifetime guard every imagekit pod gets unless asked not to (pure): the env `pod create` and each provider's
template write, what they say is armed, and the marks `imagekit pod reap` finds imagekit's pods by.

Defaults always *stop* (the volume survives): idle for ``IDLE_STOP``, a process holding GPU memory with nothing else
moving for ``HUNG_STOP``, a start-check blocker still there after ``BLOCKER_GRACE``, the pod done (every job and `pod
run` ended and nothing happened for the exit grace, ``EXIT_GRACE``) with its declared outputs checksummed. Terminate
only when the user says so; after a failed exit only with ``terminate-always``. A deadline is offered
(``--deadline``), never defaulted: instead ``worst_case`` says how long, at most, the armed triggers let a pod bill
after its last work. The names and values are the guard's own (`in_image/guard.py` reads them; durations through
`facts.parse_duration`, the same parser).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from imagekit.errors import UsageError
from imagekit.in_image import facts

# 45m: longer than the stretches of real work that show no sign the guard reads (a download, a pip install or a
# checkpoint upload left running with nohup or tmux instead of `pod run`: 10-30 minutes), short enough that a pod
# forgotten after the work is billed well under an hour ($0.33 on a $0.44/h 3090) instead of a night.
IDLE_STOP = "45m"
# 20m: time to read the login banner, look around and fix or copy out, before a blocked pod (no GPU, a driver too
# old: it cannot train) stops billing.
BLOCKER_GRACE = "20m"
# 60m: a process holding GPU memory while every GPU is at 0 % and nothing on the pod moves (no CPU, no writes, no input)
# is hung (a deadlocked NCCL collective, a dead data-loader peer): longer than any pause real work makes with the
# GPUs idle and nothing else happening, short enough to bill at most an hour of a hang instead of a night.
HUNG_STOP = "60m"
# The guard's own (in_image/guard.py EXIT_GRACE, why there): the pod stays up that long after the last run ended.
EXIT_GRACE = "10m"
LOOK = 30  # seconds between the guard's looks (IMAGEKIT_GUARD_INTERVAL's default): a trigger fires up to one late
ACTIONS = ("stop", "terminate")
ON_EXIT = ("stop", "terminate", "terminate-always")  # terminate: after a successful exit only
OFF = "off"
NAME_PREFIX = "imagekit "  # the template's and the pod's name: `imagekit CELL`
CREATED = "IMAGEKIT_CREATED"  # UTC time `pod create` sent the request: the mark `pod reap` finds its pods by
DEADLINE = "IMAGEKIT_DEADLINE"  # UTC time past which `pod reap` ends the pod (from --deadline)
GUARD_NAMES = (
    "IMAGEKIT_MAX_RUNTIME", "IMAGEKIT_IDLE_STOP", "IMAGEKIT_ON_BLOCKER", "IMAGEKIT_BLOCKER_GRACE", "IMAGEKIT_ON_EXIT",
    "IMAGEKIT_GPU_IDLE_STOP", "IMAGEKIT_GUARD_ACTION", "IMAGEKIT_HUNG_STOP", "IMAGEKIT_EXIT_GRACE",
)  # fmt: skip


@dataclass(frozen=True)
class GuardChoice:
    """What the user asked of the guard; None: the default (for ``deadline`` and ``gpu_idle_stop``: not armed)."""

    no_guard: bool = False  # arm nothing by default (what is given below is still armed)
    deadline: str | None = None  # a duration: the guard stops the pod that long after it started
    idle_stop: str | None = None  # a duration, or "off"
    on_blocker: str | None = None  # stop | terminate | off
    blocker_grace: str | None = None  # a duration
    on_exit: str | None = None  # stop | terminate | terminate-always | off
    gpu_idle_stop: str | None = None  # a duration
    action: str | None = None  # what the deadline and the idle stop do: stop | terminate
    hung_stop: str | None = None  # a duration, or "off"
    exit_grace: str | None = None  # a duration


def _duration(flag: str, value: str) -> str:
    try:
        facts.parse_duration(value.strip(), flag)
    except facts.SettingError as exc:
        raise UsageError(str(exc), f"for example {flag} 45m (90s, 30m, 6h, 1d; off turns it off)") from None
    return value.strip()


def _one_of(flag: str, value: str, allowed: tuple[str, ...], hint: str) -> str:
    if value not in allowed:
        raise UsageError(f"{flag} {value[:40]!r}: {' or '.join(allowed)}", hint)
    return value


def env(choice: GuardChoice) -> dict[str, str]:
    """The guard's env for ``choice``: the defaults unless ``no_guard``, each flag given over them ("off" drops one)."""
    default = not choice.no_guard
    out: dict[str, str] = {}
    if choice.deadline is not None:
        out["IMAGEKIT_MAX_RUNTIME"] = _duration("--deadline", choice.deadline)
    idle = choice.idle_stop if choice.idle_stop is not None else (IDLE_STOP if default else OFF)
    if idle != OFF:
        out["IMAGEKIT_IDLE_STOP"] = _duration("--idle-stop", idle)
    blocker = choice.on_blocker if choice.on_blocker is not None else ("stop" if default else OFF)
    if blocker != OFF:
        out["IMAGEKIT_ON_BLOCKER"] = _one_of(
            "--on-blocker", blocker, (*ACTIONS, OFF), "stop keeps the volume; terminate deletes it; off: stays up"
        )
        out["IMAGEKIT_BLOCKER_GRACE"] = _duration("--blocker-grace", choice.blocker_grace or BLOCKER_GRACE)
    exit_ = choice.on_exit if choice.on_exit is not None else ("stop" if default else OFF)
    if exit_ != OFF:
        out["IMAGEKIT_ON_EXIT"] = _one_of(
            "--on-exit",
            exit_,
            (*ON_EXIT, OFF),
            "stop keeps the volume; terminate deletes it after a successful exit only (a failed one stops); "
            "terminate-always deletes it after any exit; off: stays up",
        )
        if choice.exit_grace is not None:
            out["IMAGEKIT_EXIT_GRACE"] = _duration("--exit-grace", choice.exit_grace)
    hung = choice.hung_stop if choice.hung_stop is not None else (HUNG_STOP if default else OFF)
    if hung != OFF:
        out["IMAGEKIT_HUNG_STOP"] = _duration("--hung-stop", hung)
    if choice.gpu_idle_stop is not None:
        out["IMAGEKIT_GPU_IDLE_STOP"] = _duration("--gpu-idle-stop", choice.gpu_idle_stop)
    if choice.action is not None:
        out["IMAGEKIT_GUARD_ACTION"] = _one_of(
            "--guard-action", choice.action, ACTIONS, "what the deadline and the idle stop do; stop keeps the volume"
        )
    elif any(
        k in out for k in ("IMAGEKIT_MAX_RUNTIME", "IMAGEKIT_IDLE_STOP", "IMAGEKIT_GPU_IDLE_STOP", "IMAGEKIT_HUNG_STOP")
    ):
        out["IMAGEKIT_GUARD_ACTION"] = "stop"  # said, not left to the image's default
    return out


def armed(guard: dict[str, str]) -> list[str]:
    """What ``guard`` (the env above) arms, one phrase each, as the readme and `pod create` say it."""
    said = []
    action = guard.get("IMAGEKIT_GUARD_ACTION", "stop")
    if "IMAGEKIT_MAX_RUNTIME" in guard:
        said.append(f"{action} {guard['IMAGEKIT_MAX_RUNTIME']} after the start (IMAGEKIT_MAX_RUNTIME)")
    if "IMAGEKIT_IDLE_STOP" in guard:
        said.append(f"{action} after {guard['IMAGEKIT_IDLE_STOP']} idle (IMAGEKIT_IDLE_STOP)")
    if "IMAGEKIT_HUNG_STOP" in guard:
        said.append(
            f"{action} after {guard['IMAGEKIT_HUNG_STOP']} of a process holding GPU memory while nothing moves "
            "(IMAGEKIT_HUNG_STOP)"
        )
    if "IMAGEKIT_ON_BLOCKER" in guard:
        said.append(
            f"{guard['IMAGEKIT_ON_BLOCKER']} when a start-check blocker is still there after "
            f"{guard.get('IMAGEKIT_BLOCKER_GRACE', '15m')} (IMAGEKIT_ON_BLOCKER)"
        )
    exit_ = guard.get("IMAGEKIT_ON_EXIT")
    done = (
        f"once every job and `pod run` has ended and nothing happened for "
        f"{guard.get('IMAGEKIT_EXIT_GRACE', EXIT_GRACE)} (no input, no `pod cp`)"
    )
    if exit_ == "terminate-always":
        said.append(f"terminate {done}, even after a failure (IMAGEKIT_ON_EXIT)")
    elif exit_ == "terminate":
        said.append(f"terminate {done} if they exited 0, else stop (IMAGEKIT_ON_EXIT)")
    elif exit_:
        said.append(f"{exit_} {done}, the outputs checksummed (IMAGEKIT_ON_EXIT)")
    if "IMAGEKIT_GPU_IDLE_STOP" in guard:
        said.append(f"{action} when a job's GPUs idle {guard['IMAGEKIT_GPU_IDLE_STOP']} (IMAGEKIT_GPU_IDLE_STOP)")
    return said


def worst_case(guard: dict[str, str]) -> str:
    """How long, at most, the armed triggers of ``guard`` let the pod bill after its last work (a sign the guard
    reads: GPU utilisation, a process using CPU or writing, input at a terminal, Jupyter activity, the heartbeat), as
    `pod create` and the readmes say it; and what bounds it from the start (the deadline)."""

    def seconds(name: str) -> int:
        return facts.parse_duration(guard[name], name)

    deadline = (
        f"; at most {guard['IMAGEKIT_MAX_RUNTIME']} after its start (--deadline)"
        if ("IMAGEKIT_MAX_RUNTIME" in guard)
        else ""
    )
    if "IMAGEKIT_IDLE_STOP" not in guard:
        return (
            "Worst case: nothing stops this pod after its work ends (no idle stop)"
            + deadline
            + ("" if deadline else "; give --deadline 6h or leave the idle stop armed")
            + "."
        )
    parts = [f"idle {guard['IMAGEKIT_IDLE_STOP']}"]
    worst = seconds("IMAGEKIT_IDLE_STOP")
    if "IMAGEKIT_HUNG_STOP" in guard:
        parts.append(f"a process holding GPU memory with nothing else moving {guard['IMAGEKIT_HUNG_STOP']}")
        worst = max(worst, seconds("IMAGEKIT_HUNG_STOP"))
    else:
        parts.append("a process holding GPU memory keeps it up (--hung-stop off)")
    return (
        f"Worst case: this pod bills at most {facts.say(worst + LOOK)} after its last work ("
        + "; ".join(parts)
        + f"; a look every {LOOK}s); a process that never stops using CPU or writing counts as "
        "work" + (deadline or ": only a deadline bounds that (--deadline)") + "."
    )


def readme_line(guard: dict[str, str], command: str, ends: str = "") -> str:
    """The template readme's line: what is armed, and how to turn each trigger or the whole guard off (``ends``: how
    the guard ends the pod, said when it is armed)."""
    said = armed(guard)
    if not said:
        return (
            f"Lifetime guard: off (made with `{command} --no-guard`): nothing stops this pod but you. Arm it in the "
            "env: IMAGEKIT_IDLE_STOP=45m, IMAGEKIT_ON_BLOCKER=stop, IMAGEKIT_ON_EXIT=stop, IMAGEKIT_MAX_RUNTIME=6h."
        )
    return (
        f"Lifetime guard (armed): {'; '.join(said)}. {worst_case(guard)} Stop keeps the volume (billed while "
        "stopped); terminate deletes it; `imagekit pod start` starts a stopped pod again to fetch its outputs. Turn a "
        "trigger off by deleting its variable from the env (or `off` to the flag), all of it with "
        f"`{command} --no-guard`; `touch /run/imagekit/heartbeat` from a loop counts as work.{ends}"
    )


def stamp(now: dt.datetime) -> str:
    """A UTC time as the marks carry it: 2026-12-01T10:00:00Z."""
    return now.astimezone(dt.UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_stamp(value: object) -> dt.datetime | None:
    """A mark's time (or RunPod's ``lastStartedAt``, with its milliseconds), else None: untrusted text from the API."""
    if not isinstance(value, str) or not 20 <= len(value) <= 40:
        return None
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def marks(now: dt.datetime, deadline: str | None) -> dict[str, str]:
    """The env `pod create` adds so `pod reap` can find the pod and its deadline: the creation time, the deadline."""
    out = {CREATED: stamp(now)}
    if deadline is not None:
        seconds = facts.parse_duration(deadline.strip(), "--deadline")
        out[DEADLINE] = stamp(now + dt.timedelta(seconds=seconds))
    return out
