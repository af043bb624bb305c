"""The lifetime guard's options, the same on `pod create` and every `*-template` command (`clouds.guard_defaults`
says what each default is and why)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from imagekit.clouds import guard_defaults as gd

NoGuardOpt = Annotated[
    bool,
    typer.Option(
        "--no-guard",
        help="Arm nothing by default (the guard options given are still armed). Without it: stop after "
        f"{gd.IDLE_STOP} idle, after {gd.HUNG_STOP} of a process holding GPU memory while nothing moves, on a "
        f"start-check blocker after {gd.BLOCKER_GRACE}, and once every job and run has ended and the pod stayed quiet "
        f"for {gd.EXIT_GRACE}.",
    ),
]
DeadlineOpt = Annotated[
    str | None,
    typer.Option(
        "--deadline",
        "--max-runtime",
        metavar="DURATION",
        help="Guard: stop the pod this long after it started (6h; none by default).",
    ),
]
IdleStopOpt = Annotated[
    str | None,
    typer.Option(
        "--idle-stop", metavar="DURATION|off", help=f"Guard: stop it when idle this long (default {gd.IDLE_STOP})."
    ),
]
OnBlockerOpt = Annotated[
    str | None,
    typer.Option(
        "--on-blocker",
        metavar="stop|terminate|off",
        help="Guard: when the start check's blocker (no GPU, a driver too old) is still there after --blocker-grace "
        "(default stop).",
    ),
]
BlockerGraceOpt = Annotated[
    str | None,
    typer.Option(
        "--blocker-grace", metavar="DURATION", help=f"Time to look at a blocked pod first (default {gd.BLOCKER_GRACE})."
    ),
]
OnExitOpt = Annotated[
    str | None,
    typer.Option(
        "--on-exit",
        metavar="stop|terminate|terminate-always|off",
        help="Guard: once every job-mode command and `pod run` has ended and the pod stayed quiet for --exit-grace (no "
        "input, nothing making progress, no `pod cp`/`pod wait` connected), its outputs checksummed (default stop). "
        "terminate: after successful exits only (a failure stops, keeping the volume); terminate-always: after any.",
    ),
]
ExitGraceOpt = Annotated[
    str | None,
    typer.Option(
        "--exit-grace",
        metavar="DURATION",
        help=f"How long the pod stays quiet after the last run ended before --on-exit acts (default {gd.EXIT_GRACE}).",
    ),
]
HungStopOpt = Annotated[
    str | None,
    typer.Option(
        "--hung-stop",
        metavar="DURATION|off",
        help="Guard: stop it when a process holds GPU memory while every GPU idles and nothing else moves this long "
        f"(default {gd.HUNG_STOP}).",
    ),
]
GuardActionOpt = Annotated[
    str | None,
    typer.Option(
        "--guard-action", metavar="stop|terminate", help="What the deadline and the idle stop do (default stop)."
    ),
]

# (parameter name, annotation, default): the template commands add these to every provider's options
PARAMETERS: tuple[tuple[str, Any, Any], ...] = (
    ("no_guard", NoGuardOpt, False),
    ("deadline", DeadlineOpt, None),
    ("idle_stop", IdleStopOpt, None),
    ("on_blocker", OnBlockerOpt, None),
    ("blocker_grace", BlockerGraceOpt, None),
    ("on_exit", OnExitOpt, None),
    ("exit_grace", ExitGraceOpt, None),
    ("hung_stop", HungStopOpt, None),
    ("guard_action", GuardActionOpt, None),
)
NAMES = tuple(name for name, _, _ in PARAMETERS)


def choice(values: dict[str, Any], gpu_idle_stop: str | None = None) -> gd.GuardChoice:
    """The user's guard choice from the command's values (keyed by the parameter names above)."""
    return gd.GuardChoice(
        no_guard=bool(values["no_guard"]),
        deadline=values["deadline"],
        idle_stop=values["idle_stop"],
        on_blocker=values["on_blocker"],
        blocker_grace=values["blocker_grace"],
        on_exit=values["on_exit"],
        gpu_idle_stop=gpu_idle_stop,
        action=values["guard_action"],
        hung_stop=values.get("hung_stop"),
        exit_grace=values.get("exit_grace"),
    )
