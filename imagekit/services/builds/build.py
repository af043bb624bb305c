"""Build use case, per cell: one function per stage (:data:`STAGES`): base -> lock (if stale) -> fetch wheels ->
the project's wheel (`[image] install`) -> render -> docker build -> runtime config -> size budget -> self-test ->
publish."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from imagekit import __version__
from imagekit.compat.catalog import CompatData
from imagekit.effects import index_auth, process, wheelserver
from imagekit.effects.docker import Engine
from imagekit.effects.files import clamp_mtimes, write_atomic, write_tree_atomic
from imagekit.effects.registry import RegistryClient, Remote
from imagekit.errors import CheckFailed, ImagekitError
from imagekit.image import budget, imageconfig, naming, render
from imagekit.image import steps as steps_core
from imagekit.image.buildplan import DEFAULT_SOURCE_DATE_EPOCH, BaseRef, BuildPlan, base_for, manifest
from imagekit.image.code_layer import CodeLayer
from imagekit.image.image_options import ImageOptions
from imagekit.image.project_wheel import REQUIREMENTS_FILE, ProjectWheel
from imagekit.locking import resolution, source_builds
from imagekit.locking.lockfile import Lock
from imagekit.model import AMD64, Cell
from imagekit.services.builds import project_build, selftest_runner, staged_build
from imagekit.services.builds.base_images import native, present, require_emulation
from imagekit.services.builds.build_plans import code_for
from imagekit.services.locks import apt_resolve
from imagekit.services.locks import lock_cells as lock_service
from imagekit.services.ports import ContainerEngine, Registry
from imagekit.services.progress import NullProgress, Progress, activity, human_bytes
from imagekit.services.publishing import blob_prepare, image_tags, publish, release_index, signing
from imagekit.services.publishing.image_tags import set_runtime_config
from imagekit.services.wheels import fetch, wheel_builds, wheel_folders
from imagekit.supplychain import dpkg_status, sbom

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
    full_selftest: bool = False  # every check, reusing no earlier release's results (oci.selftest_reuse)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    source_date_epoch: int = DEFAULT_SOURCE_DATE_EPOCH
    bases: dict[str, BaseRef] = field(default_factory=dict)  # registry bases from the matrix, by Python version
    options: ImageOptions = field(default_factory=ImageOptions)  # the matrix's [image] switches, the flags over them
    # an ECDSA P-256 private key (cosign's): publish signs each image with it before its alias moves; never shown
    sign_key: object | None = field(default=None, repr=False)
    # the vulnerability gate before publish (supplychain.audit): an OSV export, the level that fails, the allowlist
    audit_osv: Path | None = None
    audit_fail_on: str = "high"
    audit_allowlist: Path | None = None
    audit_fail_on_unrated: bool = False  # an advisory with no rating (a DSA for a local root) fails the gate too

    @property
    def outputs(self) -> tuple[Path, ...]:  # what a build writes: never in the code layer (build_plans.code_for)
        return (self.state_dir, self.lock_dir, self.release_index, self.release_records)

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
    digest: str | None = None  # the image's manifest (what a pod pulls by digest)
    tag_digest: str | None = None  # what the immutable tag names: the index of the image and its SBOM attestation
    index_digest: str | None = None  # the alias names an image index of this and the cell's other platforms
    seconds: float = 0.0
    report: dict | None = None
    error: ImagekitError | None = None
    steps: dict[str, float] = field(default_factory=dict)  # wall seconds per stage, in order
    sbom: dict | None = None  # where the SBOM was written, and its package counts
    audit: dict | None = None  # the vulnerability gate's verdict, when it ran

    def step_summary(self) -> str:
        """``base 76 s, lock 0 s, ..., publish 92 s``: where the build's time went."""
        return ", ".join(f"{step} {seconds:.0f} s" for step, seconds in self.steps.items())

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
            **({"tag_digest": self.tag_digest} if self.tag_digest and self.tag_digest != self.digest else {}),
            **({"platform": self.cell.platform} if self.cell.platform != AMD64 else {}),
            **({"index_digest": self.index_digest} if self.index_digest else {}),
            "seconds": round(self.seconds, 1),
            "steps": {step: round(seconds, 1) for step, seconds in self.steps.items()},
            "selftest_failed": (self.report or {}).get("failed"),
            **({"selftest_reused": self.report["reused"]} if self.report and self.report.get("reused") else {}),
            **({"sbom": self.sbom} if self.sbom else {}),
            **({"audit": self.audit} if self.audit else {}),
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
        if line.startswith(("install-layer:", "finalize-layer:", "staged-layer:")):  # where a layer's time went
            self.progress.line(self.cell, line.strip()[:200])
            return
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


