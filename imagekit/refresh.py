"""`imagekit compat refresh`: regenerate pypi-metadata.json from the package index (effects at the edge)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from imagekit.effects import http, remote_zip
from imagekit.effects.files import write_atomic
from imagekit.errors import EnvironmentFailure
from imagekit.metadata import (
    TORCH_FLOOR,
    WATCHED,
    parse_metadata,
    pick_metadata_wheel,
    releases_to_record,
    torch_releases,
    wheel_files,
    yanked_releases,
)

DEFAULT_INDEX = "https://pypi.org/simple"


def _simple(index: str, name: str) -> dict:
    """A PEP 691 page, checked: a list of files with names and http(s) URLs (made absolute against the page)."""
    page_url = f"{index.rstrip('/')}/{name}/"
    page = http.get_json(page_url, accept=http.SIMPLE_JSON)
    files = page.get("files") if isinstance(page, dict) else None
    hint = "the index must serve PEP 691 JSON (application/vnd.pypi.simple.v1+json)"
    if not isinstance(files, list):
        raise EnvironmentFailure(f"the index page {page_url} has no list of files", hint)
    fixed = []
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("filename"), str) or not isinstance(f.get("url"), str):
            raise EnvironmentFailure(f"the index page {page_url} lists a file without a filename or url", hint)
        try:
            url = str(httpx.URL(page_url).join(f["url"]))
        except httpx.InvalidURL:
            url = f["url"]
        http.require_http(url, f"the index lists {f['filename']} at", EnvironmentFailure, "use another index")
        fixed.append({**f, "url": url})
    return {**page, "files": fixed}


def _fetch_metadata(url: str) -> str:
    """PEP 658 metadata when the index has it, else METADATA read out of the wheel by range requests."""
    try:
        return http.get(url).decode("utf-8", "replace")
    except EnvironmentFailure:
        wheel = url.removesuffix(".metadata")
        return remote_zip.read_member(wheel, ".dist-info/METADATA").decode("utf-8", "replace")


def _metadata_for(index_json: dict, versions: list[str]) -> dict[str, dict]:
    files = wheel_files(index_json)
    picks = {v: pick_metadata_wheel(files, v) for v in versions}
    urls = [(v, w.url + ".metadata") for v, w in picks.items() if w is not None]
    texts = http.map_concurrently(_fetch_metadata, [u for _, u in urls])
    return {v: parse_metadata(t).to_json() for (v, _), t in zip(urls, texts, strict=True)}


def build_metadata(index: str = DEFAULT_INDEX) -> dict:
    """Fetch and parse everything; returns the JSON document (not yet written)."""
    torch_json = _simple(index, "torch")
    torch = torch_releases(torch_json, TORCH_FLOOR)
    torch_meta = _metadata_for(torch_json, sorted(torch))
    doc: dict = {
        "generated_by": "imagekit compat refresh",
        "source": "PYPI",
        "torch": {
            v: {"python": list(r.pythons), "glibc": r.glibc, **torch_meta.get(v, {})} for v, r in sorted(torch.items())
        },
        "packages": {},
    }
    for name, floor in sorted(WATCHED.items()):
        pj = _simple(index, name)
        versions = releases_to_record(pj, floor)
        yanked = yanked_releases(pj)
        meta = _metadata_for(pj, versions)
        doc["packages"][name] = {v: {**meta[v], "yanked": v in yanked} for v in versions if v in meta}
    return doc


def dump(doc: dict) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def refresh(out: Path, index: str = DEFAULT_INDEX, floor: dict | None = None) -> dict:
    """Fetch, check and write atomically. ``floor`` (the shipped metadata, when writing the file imagekit reads):
    refuse a document `compat.load` would pass over, so what is written is what is used."""
    from imagekit import compat
    from imagekit.resolution import redact

    doc = build_metadata(index)
    problems = compat.metadata_problems(doc)
    short = compat.floor_problem(doc, floor) if floor is not None and not problems else None
    if problems or short:
        raise EnvironmentFailure(
            f"the index {redact(index)} answered metadata imagekit would not use ({short or '; '.join(problems)}); "
            f"{out} was not written",
            "use an index that mirrors PyPI's torch releases (the default https://pypi.org/simple), or --out FILE "
            "to export what it has",
        )
    write_atomic(out, dump(doc))
    return doc
