"""The release record: what publish writes per image and every reader takes back, its fields and their one check.

Publish writes it as its file in the records folder and its entry in the release index (``{"schema": 1, "images":
{TAG: RECORD}}``); `release merge`, `build`'s size budget, `runpod-template`, `vast-template` and `pod create` read
it back. Pure: documents in, documents out; reading and writing the files is services.release_index's.

Fields (``?``: may be absent). :func:`entry_problems` checks each one's type, grammar and range, except
``reference``, ``lock_hash``, ``layers``, ``selftest`` and ``manifest.cell.platform``, which it leaves as they are:

- ``tag``, ``alias``: ``REPOSITORY:TAG``, the immutable tag and the cell's alias
- ``digest``: the image manifest's, what a pod pulls by; ``reference``: ``REPOSITORY@DIGEST``
- ``config_digest``?: the image config's; ``tag_digest``?: what the tag names when not the image (its SBOM's index)
- ``lock_hash``; ``size_bytes``: 0 to ``MAX_IMAGE_BYTES``; ``published_at``?: at most 64 characters (UTC, RFC 3339)
- ``layers``?, ``compressed_bytes``?: each layer's digest, compressed size and step, and their sum
- ``sbom``?: ``attestation`` (a digest), ``statement``?, ``document``? (digests), ``python``, ``dpkg`` (counts)
- ``<format>``? for each variant of publish_formats (``zstd``): ``tag`` (``REPOSITORY:TAG``) and ``digest``
- ``signature``?: ``key`` (the public key's sha256, a digest) and ``tags`` (at most 4 ``sha256-<hex>.sig``)
- ``manifest``: the image's manifest.json: ``cell`` (``id``; ``torch``, ``variant``, ``transformers``, ``python``,
  ``platform``), ``driver.minimum``, ``torch.archs``, ``image.ports`` and ``image.jupyter``, ``runtime`` (the
  runtime contract, compat.contract's check)
- ``selftest``: the self-test's report; its ``ran`` says where it ran (``gpu``, ``emulated``) and on what (``layers``:
  the image's diff ids, ``code_layer``, ``config``: oci.selftest_reuse's key), a result taken from an earlier release
  carries ``reused`` (that record's tag and digest, the layers), and ``reused`` at the top lists those checks
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from imagekit.errors import UsageError
from imagekit.model import AMD64
from imagekit.oci import publish_formats
from imagekit.trust import untrusted, validate

MAX_IMAGE_BYTES = 10**13  # 10 TB: no image is larger; a bigger size_bytes would size a template's disk absurdly
_PORT = re.compile(r"([0-9]{1,5})/(tcp|udp|http)", re.ASCII)
# a cell id as a record names it (and a self-test report, which the release page reads)
CELL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}", re.ASCII)
_SIG_TAG = re.compile(r"sha256-[0-9a-f]{64}\.sig")


@dataclass(frozen=True)
class Published:
    """What a publish did: the release a record is made of."""

    immutable: str
    alias: str
    digest: str
    reused: bool  # the registry already had exactly this image under the immutable tag
    config_digest: str | None = None  # the image config the registry serves under ``digest``
    platform: str = AMD64
    index_digest: str | None = None  # the alias names an image index of several platforms (this one among them)
    tag_digest: str | None = None  # what the immutable tag names: the image and its SBOM attestation's index
    sbom: dict | None = None  # the SBOM attestation: its manifest's digest, the document's, its package counts
    signature: dict | None = None  # cosign signatures made at publish: the key's fingerprint and the .sig tags
    variants: dict[str, dict] = field(default_factory=dict)  # format name -> its immutable tag and manifest digest


def empty_index() -> dict:
    return {"schema": 1, "images": {}}


def entry(
    published: Published,
    *,
    lock_hash: str,
    manifest: dict,
    report: dict,
    size: int,
    published_at: str,
    layers: list[dict] | None = None,
) -> dict:
    """One release: the index's entry for the immutable tag, and the content of its record file."""
    made = {
        "tag": published.immutable,
        "alias": published.alias,
        "digest": published.digest,
        "reference": f"{published.immutable.rsplit(':', 1)[0]}@{published.digest}",
        "lock_hash": lock_hash,
        "size_bytes": size,
        **(
            {"layers": layers, "compressed_bytes": sum(x.get("compressed_bytes") or 0 for x in layers)}
            if layers
            else {}
        ),
        "published_at": published_at,
        "manifest": manifest,
        "selftest": report,
    }
    if published.config_digest:
        made["config_digest"] = published.config_digest
    if published.tag_digest and published.tag_digest != published.digest:
        made["tag_digest"] = published.tag_digest  # the index the tag names: the image and its SBOM attestation
    if published.sbom:
        made["sbom"] = published.sbom
    for name, variant in published.variants.items():
        made[name] = variant  # the same image in another layer format, for engines that pull it
    if published.signature:
        made["signature"] = published.signature  # the key's fingerprint and where the signatures are, never the key
    return made


