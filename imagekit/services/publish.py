"""Publish: push only images whose self-test passed; an immutable tag never moves to other contents."""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from imagekit.effects.files import read_input, write_atomic
from imagekit.effects.registry import OciManifest, Remote
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.model import AMD64
from imagekit.oci import image_index, layer_blobs
from imagekit.services import blob_push
from imagekit.services.ports import ContainerEngine, Registry
from imagekit.services.progress import Progress
from imagekit.services.selftest_runner import SelfTestReport
from imagekit.supplychain import sbom
from imagekit.trust import untrusted


@dataclass(frozen=True)
class Published:
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
    zstd: dict | None = None  # the zstd variant: its immutable tag and manifest digest


MAX_IMAGE_BYTES = 10**13  # 10 TB: no image is larger; a bigger size_bytes would size a template's disk absurdly
_PORT = re.compile(r"([0-9]{1,5})/(tcp|udp|http)", re.ASCII)
_CELL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}", re.ASCII)


def _load(path: Path, text: str, what: str, hint: str) -> object:
    from imagekit.trust import untrusted

    try:
        return untrusted.load_json(text, "it")
    except untrusted.UntrustedData as exc:
        raise UsageError(f"{what} {path} is not a {what}: {exc}", hint) from None


def read_index(path: Path) -> dict:
    """The release index (empty when missing); one of another shape is a usage error naming what is wrong."""
    hint = f"pass the index `imagekit build --push` writes, or move {path} aside"
    text = read_input(path, "release index", hint, missing_ok=True)
    if text is None:
        return {"schema": 1, "images": {}}
    doc = _load(path, text, "release index", hint)
    problems = index_problems(doc)
    if problems:
        raise UsageError(f"release index {path} is not a release index: " + "; ".join(problems[:5]), hint)
    assert isinstance(doc, dict)
    return doc


def index_problems(doc: object) -> list[str]:
    """What keeps ``doc`` from being a release index: every field a reader uses (`release merge`, `build`'s size
    budget, `runpod-template` and the template it makes), with its type, grammar and range. One check for all of
    them: what passes here, every reader can use as it is."""
    if not isinstance(doc, dict) or not isinstance(doc.get("images", {}), dict):
        return ["expected an object with an 'images' object"]
    problems: list[str] = []
    for tag, entry in doc.get("images", {}).items():
        where = f"images[{tag[:80]!r}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: expected an object")
            continue
        problems += [f"{where}.{p}" for p in entry_problems(entry)]
        if isinstance(entry.get("tag"), str) and entry["tag"] != tag:
            problems.append(f"{where}.tag: names another image than its key")
    return problems


