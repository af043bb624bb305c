"""`imagekit compat`: look at and refresh the compatibility data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from imagekit.cli.common import err_console, handles_errors, out, out_json, output_file_option
from imagekit.cli.options import JsonOpt, OldIndexOpt, renamed
from imagekit.compat import catalog as compat
from imagekit.compat.refresh import DEFAULT_INDEX, DEFAULT_PYTORCH_INDEX
from imagekit.errors import EXIT_NO, EnvironmentFailure, UsageError
from imagekit.services import inputs
from imagekit.trust import validate
from imagekit.trust.redact import redact


def _user_file() -> Path:
    path = compat.user_metadata_path()
    if path is None:
        raise EnvironmentFailure(
            "no user data folder: $HOME is not set",
            "set IMAGEKIT_DATA_DIR (or XDG_DATA_HOME, or HOME), or pass --out FILE",
        )
    return path


def _check(index: str, out_file: Path | None, as_json: bool) -> None:
    """`compat refresh --check`: the releases the index has that the data lacks; exit 1 when there are any."""
    from imagekit.compat import refresh as refresh_mod
    from imagekit.services.locks import compat_refresh

    if out_file is not None:
        hint = "pass a metadata file `imagekit compat refresh --out FILE` wrote, or drop --out to check the data in use"
        doc = inputs.read_user_metadata(out_file, hint)
        if doc is None:
            raise UsageError(f"--out {out_file} does not exist: there is nothing to compare", hint)
        where, origin = str(out_file), "--out"
        fix = f"run `imagekit compat refresh --out {out_file}` to regenerate it"
    else:
        doc, where, origin, _ = inputs.choose_metadata(compat.user_metadata_path())
        fix = (
            "run `imagekit compat refresh` (it writes the user data file imagekit reads from then on); to update the "
            "data shipped with imagekit, `imagekit compat refresh --out imagekit/data/pypi-metadata.json` in its "
            "source tree"
        )
    missing = compat_refresh.check(doc, index)
    data = compat.parse(compat.curated_document(), doc)
    known = set(data.torch_minors)
    new_minors = refresh_mod.uncurated_minors(missing.get("torch", []), known)
    blocked = refresh_mod.unbuildable(data)
    if as_json:
        out_json(
            {
                "up_to_date": not missing and not blocked,
                "data": {"path": where, "origin": origin},
                "index": redact(index),
                "missing": missing,
                "uncurated_torch_minors": new_minors,
                "unbuildable_torch_minors": blocked,
            }
        )
    console = err_console()
    if not missing and not blocked:
        console.print(
            f"up to date: {where} ({origin}) has every release {redact(index)} lists, and every torch minor in it "
            "can be built",
            markup=False,
        )
        return
    if missing:
        verb = "is" if sum(map(len, missing.values())) == 1 else "are"
        console.print(
            f"stale: {refresh_mod.describe_missing(missing)} {verb} on the index and not in the data ({where}, "
            f"{origin})",
            markup=False,
        )
    if new_minors:
        console.print(
            f"note: torch {', '.join(new_minors)} is new: refreshing records its releases, and what the index says of "
            "them (PyPI build, glibc, Python window) makes its cells known",
            markup=False,
        )
    for why in blocked.values():
        console.print(f"unbuildable: {why}", markup=False)
    if blocked:
        console.print(
            f"hint: a curated fact no index gives is missing: add it, with its source, to {compat.CURATED_FILE} (the "
            "[[arch]] or [[driver_family]] table named above) or upgrade imagekit",
            markup=False,
        )
    if missing:
        console.print(f"hint: {fix}", markup=False)
    raise typer.Exit(EXIT_NO)


@handles_errors
def refresh(
    out_file: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="FILE",
            help="Write the metadata JSON here instead (an export: imagekit reads only the user data file); "
            "with --check, the file to compare.",
        ),
    ] = None,
    index_url: Annotated[
        str, typer.Option("--index-url", metavar="URL", help="PEP 691 simple index to read.")
    ] = DEFAULT_INDEX,
    old_index: OldIndexOpt = None,
    pytorch_index: Annotated[
        str | None,
        typer.Option(
            "--pytorch-index",
            metavar="URL",
            help="The PyTorch wheel index to read each torch release's CUDA variants from (default: "
            f"{DEFAULT_PYTORCH_INDEX} when --index-url is PyPI; not read otherwise).",
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Write nothing; exit 1 naming each release the index has and the data in use (or --out) lacks.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Regenerate Requires-Python / Requires-Dist data and torch's Python windows from package metadata.

    Writes the user data file imagekit reads from then on: $IMAGEKIT_DATA_DIR/pypi-metadata.json, else
    $XDG_DATA_HOME/imagekit/, else ~/.local/share/imagekit/ (`imagekit compat show` says which). It is refused
    when it would know fewer torch releases, or fewer releases of a package, than the data shipped with
    imagekit, and when a torch wheel it reads (each minor's newest, its GPU architectures) holds less than
    imagekit's curated architecture tables promise. The curated facts (CUDA variants, driver floors, archs,
    companions, with sources) are not refreshed: they come with imagekit; the companions a wheel's METADATA pins
    to a torch release (torchvision, torchaudio, torchtext, torchdata, xformers; triton from torch's own) are.
    Lock input hashes cover the curated facts' data version, not this file: a refresh makes a lock stale only
    where it pins a companion the refreshed table no longer pairs with its torch. With --check it reads only the
    index's release lists (no metadata) and writes nothing.
    """
    index, flag = renamed(index_url, DEFAULT_INDEX, old_index, "--index-url", "--index")
    validate.index_url(index, flag)
    if pytorch_index is not None:  # checked whatever else is asked: a bad value is never silently unused
        validate.index_url(pytorch_index, "--pytorch-index")
    if check:
        _check(index, out_file, as_json)
        return
    from imagekit.services.locks import compat_refresh

    target = out_file if out_file is not None else _user_file()
    output_file_option(target, "--out" if out_file is not None else "the user data file")
    if pytorch_index is None and index == DEFAULT_INDEX:
        pytorch_index = DEFAULT_PYTORCH_INDEX
    doc = compat_refresh.write(
        target,
        index,
        floor=compat.shipped_metadata() if out_file is None else None,
        pytorch_index=pytorch_index,
        note=lambda text: err_console().print(text, markup=False),
    )
    counts = {k: len(v) for k, v in sorted(doc["packages"].items())}
    if as_json:
        out_json({"path": str(target), "index": redact(index), "releases": {"torch": len(doc["torch"]), **counts}})
    err_console().print(
        f"wrote {target}: torch {len(doc['torch'])} releases, " + ", ".join(f"{k} {v}" for k, v in counts.items()),
        markup=False,
    )