def record_name(tag: str) -> str:
    """``<cell id>-<build hash>.json`` for ``REPO:<cell id>-<build hash>``."""
    return tag.rsplit(":", 1)[1] + ".json"


def index_problems(doc: object) -> list[str]:
    """What keeps ``doc`` from being a release index: every field a reader uses (`release merge`, `build`'s size
    budget, `runpod-template` and the template it makes), with its type, grammar and range. One check for all of
    them: what passes here, every reader can use as it is."""
    if not isinstance(doc, dict) or not isinstance(doc.get("images", {}), dict):
        return ["expected an object with an 'images' object"]
    problems: list[str] = []
    for tag, found in doc.get("images", {}).items():
        where = f"images[{tag[:80]!r}]"
        if not isinstance(found, dict):
            problems.append(f"{where}: expected an object")
            continue
        problems += [f"{where}.{p}" for p in entry_problems(found)]
        if isinstance(found.get("tag"), str) and found["tag"] != tag:
            problems.append(f"{where}.tag: names another image than its key")
    return problems


def record_problems(doc: object, file_name: str) -> list[str]:
    """What keeps ``doc``, read from the file ``file_name``, from being a release record (its name is its tag's)."""
    if not isinstance(doc, dict):
        return ["expected an object"]
    problems = entry_problems(doc)
    if not problems and file_name != record_name(doc["tag"]):
        problems = [f"its name is not the tag it records ({doc['tag']})"]
    return problems


def entry_problems(entry: dict) -> list[str]:
    """What is wrong with one release (an index entry, a record's content): ``field: why``."""
    problems: list[str] = []

    def check(key: str, fn: Callable[[object], object], value: object) -> None:
        try:
            fn(value)
        except (UsageError, untrusted.UntrustedData) as exc:
            problems.append(f"{key}: {exc.message if isinstance(exc, UsageError) else exc}")

    def section(key: str, value: object, fields: dict[str, Callable[[object], object]]) -> None:
        if value is None:
            return
        if not isinstance(value, dict):
            problems.append(f"{key}: expected an object")
            return
        for name, fn in fields.items():
            check(f"{key}.{name}", fn, value.get(name))

    check("tag", _tagged, entry.get("tag"))
    check("alias", _tagged, entry.get("alias"))
    check("digest", _digest, entry.get("digest"))
    check("config_digest", _optional(_digest), entry.get("config_digest"))
    check("tag_digest", _optional(_digest), entry.get("tag_digest"))
    section(
        "sbom",
        entry.get("sbom"),
        {
            "attestation": _digest,
            "statement": _optional(_digest),
            "document": _optional(_digest),
            "python": _count,
            "dpkg": _count,
        },
    )
    for name in publish_formats.variants():
        section(name, entry.get(name), {"tag": _tagged, "digest": _digest})
    section("signature", entry.get("signature"), {"key": _digest, "tags": _strings(80, 4, _SIG_TAG)})
    check("size_bytes", _size, entry.get("size_bytes", 0))
    check("published_at", _optional(_text(64)), entry.get("published_at"))
    manifest = entry.get("manifest")
    if not isinstance(manifest, dict):
        problems.append("manifest.cell.id: expected a string")
        return problems
    cell = manifest.get("cell")
    if not isinstance(cell, dict):
        problems.append("manifest.cell.id: expected a string")
    else:
        check("manifest.cell.id", _cell_id, cell.get("id"))
        for name in ("torch", "variant", "transformers", "python"):
            check(f"manifest.cell.{name}", _optional(_text(64)), cell.get(name))
    section("manifest.driver", manifest.get("driver"), {"minimum": _optional(_text(32))})
    section("manifest.torch", manifest.get("torch"), {"archs": _optional(_strings(16, 64))})
    section("manifest.image", manifest.get("image"), {"ports": _optional(_ports), "jupyter": _optional(_flag)})
    if manifest.get("runtime") is not None:
        from imagekit.compat import contract

        problems += [f"manifest.runtime.{p}" for p in contract.problems(manifest["runtime"], manifest.get("cell"))]
    return problems