def entry_problems(entry: dict) -> list[str]:
    """What is wrong with one release (an index entry, a record's content): ``field: why``."""
    from imagekit.trust import untrusted, validate

    problems = []

    def check(key: str, fn: Callable[[object], object], value: object) -> None:
        try:
            fn(value)
        except (UsageError, untrusted.UntrustedData) as exc:
            problems.append(f"{key}: {exc.message if isinstance(exc, UsageError) else exc}")

    def tagged(value: object) -> None:
        validate.image_ref(value, "reference")
        m = validate.IMAGE_REF.fullmatch(value)  # type: ignore[arg-type]
        if m is None or not m["tag"] or m["digest"]:
            raise UsageError(f"{value!r} is not REPOSITORY:TAG")

    def text(limit: int) -> Callable[[object], object]:
        return lambda v: untrusted.bounded_text(v, "value", limit)

    def optional(fn: Callable[[object], object]) -> Callable[[object], object]:
        return lambda v: None if v is None else fn(v)

    def strings(limit: int, count: int, pattern: re.Pattern[str] | None = None) -> Callable[[object], object]:
        def fn(v: object) -> None:
            if not isinstance(v, list) or len(v) > count:
                raise UsageError(f"expected a list of at most {count} strings")
            for item in v:
                untrusted.bounded_text(item, "item", limit)
                if pattern is not None and not pattern.fullmatch(item):
                    raise UsageError(f"{untrusted.printable(item, 40)!r} is not of the form {pattern.pattern}")

        return fn

    def size(v: object) -> None:
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not math.isfinite(v)
            or not 0 <= v <= MAX_IMAGE_BYTES
        ):
            raise UsageError(f"expected a number of bytes from 0 to {MAX_IMAGE_BYTES}")

    def cell_id(v: object) -> None:
        if not isinstance(v, str) or not _CELL_ID.fullmatch(v):
            raise UsageError("expected a cell id (such as cu121-torch2.1.2-py3.11-tf4.48.2)")

    def ports(v: object) -> None:
        strings(16, 32, _PORT)(v)
        for item in v:  # type: ignore[union-attr]
            if not 1 <= int(_PORT.fullmatch(item)[1]) <= 65535:  # type: ignore[index]
                raise UsageError(f"{item!r}: a port from 1 to 65535")

    def count(v: object) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1_000_000:
            raise UsageError("expected a count from 0 to 1000000")

    def flag(v: object) -> None:
        if not isinstance(v, bool):
            raise UsageError("expected true or false")

    def section(key: str, value: object, fields: dict[str, Callable[[object], object]]) -> None:
        if value is None:
            return
        if not isinstance(value, dict):
            problems.append(f"{key}: expected an object")
            return
        for name, fn in fields.items():
            check(f"{key}.{name}", fn, value.get(name))

    check("tag", tagged, entry.get("tag"))
    check("alias", tagged, entry.get("alias"))
    check("digest", lambda v: untrusted.digest(v, "value"), entry.get("digest"))
    check("config_digest", optional(lambda v: untrusted.digest(v, "value")), entry.get("config_digest"))
    check("tag_digest", optional(lambda v: untrusted.digest(v, "value")), entry.get("tag_digest"))
    section(
        "sbom",
        entry.get("sbom"),
        {
            "attestation": lambda v: untrusted.digest(v, "value"),
            "statement": optional(lambda v: untrusted.digest(v, "value")),
            "document": optional(lambda v: untrusted.digest(v, "value")),
            "python": count,
            "dpkg": count,
        },
    )
    section("zstd", entry.get("zstd"), {"tag": tagged, "digest": lambda v: untrusted.digest(v, "value")})
    section(
        "signature",
        entry.get("signature"),
        {
            "key": lambda v: untrusted.digest(v, "value"),
            "tags": strings(80, 4, re.compile(r"sha256-[0-9a-f]{64}\.sig")),
        },
    )
    check("size_bytes", size, entry.get("size_bytes", 0))
    check("published_at", optional(text(64)), entry.get("published_at"))
    manifest = entry.get("manifest")
    if not isinstance(manifest, dict):
        problems.append("manifest.cell.id: expected a string")
        return problems
    cell = manifest.get("cell")
    if not isinstance(cell, dict):
        problems.append("manifest.cell.id: expected a string")
    else:
        check("manifest.cell.id", cell_id, cell.get("id"))
        for name in ("torch", "variant", "transformers", "python"):
            check(f"manifest.cell.{name}", optional(text(64)), cell.get(name))
    section("manifest.driver", manifest.get("driver"), {"minimum": optional(text(32))})
    section("manifest.torch", manifest.get("torch"), {"archs": optional(strings(16, 64))})
    section("manifest.image", manifest.get("image"), {"ports": optional(ports), "jupyter": optional(flag)})
    if manifest.get("runtime") is not None:
        from imagekit.compat import contract

        problems += [f"manifest.runtime.{p}" for p in contract.problems(manifest["runtime"], manifest.get("cell"))]
    return problems


def _same_contents(
    engine: ContainerEngine, registry: Registry, remote: Remote, config_digest: str | None, image_id: str
) -> bool:
    """Same layers and labels (a rebuild differing only in creation times), so the published image stands."""
    if not config_digest:
        return False
    remote_config = registry.blob_json(remote, config_digest)
    local = engine.image(image_id) or {}
    return remote_config.get("rootfs", {}).get("diff_ids") == local.get("RootFS", {}).get(
        "Layers"
    ) and remote_config.get("config", {}).get("Labels") == local.get("Config", {}).get("Labels")


