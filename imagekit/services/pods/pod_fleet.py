"""The account's imagekit pods as a whole: a create that leaves no unknown pod, and the reaper outside the pods.

`create`: the pending record is written before the request leaves and the id the moment the provider answers it
(`effects.pod_records`), so a client killed at any point leaves a pod `reap` can find. `reap`: the account's pods (the
provider's list, RunPod's `GET /v2/pods` or Vast's `GET /instances/`, with this machine's records of that provider),
each read by the provider's ``reap_pod`` and decided by `clouds.reap`;
overdue imagekit pods stopped (or terminated), every other pod untouched; a dry run sends nothing and writes nothing.
"""

from __future__ import annotations

import datetime as dt
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from imagekit.clouds import guard_defaults as gd
from imagekit.clouds import reap
from imagekit.clouds.provider_spec import Provider
from imagekit.effects import pod_records
from imagekit.errors import CheckFailed, EnvironmentFailure, NotSent, PodMayExist, UsageError
from imagekit.trust import urls

Log = Callable[[str], None]
PENDING_GRACE = 3600  # seconds a create's pending record is left alone: it may be in flight
LOOK_EVERY = 15.0  # seconds between the reaper's looks at a pod it would end by age alone


def client(provider: Provider):  # type: ignore[no-untyped-def]
    """The provider's API client (`effects/<name>_api.py`): `create_pod`, `pod_action`, `list_pods`, `get_pod`, as
    far as the provider offers them."""
    return importlib.import_module(f"imagekit.effects.{provider.name}_api")


def create(provider: Provider, body: dict, key: str, api_url: str) -> dict:
    """Create the pod at ``provider``, recorded first: the pending record (its IMAGEKIT_CREATED mark, the provider)
    before the request, the id as soon as it is read. A request the provider refused, or one that never left, leaves
    no record; one whose answer cannot be read says how `pod reap` finds the pod."""
    env = body.get("env") or {}
    pending = pod_records.pending(
        env[gd.CREATED], body.get("name", "?"), env.get(gd.DEADLINE), urls.display(api_url), provider.name
    )
    try:
        answer = client(provider).create_pod(body, key, api_url)
    except (UsageError, CheckFailed, NotSent):
        pod_records.drop(pending)  # refused, or nothing was sent
        raise
    except PodMayExist as exc:
        raise PodMayExist(
            exc.message,
            f"imagekit pod reap --provider {provider.name} --dry-run finds it by its mark ({gd.CREATED}="
            f"{env[gd.CREATED]}); {exc.hint}",
        ) from None
    pod_records.created(pending, answer["id"])
    return answer


@dataclass
class Reaped:
    verdicts: list[reap.Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # local records the provider no longer lists, and the like
    failed: list[str] = field(default_factory=list)  # actions the provider did not carry out


def reap_pods(
    provider: Provider,
    key: str,
    api_url: str,
    now: dt.datetime,
    older_than: float | None,
    terminate: bool,
    dry_run: bool,
    warn: Log,
    watch: float = 0.0,
    every: float = LOOK_EVERY,
    sleep: Callable[[float], None] = time.sleep,
) -> Reaped:
    """List, decide, act (unless ``dry_run``): see the module's doc. ``provider``: whose account (its API client,
    `effects/<name>_api.py`, lists and ends its pods; the records are of the provider `pod create` rents on).
    ``watch``: seconds the pods that only their age would end are looked at again (every ``every``) before any is:
    each must report no work at every look."""
    if provider.reap_pod is None:
        raise UsageError(f"imagekit cannot list {provider.name}'s pods", "reap a provider `pod reap --help` names")
    api = client(provider)
    records = [(path, r) for path, r in pod_records.load(warn) if r.provider == provider.name]
    listed = api.list_pods(key, api_url)
    out = Reaped()
    pods, twice = reap.distinct([p for p in (provider.reap_pod(d, [r for _, r in records]) for d in listed) if p])
    out.notes += [f"{i}: listed more than once by {provider.name}, its entries not the same pod: left alone"
                  for i in twice]  # fmt: skip
    looks = _watch(api, provider, key, api_url, pods, records, now, older_than, watch, every, sleep)
    for pod in pods:
        verdict = reap.decide(pod, now, older_than, terminate, looks.get(pod.id))
        out.verdicts.append(verdict)
        if verdict.action is None or dry_run:
            continue
        try:
            api.pod_action(verdict.action, pod.id, key, api_url)
        except (EnvironmentFailure, CheckFailed) as exc:
            out.failed.append(f"{pod.id}: {verdict.action} failed: {exc.message}")
    seen = {p.id for p in pods}
    for path, record in records:
        out.notes += _record_note(path, record, seen, pods, now, dry_run, provider.command.display)
    return out


def _watch(
    client, provider: Provider, key: str, api_url: str, pods: list[reap.Pod], records: list, now: dt.datetime,
    older_than: float | None, watch: float, every: float, sleep: Callable[[float], None],
) -> dict[str, list[tuple[float, ...] | None]]:  # fmt: skip
    """{pod id: the utilisation it reported at each look} of the pods only their age would end, looked at again every
    ``every`` seconds for ``watch`` seconds (a data-loading pause must not look like a pod at rest)."""
    looks = {p.id: [p.work] for p in pods if reap.by_age(p, now, older_than) and reap.working([p.work]) is None}
    waited = 0.0
    while looks and waited < watch:
        pause = min(every, watch - waited)
        sleep(pause)
        waited += pause
        for doc in client.list_pods(key, api_url):
            pod = provider.reap_pod(doc, [r for _, r in records])
            if pod is not None and pod.id in looks:
                looks[pod.id].append(pod.work)
    return looks


def _record_note(
    path: Path, record: reap.Record, seen: set[str], pods: list[reap.Pod], now: dt.datetime, dry_run: bool,
    display: str,
) -> list[str]:  # fmt: skip
    """What a local record says against the provider's list (and, in a real run, the record brought up to date)."""
    if record.pod_id is None:
        return _pending_note(path, record, pods, now, dry_run, display)
    if record.pod_id not in seen:
        if not dry_run:
            pod_records.drop(path)
        return [f"{record.pod_id}: recorded here ({record.name!r}, created {record.created}), not listed by "
                f"{display}: terminated, or another account's" + ("" if dry_run else "; record dropped")]  # fmt: skip
    pod = next(p for p in pods if p.id == record.pod_id)
    return [f"{pod.id}: recorded here, still running"] if pod.status == "RUNNING" else []


def _pending_note(
    path: Path, record: reap.Record, pods: list[reap.Pod], now: dt.datetime, dry_run: bool, display: str
) -> list[str]:
    """A create that never recorded its id: its pod found by the mark it sent (and its id recorded), or none."""
    sent_mark = record.created
    found = [p for p in pods if p.ours == "an unfinished create" and p.created and gd.stamp(p.created) == sent_mark]
    if found:
        if not dry_run:
            pod_records.created(path, found[0].id)
        return [f"{found[0].id}: the pod of a create that never recorded its id ({record.name!r}, "
                f"{gd.CREATED}={record.created}){'' if dry_run else '; its id is recorded now'}"]  # fmt: skip
    sent = gd.parse_stamp(record.created)
    if sent is not None and (now - sent).total_seconds() < PENDING_GRACE:
        return [f"a create at {record.created} ({record.name!r}) has no pod listed yet (in flight?)"]
    if not dry_run:
        pod_records.drop(path)
    return [f"a create at {record.created} ({record.name!r}) left no pod {display} lists (refused, or another "
            "account's)" + ("" if dry_run else "; record dropped")]  # fmt: skip