def newest(images: dict, ref: str, platform: str | None = None) -> dict | None:
    """The release ``ref`` names in a checked index's images (its immutable tag, alias or cell id; the newest when
    several do), or None. A cell published for several platforms names one release per platform: ``platform``'s
    (default linux/amd64) when there is one."""
    matches = [e for tag, e in sorted(images.items()) if ref in (tag, e["alias"], e["manifest"]["cell"]["id"])]
    if not matches:
        return None
    mine = [e for e in matches if (e["manifest"]["cell"].get("platform") or AMD64) == (platform or AMD64)]
    return max(mine or matches, key=lambda e: e.get("published_at") or "")


def last_size(images: dict, cell_id: str, platform: str = AMD64) -> int | None:
    """The size of the cell's most recently published image for ``platform`` among a checked index's images."""
    mine = [
        e for e in images.values()
        if isinstance(e.get("manifest"), dict) and (e["manifest"].get("cell") or {}).get("id") == cell_id
        and (e["manifest"].get("cell") or {}).get("platform", AMD64) == platform
    ]  # fmt: skip
    if not mine:
        return None
    latest = max(mine, key=lambda e: (str(e.get("published_at", "")), e.get("tag", "")))
    return int(latest.get("size_bytes") or 0) or None


def _tagged(value: object) -> None:
    validate.image_ref(value, "reference")
    m = validate.IMAGE_REF.fullmatch(value)  # type: ignore[arg-type]
    if m is None or not m["tag"] or m["digest"]:
        raise UsageError(f"{value!r} is not REPOSITORY:TAG")


def _digest(value: object) -> None:
    untrusted.digest(value, "value")


def _text(limit: int) -> Callable[[object], object]:
    return lambda v: untrusted.bounded_text(v, "value", limit)


def _optional(fn: Callable[[object], object]) -> Callable[[object], object]:
    return lambda v: None if v is None else fn(v)


def _strings(limit: int, count: int, pattern: re.Pattern[str] | None = None) -> Callable[[object], object]:
    def fn(v: object) -> None:
        if not isinstance(v, list) or len(v) > count:
            raise UsageError(f"expected a list of at most {count} strings")
        for item in v:
            untrusted.bounded_text(item, "item", limit)
            if pattern is not None and not pattern.fullmatch(item):
                raise UsageError(f"{untrusted.printable(item, 40)!r} is not of the form {pattern.pattern}")

    return fn


def _size(v: object) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= MAX_IMAGE_BYTES:
        raise UsageError(f"expected a number of bytes from 0 to {MAX_IMAGE_BYTES}")


def _cell_id(v: object) -> None:
    if not isinstance(v, str) or not CELL_ID.fullmatch(v):
        raise UsageError("expected a cell id (such as cu121-torch2.1.2-py3.11-tf4.48.2)")


def _ports(v: object) -> None:
    _strings(16, 32, _PORT)(v)
    for item in v:  # type: ignore[union-attr]
        if not 1 <= int(_PORT.fullmatch(item)[1]) <= 65535:  # type: ignore[index]
            raise UsageError(f"{item!r}: a port from 1 to 65535")


def _count(v: object) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1_000_000:
        raise UsageError("expected a count from 0 to 1000000")


def _flag(v: object) -> None:
    if not isinstance(v, bool):
        raise UsageError("expected true or false")