def publish(
    engine: ContainerEngine,
    registry: Registry,
    *,
    image_id: str,
    repository: str,
    immutable_tag: str,
    alias_tag: str,
    report: SelfTestReport,
    log: Callable[[str], None] = lambda _: None,
    progress: Progress | None = None,
    platform: str = AMD64,
    gzip: layer_blobs.Gzip | None = None,
    sbom_doc: dict | None = None,
    sign: Callable[[str], dict] | None = None,
    zstd: bool = False,
) -> Published:
    """Push the tested image, then name it by ``immutable_tag``: with ``sbom_doc``, an image index of the image and
    its SBOM attestation (as BuildKit stores them), else the image's manifest. A tag that exists already must hold
    the same image (an index's entry for ``platform``, or the manifest itself): it is never moved. ``sign`` (a
    digest -> what to record) signs what the tag names and the image itself, after the tag and before the alias:
    an alias never names an unsigned image when signing was asked for. ``zstd``: the same image with zstd layers under
    ``<tag>-zstd`` and ``<alias>-zstd`` too, for engines that pull zstd (Docker >= 23, containerd); never instead."""
    if not report.passed:
        raise CheckFailed(
            f"refusing to publish {repository}:{immutable_tag}: its self-test failed "
            f"({', '.join(report.failed) or 'no report'})",
            "fix the image; only tested images are pushed",
        )
    remote = Remote.parse(repository)
    existing = registry.oci_manifest(remote, immutable_tag)
    tag_digest = existing.digest if existing is not None else None
    if existing is not None and existing.config_digest is None:  # an index: this platform's image in it
        existing = _image_in_index(registry, remote, immutable_tag, platform)
    if (
        existing is not None
        and existing.config_digest != image_id
        and not _same_contents(engine, registry, remote, existing.config_digest, image_id)
    ):
        raise CheckFailed(
            f"{repository}:{immutable_tag} already exists with other contents (config {existing.config_digest}, "
            f"this build {image_id})",
            "immutable tags never move; change the lock (and so the tag) or delete it by hand",
        )
    engine.tag(image_id, repository, immutable_tag)
    attested: dict | None = None
    if existing is not None:
        digest, reused = existing.digest, True
        log(f"{repository}:{immutable_tag} already published as {digest}")
    else:
        log(f"pushing {repository}:{immutable_tag}")
        digest = blob_push.push_image(
            engine,
            registry,
            remote,
            image_id,
            None if sbom_doc is not None else immutable_tag,  # with an SBOM, the tag names the index made below
            gzip=gzip,
            progress=progress,
            label=alias_tag,
            log=log,
        )
        reused = False
        tag_digest = digest
        if sbom_doc is not None:
            tag_digest, attested = attach_sbom(registry, remote, immutable_tag, digest, platform, sbom_doc)
            log(
                f"{repository}:{immutable_tag} names an image index ({tag_digest}): the image and its SBOM "
                f"attestation ({attested['attestation']}, {attested['python']} Python distributions, "
                f"{attested['dpkg']} Debian packages)"
            )
    check = registry.oci_manifest(remote, digest)
    expected = existing.config_digest if existing is not None else image_id
    if check is None or check.config_digest != expected:
        raise EnvironmentFailure(
            f"the registry does not serve {digest} with this image's config after the push", "retry the push"
        )
    signature = None
    if sign is not None:
        made = [sign(d) for d in dict.fromkeys([tag_digest or digest, digest])]
        signature = {"key": made[0]["key"], "tags": [m["tag"] for m in made]}
    variant = None
    if zstd:
        variant = _push_zstd(engine, registry, remote, image_id, immutable_tag, alias_tag, progress, log)
    index_digest = point_alias(registry, remote, alias_tag, digest, platform, tagged=tag_digest)
    if index_digest:
        log(f"{repository}:{alias_tag} names an image index ({index_digest}) with this {platform} image")
    return Published(
        f"{repository}:{immutable_tag}",
        f"{repository}:{alias_tag}",
        digest,
        reused,
        check.config_digest,
        platform,
        index_digest,
        tag_digest,
        attested,
        signature,
        variant,
    )


