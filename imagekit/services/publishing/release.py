"""`imagekit release merge`: the release index from the records parallel publishers (CI runners) wrote.

Each record is checked against the registry before anything is written: the manifest its digest names exists
(with the recorded image config) and its immutable tag still points at it. An immutable tag is never given
another digest, neither by two records nor over the index's entry.

A record is a CI artifact, so it is data to check: it may only name a registry the user named (``--registry``) or
one the index already lists, and that is checked before any request, so the registry credentials (bound to those
registries) never reach another.

Every fetch by digest is bound to its digest (imagekit.effects.registry): a registry answering a record's digest, a
signature's payload or an alias index's image with other bytes, or a tag with a Docker-Content-Digest that is not the
digest of what it serves, is refused, exit 3 (the registry's answer is not the API's), and nothing is written. A
record the registry honestly contradicts (no such manifest, another config, a moved tag) is exit 1.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from imagekit.effects.files import write_atomic
from imagekit.effects.registry import RegistryClient, Remote, refuse_user_info, without_user_info
from imagekit.errors import CheckFailed, UsageError
from imagekit.model import AMD64
from imagekit.oci import image_index, media_types
from imagekit.services.publishing.release_index import index_locked, read_index, read_record, vouch
from imagekit.trust import registry_host, validate


@dataclass(frozen=True)
class Merged:
    records: int  # record files read
    added: list[str]  # tags new to the index
    unchanged: list[str]  # tags the index already had with the same digest
    index: Path


@dataclass(frozen=True)
class Named:
    """A registry the user named: a host (every repository on it) or one repository (and those under it)."""

    registry: str
    name: str | None = None

    def __str__(self) -> str:
        return self.registry + (f"/{self.name}" if self.name else "")

    def holds(self, remote: Remote) -> bool:
        return remote.registry.lower() == self.registry.lower() and (
            self.name is None or remote.name == self.name or remote.name.startswith(self.name + "/")
        )


def named_registry(value: str) -> Named:
    """``--registry HOST[:PORT]`` or ``HOST[:PORT]/REPO``, of the distribution grammar."""
    hint = "name your registry as HOST[:PORT] or HOST[:PORT]/REPO, e.g. --registry ghcr.io/acme/train"
    refuse_user_info(value, "--registry")  # never shown: credentials come from `docker login` or the environment
    try:
        if "/" in value:
            remote = Remote.parse(validate.repository(value))
            if registry_host.split(value)[0] is None:
                raise UsageError(f"--registry {value!r} names no registry host", hint)
            return Named(registry_host.api_host(remote.registry), remote.name)
        Remote(value, "x")  # the host alone: of the grammar, or UsageError
        return Named(registry_host.api_host(value))
    except UsageError as exc:
        raise UsageError(f"--registry: {without_user_info(exc.message)}", hint) from None


def allowed_registries(flags: list[str], index: dict) -> tuple[list[Named], str]:
    """The registries records may name, and where that list came from: ``--registry`` when given, else the
    repositories the index already lists."""
    if flags:
        return [named_registry(v) for v in flags], "--registry"
    repos = sorted({e["tag"].rsplit(":", 1)[0] for e in index.get("images", {}).values()})
    return [Named(r.registry, r.name) for r in map(Remote.parse, repos)], "the index"


def check_registries(by_tag: dict[str, tuple[dict, Path]], allowed: list[Named], source: str, index: Path) -> None:
    """Every record names a registry the user named: refused before any request (nothing is sent, nothing
    written)."""
    if not by_tag:
        return
    if not allowed:
        raise UsageError(
            f"name the registry the records are for: {index} lists none yet",
            "pass --registry HOST[/REPO] (repeatable), e.g. --registry ghcr.io/acme/train; the registry "
            "credentials go only there",
        )
    names = ", ".join(map(str, allowed))
    for tag, (_, path) in sorted(by_tag.items()):
        remote = Remote.parse(tag.rsplit(":", 1)[0])
        if not any(n.holds(remote) for n in allowed):
            where = "--registry" if source == "--registry" else f"--registry or listed in {index}"
            raise CheckFailed(
                f"{path} names {remote.registry}/{remote.name}, not a registry named by {where} ({names})",
                f"if that registry is yours, pass --registry {remote.registry}/{remote.name}; otherwise remove the "
                "record; nothing was sent to it and nothing was written",
            )


def find_records(folders: list[Path]) -> list[Path]:
    """Every ``*.json`` under the folders (download-artifact puts each artifact in a subfolder), sorted."""
    found = []
    for folder in folders:
        if not folder.is_dir():
            what = "is not a folder" if folder.exists() or folder.is_symlink() else "does not exist"
            raise UsageError(
                f"records folder {folder} {what}",
                "pass the folder(s) `imagekit build --push --release-records` wrote into (default releases/records)",
            )
        found += sorted(p for p in folder.rglob("*.json") if not p.name.startswith("."))
    return found


def collect(paths: list[Path]) -> dict[str, tuple[dict, Path]]:
    """Records by immutable tag; two records giving one tag two digests is refused (exit 1)."""
    by_tag: dict[str, tuple[dict, Path]] = {}
    for path in paths:
        try:
            entry = read_record(path)
        except UsageError as exc:  # a record is a CI artifact: what it holds may carry credentials, never shown
            raise UsageError(without_user_info(exc.message), exc.hint and without_user_info(exc.hint)) from None
        seen = by_tag.get(entry["tag"])
        if seen is not None and seen[0]["digest"] != entry["digest"]:
            raise CheckFailed(
                f"{entry['tag']} is recorded with two digests: {seen[0]['digest']} ({seen[1]}) and "
                f"{entry['digest']} ({path})",
                "immutable tags never move; keep the record whose digest the registry serves",
            )
        by_tag.setdefault(entry["tag"], (entry, path))
    return by_tag


def verify(registry: RegistryClient, entry: dict, path: Path) -> None:
    """The registry serves the recorded manifest (bytes that hash to the recorded digest), with the recorded config,
    under the recorded tag (whose bytes hash to what the record says it names)."""
    repo, tag = entry["tag"].rsplit(":", 1)
    remote = Remote.parse(repo)
    found = registry.oci_manifest(remote, entry["digest"])
    if found is None:
        raise CheckFailed(
            f"{repo} has no manifest {entry['digest']} ({path} records it for {entry['tag']})",
            "publish it again with `imagekit build --push`, or remove the record; nothing was written",
        )
    if entry.get("config_digest") and found.config_digest != entry["config_digest"]:
        raise CheckFailed(
            f"{repo}@{entry['digest']} has config {found.config_digest}, but {path} records {entry['config_digest']}",
            "the record does not describe that image; remove it and publish again; nothing was written",
        )
    _check_selftest(registry, remote, entry, found.config_digest, path)
    tagged = registry.oci_manifest(remote, tag)
    named = entry.get("tag_digest") or entry["digest"]  # the index of the image and its SBOM, or the image itself
    if tagged is None or tagged.digest != named:
        now = tagged.digest if tagged is not None else "nothing"
        raise CheckFailed(
            f"{entry['tag']} points at {now} in the registry, not {named} ({path})",
            "immutable tags never move; publish it again with `imagekit build --push`; nothing was written",
        )


def _check_selftest(registry: RegistryClient, remote: Remote, entry: dict, config: str | None, path: Path) -> None:
    """The record's self-test passed, and the layers it names are the image's: its config's diff ids, read from the
    registry by digest (a record claiming another image's layers would lend its results to a build of those)."""
    from imagekit.oci import selftest_reuse

    report = entry.get("selftest")
    ran = report.get("ran") if isinstance(report, dict) else None
    diff_ids = None
    if isinstance(ran, dict) and ran.get("layers") is not None and config is not None:
        rootfs = registry.blob_json(remote, config).get("rootfs")
        diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
        diff_ids = diff_ids if isinstance(diff_ids, list) else []
    problem = selftest_reuse.record_problem(report, diff_ids)
    if problem:
        raise CheckFailed(
            f"{path}: {entry['tag']}: {problem}",
            "only a tested image is published: remove the record, or publish the image again with "
            "`imagekit build --push`; nothing was written",
        )


def merge(
    folders: list[Path],
    index_path: Path,
    registry: RegistryClient,
    log: Callable[[str], None] = lambda _: None,
    allowed: tuple[list[Named], str] = ([], "--registry"),
    signed_by: object | None = None,
) -> Merged:
    """Check every record names an allowed registry, verify each against it (and, with ``signed_by``, a public key,
    that what its tag names carries a cosign signature by that key), then add them to the index in one atomic write
    (or none)."""
    paths = find_records(folders)
    by_tag = collect(paths)
    check_registries(by_tag, *allowed, index_path)
    with index_locked(index_path):
        index = read_index(index_path)
        images = index.setdefault("images", {})
        added, unchanged = [], []
        for tag, (entry, path) in sorted(by_tag.items()):
            old = images.get(tag)
            if old is not None and old.get("digest") != entry["digest"]:
                raise CheckFailed(
                    f"{tag} is {old.get('digest')} in {index_path}, but {path} records {entry['digest']}",
                    "immutable tags never move; nothing was written",
                )
            verify(registry, entry, path)
            if signed_by is not None:
                from imagekit.services.publishing import signing

                repo = tag.rsplit(":", 1)[0]
                signing.verify(registry, Remote.parse(repo), entry.get("tag_digest") or entry["digest"], signed_by)
            log(f"verified {tag}@{entry['digest']}" + (" and its signature" if signed_by is not None else ""))
            (unchanged if old is not None else added).append(tag)
        for tag in added + unchanged:
            entry = by_tag[tag][0]
            old = images.get(tag) or {}
            images[tag] = {**entry, "published_at": old.get("published_at") or entry.get("published_at")}
        if by_tag:
            write_atomic(index_path, json.dumps(index, indent=2, sort_keys=True) + "\n")
        if signed_by is not None:  # its self-test may lend results to this machine's builds (selftest_reuse)
            for tag in added + unchanged:
                vouch(images[tag], f"merged from {by_tag[tag][1].name}, its signature verified")
    for alias, platforms in sorted(platform_images([entry for entry, _ in by_tag.values()]).items()):
        digest = point_index(registry, alias, platforms)
        log(f"{alias} names {', '.join(sorted(platforms))} ({digest})")
    return Merged(len(paths), added, unchanged, index_path)


def platform_images(entries: list[dict]) -> dict[str, dict[str, str]]:
    """The aliases these records publish for more than one platform: alias -> platform -> the newest record's
    digest. Pure."""
    newest: dict[str, dict[str, tuple[str, str]]] = {}
    for entry in entries:
        platform = (entry["manifest"].get("cell") or {}).get("platform", AMD64)
        stamp = str(entry.get("published_at") or "")
        mine = newest.setdefault(entry["alias"], {})
        if platform not in mine or mine[platform][0] < stamp:
            mine[platform] = (stamp, entry["digest"])
    return {a: {p: d for p, (_, d) in by.items()} for a, by in newest.items() if len(by) > 1}


def point_index(registry: RegistryClient, alias: str, platforms: dict[str, str]) -> str:
    """Point ``alias`` at an index of each platform's verified image: CI's per-platform jobs each extend the alias as
    they publish and may race; the merge, after all of them, makes it whole. Each entry's size and type are those of
    the bytes its digest names (a registry serving other bytes is refused before the index is written)."""
    repo, tag = alias.rsplit(":", 1)
    remote = Remote.parse(repo)
    entries = []
    for platform, digest in sorted(platforms.items()):
        found = registry.manifest_raw(remote, digest)
        if found is None or found[0] not in media_types.IMAGE_MANIFESTS:
            raise CheckFailed(f"{repo} does not serve {digest} as an image", "publish it again; the index was kept")
        entries.append(image_index.Entry(platform, digest, len(found[1]), found[0]))
    return registry.put_manifest(remote, tag, image_index.document(entries), media_types.DOCKER_MANIFEST_LIST)