@dataclass
class _Build:
    """One cell's build as it goes: the inputs, and what each stage hands the next."""

    cell: Cell
    opts: BuildOptions
    engine: ContainerEngine
    data: CompatData
    registry: Registry
    progress: Progress
    say: Callable[[str], None]
    result: CellResult
    lock: Lock | None = None
    base: BaseRef | None = None
    wheels: list[fetch.FetchedWheel] = field(default_factory=list)
    plan: BuildPlan | None = None
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    built: str = ""  # the builder's image, before its runtime config
    built_at: float = 0.0
    history: list[dict] | None = None  # the built image's history, when imagekit ran its steps (staged_build)
    immutable: str = ""  # the tag the tested image is published under (it names the context's digest)
    report: selftest_runner.SelfTestReport | None = None
    runtime: imageconfig.RuntimeConfig | None = None  # the config _config set: the self-test checks the image has it
    sbom: dict | None = None  # the tested image's SPDX document (_sbom), published with it
    code: CodeLayer | None = None  # `[image] copy`, as read when the context is rendered (or the wheel built)
    project: ProjectWheel | None = None  # `[image] install`: the project's wheel (_project), and where it lies
    project_path: Path | None = None
    alias_before: str | None = None  # the image the cell's alias tag named before this build (_config)
    prepare: blob_prepare.Prepare | None = None  # with --push: the layers' blobs compressed while building


def _lock(b: _Build) -> None:
    """The cell's lock, re-resolved when missing or stale (a line only when it takes time: when it resolves)."""
    assert b.base is not None
    base = b.base
    apt = (lambda cell: apt_resolve.resolve(b.engine, base, cell.apt)) if b.cell.apt else None
    # its from_source packages and its git requirements (a pinned commit needs no other setting)
    build = wheel_builds.builder_in(b.engine, base, b.say) if source_builds.built_names(b.cell) else None
    with activity(b.progress, b.cell.slug, "lock"):
        locked = lock_service.lock_one(b.cell, b.opts.lock_dir, b.opts.settings, b.data, apt=apt, build=build)
    if locked.error:
        raise locked.error
    b.lock = locked.lock
    assert b.lock is not None
    b.result.lock = "re-resolved" if locked.status == "locked" else locked.status
    said = f"re-resolved {locked.path} (it was missing or stale): {b.lock.short_hash}; review and commit it"
    b.say(said if locked.status == "locked" else f"lock {locked.status} ({b.lock.short_hash})")


def _base(b: _Build) -> None:
    """The base image: the matrix's registry base, pulled, or imagekit's own, bootstrapped once."""
    epoch = b.opts.source_date_epoch
    ref = base_for(b.cell.python, b.data, b.opts.bases, b.opts.options, platform=b.cell.platform, epoch=epoch)
    with activity(b.progress, b.cell.slug, f"pulling base {ref.reference}" if ref.registry else "base"):
        b.base = present(ref, b.engine, b.data.bases, epoch, b.say)


