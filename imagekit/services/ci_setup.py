"""`imagekit ci init`'s effects: the registry from the matrix file, a name given to --install looked up on its
index, the wheel of the running imagekit written beside the workflow, the workflow itself (each atomically)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from imagekit.clouds import providers
from imagekit.effects import http
from imagekit.effects.files import write_atomic
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.matrix import ci_workflow as ci
from imagekit.matrix import matrix_file as matrix
from imagekit.services import inputs
from imagekit.trust import urls

PYPI_SIMPLE = "https://pypi.org/simple"


@dataclass(frozen=True)
class Written:
    lines: tuple[str, ...]  # what to tell the user: the files, the registry, the secrets, the next command


def _matrix_registry() -> str | None:
    """The matrix file's [image] repository, unless it is the local default (a CI runner cannot push there)."""
    config = inputs.load_matrix(None, inputs.compat_data())
    return None if config.repository == matrix.DEFAULT_REPOSITORY else config.repository


def check_index_serves(install: str) -> None:
    """A requirement by name installs only from an index that has the project: ask it now, not on the runner."""
    name = ci.requirement_name(install)
    if name is None:
        return
    index = os.environ.get("PIP_INDEX_URL") or PYPI_SIMPLE
    url = f"{index.rstrip('/')}/{name.lower().replace('_', '-').replace('.', '-')}/"
    status, _, _ = http.request("GET", url, max_bytes=4 << 20)
    if status == 404:
        raise UsageError(
            f"--install {install}: {urls.display(index)} has no project {name!r}: every job would fail to install it",
            "leave --install out (a wheel of this imagekit is committed beside the workflow), or pass a path, a wheel "
            "URL or git+https://...",
        )
    if status >= 400:
        raise EnvironmentFailure(
            f"--install {install}: {urls.display(index)} answered HTTP {status} for {name!r}",
            "check PIP_INDEX_URL, or pass a path, a wheel URL or git+https://... to --install",
        )


def write(opts: ci.CiOptions, out: Path) -> Written:
    """Write the workflow (and, without --install, the wheel it installs); what to tell the user."""
    from imagekit.effects import self_wheel

    if opts.registry is None:
        opts = dataclasses.replace(opts, registry=_matrix_registry())
    wheel = None
    lines = []
    if opts.install is None:
        name, data = self_wheel.wheel()
        path = Path(opts.wheel_dir) / name
        wheel = ci.Wheel(path.as_posix(), hashlib.sha256(data).hexdigest())
        text = ci.workflow(opts, wheel)
        for old in path.parent.glob("imagekit-*.whl") if path.parent.is_dir() else ():
            if old.name != name:
                old.unlink()  # an earlier imagekit's wheel: the workflow names this one only
        write_atomic(path, data)
        lines.append(f"wrote {path} ({len(data) // 1024} KiB, sha256 {wheel.sha256[:12]}): the jobs install it")
    else:
        check_index_serves(opts.install)
        text = ci.workflow(opts, wheel)
    write_atomic(out, text)
    lines.append(f"wrote {out}: pushes to {opts.registry or 'ghcr.io/<owner>/<repo>'}")
    if opts.reap:
        reaper = out.parent / Path(ci.REAP_OUT).name
        pods = providers.pod_provider()
        reaped = opts.reap_providers or ((pods.name, pods.account_key),)
        keys = " and ".join(key for _, key in reaped)
        write_atomic(reaper, ci.reap_workflow(opts, reaped, wheel))
        secret = "secrets" if len(reaped) > 1 else "secret"
        lines.append(f"wrote {reaper}: `imagekit pod reap` every half hour (add the repository {secret} {keys})")
        if not opts.reap_older_than:
            lines.append("the reaper ends only pods past a deadline (`pod create --deadline`, a template's "
                         "--deadline); --reap-older-than 12h ends the others too")  # fmt: skip
    if opts.pages:
        lines.append("the pages job publishes the release page: set Settings > Pages > Source to GitHub Actions")
    lines.append(ci.secrets_note(opts))
    added = f"{out} {opts.wheel_dir}" if wheel else str(out)
    added += f" {out.parent / Path(ci.REAP_OUT).name}" if opts.reap else ""
    lines.append(f"next: git add {added} && git commit -m 'images workflow' && git push")
    return Written(tuple(lines))
