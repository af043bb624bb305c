"""`imagekit pod`: reach a live pod from a script (exec, doctor, verified copies) and stop or terminate it."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import err_console, handles_errors, out_json
from imagekit.cli.options import JsonOpt
from imagekit.clouds import providers
from imagekit.errors import CheckFailed, UsageError

JSON_OUTPUT_LIMIT = 16 << 20  # characters of a command's output `pod exec --json` keeps
PODS = providers.pod_provider()  # whose pods `pod create`, `pod stop` and `pod terminate` rent and end


def _starts() -> tuple[str, ...]:
    """Whose pods `pod start` starts (their facts row has the call)."""
    return tuple(p.name for p in providers.PROVIDERS if p.pod.start is not None)


ENDS = providers.enders()  # whose pods `pod stop` and `pod terminate` end
ProviderOpt = Annotated[
    str, typer.Option("--provider", metavar="|".join(ENDS), help="Whose pod: its API and account key variable.")
]

TargetArg = Annotated[
    str,
    typer.Argument(metavar="TARGET", help=f"USER@HOST[:PORT], or RunPod's gateway form POD-HEX@{PODS.ssh_gateway}."),
]
KeyOpt = Annotated[
    Path | None,
    typer.Option("--key", metavar="FILE", help="Private key (default: ssh-agent, then ~/.ssh/id_*).", dir_okay=False),
]
TimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout", metavar="SECONDS", help="Seconds a remote command may run (0: no limit); past it: exit 3."
    ),
]
InsecureOpt = Annotated[
    bool, typer.Option("--insecure-host-key", help="Do not check the host key (said loudly on every use).")
]
AcceptNewOpt = Annotated[
    bool, typer.Option("--accept-new-host-key", help="Record an unknown host's key in ~/.ssh/known_hosts.")
]
PodIdArg = Annotated[str, typer.Argument(metavar="POD_ID", help="The provider's pod id (not the SSH target).")]
ApiOpt = Annotated[
    str | None, typer.Option("--api-url", metavar="URL", help="The provider's API base (default: its own).")
]
IgnoreOpt = Annotated[
    bool,
    typer.Option("--ignore-blockers", help="Run it even where the pod's start check found a blocker (no GPU, drift)."),
]
RunOpt = Annotated[
    str | None, typer.Option("--run", metavar="ID", help="The run (default: the latest one `pod run` started).")
]


def _options(key: Path | None, timeout: float, insecure: bool, accept_new: bool, force_pty: bool = False):
    from imagekit.services.pods.pod import PodOptions

    if not math.isfinite(timeout) or timeout < 0:
        raise UsageError(f"--timeout {timeout}: not a number of seconds", "give seconds >= 0 (0: no limit)")
    if insecure and accept_new:
        raise UsageError("--insecure-host-key and --accept-new-host-key exclude each other", "pick one")
    mode = "insecure" if insecure else ("accept-new" if accept_new else "strict")
    return PodOptions(key=key, host_keys=mode, timeout=timeout or 10.0**9, force_pty=force_pty)


def _account_key(command: str) -> str:
    """The account key of the pods' provider, from the environment (``command`` is what needs it)."""
    key = os.environ.get(PODS.account_key, "")
    if not key.strip():
        raise UsageError(f"{command} needs {PODS.account_key} in the environment", f"export {PODS.account_key}=...")
    return key


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _warn(text: str) -> None:
    err_console().print(text, markup=False)


