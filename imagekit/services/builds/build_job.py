"""`imagekit build` over the selected cells, as one job: its flags refused before any work when they cannot work
(:func:`check`), its options decided once (:func:`prepare`: the repository, the registry's credentials, the signing
key, the image's options), then either the forecast alone (:func:`dry_run`) or the forecast as the gate and each cell
built (:func:`run`, over ``services/builds/build.py``). The CLI parses the flags and prints; it decides nothing here."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from imagekit.compat.catalog import CompatData
from imagekit.effects import credentials, http
from imagekit.effects.credentials import Credential
from imagekit.effects.registry import RegistryClient, Remote
from imagekit.errors import ImagekitError, UsageError
from imagekit.image.image_options import ImageOptions
from imagekit.locking import resolution
from imagekit.matrix.matrix_file import MatrixConfig
from imagekit.model import Cell
from imagekit.services.builds import forecast
from imagekit.services.builds.build import BuildOptions, CellResult, build_cells
from imagekit.services.progress import Progress
from imagekit.trust.validate import repository as validate_repository

GPUS = ("auto", "on", "off")
AUDIT_LEVELS = ("low", "medium", "high", "critical")


@dataclass(frozen=True)
class BuildRequest:
    """`imagekit build`'s flags, as given (an invalid --gpus is refused as the request is made)."""

    registry: str | None = None  # --registry (default: the matrix's [image] repository)
    push: bool = False
    lock_dir: Path = Path("lockfiles")
    state_dir: Path = Path(".imagekit")
    release_index: Path = Path("releases/index.json")
    release_records: Path = Path("releases/records")
    no_cache: bool = False
    gpus: str = "auto"
    require_gpu: bool = False
    full_self_test: bool = False
    keep_going: bool = False
    sign_key: Path | None = None
    audit_osv: Path | None = None
    audit_fail_on: str = "high"
    audit_allowlist: Path | None = None
    audit_fail_on_unrated: bool = False

    def __post_init__(self) -> None:
        if self.gpus not in GPUS:
            raise UsageError(f"invalid --gpus {self.gpus!r}", "use auto, on or off")


def check(request: BuildRequest) -> object | None:
    """Refuse now what would fail after the build: a broken release index, the publish's settings in the environment
    (IMAGEKIT_GZIP_LEVEL, IMAGEKIT_PREPARE_BLOBS), the audit gate's options, a signing key without --push or that does
    not open (a wrong password). Returns the opened key (None without --sign-key)."""
    from imagekit.services.publishing.release_index import read_index

    read_index(request.release_index)  # a broken index is refused now, not after the build
    if request.push:  # the publish's settings from the environment: refused now, not after the build and self-test
        from imagekit.services.publishing import blob_prepare, blob_push

        blob_push.default_gzip()
        blob_prepare.enabled()
    if request.audit_fail_on not in AUDIT_LEVELS:
        raise UsageError(f"invalid --audit-fail-on {request.audit_fail_on!r}", "use low, medium, high or critical")
    if request.audit_osv is not None and not request.audit_osv.exists():
        raise UsageError(
            f"--audit-osv {request.audit_osv} does not exist", "pass osv.dev's all.zip or a folder of them"
        )
    if request.sign_key is None:
        return None
    if not request.push:
        raise UsageError("--sign-key signs what --push publishes", "add --push, or sign later: imagekit sign")
    from imagekit.effects.files import read_input
    from imagekit.supplychain import cosign

    key_bytes = (read_input(request.sign_key, "--sign-key", "pass the cosign.key file") or "").encode()
    try:  # opened now: a wrong password is refused before the build, not after it
        return cosign.load_private_key(key_bytes, os.environ.get("COSIGN_PASSWORD", "").encode())
    except cosign.KeyError_ as exc:
        raise UsageError(f"--sign-key {request.sign_key}: {exc}", "set COSIGN_PASSWORD to the key's password") from None


@dataclass(frozen=True)
class Job:
    """A checked build: what each cell's build is given, where it publishes and with which credentials."""

    opts: BuildOptions
    remote: Remote
    credential: Credential
    keep_going: bool = False