def _push_zstd(
    engine: ContainerEngine,
    registry: Registry,
    remote: Remote,
    image_id: str,
    tag: str,
    alias: str,
    progress: Progress | None,
    log: Callable[[str], None],
) -> dict:
    """The zstd variant under its own immutable tag (which never moves either), then its alias."""
    variant, variant_alias = f"{tag}-zstd", f"{alias}-zstd"
    existing = registry.oci_manifest(remote, variant)
    if existing is not None and existing.config_digest != image_id:
        raise CheckFailed(
            f"{remote.registry}/{remote.name}:{variant} already exists with other contents",
            "immutable tags never move; change the lock (and so the tag) or delete it by hand",
        )
    if existing is not None:
        digest = existing.digest
    else:
        digest = blob_push.push_image(
            engine,
            registry,
            remote,
            image_id,
            variant,
            gzip=layer_blobs.Zstd(),
            progress=progress,
            label=alias,
            log=log,
        )
    registry.copy_tag(remote, digest, variant_alias)
    return {"tag": f"{remote.registry}/{remote.name}:{variant}", "digest": digest}


def _image_in_index(registry: Registry, remote: Remote, tag: str, platform: str) -> OciManifest | None:
    """The ``platform`` image of the index ``tag`` names (an image and its attestation, as `publish` writes)."""
    raw = registry.manifest_raw(remote, tag)
    try:
        if raw is None or raw[0] not in image_index.INDEX_TYPES:
            raise untrusted.UntrustedData("the tag changed while it was read")
        entries = image_index.entries_of(untrusted.load_json(raw[1], "the tag's image index"))
    except untrusted.UntrustedData as exc:
        raise EnvironmentFailure(
            f"{remote.registry}/{remote.name}:{tag} is neither an image nor an index imagekit can read: {exc}",
            "immutable tags never move; delete it by hand if it is not a published image",
        ) from None
    mine = [e for e in entries if e.platform == platform]
    if not mine:
        raise CheckFailed(
            f"{remote.registry}/{remote.name}:{tag} already exists without a {platform} image",
            "immutable tags never move; change the lock (and so the tag) or delete it by hand",
        )
    return registry.oci_manifest(remote, mine[0].digest)


def attach_sbom(
    registry: Registry, remote: Remote, tag: str, digest: str, platform: str, doc: dict
) -> tuple[str, dict]:
    """Upload the SBOM attestation of the image ``digest`` and name both by ``tag`` in one image index; returns the
    index's digest and what the release records of the attestation."""
    raw = registry.manifest_raw(remote, digest)
    if raw is None or raw[0] not in image_index.IMAGE_TYPES:
        raise EnvironmentFailure(f"the registry does not serve {digest} as an image manifest", "retry the push")
    subject = f"pkg:docker/{remote.registry}/{remote.name}@{tag}?platform={quote(platform, safe='')}"
    att = sbom.attestation(sbom.statement(doc, subject, digest))
    for blob in (att.statement, att.config):
        if registry.blob_size(remote, sbom.digest(blob)) != len(blob):
            registry.upload_blob(remote, sbom.digest(blob), len(blob), blob)
    attestation = registry.put_manifest(remote, att.manifest_digest, att.manifest, sbom.OCI_MANIFEST)
    body = sbom.index(raw[0], digest, len(raw[1]), platform, att)
    tag_digest = registry.put_manifest(remote, tag, body, sbom.OCI_INDEX)
    recorded = {
        "attestation": attestation,
        "statement": sbom.digest(att.statement),
        "document": sbom.digest(sbom.canonical(doc)),
        **sbom.counts(doc),
    }
    return tag_digest, recorded


