"""Build use case, per cell: lock (if stale) -> fetch wheels -> render -> docker build -> self-test -> publish."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from imagekit import __version__, budget, imageconfig, naming, render, resolution
from imagekit.buildplan import DEFAULT_SOURCE_DATE_EPOCH, BaseRef, BuildPlan, ImageOptions, manifest
from imagekit.compat import CompatData
from imagekit.effects import process, wheelserver
from imagekit.effects.docker import Engine
from imagekit.effects.files import clamp_mtimes, write_atomic, write_tree_atomic
from imagekit.effects.registry import RegistryClient, Remote
from imagekit.errors import CheckFailed, EnvironmentFailure, ImagekitError
from imagekit.model import Cell
from imagekit.services import fetch, publish, selftest_runner
from imagekit.services import lock_cells as lock_service
from imagekit.services.base_images import ensure_base
from imagekit.services.ports import ContainerEngine, Registry
from imagekit.services.progress import NullProgress, Progress, activity, human_bytes

Log = Callable[[str, str], None]  # (cell id, message)


@dataclass(frozen=True)
class BuildOptions:
    repository: str
    lock_dir: Path = Path("lockfiles")
    state_dir: Path = Path(".imagekit")
    release_index: Path = Path("releases/index.json")
    release_records: Path = Path("releases/records")  # one record per published immutable tag (CI merges them)
    settings: resolution.LockSettings = field(default_factory=resolution.LockSettings)
    push: bool = False
    nocache: bool = False
    gpus: str = "auto"  # auto | on | off
    require_gpu: bool = False
    username: str | None = None
    password: str | None = None
    source_date_epoch: int = DEFAULT_SOURCE_DATE_EPOCH
    bases: dict[str, BaseRef] = field(default_factory=dict)  # registry bases from the matrix, by Python version
    options: ImageOptions = field(default_factory=ImageOptions)  # the matrix's [image] switches

    @property
    def auth(self) -> dict | None:
        return {"username": self.username, "password": self.password or ""} if self.username else None


@dataclass
class CellResult:
    cell: Cell
    status: str = "pending"  # passed | published | failed
    step: str = "lock"
    lock: str | None = None  # up-to-date | re-resolved
    image_id: str | None = None
    tag: str | None = None
    size: int | None = None
    digest: str | None = None
    seconds: float = 0.0
    report: dict | None = None
    error: ImagekitError | None = None

    def to_json(self) -> dict:
        return {
            "cell": self.cell.id,
            "status": self.status,
            "step": self.step,
            "lock": self.lock,
            "image_id": self.image_id,
            "tag": self.tag,
            "size_bytes": self.size,
            "digest": self.digest,
            "seconds": round(self.seconds, 1),
            "selftest_failed": (self.report or {}).get("failed"),
            "error": self.error.render() if self.error else None,
        }


def source_revision() -> str:
    res = process.run(["git", "rev-parse", "--short=12", "HEAD"], timeout=10) if shutil.which("git") else None
    return res.stdout.strip() if res is not None and res.ok else "unknown"


class _StepTimer:
    """Docker build steps as activities: each `Step N/M` line starts one, the next ends it with its elapsed time."""

    def __init__(self, progress: Progress, cell: str) -> None:
        self.progress, self.cell = progress, cell
        self.current = None

    def __call__(self, line: str) -> None:
        if not line.startswith("Step "):
            return
        self.close()
        head, _, instruction = line.partition(" : ")
        self.progress.line(self.cell, line[:160])
        self.current = self.progress.begin(self.cell, f"{head.lower()} {instruction.split(' ', 1)[0]}")

    def close(self) -> None:
        if self.current is not None:
            self.current.finish()
            self.current = None


def build_cell(
    cell: Cell,
    opts: BuildOptions,
    engine: ContainerEngine,
    data: CompatData,
    log: Log,
    progress: Progress | None = None,
    registry: Registry | None = None,
) -> CellResult:
    """Lock (when stale) -> base -> fetch -> render -> build -> runtime config -> size budget -> self-test -> publish.
    Nothing is pushed unless the self-test passed; the alias tag moves only after the immutable tag is published."""
    result = CellResult(cell)
    registry = registry or RegistryClient(
        opts.username, opts.password, registries=[Remote.parse(opts.repository).registry]
    )
    start = time.time()
    say = lambda msg: log(cell.id, msg)  # noqa: E731
    progress = progress or NullProgress()
    try:
        with activity(progress, cell.id, "lock"):  # a line only when it takes time: when it resolves
            locked = lock_service.lock_one(cell, opts.lock_dir, opts.settings, data)
        if locked.error:
            raise locked.error
        lock = locked.lock
        result.lock = "re-resolved" if locked.status == "locked" else locked.status
        if locked.status == "locked":
            say(f"re-resolved {locked.path} (it was missing or stale): {lock.short_hash}; review and commit it")
        else:
            say(f"lock {locked.status} ({lock.short_hash})")
        result.step = "base"
        if cell.python in opts.bases:
            base = opts.bases[cell.python]
            with activity(progress, cell.id, f"pulling base {base.reference}"):
                engine.pull(base.reference)
        else:
            with activity(progress, cell.id, "base"):
                base = ensure_base(
                    data.bases[cell.python], engine, opts.source_date_epoch, say, compiler=opts.options.compiler
                )
        result.step = "fetch"
        with activity(progress, cell.id, "fetching wheels"):
            wheels = fetch.fetch_for_build(lock, cell.python, base.glibc, progress=progress, cell=cell.id)
        got = [w for w in wheels if w.downloaded]
        say(
            f"{len(wheels)} wheels ready ({len(got)} downloaded, "
            f"{human_bytes(sum(w.path.stat().st_size for w in got))})"
        )
        result.step = "render"
        plan = BuildPlan(
            cell=cell,
            lock=lock,
            base=base,
            repository=opts.repository,
            source_revision=source_revision(),
            source_date_epoch=opts.source_date_epoch,
        )
        files = render.render_plan(plan, data)
        context = opts.state_dir / "build" / cell.id
        shutil.rmtree(context, ignore_errors=True)
        write_tree_atomic(context, {k: v[0] for k, v in files.items()}, {k: v[1] for k, v in files.items()})
        clamp_mtimes(context, opts.source_date_epoch)
        result.step = "build"
        alias = naming.alias_tag(opts.repository, cell)
        immutable = naming.immutable_tag(opts.repository, cell, render.context_digest(files))
        house = fetch.wheelhouse(wheels, opts.state_dir / "wheelhouse" / cell.id)
        fetch.write_requirements(lock, house)  # each layer's RUN reads its requirements from the server too
        write_atomic(house / render.APP_TARBALL, render.app_tarball(files, opts.source_date_epoch))
        steps = _StepTimer(progress, cell.id)
        built_at = time.monotonic()
        try:
            with wheelserver.serve(house) as address:  # a loopback address of its own: builds run side by side
                built = engine.build(
                    context,
                    [naming.build_cache_tag(cell)],
                    {},
                    nocache=opts.nocache,
                    on_line=steps,
                    extra_hosts={wheelserver.HOST: address},
                )
        finally:
            steps.close()
        with activity(progress, cell.id, "image config"):
            runtime = imageconfig.runtime(naming.labels(manifest(plan, data)))
            result.image_id = set_runtime_config(
                engine, built, base.reference, runtime, opts.source_date_epoch, [immutable, alias], say
            )
        result.tag = immutable
        result.size = int(engine.image(immutable)["Size"])
        say(f"built {immutable} ({human_bytes(result.size)}) in {time.monotonic() - built_at:.0f} s")
        result.step = "size-budget"
        previous = publish.last_size(opts.release_index, cell.id)
        too_big = budget.over(result.size, budget.parse(opts.options.size_budget), previous)
        if too_big:
            raise CheckFailed(
                f"size budget: {too_big}",
                "see what grew with `docker history " + immutable + "`; or set [image] size_budget; nothing was pushed",
            )
        result.step = "self-test"
        caps = engine.capabilities()
        gpus = opts.gpus == "on" or (opts.gpus == "auto" and caps.gpu_runtime)
        report = selftest_runner.run(
            engine, immutable, gpus=gpus, require_gpu=opts.require_gpu, progress=progress, cell=cell.id
        )
        result.report = report.report
        write_atomic(opts.state_dir / "reports" / f"{cell.id}.json", json.dumps(report.report, indent=2) + "\n")
        if not report.passed:
            raise CheckFailed(
                f"self-test failed: {', '.join(report.failed)}",
                f"details in {opts.state_dir / 'reports' / (cell.id + '.json')}; nothing was pushed",
            )
        result.status = "passed"
        if opts.push:
            result.step = "publish"
            repo, tag = immutable.rsplit(":", 1)
            with activity(progress, cell.id, "publish"):
                published = publish.publish(
                    engine,
                    registry,
                    image_id=result.image_id,
                    repository=repo,
                    immutable_tag=tag,
                    alias_tag=cell.id,
                    report=report,
                    auth=opts.auth,
                    log=say,
                    progress=progress,
                )
            result.digest = published.digest
            remote = Remote.parse(repo)
            try:
                layer_sizes = publish.layer_sizes(registry, remote, published.digest, published.config_digest)
            except ImagekitError as exc:  # published already: the record goes without its layer sizes
                layer_sizes = None
                say(f"warning: layer sizes not read back from the registry: {exc.message}")
            publish.record(
                opts.release_index,
                published,
                lock_hash=lock.content_hash,
                manifest=manifest(plan, data),
                report=report.report,
                size=result.size,
                records_dir=opts.release_records,
                layers=layer_sizes,
            )
            result.status = "published"
            say(f"published {published.immutable}@{published.digest}")
        result.step = "done"
    except ImagekitError as exc:
        result.status = "failed"
        result.error = exc
    finally:
        result.seconds = time.time() - start
    return result


def set_runtime_config(
    engine: ContainerEngine,
    built: str,
    base: str,
    runtime: imageconfig.RuntimeConfig,
    source_date_epoch: int,
    tags: list[str],
    say: Callable[[str], None],
) -> str:
    """The built image with its ENV, WORKDIR, ENTRYPOINT, CMD and labels, tagged ``tags``: a new config over the same
    layers, loaded in milliseconds; when the engine's history cannot be matched to the layers, or the engine refuses
    the load, a container commit (one step's time) makes the same image but for its dates."""
    try:
        base_image = engine.image(base) or {}
        history = engine.history(built)
        layers_of = {
            item["Id"]: len((engine.image(item["Id"]) or {}).get("RootFS", {}).get("Layers", []))
            for item in history
            if item.get("Id", "<missing>") != "<missing>"
        }
        entries = imageconfig.history_entries(
            history, layers_of, base_image.get("Id", ""), len(base_image.get("RootFS", {}).get("Layers", []))
        )
        built_image = engine.image(built)
        if built_image is None:
            raise imageconfig.Unknown(f"the engine has no image {built}")
        config = imageconfig.config_json(built_image, entries, runtime, source_date_epoch, __version__)
        return engine.load_config(config, tags)
    except (imageconfig.Unknown, EnvironmentFailure) as exc:
        say(f"setting the image config by a container commit ({exc})")
        return engine.commit_changes(built, runtime.instructions(" "), tags)


def build_cells(
    cells: list[Cell],
    opts: BuildOptions,
    data: CompatData,
    log: Log,
    keep_going: bool = False,
    engine: ContainerEngine | None = None,
    progress: Progress | None = None,
) -> list[CellResult]:
    engine = engine or Engine()
    results = []
    for cell in cells:
        res = build_cell(cell, opts, engine, data, log, progress)
        results.append(res)
        if res.status == "failed" and not keep_going:
            break
    return results