def _fetch(b: _Build) -> None:
    """Every locked wheel, sha256 checked, from the content-addressed cache or its index."""
    assert b.lock is not None and b.base is not None  # wheels built from source: made again here where missing
    wheel_builds.ensure_built(b.lock, b.cell, b.opts.settings, b.data, b.base, b.engine, b.say)
    with activity(b.progress, b.cell.slug, "fetching wheels"):
        auth = index_auth.for_indexes([b.opts.settings.index_url, *b.opts.settings.extra_index_urls])
        b.wheels = fetch.fetch_for_build(b.lock, b.cell.python, b.base.glibc, progress=b.progress, cell=b.cell.slug,
                                         auth=auth)  # fmt: skip
    got = [w for w in b.wheels if w.downloaded]
    size = human_bytes(sum(w.path.stat().st_size for w in got))
    b.say(f"{len(b.wheels)} wheels ready ({len(got)} downloaded, {size})")


def _project(b: _Build) -> None:
    """`[image] install`: the project's wheel, built from the copied code in a container of the base (kept by what it
    is built from), its dependencies checked against the lock."""
    options = b.opts.options
    if options.install is None or options.copy is None:
        return
    assert b.lock is not None and b.base is not None
    b.code = code_for(options, b.opts.outputs)
    assert b.code is not None
    with activity(b.progress, b.cell.slug, "project wheel"):
        b.project, b.project_path = project_build.wheel_for(
            b.engine, b.base, b.code, options.copy.source, options.install, b.cell, b.lock, b.wheels,
            b.opts.source_date_epoch, b.say,
        )  # fmt: skip


def _render(b: _Build) -> None:
    """The Dockerfile and its context, written whole, with clamped dates."""
    assert b.lock is not None and b.base is not None
    b.code = b.code or code_for(b.opts.options, b.opts.outputs)
    b.plan = BuildPlan.make(
        b.cell,
        b.lock,
        b.base,
        b.opts.repository,
        b.data,
        options=b.opts.options,
        code=b.code,
        project=b.project,
        source_revision=source_revision(),
        source_date_epoch=b.opts.source_date_epoch,
    )
    b.files = render.render_plan(b.plan)
    context = b.opts.state_dir / "build" / b.cell.slug
    shutil.rmtree(context, ignore_errors=True)
    write_tree_atomic(context, {k: v[0] for k, v in b.files.items()}, {k: v[1] for k, v in b.files.items()})
    clamp_mtimes(context, b.opts.source_date_epoch)


def _build(b: _Build) -> None:
    """The engine builds the context, its wheels served from a loopback wheel server of this build's own."""
    assert b.lock is not None
    b.immutable = naming.immutable_tag(b.opts.repository, b.cell, render.context_digest(b.files))
    house = wheel_folders.wheelhouse(b.wheels, b.opts.state_dir / "wheelhouse" / b.cell.slug)
    wheel_folders.write_requirements(b.lock, house, b.opts.options.cuda_toolkit)  # each RUN reads its file there
    write_atomic(house / render.APP_TARBALL, render.app_tarball(b.files, b.opts.source_date_epoch))
    if b.code is not None:
        write_atomic(house / render.CODE_TARBALL, b.code.tar(b.opts.source_date_epoch))
    if b.project is not None and b.project_path is not None:  # the code layer installs it, by its sha256
        shutil.copyfile(b.project_path, house / b.project.filename)
        write_atomic(house / REQUIREMENTS_FILE, b.files[REQUIREMENTS_FILE][0])
    steps = _StepTimer(b.progress, b.cell.slug)
    foreign = not native(b.cell.platform, os.uname().machine)
    if foreign:
        require_emulation(b.cell.platform)  # its RUN steps are the platform's programs
    b.built_at = time.monotonic()
    if b.opts.push and blob_prepare.enabled() and staged_build.available(b.engine):  # an engine on this machine
        b.prepare = blob_prepare.for_push(b.engine, b.registry, Remote.parse(b.opts.repository), b.say)
    on_image = b.prepare.add if b.prepare is not None else (lambda _: None)
    try:
        with wheelserver.serve(house) as address:  # a loopback address of its own: builds run side by side
            if not foreign and staged_build.available(b.engine):
                try:
                    b.built, b.history = staged_build.build_staged(
                        b.engine,
                        b.opts.state_dir / "build" / b.cell.slug,
                        naming.build_cache_tag(b.cell),
                        staged_build.stage_dir(b.opts.state_dir, b.cell.slug),
                        nocache=b.opts.nocache,
                        on_line=steps,
                        extra_hosts={wheelserver.HOST: address},
                        source_date_epoch=b.opts.source_date_epoch,
                        on_image=on_image,
                    )
                    b.immutable = naming.immutable_tag(
                        b.opts.repository, b.cell, steps_core.build_hash(render.context_digest(b.files))
                    )
                    return
                except staged_build.Unstageable as exc:
                    b.say(f"building with `docker build` ({exc})")
            b.built = b.engine.build(
                b.opts.state_dir / "build" / b.cell.slug,
                [naming.build_cache_tag(b.cell)],
                {},
                nocache=b.opts.nocache,
                on_line=steps,
                extra_hosts={wheelserver.HOST: address},
                platform=b.cell.platform if foreign or b.cell.platform != AMD64 else None,
            )
            on_image(b.built)
    finally:
        steps.close()


