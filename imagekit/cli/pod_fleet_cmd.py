"""`imagekit pod create` and `imagekit pod reap`: rent a pod guarded by default and recorded before anything waits on
it; find and end, from outside, the imagekit pods the guard inside them missed."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli import guard_options as go
from imagekit.cli.common import err_console, handles_errors, out_json
from imagekit.cli.options import JsonOpt
from imagekit.clouds import providers

PODS = providers.pod_provider()
CREATES = providers.pod_providers()
CREATE_EPILOG = (
    f"Example: {PODS.account_key}=... imagekit pod create cu118-torch2.5.1-py3.11-tf4.48.2 --gpu 'NVIDIA GeForce RTX "
    "3090' --deadline 6h. Armed unless --no-guard: stop after 45m idle, after 60m of a process holding GPU memory "
    "while nothing moves, on a start-check blocker after 20m, and 10m after every job and `pod run` has ended (outputs "
    "checksummed); never terminate unless asked. It prints the worst case: how long the pod can bill after its work."
)
REAP_EPILOG = (
    f"Example: {PODS.account_key}=... imagekit pod reap --dry-run --older-than 1d. imagekit's pods carry "
    "IMAGEKIT_CREATED in their env (pod create, the templates); any other pod is listed and never touched."
)


def register_create(app: typer.Typer, write, warn) -> None:  # type: ignore[no-untyped-def]
    @app.command("create", epilog=CREATE_EPILOG)
    @handles_errors
    def create(
        ref: Annotated[
            str,
            typer.Argument(
                metavar="CELL_OR_TAG",
                help="A cell id or tag from the release index, or a published image as REGISTRY/REPO:TAG (or "
                "@sha256:...), read from its labels in the registry when the index does not record it.",
            ),
        ],
        gpu: Annotated[
            str,
            typer.Option(
                "--gpu",
                metavar="ID",
                help="RunPod's GPU type id, e.g. 'NVIDIA GeForce RTX 3090' (checked against "
                "the architectures the cell's torch build has kernels for).",
            ),
        ],
        count: Annotated[int, typer.Option("--count", min=1, max=8, metavar="N", help="GPUs in the pod.")] = 1,
        cloud: Annotated[
            str | None,
            typer.Option(
                "--cloud",
                metavar="NAME",
                help=f"Where it runs (RunPod: {' or '.join(PODS.pod_clouds)}; default the first).",
            ),
        ] = None,
        provider: Annotated[
            str, typer.Option("--provider", metavar="|".join(CREATES), help="Whose pod: its API and account key.")
        ] = PODS.name,
        volume_gb: Annotated[
            int,
            typer.Option("--volume", min=10, max=10_000, metavar="GB", help="Pod volume on /workspace (10 GB and up)."),
        ] = 50,
        no_guard: go.NoGuardOpt = False,
        deadline: go.DeadlineOpt = None,
        idle_stop: go.IdleStopOpt = None,
        on_blocker: go.OnBlockerOpt = None,
        blocker_grace: go.BlockerGraceOpt = None,
        on_exit: go.OnExitOpt = None,
        exit_grace: go.ExitGraceOpt = None,
        hung_stop: go.HungStopOpt = None,
        guard_action: go.GuardActionOpt = None,
        gpu_idle_stop: Annotated[
            str | None,
            typer.Option(
                "--gpu-idle-stop", metavar="DURATION", help="Guard: stop it when a job's GPUs idle that long (30m)."
            ),
        ] = None,
        registry_auth: Annotated[
            str | None,
            typer.Option("--registry-auth", metavar="ID", help="RunPod's id of the credentials for a private image."),
        ] = None,
        arch: Annotated[
            str | None, typer.Option("--arch", metavar="sm_XY", help="The GPU's architecture, when imagekit lacks it.")
        ] = None,
        release_index: Annotated[
            Path, typer.Option("--release-index", metavar="FILE", help="Where published images are recorded.")
        ] = Path("releases/index.json"),
        api_url: Annotated[
            str | None, typer.Option("--api-url", metavar="URL", help="The provider's API base (default: its own).")
        ] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the request body; send nothing.")] = False,
        as_json: JsonOpt = False,
    ) -> None:
        """Rent a pod for a published image (RunPod unless --provider), only on hosts that can run it: the host
        filters from the image's CUDA, the GPU refused (exit 2, naming those that work) when torch has no kernels for
        it. The lifetime
        guard is armed (stop, never terminate, unless asked; off with --no-guard). The pod's id is recorded here before
        anything waits on it (`pod reap` finds it whatever happens). Prints the pod id and its price per hour."""
        values = dict(locals())
        _create(values, go.choice(values, gpu_idle_stop), write, warn)


def _create(v: dict, choice, write, warn) -> None:  # type: ignore[no-untyped-def]
    from imagekit.clouds import guard_defaults, pod_create
    from imagekit.clouds.pull import unreachable_registry
    from imagekit.errors import UsageError
    from imagekit.services import inputs
    from imagekit.services.pods import pod_fleet, remote_contract

    name, creates = v["provider"], providers.pod_providers()  # the registry as it is now (a provider added since)
    if name not in creates:
        raise UsageError(f"--provider {name[:40]!r}: {' or '.join(creates)} (imagekit rents pods there)",
                         "rent elsewhere from the provider's template: imagekit <provider>-template")  # fmt: skip
    cloud = providers.named(name)
    assert cloud.pod_body is not None
    data = inputs.compat_data()
    gpu = v["gpu"]
    entry = remote_contract.release(v["release_index"], v["ref"], pod_create.platform_of_gpu(data, gpu))  # Grace
    if "source" in entry:
        warn(f"pod create: from {entry['source']}")
    guard = guard_defaults.env(choice)
    marks = guard_defaults.marks(dt.datetime.now(dt.UTC), choice.deadline)
    body = cloud.pod_body(
        entry, data, gpu, count=v["count"], cloud=v["cloud"] or cloud.pod_clouds[0], volume_gb=v["volume_gb"],
        registry_auth=v["registry_auth"], arch=v["arch"], guard=guard, env=marks,
    )  # fmt: skip
    if v["dry_run"]:
        out_json(body)
        return
    unreachable = unreachable_registry(entry["tag"])
    if unreachable:
        raise UsageError(f"no pod can pull {entry['tag']}: {unreachable}", "publish to a registry pods reach")
    key = _account_key("pod create", cloud.account_key)
    answer = pod_fleet.create(cloud, body, key, v["api_url"] or cloud.api)  # recorded before anything is printed
    price = cloud.pod_price(answer)
    armed = guard_defaults.armed(guard)
    if v["as_json"]:
        out_json({"pod": answer["id"], "provider": name, "cost_per_hour": price, "guard": armed,
                  "worst_case": guard_defaults.worst_case(guard), "request": body})  # fmt: skip
        return
    write(answer["id"] + "\n")
    deadline = f"; reap deadline {marks[guard_defaults.DEADLINE]}" if guard_defaults.DEADLINE in marks else ""
    said = (
        f"guard armed: {'; '.join(armed)} (off: --no-guard, or a trigger's flag with off){deadline}. "
        + guard_defaults.worst_case(guard)
        if armed
        else "no lifetime guard (--no-guard): nothing stops this pod but you (imagekit pod stop ID)"
    )
    hosts = ((body.get("gpu") or {}).get("allowedCudaVersions") or [None])[0] if isinstance(body.get("gpu"), dict) \
        else None  # fmt: skip
    err_console().print(
        f"created {cloud.command.display} pod {answer['id']} ({price}) for {entry['tag']} on {gpu}"
        + (f"; host CUDA {hosts}+" if isinstance(hosts, str) else "")
        + f"; {said}",
        markup=False,
    )


def _account_key(command: str, variable: str = PODS.account_key) -> str:
    import os

    from imagekit.errors import UsageError

    key = os.environ.get(variable, "")
    if not key.strip():
        raise UsageError(f"{command} needs {variable} in the environment", f"export {variable}=...")
    return key


REAPS = providers.reapers()


def register_reap(app: typer.Typer, warn) -> None:  # type: ignore[no-untyped-def]
    @app.command("reap", epilog=REAP_EPILOG)
    @handles_errors
    def reap_(
        dry_run: Annotated[bool, typer.Option("--dry-run", help="List what it would do; change nothing.")] = False,
        older_than: Annotated[
            str | None,
            typer.Option(
                "--older-than",
                metavar="DURATION",
                help="Also end imagekit pods created (else last started) longer ago than this (12h).",
            ),
        ] = None,
        terminate: Annotated[
            bool,
            typer.Option(
                "--terminate", help="Terminate overdue pods, stopped ones too (their volumes go): default stop."
            ),
        ] = False,
        provider: Annotated[
            str, typer.Option("--provider", metavar="|".join(REAPS), help="Whose account: its API key variable.")
        ] = PODS.name,
        watch: Annotated[
            str,
            typer.Option(
                "--watch",
                metavar="DURATION",
                help="How long a pod that only its age would end is watched (a look every 15 s) before it is: each "
                "look must report no work (0s: one look).",
            ),
        ] = "1m",
        api_url: Annotated[
            str | None, typer.Option("--api-url", metavar="URL", help="The provider's API base (default: its own).")
        ] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """List the account's pods imagekit created (marked IMAGEKIT_CREATED, or recorded here by `pod create`)
        with their deadline and cost since their last start, and stop (--terminate: terminate) those past their
        deadline (--deadline), or older than --older-than while the provider reports no work on them (GPU or CPU
        utilisation, watched for --watch: age alone never ends a pod that trains); every other pod is left alone.
        Also says which pods recorded here RunPod no longer lists, and which are still running. Vast.ai's instances
        with --provider vast (VAST_API_KEY; those made from `imagekit vast-template`'s template). Exit 3 when an
        action failed."""
        from imagekit.clouds import reap
        from imagekit.errors import EnvironmentFailure, UsageError
        from imagekit.in_image import facts
        from imagekit.services.pods import pod_fleet

        try:
            watched = 0 if watch.strip() in ("0", "0s") else facts.parse_duration(watch.strip(), "--watch")
        except facts.SettingError as exc:
            raise UsageError(str(exc), "for example --watch 1m (0s: a single look)") from None
        seconds = None
        if older_than is not None:
            try:
                seconds = facts.parse_duration(older_than.strip(), "--older-than")
            except facts.SettingError as exc:
                raise UsageError(str(exc), "for example --older-than 12h (90s, 30m, 6h, 1d)") from None
        now = dt.datetime.now(dt.UTC)
        reapers = providers.reapers()
        if provider not in reapers:
            raise UsageError(f"--provider {provider[:40]!r}: {' or '.join(reapers)}", "for example --provider vast")
        cloud = providers.named(provider)
        key = _account_key("pod reap", cloud.account_key)
        done = pod_fleet.reap_pods(
            cloud, key, api_url or cloud.api, now, seconds, terminate, dry_run, warn, watch=watched
        )
        if as_json:
            out_json(
                {
                    "dry_run": dry_run,
                    "pods": [reap.as_json(v, now) for v in done.verdicts],
                    "notes": done.notes,
                    "failed": done.failed,
                }
            )
        else:
            for verdict in done.verdicts:
                typer.echo(reap.line(verdict, now, dry_run))
            for note in done.notes:
                warn(note)
            acted = sum(1 for v in done.verdicts if v.action)
            verb = "would end" if dry_run else "ended"
            warn(f"{len(done.verdicts)} pod(s) listed; {verb} {acted - len(done.failed)}")
        if done.failed:
            raise EnvironmentFailure("; ".join(done.failed), "run imagekit pod reap again (it retries what failed)")