def point_alias(
    registry: Registry, remote: Remote, alias_tag: str, digest: str, platform: str, tagged: str | None = None
) -> str | None:
    """Point the cell's alias at the image ``digest`` just published for ``platform``: what its immutable tag names
    (``tagged``: the image with its SBOM attestation, or the manifest itself) while the cell has only a linux/amd64
    image, else an image index of every platform's image, this one replacing its platform's earlier entry (the
    attestations stay with each platform's immutable tag). Returns that index's digest, or None."""
    current = registry.manifest_raw(remote, alias_tag)
    others: list[image_index.Entry] = []
    try:
        if current is not None and current[0] in image_index.INDEX_TYPES:
            others = image_index.entries_of(untrusted.load_json(current[1], "the alias's image index"))
        elif current is not None and current[0] in image_index.IMAGE_TYPES:
            doc = untrusted.load_json(current[1], "the alias's manifest")
            config = doc.get("config", {}).get("digest") if isinstance(doc, dict) else None
            earlier = image_index.platform_of_config(registry.blob_json(remote, untrusted.digest(config)))
            others = [image_index.Entry(earlier, current[2], len(current[1]), current[0])]
    except untrusted.UntrustedData as exc:
        raise EnvironmentFailure(
            f"{remote.registry}/{remote.name}:{alias_tag} is not an image or index imagekit can extend: {exc}",
            "delete the tag by hand (immutable tags keep every image) and publish again",
        ) from None
    if platform == AMD64 and all(e.platform == AMD64 for e in others):
        registry.copy_tag(remote, tagged or digest, alias_tag)  # the alias names exactly what the tag names
        return None
    mine = registry.manifest_raw(remote, digest)
    if mine is None or mine[0] not in image_index.IMAGE_TYPES:
        raise EnvironmentFailure(f"the registry does not serve {digest} as an image manifest", "retry the push")
    entries = image_index.merged(others, image_index.Entry(platform, digest, len(mine[1]), mine[0]))
    return registry.put_manifest(remote, alias_tag, image_index.document(entries), image_index.LIST_TYPE)


@contextmanager
def index_locked(index_path: Path) -> Iterator[None]:
    """Hold an exclusive flock on the index's folder: read-modify-write of the index by several processes on one
    machine (parallel publishers, `release merge`) serializes and loses nothing; no lock file is left behind."""
    folder = index_path.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def layer_sizes(registry: Registry, remote: Remote, digest: str, config_digest: str | None) -> list[dict]:
    """Each layer of a published image, bottom first: blob digest, compressed bytes (what a pull downloads and a
    registry stores) and the step that made it (from the config's history, where `empty_layer` steps make none)."""
    layers = registry.oci_manifest_json(remote, digest).get("layers") or []
    steps: list[str] = []
    if config_digest:
        history = registry.blob_json(remote, config_digest).get("history") or []
        steps = [h.get("created_by", "") for h in history if isinstance(h, dict) and not h.get("empty_layer")]
    if len(steps) != len(layers):
        steps = [""] * len(layers)
    return [
        {"digest": layer.get("digest"), "compressed_bytes": layer.get("size"), "created_by": step[-160:]}
        for layer, step in zip(layers, steps, strict=True)
        if isinstance(layer, dict)
    ]


def release_entry(
    published: Published,
    *,
    lock_hash: str,
    manifest: dict,
    report: dict,
    size: int,
    published_at: str | None = None,
    layers: list[dict] | None = None,
) -> dict:
    """One release: the index's entry for the immutable tag, and the content of its record file."""
    entry = {
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
        "published_at": published_at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "manifest": manifest,
        "selftest": report,
    }
    if published.config_digest:
        entry["config_digest"] = published.config_digest
    if published.tag_digest and published.tag_digest != published.digest:
        entry["tag_digest"] = published.tag_digest  # the index the tag names: the image and its SBOM attestation
    if published.sbom:
        entry["sbom"] = published.sbom
    if published.zstd:
        entry["zstd"] = published.zstd  # the same image with zstd layers, for engines that pull them
    if published.signature:
        entry["signature"] = published.signature  # the key's fingerprint and where the signatures are, never the key
    return entry


