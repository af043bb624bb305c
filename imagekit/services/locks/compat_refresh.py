"""`imagekit compat refresh`: read the index's PEP 691 pages and each recorded release's metadata, write
pypi-metadata.json atomically; `--check`: read the pages only and say which releases the data lacks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from imagekit.compat import catalog as compat
from imagekit.compat import pypi_metadata as metadata_mod
from imagekit.compat import refresh
from imagekit.compat.pypi_metadata import parse_metadata
from imagekit.effects import http, remote_zip
from imagekit.effects.files import write_atomic
from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.trust import untrusted, urls
from imagekit.trust.redact import redact


def simple_page(index: str, name: str) -> dict:
    """A PEP 691 page, checked: a list of files with names and http(s) URLs (made absolute against the page)."""
    page_url = f"{index.rstrip('/')}/{name}/"
    hint = "the index must serve PEP 691 JSON (application/vnd.pypi.simple.v1+json)"
    try:  # bounded: nested thousands deep, a 5,000-digit number or NaN is refused, not a traceback later
        page = untrusted.load_json(http.get(page_url, accept=http.SIMPLE_JSON), f"the index page {redact(page_url)}")
    except untrusted.UntrustedData as exc:
        raise EnvironmentFailure(str(exc), hint) from None
    files = page.get("files") if isinstance(page, dict) else None
    if not isinstance(files, list):
        raise EnvironmentFailure(f"the index page {urls.display(page_url)} has no list of files", hint)
    fixed = []
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("filename"), str) or not isinstance(f.get("url"), str):
            raise EnvironmentFailure(
                f"the index page {urls.display(page_url)} lists a file without a filename or url", hint
            )
        url = urls.join(page_url, f["url"])
        shown = untrusted.printable(f["filename"], 120)
        urls.require_http(url, f"the index lists {shown} at", EnvironmentFailure, "use another index")
        fixed.append({**f, "url": url})
    return {**page, "files": fixed}


def pages(index: str) -> dict[str, dict]:
    """The page of torch and of each watched package (`refresh.PROJECTS`), read side by side."""
    found = http.map_concurrently(lambda name: simple_page(index, name), list(refresh.PROJECTS))
    return dict(zip(refresh.PROJECTS, found, strict=True))


def _fetch_metadata(url: str) -> str:
    """PEP 658 metadata when the index has it, else METADATA read out of the wheel by range requests."""
    try:
        return http.get(url).decode("utf-8", "replace")
    except EnvironmentFailure:
        wheel = url.removesuffix(".metadata")
        return remote_zip.read_member(wheel, ".dist-info/METADATA").decode("utf-8", "replace")


def _metadata_for(name: str, page: dict, versions: list[str]) -> dict[str, dict]:
    urls = [(v, w.url + ".metadata") for v, w in refresh.metadata_wheels(page, versions).items()]
    texts = http.map_concurrently(_fetch_metadata, [u for _, u in urls])
    out = {}
    for (v, url), text in zip(urls, texts, strict=True):
        try:
            out[v] = parse_metadata(text).to_json()
        except ValueError as exc:  # the fields `parse_metadata` leaves as text are checked with the document
            raise EnvironmentFailure(
                f"the metadata of {name} {v} ({redact(url)}) is unusable: {exc}",
                "the index is broken or does not mirror PyPI; use another index (the default https://pypi.org/simple)",
            ) from None
    return out


def pytorch_variants(pytorch_index: str, note: Callable[[str], None] = print) -> dict[str, dict]:
    """The CUDA variants per torch release on the PyTorch index (its PEP 503 torch page, HTML), and for the newest
    release of each minor the GPU architectures of its aarch64 builds (``aarch64_index_archs``: variant -> arch flags,
    read out of each wheel's libtorch_python.so by range requests): what a linux/arm64 cell whose torch PyPI has as a
    CPU-only build is routed to."""
    url = f"{pytorch_index.rstrip('/')}/torch/"
    text = http.get(url, accept="text/html", max_bytes=64 << 20).decode("utf-8", "replace")
    found: dict[str, dict] = dict(refresh.pytorch_variants(text))
    reads = []
    for version, variant, link in refresh.pytorch_aarch64_reads(text):
        wheel = urls.join(url, link)
        urls.require_http(wheel, f"the PyTorch index lists torch {version}+{variant} at", EnvironmentFailure)
        reads.append((version, variant, wheel))
    for (version, variant, wheel), flags in zip(
        reads, http.map_concurrently(_flags, [w for _, _, w in reads]), strict=True
    ):
        if flags:
            found.setdefault(version, {}).setdefault("aarch64_index_archs", {})[variant] = flags
        else:
            note(f"note: torch {version}+{variant} for aarch64 ({urls.display(wheel)}) names no GPU architectures")
    return found


def _flags(url: str) -> str | None:
    """torch's compiled GPU architectures, read out of the wheel's libtorch_python.so by range requests; None when
    the wheel does not say (no such library, or no single list in it)."""
    try:
        return metadata_mod.arch_flags(remote_zip.read_member(url, "torch/lib/libtorch_python.so"))
    except EnvironmentFailure:
        return None


def add_archs(page: dict, torch_meta: dict[str, dict], note: Callable[[str], None] = print) -> None:
    """Record, per release `refresh.arch_reads` names, what its wheels say of the GPUs they run on: ``archs``
    (x86_64), and for Linux aarch64 its CUDA runtime (``aarch64_cuda_runtime``; none: a CPU-only build) and
    ``aarch64_archs`` ('' for a CPU-only build). A wheel that does not say is named in ``note`` and left out: the
    release then has no list, which `compat refresh --check` reports."""
    reads = refresh.arch_reads(page, torch_meta)
    aarch64 = reads["aarch64"]
    texts = http.map_concurrently(_fetch_metadata, [w.url + ".metadata" for _, w in aarch64])
    runtimes = {v: parse_metadata(t, "aarch64").cuda_runtime for (v, _), t in zip(aarch64, texts, strict=True)}
    cuda = [(v, w, "aarch64_archs") for v, w in aarch64 if runtimes[v]]
    for v, _ in aarch64:
        torch_meta[v]["aarch64_archs"] = ""  # a CPU-only build, unless its flags are read below
        if runtimes[v]:
            torch_meta[v]["aarch64_cuda_runtime"] = runtimes[v]
    todo = [*cuda, *((v, w, "archs") for v, w in reads["x86_64"])]
    for (v, w, field), flags in zip(todo, http.map_concurrently(_flags, [w.url for _, w, _ in todo]), strict=True):
        if flags:
            torch_meta[v][field] = flags
        else:
            if field == "aarch64_archs":
                del torch_meta[v][field]
            note(f"note: {w.filename} names no GPU architectures (torch/lib/libtorch_python.so): torch {v} has no list")


def build_metadata(
    index: str = refresh.DEFAULT_INDEX, pytorch_index: str | None = None, note: Callable[[str], None] = print
) -> dict:
    """Fetch and parse everything; returns the JSON document (not yet written, nor checked: `refresh.refusal`).
    ``pytorch_index``: where the torch releases' CUDA variants are read; unreachable, the refresh goes on without
    them and ``note`` says so (a torch minor without a [[torch]] table then knows its PyPI build only)."""
    found = pages(index)
    metadata = {name: _metadata_for(name, page, refresh.recorded_releases(name, page)) for name, page in found.items()}
    add_archs(found["torch"], metadata["torch"], note)
    variants = None
    if pytorch_index is not None:
        try:
            variants = pytorch_variants(pytorch_index, note)
        except EnvironmentFailure as exc:
            note(
                f"note: the PyTorch index was not read ({exc.message}): torch minors imagekit has no [[torch]] "
                "table for know their PyPI build only"
            )
    return refresh.document(found, metadata, variants)


def write(
    out: Path,
    index: str = refresh.DEFAULT_INDEX,
    floor: dict | None = None,
    pytorch_index: str | None = None,
    note: Callable[[str], None] = print,
) -> dict:
    """Fetch, check and write atomically. ``floor`` (the shipped metadata, when writing the file imagekit reads):
    refuse a document `inputs.compat_data` would pass over, so what is written is what is used."""
    try:
        doc = build_metadata(index, pytorch_index, note)
    except EnvironmentFailure as exc:
        raise EnvironmentFailure(f"{exc.message}; {out} was not written", exc.hint) from None
    over = refresh.arch_overpromises(compat.curated_document(), doc)
    if over:  # imagekit's own facts promise GPUs the wheels do not run on: said, and nothing written on top of them
        raise CheckFailed(
            "imagekit's curated GPU architectures promise more than the torch wheels hold: "
            + "; ".join(over)
            + f"; {out} was not written",
            "the wheel is the authority: correct the [[arch]] table in compat.toml from its flags (torch."
            "_C._cuda_getArchFlags(): sm_XY cubins, compute_XY PTX), or upgrade imagekit",
        )
    why = refresh.refusal(doc, floor)
    if why:
        raise EnvironmentFailure(
            f"the index {redact(index)} answered metadata imagekit would not use ({why}); {out} was not written",
            "use an index that mirrors PyPI's releases (the default https://pypi.org/simple), or --out FILE "
            "to export what it has",
        )
    write_atomic(out, refresh.dump(doc))
    return doc


def check(doc: dict, index: str = refresh.DEFAULT_INDEX) -> dict[str, list[str]]:
    """The releases the index lists that ``doc`` lacks (`refresh.missing_releases`): its pages only, no metadata."""
    return refresh.missing_releases(doc, pages(index))
