"""Run the self-test inside a built image and read its JSON report."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from imagekit.errors import CheckFailed
from imagekit.image import config_truth, emulation, render
from imagekit.image.imageconfig import RuntimeConfig
from imagekit.model import Cell
from imagekit.oci import selftest_reuse
from imagekit.oci.selftest_reuse import Reuse, RunKey
from imagekit.services.ports import ContainerEngine
from imagekit.services.progress import NullProgress, Progress, activity
from imagekit.trust.untrusted import printable

_PREFIX = "imagekit-selftest: "
TIMEOUT, EMULATED_TIMEOUT = 900, 3600  # seconds: under qemu every check is 5-20 times slower


class NotReusable(Exception):
    """The results offered do not cover what this image's full self-test would run (selftest_reuse.shortfall)."""


@dataclass(frozen=True)
class SelfTestReport:
    image: str
    passed: bool
    report: dict

    @property
    def failed(self) -> list[str]:
        return list(self.report.get("failed", []))

    def summary(self) -> str:
        """What the build's error says: each failed check with its message and fix (failure_lines)."""
        return "\n".join([f"self-test failed: {', '.join(map(str, self.failed))}", *failure_lines(self.report)])


MAX_SHOWN = 8  # failed checks whose message the summary shows; the report holds them all
MAX_MESSAGE, MAX_FIX = 400, 200  # characters of each


def failure_lines(report: dict) -> list[str]:
    """One line per failed check (its message) and one for its fix, as the image wrote them: another party's text,
    so escape sequences and control characters removed, newlines folded, each bounded (trust.untrusted.printable);
    at most MAX_SHOWN checks, the rest counted."""
    checks = report.get("checks") if isinstance(report.get("checks"), list) else []
    failed = [c for c in checks if isinstance(c, dict) and c.get("status") == "fail"]
    lines = []
    for c in failed[:MAX_SHOWN]:
        message = printable(c.get("message") or "(no message)", MAX_MESSAGE)
        lines.append(f"  {printable(c.get('id'), 80)}: {message}")
        if c.get("fix"):
            lines.append(f"    fix: {printable(c.get('fix'), MAX_FIX)}")
    if len(failed) > MAX_SHOWN:
        lines.append(f"  ... and {len(failed) - MAX_SHOWN} more failed checks")
    return lines


def _relay(progress: Progress, cell: str):
    """Lines the self-test prints as each check ends (``imagekit-selftest: pass tiny-model 4.2s``)."""

    def on_line(line: str) -> None:
        if line.startswith(_PREFIX):
            status, _, rest = line[len(_PREFIX) :].partition(" ")
            progress.line(cell, f"self-test {status:<4} {rest}")

    return on_line


@contextmanager
def emulated_cpus(emulated: bool) -> Iterator[dict[str, dict] | None]:
    """For an emulated run, a CPU folder for /sys/devices/system/cpu (imagekit.image.emulation: torch's aarch64 build
    reads its CPU's identification there and crashes without it), removed afterwards."""
    if not emulated:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="imagekit-cpus-") as folder:
        for rel, text in emulation.arm64_cpu_folder(os.cpu_count() or 1).items():
            path = Path(folder) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        yield {folder: {"bind": "/sys/devices/system/cpu", "mode": "ro"}}