def newest_release(index_path: Path, ref: str, platform: str | None = None) -> dict:
    """The release ``ref`` names in the index (its immutable tag, alias or cell id; the newest when several do): what
    `runpod-template`, `vast-template` and `pod create` use. A cell published for several platforms names one release
    per platform: ``platform``'s (default linux/amd64) when there is one."""
    images = read_index(index_path).get("images", {})
    matches = [e for tag, e in sorted(images.items()) if ref in (tag, e["alias"], e["manifest"]["cell"]["id"])]
    if not matches:
        raise UsageError(f"{ref} is not in {index_path}", "publish it with `imagekit build --push` first")
    mine = [e for e in matches if (e["manifest"]["cell"].get("platform") or AMD64) == (platform or AMD64)]
    return max(mine or matches, key=lambda e: e.get("published_at") or "")


def last_size(index_path: Path, cell_id: str, platform: str = AMD64) -> int | None:
    """The size of the cell's most recently published image for ``platform`` in the release index, if any."""
    images = read_index(index_path).get("images", {})
    mine = [
        e for e in images.values()
        if isinstance(e.get("manifest"), dict) and (e["manifest"].get("cell") or {}).get("id") == cell_id
        and (e["manifest"].get("cell") or {}).get("platform", AMD64) == platform
    ]  # fmt: skip
    if not mine:
        return None
    newest = max(mine, key=lambda e: (str(e.get("published_at", "")), e.get("tag", "")))
    return int(newest.get("size_bytes") or 0) or None


def record_name(tag: str) -> str:
    """``<cell id>-<build hash>.json`` for ``REPO:<cell id>-<build hash>``."""
    return tag.rsplit(":", 1)[1] + ".json"


def read_record(path: Path) -> dict:
    """A release record (one index entry); another shape is a usage error naming the file."""
    hint = f"pass the folder `imagekit build --push --release-records` writes, or move {path} aside"
    text = read_input(path, "release record", hint)
    entry = _load(path, text or "", "release record", hint)
    if not isinstance(entry, dict):
        raise UsageError(f"release record {path} is not a release record: expected an object", hint)
    problems = entry_problems(entry)
    tag = entry["tag"] if not problems else ""
    if not problems and path.name != record_name(tag):
        problems = [f"its name is not the tag it records ({tag})"]
    if problems:
        raise UsageError(f"release record {path} is not a release record: " + "; ".join(problems[:5]), hint)
    return entry


def write_record(records_dir: Path, entry: dict) -> Path:
    """``records_dir/<cell id>-<build hash>.json`` (atomic): one file per immutable tag, so parallel publishers
    (CI runners) never write the same file; an existing record of this tag with another digest is refused."""
    path = records_dir / record_name(entry["tag"])
    if path.is_file():
        old = read_record(path)
        if old["digest"] != entry["digest"]:
            raise CheckFailed(
                f"{path} records {entry['tag']} as {old['digest']}, not {entry['digest']}",
                "immutable tags never move; find out why the registry changed, then remove the old record by hand",
            )
        entry = {**entry, "published_at": old.get("published_at") or entry["published_at"]}
    write_atomic(path, json.dumps(entry, indent=2, sort_keys=True) + "\n")
    return path


def record(
    index_path: Path,
    published: Published,
    *,
    lock_hash: str,
    manifest: dict,
    report: dict,
    size: int,
    records_dir: Path | None = None,
    layers: list[dict] | None = None,
) -> dict:
    """Add the release to the index (atomically, under the index's lock): tag, digest, lock hash, manifest,
    self-test report; and, with ``records_dir``, write its own record file."""
    with index_locked(index_path):
        index = read_index(index_path)
        earlier = index.get("images", {}).get(published.immutable, {})
        entry = release_entry(
            published,
            lock_hash=lock_hash,
            manifest=manifest,
            report=report,
            size=size,
            published_at=earlier.get("published_at") if earlier.get("digest") == published.digest else None,
            layers=layers,
        )
        if records_dir is not None:
            write_record(records_dir, entry)
        index.setdefault("images", {})[published.immutable] = entry
        write_atomic(index_path, json.dumps(index, indent=2, sort_keys=True) + "\n")
    return entry
