"""`imagekit explain`: is this combination compatible, and if not, why (with sources)."""

from __future__ import annotations

from typing import Annotated

import typer

from imagekit.cli.common import err_console, handles_errors, out_json
from imagekit.cli.options import JsonOpt
from imagekit.compat import companions, rules
from imagekit.image import cuda_toolkit
from imagekit.locking import direct_wheels
from imagekit.model import Query
from imagekit.services import inputs
from imagekit.trust import validate


@handles_errors
def explain(
    cuda: Annotated[
        str | None, typer.Option(metavar="VERSION", help="CUDA variant of the torch wheel, e.g. 12.4 or cu124.")
    ] = None,
    torch: Annotated[
        str | None,
        typer.Option(metavar="VERSION", help="torch version or prefix, e.g. 2.5.1, or 2.5 for the newest known 2.5.x."),
    ] = None,
    transformers: Annotated[
        str | None,
        typer.Option(
            metavar="VERSION", help="transformers version or prefix, e.g. 4.48.2, or 4.48 for the newest known."
        ),
    ] = None,
    python: Annotated[str | None, typer.Option(metavar="VERSION", help="Python version, e.g. 3.11.")] = None,
    arch: Annotated[
        list[str] | None,
        typer.Option(metavar="ARCH", help="Target GPU: sm_90, 9.0 or a name such as H100 (repeatable)."),
    ] = None,
    driver: Annotated[str | None, typer.Option(metavar="VERSION", help="Oldest host driver, e.g. 535.104.05.")] = None,
    package: Annotated[
        list[str] | None,
        typer.Option(metavar="REQUIREMENT", help="Extra pinned package, e.g. accelerate==1.2.1 (repeatable)."),
    ] = None,
    platform: Annotated[
        str,
        typer.Option(
            "--platform", metavar="PLATFORM", help="Image platform: linux/amd64 or linux/arm64 (Grace hosts)."
        ),
    ] = "linux/amd64",
    as_json: JsonOpt = False,
) -> None:
    """Check one combination against the cited compatibility rules. Omitted axes are not checked.

    Exit 0 when compatible, 1 when not, 2 for bad or unknown versions.
    """
    data = inputs.compat_data()
    resolved: dict[str, str] = {}

    def release(name: str, value: str | None) -> str | None:
        if value is None:
            return None
        exact = data.resolve(name, validate.version(value, f"{name} version"))
        if exact != value:
            resolved[name] = exact
            err_console().print(
                f"{name} {value} -> {exact} (the newest known {value}.x; give an exact version to check another)",
                markup=False,
            )
        return exact

    query = Query(
        cuda=validate.cuda(cuda) if cuda is not None else None,
        torch=release("torch", torch),
        transformers=release("transformers", transformers),
        python=validate.python(python) if python is not None else None,
        packages=tuple(direct_wheels.requirement(p) for p in package or ()),
        archs=tuple(validate.arch(a, data.gpus) for a in arch or ()),
        driver=validate.driver(driver) if driver is not None else None,
        platform=validate.platform(platform),
    )
    verdict = rules.evaluate(query, data)
    # torch's companion table for this torch: what a lock holds each of them to (compat/companions.py)
    held = companions.constraints(data, query.torch) if query.torch else ()
    if as_json:
        doc = verdict.to_json()
        if resolved:  # only when a prefix was given, so the exact-version contract stays as it was
            doc["resolved"] = resolved
        named = {validate.requirement_name(p) for p in query.packages}
        if any(c.name in named for c in held):  # likewise: only when a --package names one of them
            doc["companions"] = {c.name: c.to_json() for c in held if c.name in named}
        out_json(doc)
    else:
        console = err_console()
        named = (
            ", ".join(
                f"{k} {v}"
                for k, v in (
                    ("cuda", query.cuda),
                    ("torch", query.torch),
                    ("transformers", query.transformers),
                    ("python", query.python),
                    ("driver", query.driver),
                )
                if v
            )
            or "nothing"
        )
        if query.archs:
            named += ", archs " + " ".join(query.archs)
        if query.platform != "linux/amd64":
            named += f", on {query.platform}"
        if verdict.compatible:
            console.print(f"[green]compatible[/]: {named}")
        else:
            console.print(f"[red]incompatible[/]: {named}")
            for v in verdict.violations:
                console.print(f"  [bold]{v.rule}[/]: {v.message}\n    source: {v.source}")
        if query.cuda and query.platform == "linux/amd64":  # `[image] cuda_toolkit`: which compiler, or none
            said = cuda_toolkit.describe(query.cuda, query.python, data)
            console.print(f"[image] cuda_toolkit: {said}", markup=False, soft_wrap=True)
        if held:
            console.print(f"with torch {query.torch}, a lock holds what the cell holds of these:", markup=False)
            for c in held:
                console.print(f"  {c.requirement if c.binding else c.name + ' (free)'}: {c.why} [{c.source}]",
                              markup=False, soft_wrap=True)  # fmt: skip
    raise typer.Exit(0 if verdict.compatible else 1)


def register(app: typer.Typer) -> None:
    """`imagekit explain`, registered onto the top-level app."""
    app.command(
        "explain",
        help="Check one combination against the cited compatibility rules. Omitted axes are not checked.\n\n"
        "Versions are selected as `matrix` and `lock` select them: --cuda 12.4 or cu124, --python 3.11, and "
        "--torch/--transformers as an exact release or a prefix. A prefix that names several known releases "
        "(--torch 2.5: 2.5.0 and 2.5.1) is evaluated as the newest of them that is not a pre-release, not yanked "
        "and (for torch) covered by the curated facts; stderr says which, and --json adds "
        '"resolved": {"torch": "2.5.1"}. Give the exact version to check another.\n\n'
        "Exit 0 when compatible, 1 when not, 2 for bad or unknown versions.",
        epilog="Example: imagekit explain --cuda 12.4 --torch 2.5.1 --transformers 4.48.2 --python 3.11 "
        "--arch sm_90 --driver 535.104.05 --json",
    )(explain)