def run(
    engine: ContainerEngine,
    image: str,
    *,
    gpus: bool,
    require_gpu: bool,
    progress: Progress | None = None,
    cell: str = "",
    emulated: bool = False,
    runtime: RuntimeConfig | None = None,
    key: RunKey | None = None,
    reuse: Reuse | None = None,
    code_to: str | None = None,
) -> SelfTestReport:
    """The image's self-test, its report as the image wrote it plus how it ran: ``emulated`` (another CPU
    architecture's image under qemu-user-static: the CPU checks only, never "passed on GPU"). With ``runtime`` (the
    config imagekit set), one check more, from outside: the image's config and labels tell the truth
    (imagekit.image.config_truth). ``key`` (oci.selftest_reuse): the run's layers and config, recorded in ``ran``;
    with ``reuse``, the image runs its code layer's checks alone (its hygiene over ``code_to``, where that layer lies,
    and the project's files) and the others are those results."""
    argv = [f"/{render.IMAGEKIT_DIR}/{render.IN_IMAGE['selftest.py']}"] + (["--require-gpu"] if require_gpu else [])
    argv += ["--code-layer"] if reuse is not None else []
    argv += [f"--code-to={code_to}"] if reuse is not None and code_to else []
    if emulated and require_gpu:
        raise CheckFailed(
            f"{image} is for another CPU architecture: its self-test runs emulated, with no GPU",
            "run it with a GPU on a host of its platform (a native CI runner: `imagekit ci init --arm64-runner`), "
            "or build without --require-gpu here",
        )
    progress = progress or NullProgress()
    start = time.monotonic()
    with activity(progress, cell, "self-test", total=None) as act, emulated_cpus(emulated) as volumes:
        code, out, err = engine.run(
            image,
            argv,
            entrypoint=["/opt/venv/bin/python"],
            gpus=gpus,
            on_stderr=_relay(progress, cell),
            timeout=EMULATED_TIMEOUT if emulated else TIMEOUT,
            volumes=volumes,
        )
        act.finish("")
    try:
        report = json.loads(out)
    except json.JSONDecodeError:
        raise CheckFailed(
            f"the self-test in {image} crashed (exit {code}):\n{(err or out)[-2000:]}",
            "the image cannot run its own checks; see the output above",
        ) from None
    if not isinstance(report, dict):
        raise CheckFailed(f"the self-test in {image} wrote no report object (exit {code})", "see the image's output")
    if reuse is not None and isinstance(report.get("checks"), list):
        short = selftest_reuse.shortfall(report, reuse)
        if short is not None:
            raise NotReusable(short)
        report = selftest_reuse.merge(report, reuse)
    if runtime is not None and isinstance(report.get("checks"), list):
        truth = config_truth.check(engine.image(image).get("Config") or {}, runtime, report)
        progress.line(cell, f"self-test {truth['status']:<4} {truth['id']}")
        report = {**report, "checks": [*report["checks"], truth]}
        if truth["status"] == "fail":
            report = {**report, "failed": [*report.get("failed", []), truth["id"]], "passed": False}
    seconds = round(time.monotonic() - start, 1)
    ran = {"emulated": emulated, "gpu": gpus and not emulated, "seconds": seconds, **(key.to_json() if key else {})}
    report = {**report, "ran": ran}
    result = SelfTestReport(image, code == 0 and bool(report.get("passed")), report)
    checks = report.get("checks") if isinstance(report.get("checks"), list) else []
    skipped = sum(1 for c in checks if isinstance(c, dict) and c.get("status") == "skip")
    verdict = "passed" if result.passed else f"FAILED ({', '.join(result.failed) or f'exit {code}'})"
    progress.line(
        cell,
        f"self-test {verdict}: {len(checks)} checks"
        + (f" ({skipped} skipped)" if skipped else "")
        + f" in {seconds:.1f} s"
        + (f", {len(report.get('reused', {}).get('checks', []))} of them reused from {reuse.record}" if reuse else "")
        + (" (emulated: CPU checks only)" if emulated else ""),
    )
    return result


def for_build(
    engine: ContainerEngine,
    image: str,
    built: Cell,
    images: dict,
    *,
    gpus: str,
    emulated: bool,
    code_to: str | None,
    full: bool,
    say: Callable[[str], None],
    **how: object,
) -> SelfTestReport:
    """A build's self-test: with ``full``, every check; otherwise the results an earlier release of the cell (in a
    checked release index's ``images``) offers for this image are reused (oci.selftest_reuse) and only the code
    layer's checks run. ``built``: the image's cell; ``code_to``: where its code layer lies (None: it has none);
    ``how``: the rest of :func:`run`'s options."""
    # with GPUs where the engine has them (``gpus``: auto, on, off); qemu-user runs the CPU checks: no GPU answers
    on_gpu = (gpus == "on" or (gpus == "auto" and engine.capabilities().gpu_runtime)) and not emulated
    inspect = engine.image(image) or {}
    key = selftest_reuse.key_of(inspect, code_layer=code_to is not None, gpu=on_gpu, emulated=emulated)
    shadow = selftest_reuse.on_path(inspect.get("Config") or {}, code_to) if code_to else None
    if full or shadow:
        reuse, why = None, "--full-self-test" if full else f"ENV {shadow} names the code layer's folder {code_to}"
    else:
        from imagekit.services.publishing.release_index import unvouched

        reuse, why = selftest_reuse.find(key, images, built.id, built.platform, origin=unvouched)
    if reuse is not None:
        say(
            f"self-test: the code layer's checks; the others' results are {reuse.record}'s ({reuse.digest}), whose "
            f"{len(reuse.layers)} layers below the code layer are this image's (--full-self-test runs them all)"
        )
        try:
            return run(  # type: ignore[arg-type]
                engine, image, gpus=on_gpu, emulated=emulated, key=key, reuse=reuse, code_to=code_to, **how
            )
        except NotReusable as exc:
            why = str(exc)
    say(f"self-test: every check ({why})")
    return run(engine, image, gpus=on_gpu, emulated=emulated, key=key, **how)  # type: ignore[arg-type]