@handles_errors
def exec_(
    target: TargetArg,
    command: Annotated[
        list[str], typer.Argument(metavar="COMMAND...", help="The command, after --; run by the pod's shell.")
    ],
    key: KeyOpt = None,
    timeout: TimeoutOpt = 0.0,
    insecure_host_key: InsecureOpt = False,
    accept_new_host_key: AcceptNewOpt = False,
    as_json: JsonOpt = False,
    ignore_blockers: IgnoreOpt = False,
) -> None:
    """Run a command on the pod; its output streams here, its exit code becomes ours (timeout: 3). A pod whose
    start check found a blocker refuses (exit 1, naming it) unless --ignore-blockers."""
    import time

    from imagekit.clouds import podwire
    from imagekit.services.pods import pod

    opts = _options(key, timeout, insecure_host_key, accept_new_host_key)
    text = " ".join(command)  # like ssh: the words, joined, for the remote shell
    if not text.strip():
        raise UsageError("no command given", "put it after --: imagekit pod exec TARGET -- nvidia-smi")
    collected: list[str] = []
    kept = [0]

    def keep(text: str) -> None:
        """--json holds the output to print it whole: bounded, so a pod printing without end cannot exhaust
        memory (the command goes on; what came after the bound is said to be left out)."""
        if kept[0] < JSON_OUTPUT_LIMIT:
            collected.append(text[: JSON_OUTPUT_LIMIT - kept[0]])
        kept[0] += len(text)

    sink = keep if as_json else _write
    started = time.monotonic()
    code, transport = pod.run_command(
        podwire.parse_target(target),
        text,
        opts,
        sink,
        sink if as_json else _stderr,
        _warn,
        ignore_blockers=ignore_blockers,
    )
    if as_json:
        out_json(
            {
                "target": target,
                "command": text,
                "transport": transport,
                "exit_code": code,
                "output": "".join(collected),
                "output_truncated": kept[0] > JSON_OUTPUT_LIMIT,
                "output_chars": kept[0],
                "seconds": round(time.monotonic() - started, 3),
            }
        )
    raise typer.Exit(code)


@handles_errors
def run(
    target: TargetArg,
    command: Annotated[
        list[str], typer.Argument(metavar="COMMAND...", help="The command, after --; run by the pod's shell.")
    ],
    key: KeyOpt = None,
    insecure_host_key: InsecureOpt = False,
    accept_new_host_key: AcceptNewOpt = False,
    as_json: JsonOpt = False,
    ignore_blockers: IgnoreOpt = False,
    skip_launch_check: Annotated[
        bool,
        typer.Option("--skip-launch-check", help="Start it without the image's launch check (imagekit-doctor)."),
    ] = False,
) -> None:
    """Start a command on the pod in a session of its own: it goes on when the connection drops. Its output goes
    to a log on the pod's volume (`pod logs`), its exit code is kept (`pod wait`). First the image's doctor checks
    the launch there (as `imagekit-doctor -- COMMAND` would: an Accelerate config's num_processes against the
    GPUs, drift): a blocker refuses (exit 1, nothing started) unless --skip-launch-check or --ignore-blockers."""
    from imagekit.clouds import podwire
    from imagekit.services.pods import pod_runs

    text = " ".join(command)
    if not text.strip():
        raise UsageError("no command given", "put it after --: imagekit pod run TARGET -- python train.py")
    opts = _options(key, 60.0, insecure_host_key, accept_new_host_key)
    started = pod_runs.start(
        podwire.parse_target(target), text, opts, _warn, ignore_blockers=ignore_blockers,
        check_launch=not skip_launch_check,
    )  # fmt: skip
    if as_json:
        out_json({"target": target, "run": started.run_id, "transport": started.transport})
    else:
        _write(f"{started.run_id}\n")
        err_console().print(
            f"started run {started.run_id}; follow it: imagekit pod logs {target} -f; its exit code: "
            f"imagekit pod wait {target}",
            markup=False,
        )


@handles_errors
def logs(
    target: TargetArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Until the run ends.")] = False,
    run_id: RunOpt = None,
    key: KeyOpt = None,
    insecure_host_key: InsecureOpt = False,
    accept_new_host_key: AcceptNewOpt = False,
) -> None:
    """A run's output, from any connection (the latest run unless --run)."""
    from imagekit.clouds import podwire
    from imagekit.services.pods import pod_runs

    opts = _options(key, 600.0, insecure_host_key, accept_new_host_key)
    code = pod_runs.logs(podwire.parse_target(target), run_id, follow, opts, _write, _stderr, _warn)
    if code == 4:
        raise UsageError("no such run on this pod", "imagekit pod run TARGET -- COMMAND starts one")
    raise typer.Exit(code)


@handles_errors
def wait(
    target: TargetArg,
    run_id: RunOpt = None,
    key: KeyOpt = None,
    timeout: TimeoutOpt = 0.0,
    insecure_host_key: InsecureOpt = False,
    accept_new_host_key: AcceptNewOpt = False,
) -> None:
    """Wait for a run to end; its exit code becomes ours (the latest run unless --run)."""
    from imagekit.clouds import podwire
    from imagekit.services.pods import pod_runs

    opts = _options(key, timeout, insecure_host_key, accept_new_host_key)
    raise typer.Exit(pod_runs.wait(podwire.parse_target(target), run_id, opts, _warn))