def _config(b: _Build) -> None:
    """The runtime config (ENV, WORKDIR, ENTRYPOINT, CMD, labels) over the built layers; the image tagged."""
    assert b.plan is not None and b.base is not None
    immutable = b.immutable
    with activity(b.progress, b.cell.slug, "image config"):
        facts, options = manifest(b.plan), b.plan.options
        labels, home = naming.labels(facts), imageconfig.cuda_home(facts)
        alias = naming.alias_tag(b.opts.repository, b.cell)
        b.alias_before = (b.engine.image(alias) or {}).get("Id")  # put back if this image is refused
        runtime = b.runtime = imageconfig.runtime(labels, options.command, options.env, home)
        b.result.image_id = set_runtime_config(
            b.engine,
            b.built,
            b.base.reference,
            runtime,
            b.opts.source_date_epoch,
            [immutable, naming.alias_tag(b.opts.repository, b.cell)],
            b.say,
            history=b.history,
        )
    b.result.tag = immutable
    b.result.size = int(b.engine.image(immutable)["Size"])  # type: ignore[index]
    b.say(f"built {immutable} ({human_bytes(b.result.size)}) in {time.monotonic() - b.built_at:.0f} s")


def _withdraw(b: _Build) -> str:
    """The refused image out of its published names (image_tags.withdraw); the result's tag is where it is kept."""
    alias = naming.alias_tag(b.opts.repository, b.cell)
    image = b.result.image_id or b.immutable
    b.result.tag = image_tags.withdraw(b.engine, b.cell, image, b.immutable, alias, b.alias_before)
    return b.result.tag


def _budget(b: _Build) -> None:
    """An image over its size budget (or grown past it since the last release) goes no further."""
    assert b.result.size is not None
    previous = release_index.last_size(b.opts.release_index, b.cell.id, b.cell.platform)
    too_big = budget.over(b.result.size, budget.parse(b.opts.options.size_budget), previous)
    if too_big:
        kept = _withdraw(b)
        raise CheckFailed(
            f"size budget: {too_big}",
            f"see what grew with `docker history {kept}`; or set [image] size_budget; nothing was pushed",
        )


def _selftest(b: _Build) -> None:
    """The image's self-test in the image (with GPUs where the engine has them); its report kept either way."""
    # by the image's id, not its tag: another build of the same cell on this engine may move or withdraw the tag
    b.report = selftest_runner.for_build(
        b.engine, b.result.image_id or b.immutable, b.cell,
        release_index.read_index(b.opts.release_index).get("images", {}),
        gpus=b.opts.gpus, emulated=not native(b.cell.platform, os.uname().machine),
        code_to=b.code.to if b.code else None, full=b.opts.full_selftest,
        say=b.say, require_gpu=b.opts.require_gpu, progress=b.progress, cell=b.cell.slug, runtime=b.runtime,
    )  # fmt: skip
    b.result.report = b.report.report
    reports = b.opts.state_dir / "reports" / f"{b.cell.slug}.json"
    write_atomic(reports, json.dumps(b.report.report, indent=2) + "\n")
    if not b.report.passed:
        kept = _withdraw(b)
        raise CheckFailed(
            b.report.summary(), f"the whole report is {reports}; nothing was pushed; the image is kept as {kept}"
        )
    b.result.status = "passed"


