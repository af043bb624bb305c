"""One published cell as the release page shows it: its state, and the facts its release record holds, each value
made printable and bounded (the page's template escapes it), each fact the record lacks said to be missing. Pure.

A record is another party's data: ``release_record.entry_problems`` checked its tags, digests, sizes and the
manifest's cell, but the self-test report, the source revision and the layers are as the publisher wrote them, so
they are read here by shape and never trusted to be of one.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from imagekit.clouds import providers
from imagekit.clouds.pod_create import GPU_ID, known_gpu
from imagekit.compat import contract
from imagekit.compat.catalog import CompatData
from imagekit.model import AMD64
from imagekit.oci import publish_formats
from imagekit.oci.release_record import MAX_IMAGE_BYTES
from imagekit.trust.untrusted import printable

PASSED, GPU_SKIPPED, FAILED, EXCLUDED, UNPUBLISHED = "passed", "gpu-skipped", "failed", "excluded", "unpublished"
STATES = {  # state -> (its mark on the grid, its name, what it means): the legend, the chips, the cards
    PASSED: ("✓", "passed", "published; its self-test passed, GPU checks included"),
    GPU_SKIPPED: ("◑", "GPU checks skipped", "published; its self-test passed with the GPU checks skipped"),
    FAILED: ("✗", "failed", "its self-test failed"),
    EXCLUDED: ("⊘", "excluded", "excluded by a compatibility rule"),
    UNPUBLISHED: ("○", "not published", "in the matrix, not published"),
}
MAX_SHOWN = 200  # characters of one value from a record; a longer one is cut, saying how long it was
MAX_CHECKS = 100  # self-test checks listed per cell; the rest are counted
NOT_RECORDED = "not recorded"
GPU_PLACEHOLDER = "GPU_TYPE_ID"  # in `pod create --gpu`, when no GPU the record names can be one of the cloud's ids


@dataclass(frozen=True)
class Fact:
    label: str
    value: str
    missing: bool = False  # the record lacks it: the page says so rather than guess
    code: bool = False  # a tag, a digest, a revision: monospace


@dataclass(frozen=True)
class Check:
    id: str
    status: str  # pass, fail, skip (or what the report says, printable)
    message: str
    reused: str = ""  # the release whose result was taken for this image (oci.selftest_reuse), if one was


@dataclass(frozen=True)
class SelfTest:
    verdict: str
    where: str
    checks: tuple[Check, ...]
    more: int = 0  # checks beyond MAX_CHECKS, counted but not listed


@dataclass(frozen=True)
class Command:
    label: str
    text: str


@dataclass(frozen=True)
class Card:
    key: str  # the cell on its platform (model.Cell.key)
    anchor: str
    title: str
    state: str
    facts: tuple[Fact, ...] = ()
    selftest: SelfTest | None = None
    commands: tuple[Command, ...] = ()
    earlier: tuple[Fact, ...] = ()  # older releases of the cell
    failed_run: SelfTest | None = None  # the latest build's self-test, which failed: nothing of it was published
    failed_source: str = ""


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """``value`` as the page shows it: control and escape characters removed, whitespace runs one space, at most
    ``limit`` characters; a longer value is cut, saying how long it was (a 10,000-character name stays readable)."""
    if not isinstance(value, str):
        value = printable(value, 4 * limit)
    text = printable(value[: 4 * limit], 4 * limit)
    if len(value) <= 4 * limit and len(text) <= limit:
        return text
    return f"{text[: limit - 1]}… ({len(value):,} characters)"


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list:
    return value if isinstance(value, list) else []


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def report_checks(report: object) -> list[dict]:
    return [c for c in _list(_dict(report).get("checks")) if isinstance(c, dict)]


def state_of(report: object) -> str:
    """A published cell's state from its self-test report: failed unless the report says it passed and lists no
    failure; passed when its GPU checks ran and passed (never when it ran emulated); else GPU checks skipped."""
    if not isinstance(report, dict):
        return FAILED
    checks = report_checks(report)
    if (
        report.get("passed") is not True
        or _list(report.get("failed"))
        or any(c.get("status") == "fail" for c in checks)
    ):
        return FAILED
    gpu = [c for c in checks if str(c.get("id", "")).startswith("gpu-")]
    if _dict(report.get("ran")).get("emulated") is not True and gpu and all(c.get("status") == "pass" for c in gpu):
        return PASSED
    return GPU_SKIPPED


def tested_gpus(report: object) -> list[str]:
    """The GPU models the self-test's GPU checks name (`gpu-arch`'s evidence), in order, each once."""
    names = [_dict(c.get("evidence")).get("name") for c in report_checks(report) if c.get("id") == "gpu-arch"]
    return list(dict.fromkeys(n for n in names if isinstance(n, str) and n))


def where_ran(report: object, platform: str) -> str:
    """Where the self-test ran, as its report says: emulated, on which GPU, or on a CPU without one. The CPU's model
    is in no report: said so."""
    if not isinstance(report, dict):
        return NOT_RECORDED
    ran, gpus = _dict(report.get("ran")), tested_gpus(report)
    if ran.get("emulated") is True:
        return f"emulated under qemu on another CPU architecture ({platform} image): the CPU checks only"
    if gpus:
        return f"on a GPU: {', '.join(shown(g, 80) for g in gpus)} ({platform} host; CPU model not recorded)"
    if ran.get("gpu") is True:
        return f"on a GPU host ({platform}); the report names no GPU model"
    if not ran:
        return f"not recorded (a report from before imagekit kept where it ran; {platform} image)"
    return f"on a CPU without a GPU ({platform} host; CPU model not recorded): GPU checks skipped"


def selftest(report: object, platform: str) -> SelfTest:
    if not isinstance(report, dict):
        return SelfTest("no self-test report recorded: not known to pass", NOT_RECORDED, ())
    checks = report_checks(report)
    listed = tuple(
        Check(
            shown(c.get("id", "?"), 80),
            shown(c.get("status", "?"), 16),
            shown(c.get("message", "")),
            shown(_dict(c.get("reused")).get("tag", ""), 120) if c.get("reused") else "",
        )
        for c in checks[:MAX_CHECKS]
    )
    counts = {s: sum(1 for c in checks if c.get("status") == s) for s in ("pass", "fail", "skip")}
    summary = f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped of {len(checks)} checks"
    failed = [shown(f, 80) for f in _list(report.get("failed"))[:20]]
    if state_of(report) == FAILED:
        verdict = "failed" + (f" ({', '.join(failed)})" if failed else "") + f": {summary}"
    else:
        verdict = f"passed: {summary}"
    return SelfTest(verdict, where_ran(report, platform), listed, max(0, len(checks) - MAX_CHECKS))


def human_bytes(size: object) -> str | None:
    """``1.23 GB (1,234,567,890 bytes)``, or None for what is not a size."""
    if isinstance(size, bool) or not isinstance(size, int | float) or not math.isfinite(size):
        return None
    if not 0 <= size <= MAX_IMAGE_BYTES:
        return None
    return f"{size / 1e9:.2f} GB ({int(size):,} bytes)"


def _pod_gpu(entry: dict, data: CompatData) -> str:
    """The GPU `pod create` is shown with: the one the self-test ran on, when it is a GPU imagekit knows and has the
    form of the cloud's GPU type ids (torch's device names are, e.g. 'NVIDIA H100 80GB HBM3'), else a placeholder."""
    for name in tested_gpus(entry.get("selftest")):
        if GPU_ID.fullmatch(name) and known_gpu(data, name):
            return name
    return GPU_PLACEHOLDER


def commands(entry: dict, data: CompatData) -> tuple[Command, ...]:
    """What to paste to start the image: pull it by digest, make its RunPod template, rent a pod for it. The tag and
    digest are of the distribution grammar (the record's check); every word is quoted for a shell all the same."""
    tag, digest = entry["tag"], entry["digest"]
    repo = tag.rsplit(":", 1)[0]
    gpu = _pod_gpu(entry, data)
    pods = providers.pod_provider()  # the cloud `pod create` rents from; its template command and account key
    return (
        Command("Pull it (by digest)", shlex.join(["docker", "pull", f"{repo}@{digest}"])),
        Command(
            f"Its {pods.name} template ({pods.account_key} set)",
            shlex.join(["imagekit", pods.template_command, tag, "--digest", "--create"]),
        ),
        Command(
            f"A {pods.name} pod, stopped after 6 hours at the latest"
            + (" (name the GPU by its type id)" if gpu == GPU_PLACEHOLDER else " (on the GPU it was tested on)"),
            shlex.join(["imagekit", "pod", "create", tag, "--gpu", gpu, "--deadline", "6h"]),
        ),
    )


def _supply_chain(entry: dict) -> list[Fact]:
    sbom, signature = entry.get("sbom"), entry.get("signature")
    facts = []
    if isinstance(sbom, dict):
        facts.append(
            Fact(
                "SBOM",
                f"SPDX 2.3, attached as an attestation ({shown(sbom.get('attestation'), 80)}): "
                f"{sbom.get('python')} Python distributions, {sbom.get('dpkg')} Debian packages",
            )
        )
    else:
        facts.append(Fact("SBOM", "not recorded (published without an SBOM attestation)", missing=True))
    facts.append(
        Fact(
            "Vulnerability gate",
            "not recorded: a release record holds no audit verdict (imagekit audit TAG --osv-db DIR_OR_ZIP runs "
            "the gate against an OSV export)",
            missing=True,
        )
    )
    if isinstance(signature, dict):
        tags = len(_list(signature.get("tags")))
        facts.append(
            Fact(
                "Signed by key",
                f"{shown(signature.get('key'), 80)} (cosign format, {tags} signature tag(s))",
                code=True,
            )
        )
    else:
        facts.append(Fact("Signed by key", "not signed (no signature recorded)", missing=True))
    return facts


def _inside(entry: dict, data: CompatData, gpu_lines: dict) -> list[Fact]:
    manifest = entry["manifest"]
    size, compressed = human_bytes(entry.get("size_bytes")), human_bytes(entry.get("compressed_bytes"))
    archs = [a for a in _list(_dict(manifest.get("torch")).get("archs")) if isinstance(a, str)]
    driver = _text(_dict(manifest.get("driver")).get("minimum"))
    runtime = contract.of_record(entry, data)
    revision = _text(manifest.get("source_revision"))
    facts = [
        Fact("Size", size or NOT_RECORDED, missing=size is None),
        Fact(
            "Compressed (what a pull downloads)",
            compressed or f"{NOT_RECORDED} (a record from before imagekit pushed its own layers)",
            missing=compressed is None,
        ),
        Fact("GPU architectures", " ".join(shown(a, 16) for a in archs[:32]) or NOT_RECORDED, missing=not archs),
        Fact("Minimum driver", shown(driver, 32) if driver else NOT_RECORDED, missing=driver is None),
    ]
    if runtime is not None:
        if runtime not in gpu_lines:  # one line per contract: many cells share one, and it weighs every known GPU
            gpu_lines[runtime] = contract.gpu_line(runtime, data)
        facts.append(Fact("GPUs", gpu_lines[runtime]))
    if revision is None:
        facts.append(Fact("Built from commit", NOT_RECORDED, missing=True))
    elif revision == "unknown":
        facts.append(Fact("Built from commit", "unknown (built outside a git checkout)", missing=True))
    else:
        facts.append(Fact("Built from commit", shown(revision, 64), code=True))
    return facts


def card(
    key: str,
    anchor: str,
    entry: dict,
    data: CompatData,
    earlier: list[dict],
    note: Fact | None = None,
    gpu_lines: dict | None = None,
) -> Card:
    """The card of a published cell: its newest release ``entry`` (``earlier``: the older ones). ``gpu_lines``: the
    GPUs line of each runtime contract met so far, kept by the caller across cards."""
    manifest = entry["manifest"]
    platform = _dict(manifest.get("cell")).get("platform") or AMD64
    facts = [
        Fact("Tag", entry["tag"], code=True),
        Fact("Digest", entry["digest"], code=True),
        Fact("Alias (moves to the newest build)", entry["alias"], code=True),
        Fact("Platform", shown(platform, 32)),
        Fact("Published", shown(entry.get("published_at"), 64) if entry.get("published_at") else NOT_RECORDED),
    ]
    for name in publish_formats.variants():  # the same image in another layer format (checked by the record's check)
        if isinstance(entry.get(name), dict):
            facts.append(Fact(f"Also as ({name} layers)", entry[name]["tag"], code=True))
    facts += _inside(entry, data, {} if gpu_lines is None else gpu_lines) + _supply_chain(entry)
    facts += [note] if note else []
    older = tuple(
        Fact(shown(e.get("published_at") or "date not recorded", 64), f"{e['tag']} ({e['digest']})", code=True)
        for e in earlier
    )
    return Card(
        key,
        anchor,
        key,
        state_of(entry.get("selftest")),
        tuple(facts),
        selftest(entry.get("selftest"), shown(platform, 32)),
        commands(entry, data),
        older,
    )