@handles_errors
def doctor(
    ctx: typer.Context,
    target: TargetArg,
    key: KeyOpt = None,
    timeout: TimeoutOpt = 600.0,
    insecure_host_key: InsecureOpt = False,
    accept_new_host_key: AcceptNewOpt = False,
    as_json: JsonOpt = False,
    expect: Annotated[
        Path | None,
        typer.Option(
            "--expect", metavar="FILE", help="A local lock or manifest, sent to the pod (verified).", dir_okay=False
        ),
    ] = None,
) -> None:
    """Run the image's doctor on the pod (or, on any other pod, the stdlib doctor sent over with its Python)
    and return its exit code; other options go to the doctor (e.g. --tier standard)."""
    from imagekit.clouds import podwire
    from imagekit.services.pods import pod

    if expect is not None and not expect.is_file():
        raise UsageError(f"--expect {expect}: cannot read it", "give a lock (lockfiles/CELL.txt) or a manifest")
    opts = _options(key, timeout, insecure_host_key, accept_new_host_key)
    args = [*ctx.args, *(["--json"] if as_json else [])]
    code, how = pod.run_doctor(podwire.parse_target(target), args, expect, opts, _write, _stderr, _warn)
    err_console().print(f"(ran {how})", markup=False)
    raise typer.Exit(code)


@handles_errors
def cp(
    src: Annotated[str, typer.Argument(metavar="SRC", help="A local path, or TARGET:PATH on the pod.")],
    dst: Annotated[str, typer.Argument(metavar="DST", help="A local path, or TARGET:PATH on the pod.")],
    key: KeyOpt = None,
    insecure_host_key: InsecureOpt = False,
    accept_new_host_key: AcceptNewOpt = False,
    as_json: JsonOpt = False,
    force: Annotated[
        bool, typer.Option("--force", help="A download may replace a file or folder of that name (once complete).")
    ] = False,
    dereference: Annotated[
        bool,
        typer.Option("--dereference", help="Download a folder with what its symlinks point to, not the links."),
    ] = False,
) -> None:
    """Copy a file or directory to or from the pod; sha256 compared on both ends (exit 1 if they differ), resumed
    after a dropped connection. TARGET:PATH is USER@HOST[:PORT]:PATH. Like cp, a download into an existing
    folder lands as FOLDER/NAME; an existing file or folder is never overwritten without --force."""
    import dataclasses

    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from imagekit.services.pods import pod

    opts = _options(key, 3600.0, insecure_host_key, accept_new_host_key)
    opts = dataclasses.replace(opts, force=force, dereference=dereference)
    console = err_console()
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=console, transient=False, disable=as_json) as bar:
        task = bar.add_task("copy", total=None)
        result = pod.copy(
            src,
            dst,
            opts,
            lambda done, total: bar.update(task, completed=done, total=total),
            lambda msg: bar.console.print(msg, markup=False),
        )
    if as_json:
        out_json(result.to_json())
    else:
        rate = result.size / result.seconds / 1e6 if result.seconds else 0.0
        console.print(
            f"copied {result.size:,} bytes ({result.files} file{'s' if result.files != 1 else ''}) via "
            f"{result.mode} in {result.seconds:.1f} s ({rate:.1f} MB/s); sha256 {result.sha256} on both ends",
            markup=False,
        )


def _api(action: str, pod_id: str, provider: str, api_url: str | None, as_json: bool, yes: bool = False) -> None:
    from imagekit.services.pods import pod_fleet

    allowed = _starts() if action == "start" else providers.enders()  # the registry as it is now
    if provider not in allowed:
        raise UsageError(f"--provider {provider[:40]!r}: {' or '.join(allowed)}", "for example --provider vast")
    cloud = providers.named(provider)
    key = os.environ.get(cloud.account_key, "")
    if not key.strip():
        raise UsageError(f"pod {action} needs {cloud.account_key} in the environment",
                         f"export {cloud.account_key}=...")  # fmt: skip
    api, base = pod_fleet.client(cloud), api_url or cloud.api
    warning = None
    if action == "terminate" and cloud.terminate_warning is not None and hasattr(api, "get_pod"):
        warning = cloud.terminate_warning(pod_id, api.get_pod(pod_id, key, base))
        if warning:
            _warn(f"warning: {warning}")
            if not yes and sys.stdin.isatty() and not typer.confirm("Terminate it?", default=False, err=True):
                raise CheckFailed(f"pod {pod_id} was not terminated", "pass --yes to terminate without asking")
    doc = api.pod_action(action, pod_id, key, base)  # a key with a line ending is refused, named
    if as_json:
        out_json({"pod": pod_id, "provider": provider, "action": action, "answer": doc, "warning": warning})
    elif action == "start":  # its SSH address: the provider's console
        err_console().print(
            f"pod {pod_id} is starting; its SSH address is in {cloud.command.display}'s console (it may have "
            "changed); then imagekit pod cp TARGET:/workspace/out ./out",
            markup=False,
        )
    else:
        done = (
            "stopped (the volume stays; billing for it goes on)"
            if action == "stop"
            else "terminated (with its container disk and pod volume)"
        )
        err_console().print(f"pod {pod_id} {done}", markup=False)