_SBOM_READ = "cat /etc/os-release; echo; echo {sep}; cat /var/lib/dpkg/status"
_SEPARATOR = "@@imagekit-dpkg-status@@"


def _sbom(b: _Build) -> None:
    """The image's SBOM (supplychain.sbom): the lock's distributions and the Debian packages its dpkg database lists,
    read out of the tested image; kept beside its self-test report and published with it."""
    assert b.plan is not None and b.lock is not None and b.result.image_id
    code, out, err = b.engine.run(
        b.immutable, [_SBOM_READ.format(sep=_SEPARATOR)], entrypoint=["/bin/sh", "-c"], timeout=300
    )
    os_release, sep, status = out.partition(f"\n{_SEPARATOR}\n")
    if code != 0 or not sep:
        b.say(f"warning: no dpkg database in {b.immutable} (exit {code}: {err.strip()[-200:]}): SBOM of the lock alone")
        os_release, status = out if not sep else os_release, ""
    repo, tag = b.immutable.rsplit(":", 1)
    facts = sbom.ImageFacts(
        cell=b.cell.id,
        repository=repo,
        tag=tag,
        image_id=b.result.image_id,
        platform=b.cell.platform,
        base=b.plan.base.reference,
        distro=sbom.distro(os_release),
        created=int(b.opts.source_date_epoch),
        tool=f"imagekit-{__version__}",
    )
    b.sbom = sbom.document(facts, b.lock, dpkg_status.parse(status.encode()), b.plan.layering)
    path = b.opts.state_dir / "sbom" / f"{b.cell.slug}.spdx.json"
    write_atomic(path, json.dumps(b.sbom, indent=1, sort_keys=True) + "\n")
    counts = sbom.counts(b.sbom)
    b.result.sbom = {"path": str(path), **counts}
    b.say(f"SBOM: {counts['python']} Python distributions, {counts['dpkg']} Debian packages ({path})")


def _audit(b: _Build) -> None:
    """With an OSV export: the image's SBOM against it; a finding at or above the level, not allowlisted, stops the
    build before anything is pushed."""
    if b.opts.audit_osv is None or b.sbom is None:
        return
    import datetime as dt

    from imagekit.services.publishing import audit_run
    from imagekit.supplychain import audit

    target = audit_run.Target(b.immutable, audit.packages_from_sbom(b.sbom), "its SBOM")
    scan, verdict = audit_run.run(
        target,
        b.opts.audit_osv,
        b.opts.audit_allowlist,
        b.opts.audit_fail_on,
        dt.date.today(),
        fail_unrated=b.opts.audit_fail_on_unrated,
    )
    b.result.audit = {
        "records": scan.records,
        "findings": len(verdict.findings),
        "blocking": [f"{f.id} {f.package.name} {f.package.version} ({f.severity})" for f in verdict.blocking],
        "expired": [e.id for e, _ in verdict.expired],
        "unrated": verdict.unrated,
    }
    b.say(
        f"audit: {len(verdict.findings)} known vulnerabilities in {len(target.packages)} packages "
        f"({scan.records} OSV records, {scan.used} used), {len(verdict.blocking)} at or above "
        f"{b.opts.audit_fail_on}{' or unrated' if b.opts.audit_fail_on_unrated else ''} not allowlisted, "
        f"{verdict.unrated} unrated"
    )
    if not verdict.passed:
        named = ", ".join(
            b.result.audit["blocking"][:5] + [f"expired allowlist entry {e}" for e in b.result.audit["expired"][:5]]
        )
        raise CheckFailed(
            f"audit: {named}",
            "`imagekit audit CELL --osv-db ...` lists them; move to fixed versions or allowlist each with its reason "
            "and review_by; nothing was pushed",
        )


