"""Which self-test results a build may take from an earlier release instead of running them again (pure).

A self-test's results hold for the image it ran on. An image whose layers below the code layer (`[image] copy`,
always the last) are those of a published image whose self-test passed, with the same runtime config (ENV, ENTRYPOINT,
CMD, WORKDIR, USER: what a check sees), run in the same place (on a GPU or not, emulated or not), is that image as
far as every check but the code layer's goes: torch, CUDA, the compiler, numpy, the GPU, the Debian packages and the
self-test's own programs all lie below it. So such a build runs only the code layer's checks in the image
(in_image/selftest.py ``--code-layer``: hygiene, the smoke commands, with `[image] install` the venv against the lock)
and the config check on the host, and takes the others from that release's record, each marked with the record and
the layers it came from. Reuse is earned: never from a run that did not pass (every check `pass` or `skip`), never
across a GPU and a CPU run (a CPU run skips the GPU checks; a GPU run's tiny model ran on the GPU) nor an emulated and
a native one, never when a layer below the code layer differs, never for an image without a code layer, never from a
record this machine did not publish or verify (the caller's ``origin``: services/publishing/release_index.vouched),
and only
when the record holds a result for every check the full self-test would run here (the `--code-layer` run's
``plan``), each `pass`, or `skip` for the very reason this run would skip it; otherwise every check runs again.

A run's key goes into its report (``ran.layers``, ``ran.code_layer``, ``ran.config``, beside ``ran.gpu`` and
``ran.emulated``), and so into the release record (oci.release_record: ``selftest``), where the next build finds it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from imagekit.model import AMD64

_DIFF_ID = re.compile(r"sha256:[0-9a-f]{64}", re.ASCII)
HOST_CHECKS = ("labels-match-contents",)  # image.config_truth: the host checks the config every time
_CONFIG_KEYS = ("Env", "Entrypoint", "Cmd", "WorkingDir", "User")


@dataclass(frozen=True)
class RunKey:
    """Where a self-test ran: the image's layers (diff ids, bottom first), whether the last is the code layer, the
    digest of the runtime config its checks see, and on what (a GPU, an emulated CPU)."""

    layers: tuple[str, ...]
    code_layer: bool
    config: str
    gpu: bool
    emulated: bool

    @property
    def below_code(self) -> tuple[str, ...]:
        return self.layers[:-1] if self.code_layer else self.layers

    def to_json(self) -> dict:
        return {"layers": list(self.layers), "code_layer": self.code_layer, "config": self.config}


@dataclass(frozen=True)
class Reuse:
    """The results taken from a release: its immutable tag and digest, the layers they are keyed by, the checks."""

    record: str
    digest: str
    layers: tuple[str, ...]
    checks: tuple[dict, ...]

    def to_json(self) -> dict:
        return {
            "record": self.record,
            "digest": self.digest,
            "layers": list(self.layers),
            "checks": [c["id"] for c in self.checks],
        }


def config_digest(config: dict) -> str:
    """sha256 of what of an image's config the checks see (labels aside: the host's config check reads those)."""
    seen = {k: config.get(k) or None for k in _CONFIG_KEYS}
    return "sha256:" + hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()


def key_of(inspect: dict, *, code_layer: bool, gpu: bool, emulated: bool) -> RunKey:
    """The key of a self-test run on the image ``inspect`` describes (the engine's `docker image inspect`)."""
    layers = tuple(str(x) for x in (inspect.get("RootFS") or {}).get("Layers") or [])
    return RunKey(layers, code_layer and bool(layers), config_digest(inspect.get("Config") or {}), gpu, emulated)


def on_path(config: dict, to: str) -> str | None:
    """The ENV variable of an image's config that names the code layer's folder ``to`` (PYTHONPATH=/opt/app: its
    files may then shadow what the layers below hold, and no result below it stands), or None."""
    folder = to.rstrip("/")
    for item in config.get("Env") or []:
        name, _, value = str(item).partition("=")
        if any(part.rstrip("/") == folder or part.startswith(folder + "/") for part in value.split(":")):
            return name
    return None


def _key_in(report: dict) -> RunKey | None:
    """The key a recorded report names, or None when it names none or one of another shape (another party's file)."""
    ran = report.get("ran")
    if not isinstance(ran, dict):
        return None
    layers, code, config = ran.get("layers"), ran.get("code_layer"), ran.get("config")
    if not isinstance(layers, list) or not all(isinstance(x, str) and _DIFF_ID.fullmatch(x) for x in layers):
        return None
    if not isinstance(code, bool) or not isinstance(config, str) or not layers:
        return None
    gpu, emulated = ran.get("gpu"), ran.get("emulated")
    if not isinstance(gpu, bool) or not isinstance(emulated, bool):
        return None
    return RunKey(tuple(layers), code, config, gpu, emulated)


REUSABLE = ("pass", "skip")  # a check's statuses a result may be taken with; FAIL, error or none are not


def _passed(report: dict) -> bool:
    checks = report.get("checks")
    return (
        report.get("passed") is True
        and report.get("failed") == []
        and isinstance(checks, list)
        and bool(checks)
        and all(isinstance(c, dict) and isinstance(c.get("id"), str) and c.get("status") in REUSABLE for c in checks)
    )


def record_problem(report: object, diff_ids: list[str] | None) -> str | None:
    """Why a release record's self-test report cannot stand as its image's (what `release merge` refuses), or None:
    a report that did not pass (a check neither `pass` nor `skip`, or none at all), or one whose layers are not the
    image's (``diff_ids``: its config's rootfs, as the registry serves it; None when unknown)."""
    if not isinstance(report, dict) or not _passed(report):
        return "its self-test did not pass (every check must be pass or skip)"
    ran = report.get("ran")
    layers = ran.get("layers") if isinstance(ran, dict) else None
    if layers is not None and diff_ids is not None and list(layers) != list(diff_ids):
        return "the layers its self-test names are not the image's (its config's diff ids)"
    return None


def why_not(key: RunKey, report: dict) -> str | None:
    """Why the results of ``report`` (a recorded self-test) cannot stand for an image of ``key``; None when they can."""
    if not key.code_layer:
        return "this image has no code layer"
    if not _passed(report):
        return "its self-test did not pass"
    theirs = _key_in(report)
    if theirs is None:
        return "its self-test names no layers"
    if not theirs.code_layer:
        return "it has no code layer"
    if (theirs.gpu, theirs.emulated) != (key.gpu, key.emulated):
        return f"it ran {_where(theirs)}, this runs {_where(key)}"
    if theirs.below_code != key.below_code:
        return "a layer below the code layer differs"
    if theirs.config != key.config:
        return "its runtime config (ENV, ENTRYPOINT, CMD, WORKDIR, USER) differs"
    return None


def _where(key: RunKey) -> str:
    return ("on a GPU" if key.gpu else "without a GPU") + (", emulated" if key.emulated else "")


def find(
    key: RunKey,
    images: dict,
    cell_id: str,
    platform: str = AMD64,
    origin: Callable[[dict], str | None] = lambda entry: None,
) -> tuple[Reuse | None, str]:
    """The newest release of the cell on ``platform`` among a checked index's ``images`` whose results may stand for
    an image of ``key`` (with what it offers), or None and why the newest one may not. ``origin(entry)``: why the
    entry's record may not be trusted (not published on this machine, nor merged with its signature verified), or
    None."""
    mine = [
        e for e in images.values()
        if isinstance(e, dict) and isinstance(e.get("manifest"), dict)
        and (e["manifest"].get("cell") or {}).get("id") == cell_id
        and ((e["manifest"].get("cell") or {}).get("platform") or AMD64) == platform
        and isinstance(e.get("selftest"), dict)
    ]  # fmt: skip
    if not mine:
        return None, "no earlier release of this cell"
    first_reason = ""
    for entry in sorted(mine, key=lambda e: (str(e.get("published_at") or ""), e.get("tag", "")), reverse=True):
        reason = origin(entry) or why_not(key, entry["selftest"])
        if reason is None:
            checks = tuple(c for c in entry["selftest"]["checks"] if c["id"] not in HOST_CHECKS)
            return Reuse(entry["tag"], entry["digest"], key.below_code, checks), ""
        first_reason = first_reason or f"{entry.get('tag')}: {reason}"
    return None, first_reason


def shortfall(fresh: dict, reuse: Reuse) -> str | None:
    """Why ``reuse`` cannot complete the ``--code-layer`` run ``fresh`` into the full self-test, or None: each check
    the full run would run here (its ``plan``, with the reason it would skip each) that did not run now must be in the
    record, `pass` where this run would run it, `skip` with the same reason where this run would skip it."""
    planned = fresh.get("plan")
    if not isinstance(planned, list) or not all(isinstance(p, dict) and isinstance(p.get("id"), str) for p in planned):
        return "the image's self-test says no plan of its full run"
    ran = {c.get("id") for c in fresh.get("checks") or [] if isinstance(c, dict)}
    theirs = {c["id"]: c for c in reuse.checks}
    for step in planned:
        cid, skip = step["id"], step.get("skip")
        if cid in ran or cid in HOST_CHECKS:
            continue
        old = theirs.get(cid)
        if old is None:
            return f"{reuse.record} has no result for {cid}, which this self-test runs"
        if skip is None and old.get("status") != "pass":
            return f"{reuse.record}'s {cid} is {old.get('status')!s:.20}, and this run would run it"
        if skip is not None and (old.get("status"), old.get("message")) != ("skip", skip):
            return f"{reuse.record}'s {cid} is not skipped for the reason this run would skip it ({skip})"
    return None


def merge(fresh: dict, reuse: Reuse) -> dict:
    """The report of a ``--code-layer`` run with the results ``reuse`` offers for every check it did not run, each
    marked with where it came from (a result reused before keeps its first record); order as the earlier report's."""
    ran = {c["id"]: c for c in fresh.get("checks") or [] if isinstance(c, dict)}
    origin = {"record": reuse.record, "digest": reuse.digest, "layers": list(reuse.layers)}
    checks, taken = [], []
    for old in reuse.checks:
        if old["id"] in ran:
            checks.append(ran.pop(old["id"]))
        else:
            checks.append({**old, "reused": old.get("reused") or origin})
            taken.append(old["id"])
    checks += list(ran.values())
    failed = [c["id"] for c in checks if c.get("status") not in REUSABLE]
    reused = {**reuse.to_json(), "checks": taken}
    merged = {**fresh, "checks": checks, "failed": failed, "passed": not failed and fresh.get("passed") is True,
              "reused": reused}  # fmt: skip
    merged.pop("plan", None)  # said of this run; the record holds the full run's results instead
    return merged