@handles_errors
def start(
    pod_id: PodIdArg, provider: ProviderOpt = PODS.name, api_url: ApiOpt = None, as_json: JsonOpt = False
) -> None:
    """Start a stopped pod again (its lifetime guard stopped it, or you did): its volume is as it was, so its
    outputs can be fetched (`pod cp`); it bills its GPU again until it is stopped, and its guard is armed again
    (a run that ended before the start is not an exit: it stops after the idle window)."""
    _api("start", pod_id, provider, api_url, as_json)


@handles_errors
def stop(pod_id: PodIdArg, provider: ProviderOpt = PODS.name, api_url: ApiOpt = None, as_json: JsonOpt = False) -> None:
    """Stop a pod (RunPod's unless --provider; its account key from the environment): the GPU is released, the
    volume kept."""
    _api("stop", pod_id, provider, api_url, as_json)


@handles_errors
def terminate(
    pod_id: PodIdArg,
    provider: ProviderOpt = PODS.name,
    api_url: ApiOpt = None,
    as_json: JsonOpt = False,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask, even when the pod's files go with it.")] = False,
) -> None:
    """Terminate a RunPod pod (RUNPOD_API_KEY from the environment): it, its container disk and its pod volume
    (/workspace) are gone; only a network volume survives. A pod with no network volume is named first (and, at a
    terminal, confirmed). `pod stop` keeps the volume."""
    _api("terminate", pod_id, provider, api_url, as_json, yes)


def build() -> typer.Typer:
    """The `pod` group: each subcommand a function of this module, registered in the order `pod --help` lists."""
    from imagekit.cli import pod_fleet_cmd

    app = typer.Typer(
        help="Reach a live pod over SSH, also through RunPod's PTY-only gateway: run commands, run the doctor, "
        "copy files with sha256 checked on both ends; create, stop or terminate it through RunPod's API, and reap "
        "the account's overdue imagekit pods.",
        no_args_is_help=True,
    )

    app.command(
        "exec",
        context_settings={"ignore_unknown_options": True},
        epilog="Example: imagekit pod exec root@203.0.113.7:22011 -- python -u train.py",
    )(exec_)
    app.command(
        "run",
        context_settings={"ignore_unknown_options": True},
        epilog="Example: imagekit pod run $POD -- python -u train.py && imagekit pod wait $POD && imagekit pod cp "
        "$POD:/workspace/out ./out && imagekit pod terminate $POD_ID",
    )(run)
    app.command("logs", epilog="Example: imagekit pod logs $POD -f")(logs)
    app.command("wait", epilog="Example: imagekit pod wait $POD && echo trained")(wait)
    app.command(
        "doctor",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        epilog="Example: imagekit pod doctor $POD --json --expect lockfiles/CELL.txt > report.json || exit 1",
    )(doctor)
    app.command(
        "cp", epilog="Examples: imagekit pod cp ./data $POD:/workspace/data; imagekit pod cp $POD:/workspace/out ./out"
    )(cp)
    pod_fleet_cmd.register_create(app, _write, _warn)
    app.command(
        "start",
        epilog="Example: imagekit pod start abc123xyz456 && imagekit pod cp root@HOST:PORT:/workspace/out ./out (the "
        "address the console shows after the start); --provider vast for a Vast.ai instance.",
    )(start)
    app.command("stop", epilog="Example: imagekit pod stop abc123xyz456; imagekit pod stop 4242 --provider vast")(stop)
    app.command("terminate", epilog="Example: imagekit pod terminate abc123xyz456")(terminate)
    pod_fleet_cmd.register_reap(app, _warn)
    return app


def _stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()