def _signer(b: _Build, remote: Remote) -> Callable[[str], dict] | None:
    if b.opts.sign_key is None:
        return None
    key = b.opts.sign_key
    return lambda digest: signing.sign(b.registry, remote, digest, key, log=b.say)


def _publish(b: _Build) -> None:
    """Push the tested image under its immutable tag, then move the alias; record the release."""
    if not b.opts.push:
        return
    assert b.report is not None and b.lock is not None and b.plan is not None and b.result.image_id
    repo, tag = b.immutable.rsplit(":", 1)
    if b.prepare is not None:
        with activity(b.progress, b.cell.slug, "wait for the layers compressed during the build"):
            b.say(b.prepare.finish().summary())
    with activity(b.progress, b.cell.slug, "publish"):
        published = publish.publish(
            b.engine,
            b.registry,
            image_id=b.result.image_id,
            repository=repo,
            immutable_tag=tag,
            alias_tag=b.cell.id,  # every platform's image under one tag
            report=b.report,
            log=b.say,
            progress=b.progress,
            platform=b.cell.platform,
            sbom_doc=b.sbom,
            sign=_signer(b, Remote.parse(repo)),
            variants=b.opts.options.variants,
        )
    b.result.digest = published.digest
    b.result.tag_digest = published.tag_digest
    b.result.index_digest = published.index_digest
    try:
        layer_sizes = publish.layer_sizes(b.registry, Remote.parse(repo), published.digest, published.config_digest)
    except ImagekitError as exc:  # published already: the record goes without its layer sizes
        layer_sizes = None
        b.say(f"warning: layer sizes not read back from the registry: {exc.message}")
    release_index.record(
        b.opts.release_index,
        published,
        lock_hash=b.lock.content_hash,
        manifest=manifest(b.plan),
        report=b.report.report,
        size=b.result.size,
        records_dir=b.opts.release_records,
        layers=layer_sizes,
    )
    b.result.status = "published"
    b.say(f"published {published.immutable}@{published.digest}")


# The build, stage by stage: (the step a failure is reported at, the stage). Each stage reads what the ones before
# it left on the _Build; a failure stops the build there (nothing is pushed unless the self-test passed).
STAGES: tuple[tuple[str, Callable[[_Build], None]], ...] = (
    ("base", _base),  # first: a cell's `[image] apt` packages are locked over it
    ("lock", _lock),
    ("fetch", _fetch),
    ("project", _project),  # `[image] install`: the project's wheel, from the fetched wheels of its build backend
    ("render", _render),
    ("build", _build),
    ("build", _config),
    ("size-budget", _budget),
    ("self-test", _selftest),
    ("sbom", _sbom),
    ("audit", _audit),
    ("publish", _publish),
)


def build_cell(
    cell: Cell,
    opts: BuildOptions,
    engine: ContainerEngine,
    data: CompatData,
    log: Log,
    progress: Progress | None = None,
    registry: Registry | None = None,
) -> CellResult:
    """Base -> lock (when stale) -> fetch -> render -> build -> runtime config -> size budget -> self-test -> publish
    (:data:`STAGES`). Nothing is pushed unless the self-test passed; the alias tag moves only after the immutable tag
    is published."""
    result = CellResult(cell)
    registry = registry or RegistryClient(
        opts.username, opts.password, registries=[Remote.parse(opts.repository).registry]
    )
    start = time.time()
    run = _Build(
        cell, opts, engine, data, registry, progress or NullProgress(), lambda msg: log(cell.slug, msg), result
    )
    try:
        for step, stage in STAGES:
            result.step = step
            began = time.time()
            try:
                stage(run)
            finally:
                result.steps[step] = result.steps.get(step, 0.0) + time.time() - began
        result.step = "done"
    except ImagekitError as exc:
        result.status = "failed"
        result.error = exc
    finally:
        if run.prepare is not None:  # what a published image did not take: a failed or refused build's blobs
            run.prepare.discard()
        result.seconds = time.time() - start
    return result


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