def prepare(
    request: BuildRequest,
    config: MatrixConfig,
    options: ImageOptions,
    settings: Callable[[MatrixConfig], resolution.LockSettings],
    signer: object | None,
) -> Job:
    """The job for ``config``'s cells: ``options`` (the matrix's `[image]` with the flags over them), the resolver
    ``settings`` over the matrix's indexes, the registry's credentials looked up only for --push."""
    repo = validate_repository(request.registry) if request.registry else config.repository
    remote = Remote.parse(repo)
    credential = credentials.for_registry(remote.registry) if request.push else credentials.NONE
    opts = BuildOptions(
        repository=repo,
        lock_dir=request.lock_dir,
        state_dir=request.state_dir,
        release_index=request.release_index,
        release_records=request.release_records,
        push=request.push,
        nocache=request.no_cache,
        gpus=request.gpus,
        require_gpu=request.require_gpu,
        full_selftest=request.full_self_test,
        settings=settings(config),
        bases=config.bases,
        options=options,
        username=credential.username,
        password=credential.password,
        sign_key=signer,
        audit_osv=request.audit_osv,
        audit_fail_on=request.audit_fail_on,
        audit_allowlist=request.audit_allowlist,
        audit_fail_on_unrated=request.audit_fail_on_unrated,
    )
    return Job(opts, remote, credential, request.keep_going)


def dry_run(job: Job, cells: list[Cell], config: MatrixConfig, data: CompatData) -> forecast.Forecast:
    """What the build would do (with --push: where it would publish, and what the registry holds now)."""
    opts = job.opts
    plan = forecast.forecast(
        cells, config, data, lock_dir=opts.lock_dir, settings=opts.settings, engine=forecast.engine_or_none()
    )
    if opts.push:
        published = published_notes(opts.repository, job.credential, cells)
        plan = replace(plan, notes=(*plan.notes, push_note(opts.repository, job.credential), *published))
    return plan


def run(
    job: Job,
    cells: list[Cell],
    config: MatrixConfig,
    data: CompatData,
    progress: Progress,
    engine_note: Callable[[str], None] | None = None,
) -> list[CellResult]:
    """Build the cells: the registry's access checked first with --push (a refused login would otherwise surface
    after the build), the engine's notes said (to ``engine_note``), the forecast shown and its blockers and a short
    disk refused, then each cell built."""
    from imagekit.effects.docker import Engine

    opts = job.opts
    if opts.push:
        client = RegistryClient(job.credential.username, job.credential.password, registries=[job.remote.registry])
        client.check_access(job.remote)
    engine = Engine()
    for note in engine.capabilities().notes if engine_note is not None else ():
        engine_note(note)
    plan = forecast.forecast(cells, config, data, lock_dir=opts.lock_dir, settings=opts.settings, engine=engine)
    for line in forecast.render_text(plan):
        progress.line("", "plan: " + line)
    if plan.blockers:
        raise plan.blocked_error()
    if not plan.disk_ok:
        raise plan.disk_error()
    return build_cells(cells, opts, data, progress.line, keep_going=job.keep_going, engine=engine, progress=progress)


def push_note(repo: str, credential: Credential) -> str:
    """Where --push would publish, and with which credentials (their source, never their values)."""
    if credential.found:
        return f"push to {repo}: credentials from {credential.source}"
    host = repo.split("/", 1)[0]
    return (
        f"push to {repo}: no credentials found (a registry that needs them refuses the push; set "
        f"IMAGEKIT_REGISTRY_USER and IMAGEKIT_REGISTRY_PASSWORD, or run `docker login {host}`)"
    )


def published_notes(repo: str, credential: Credential, cells: list[Cell]) -> list[str]:
    """What the registry holds under each cell's alias tag now: a dry run says what --push would replace. The
    registry's refusal or silence is a note too, never the plan's failure."""
    remote = Remote.parse(repo)
    down = http.unreachable(remote.base.split("/v2/", 1)[0] + "/v2/", timeout=5)  # one try: a plan does not wait
    if down is not None:
        return [f"{repo}: cannot tell what is published (registry {remote.registry} is unreachable: {down})"]
    client = RegistryClient(credential.username, credential.password, registries=[remote.registry])
    notes = []
    for cell in cells:
        try:
            found = client.oci_manifest(remote, cell.id)
        except ImagekitError as exc:
            return [*notes, f"{repo}: cannot tell what is published ({exc.message.splitlines()[0][:200]})"]
        notes.append(
            f"{repo}:{cell.id} is published now ({found.digest[:19]}…): --push moves this alias to the new build "
            "(its immutable tag is new)"
            if found is not None
            else f"{repo}:{cell.id} is not published yet"
        )
    return notes
