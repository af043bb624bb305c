"""`imagekit pod reap`, decided (pure): which of the account's pods are imagekit's, what each has cost, which are
overdue, and what to do with each. Each provider's module reads its own cloud's list into :class:`Pod`s (its
``reap_pod``: `clouds.runpod.reap_pod`, `clouds.vast.reap_pod`), with the helpers here (``whose``, ``price``,
``percent``): what a provider answers is another party's, every field checked where it is read, one of another type
counting as absent.

A pod is imagekit's when its env carries the mark `pod create` and the templates write (``IMAGEKIT_CREATED``), or when
this machine recorded its id when it created it; any other pod is listed as not imagekit's and never touched. An
imagekit pod is overdue past its ``IMAGEKIT_DEADLINE`` (from `pod create --deadline`); older than ``--older-than``
(from its creation, else its last start) it is overdue only when the provider reports no work on it at every look
the reaper took (RunPod's ``runtime.gpus[].util`` and ``runtime.cpu.util``, Vast's ``gpu_util``: ``WORK`` % or more
is work): age alone never ends a pod that trains, and a pod whose work is not reported is left to its deadline.
Overdue and running: stopped (terminated with ``--terminate``); overdue and stopped: terminated with ``--terminate``
only (a stopped pod bills its volume, not its GPU).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass

from imagekit.clouds import guard_defaults as gd
from imagekit.in_image import facts

_POD_ID = re.compile(r"[A-Za-z0-9_]{4,64}", re.ASCII)
STATUSES = ("RUNNING", "EXITED", "TERMINATED")
_STARTING = ("PROVISIONING", "STARTING")  # RunPod v2: on its way to RUNNING, billed as one
WORK = 5.0  # % of a GPU (or of the container's CPU) at which a look sees work, the guard's own threshold


@dataclass(frozen=True)
class Pod:
    """One pod of the account, as far as RunPod's answer could be read."""

    id: str
    name: str
    status: str  # RUNNING | EXITED | TERMINATED | ? (anything else)
    ours: str | None  # why it is imagekit's ("marked", "recorded here", "an unfinished create"); None: not
    created: dt.datetime | None  # the mark's time, else the local record's
    started: dt.datetime | None  # RunPod's lastStartedAt
    deadline: dt.datetime | None  # IMAGEKIT_DEADLINE
    price: float | None  # $/h (RunPod's cost, Vast's dph_total)
    work: tuple[float, ...] | None = None  # utilisation % the provider reports now (GPUs, then CPU); None: none


@dataclass(frozen=True)
class Record:
    """What this machine wrote when it created a pod (`effects.pod_records`); ``pod_id`` None: the create never
    learnt the id (the client died, or the answer was lost), so the pod is found by its ``created`` mark."""

    pod_id: str | None
    created: str  # the IMAGEKIT_CREATED mark it sent
    name: str
    deadline: str | None = None
    provider: str = "runpod"  # whose pod (a record from before providers were named: RunPod's)


@dataclass(frozen=True)
class Verdict:
    pod: Pod
    action: str | None  # stop | terminate | None (left alone)
    why: str


def price(pod: dict, keys: tuple[str, ...] = ("adjustedCostPerHr", "costPerHr")) -> float | None:
    """$/h: the first of ``keys`` that is a number (or a number's text) in a sane range."""
    for key in keys:
        value = pod.get(key)
        if isinstance(value, bool):
            continue
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(number) and 0 <= number < 10_000:
            return number
    return None


