"""`imagekit release merge`: the release index from the records parallel publishers (CI runners) wrote.

Each record is checked against the registry before anything is written: the manifest its digest names exists
(with the recorded image config) and its immutable tag still points at it. An immutable tag is never given
another digest, neither by two records nor over the index's entry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from imagekit.effects.files import write_atomic
from imagekit.effects.registry import RegistryClient, Remote
from imagekit.errors import CheckFailed, UsageError
from imagekit.services.publish import index_locked, read_index, read_record


@dataclass(frozen=True)
class Merged:
    records: int  # record files read
    added: list[str]  # tags new to the index
    unchanged: list[str]  # tags the index already had with the same digest
    index: Path


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
        entry = read_record(path)
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
    """The registry serves the recorded manifest, with the recorded config, under the recorded tag."""
    repo, tag = entry["tag"].rsplit(":", 1)
    remote = Remote.parse(repo)
    found = registry.manifest(remote, entry["digest"])
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
    tagged = registry.manifest(remote, tag)
    if tagged is None or tagged.digest != entry["digest"]:
        now = tagged.digest if tagged is not None else "nothing"
        raise CheckFailed(
            f"{entry['tag']} points at {now} in the registry, not {entry['digest']} ({path})",
            "immutable tags never move; publish it again with `imagekit build --push`; nothing was written",
        )


def merge(
    folders: list[Path],
    index_path: Path,
    registry: RegistryClient,
    log: Callable[[str], None] = lambda _: None,
) -> Merged:
    """Verify every record against the registry, then add them to the index in one atomic write (or none)."""
    paths = find_records(folders)
    by_tag = collect(paths)
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
            log(f"verified {tag}@{entry['digest']}")
            (unchanged if old is not None else added).append(tag)
        for tag in added + unchanged:
            entry = by_tag[tag][0]
            old = images.get(tag) or {}
            images[tag] = {**entry, "published_at": old.get("published_at") or entry.get("published_at")}
        if by_tag:
            write_atomic(index_path, json.dumps(index, indent=2, sort_keys=True) + "\n")
    return Merged(len(paths), added, unchanged, index_path)
