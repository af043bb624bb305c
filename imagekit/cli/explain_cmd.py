"""`imagekit explain`: is this combination compatible, and if not, why (with sources)."""

from __future__ import annotations

from typing import Annotated

import typer

from imagekit import compat, rules, validate
from imagekit.cli.common import err_console, handles_errors, out_json
from imagekit.model import Query


def register(app: typer.Typer) -> None:
    @app.command(
        "explain",
        epilog="Example: imagekit explain --cuda 12.4 --torch 2.5.1 --transformers 4.48.2 --python 3.11 "
        "--arch sm_90 --driver 535.104.05 --json",
    )
    @handles_errors
    def explain(
        cuda: Annotated[
            str | None, typer.Option(metavar="VERSION", help="CUDA variant of the torch wheel, e.g. 12.4 or cu124.")
        ] = None,
        torch: Annotated[str | None, typer.Option(metavar="VERSION", help="torch version, e.g. 2.5.1.")] = None,
        transformers: Annotated[
            str | None, typer.Option(metavar="VERSION", help="transformers version, e.g. 4.48.2.")
        ] = None,
        python: Annotated[str | None, typer.Option(metavar="VERSION", help="Python version, e.g. 3.11.")] = None,
        arch: Annotated[
            list[str] | None,
            typer.Option(metavar="ARCH", help="Target GPU: sm_90, 9.0 or a name such as H100 (repeatable)."),
        ] = None,
        driver: Annotated[
            str | None, typer.Option(metavar="VERSION", help="Oldest host driver, e.g. 535.104.05.")
        ] = None,
        package: Annotated[
            list[str] | None,
            typer.Option(metavar="REQUIREMENT", help="Extra pinned package, e.g. accelerate==1.2.1 (repeatable)."),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the JSON contract on stdout.")] = False,
    ) -> None:
        """Check one combination against the cited compatibility rules. Omitted axes are not checked.

        Exit 0 when compatible, 1 when not, 2 for bad or unknown versions.
        """
        data = compat.load()
        query = Query(
            cuda=validate.cuda(cuda) if cuda is not None else None,
            torch=validate.version(torch, "torch version") if torch is not None else None,
            transformers=validate.version(transformers, "transformers version") if transformers is not None else None,
            python=validate.python(python) if python is not None else None,
            packages=tuple(validate.requirement(p) for p in package or ()),
            archs=tuple(validate.arch(a, data.gpus) for a in arch or ()),
            driver=validate.driver(driver) if driver is not None else None,
        )
        verdict = rules.evaluate(query, data)
        if as_json:
            out_json(verdict.to_json())
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
            if verdict.compatible:
                console.print(f"[green]compatible[/]: {named}")
            else:
                console.print(f"[red]incompatible[/]: {named}")
                for v in verdict.violations:
                    console.print(f"  [bold]{v.rule}[/]: {v.message}\n    source: {v.source}")
        raise typer.Exit(0 if verdict.compatible else 1)