def percent(value: object) -> float | None:
    """A utilisation the provider reports, 0-100, or None (another type, not finite, out of range)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) if 0 <= value <= 100 else None


def whose(
    pod_id: str, env: dict, records: list[Record], started: dt.datetime | None
) -> tuple[str | None, dt.datetime | None, dt.datetime | None]:
    """(why the pod is imagekit's or None, its creation time, its deadline) from its env's marks and the records. The
    deadline: the mark `pod create --deadline` sets, else the record's, else (a template's pod, whose guard was given
    IMAGEKIT_MAX_RUNTIME) its last start plus that runtime: a pod still running then is one its guard missed."""
    mark = env.get(gd.CREATED)
    mark = mark if isinstance(mark, str) and mark else None
    by_id = next((r for r in records if r.pod_id == pod_id), None)
    by_mark = next((r for r in records if r.pod_id is None and mark is not None and r.created == mark), None)
    created = gd.parse_stamp(mark) or (gd.parse_stamp(by_id.created) if by_id else None)
    ours = "recorded here" if by_id else "an unfinished create" if by_mark else "marked" if mark is not None else None
    deadline = gd.parse_stamp(env.get(gd.DEADLINE)) or (gd.parse_stamp(by_id.deadline) if by_id else None)
    runtime = env.get("IMAGEKIT_MAX_RUNTIME")
    if deadline is None and started is not None and isinstance(runtime, str):
        try:
            seconds = facts.parse_duration(runtime.strip()[:40], "IMAGEKIT_MAX_RUNTIME")
            deadline = started + dt.timedelta(seconds=seconds)
        except (facts.SettingError, OverflowError):
            pass
    return ours, created, deadline


def distinct(pods: list[Pod]) -> tuple[list[Pod], list[str]]:
    """The pods with an id listed once, and the ids listed more than once (the provider's list is another party's:
    which entry is true cannot be known, so none of them is acted on)."""
    seen: dict[str, int] = {}
    for pod in pods:
        seen[pod.id] = seen.get(pod.id, 0) + 1
    return [p for p in pods if seen[p.id] == 1], sorted(i for i, n in seen.items() if n > 1)


def cost_so_far(pod: Pod, now: dt.datetime) -> float | None:
    """The GPU's cost since the pod last started (price x hours), for a running pod whose price and start RunPod
    says: RunPod's API gives no total, and a stopped pod's GPU bills nothing."""
    if pod.status != "RUNNING" or pod.price is None or pod.started is None:
        return None
    return pod.price * max(0.0, (now - pod.started).total_seconds()) / 3600


def working(looks: list[tuple[float, ...] | None]) -> str | None:
    """Why the looks at a pod show it at work (any look with a GPU or the CPU at ``WORK`` % or more; a look that
    reports nothing: its work cannot be seen), or None when every look reported none."""
    if not looks or any(look is None for look in looks):
        return "the provider reports no utilisation for it (its work cannot be seen)"
    busy = [max(look) for look in looks if look and max(look) >= WORK]
    if busy:
        return f"at work: {max(busy):.0f} % utilisation reported ({len(busy)} of {len(looks)} look(s))"
    return None


def by_age(pod: Pod, now: dt.datetime, older_than: float | None) -> bool:
    """Would ``pod`` be ended by its age alone (imagekit's, running, no deadline passed, older than ``older_than``)?
    Those are the pods the reaper watches a while before ending any: a look can fall in a pause of real work."""
    if pod.ours is None or pod.status != "RUNNING" or older_than is None:
        return False
    if pod.deadline is not None and now >= pod.deadline:
        return False
    born = pod.created or pod.started
    return born is not None and (now - born).total_seconds() >= older_than


def decide(
    pod: Pod, now: dt.datetime, older_than: float | None, terminate: bool,
    looks: list[tuple[float, ...] | None] | None = None,
) -> Verdict:  # fmt: skip
    """What `pod reap` does with ``pod`` (``older_than``: seconds, or None; ``looks``: the utilisation it reported at
    each look the reaper took, the last one ``pod.work`` when not given)."""
    if pod.ours is None:
        return Verdict(pod, None, "not imagekit's: left alone")
    if pod.status == "TERMINATED":
        return Verdict(pod, None, "terminated already")
    overdue = None
    if pod.deadline is not None and now >= pod.deadline:
        overdue = f"past its deadline {gd.stamp(pod.deadline)}"
    born = pod.created or pod.started
    if overdue is None and older_than is not None and born is not None:
        age = (now - born).total_seconds()
        if age >= older_than:
            aged = f"{'created' if pod.created else 'started'} {say(age)} ago, older than {say(older_than)}"
            busy = working(looks if looks is not None else [pod.work]) if pod.status == "RUNNING" else None
            if busy:
                return Verdict(pod, None, f"{aged}, but {busy}: age alone never ends a pod that works")
            overdue = aged + (" with no work reported" if pod.status == "RUNNING" else "")
    if overdue is None:
        left = f"deadline {gd.stamp(pod.deadline)}" if pod.deadline else "no deadline"
        return Verdict(pod, None, f"not overdue ({left})")
    if terminate:
        return Verdict(pod, "terminate", overdue)
    if pod.status == "EXITED":
        return Verdict(pod, None, f"{overdue}; stopped already (--terminate deletes it)")
    return Verdict(pod, "stop", overdue)


def say(seconds: float) -> str:
    """A duration as a person reads it: 5400 -> 1h30m."""
    rest, out = int(seconds), ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            out += f"{rest // size}{unit}"
            rest %= size
    return out or f"{rest}s"


def line(verdict: Verdict, now: dt.datetime, dry_run: bool) -> str:
    """One pod as `pod reap` prints it."""
    pod = verdict.pod
    spent = cost_so_far(pod, now)
    parts = [
        pod.id,
        pod.status,
        repr(pod.name),
        f"imagekit's ({pod.ours})" if pod.ours else "not imagekit's",
        f"created {gd.stamp(pod.created)}" if pod.created else "",
        f"deadline {gd.stamp(pod.deadline)}" if pod.deadline else "",
        f"{pod.price:.2f} $/h" if pod.price is not None else "",
        f"~{spent:.2f} $ since its last start" if spent is not None else "",
    ]
    doing = verdict.action and (f"would {verdict.action}" if dry_run else verdict.action)
    return "  ".join(p for p in parts if p) + f": {f'{doing}: ' if doing else ''}{verdict.why}"


def as_json(verdict: Verdict, now: dt.datetime) -> dict:
    pod = verdict.pod
    spent = cost_so_far(pod, now)
    return {
        "pod": pod.id,
        "name": pod.name,
        "status": pod.status,
        "imagekit": pod.ours,
        "created": gd.stamp(pod.created) if pod.created else None,
        "deadline": gd.stamp(pod.deadline) if pod.deadline else None,
        "cost_per_hour": pod.price,
        "cost_since_start": round(spent, 4) if spent is not None else None,
        "action": verdict.action,
        "why": verdict.why,
    }