@handles_errors
def show(
    as_json: JsonOpt = False,
) -> None:
    """Which compatibility data files are in use: their paths, versions and release counts."""
    user = compat.user_metadata_path()
    try:
        metadata, where, origin, passed_over = inputs.choose_metadata(user)
        state = "in use" if origin == compat.USER else f"not used: {passed_over}" if passed_over else "absent"
    except UsageError as exc:  # an unusable user file: say so here (every other command refuses it)
        metadata, where, origin = (
            compat.shipped_metadata(),
            compat.shipped_path(compat.METADATA_FILE),
            compat.SHIPPED,
        )
        state = f"unusable: {exc.message}"
    data = compat.parse(
        compat.curated_document(),
        metadata,
        curated_path=compat.shipped_path(compat.CURATED_FILE),
        metadata_path=where,
        metadata_origin=origin,
    )
    doc = {
        "curated": {
            "path": data.curated_path,
            "data_version": data.data_version,
            "torch_minors": sorted(data.torch_minors, key=lambda m: tuple(int(x) for x in m.split("."))),
        },
        "metadata": {
            "path": data.metadata_path,
            "origin": data.metadata_origin,
            "releases": {name: len(data.releases(name)) for name in sorted(data.packages)},
            "newest_torch": data.releases("torch")[-1],
        },
        "user_file": {"path": str(user) if user is not None else None, "state": state},
    }
    if as_json:
        out_json(doc)
        return
    counts = ", ".join(f"{k} {v}" for k, v in doc["metadata"]["releases"].items())
    minors = doc["curated"]["torch_minors"]
    out(
        f"curated facts  {data.curated_path}\n"
        f"               data version {data.data_version}; torch {minors[0]} … {minors[-1]}\n"
        f"PyPI metadata  {data.metadata_path} ({data.metadata_origin})\n"
        f"               {counts}; newest torch {doc['metadata']['newest_torch']}\n"
        f"user file      {doc['user_file']['path']}: {state}"
    )


def build() -> typer.Typer:
    """The `compat` group: each subcommand a function of this module, registered in the order `compat --help` lists."""
    app = typer.Typer(
        help="Compatibility data: see which files are in use, refresh the metadata-derived part from the index.",
        no_args_is_help=True,
    )
    app.command(
        "refresh",
        epilog="Examples: imagekit compat refresh; imagekit compat refresh --check; "
        "imagekit compat refresh --out imagekit/data/pypi-metadata.json",
    )(refresh)
    app.command("show", epilog="Example: imagekit compat show --json")(show)
    return app
