"""Publish: push only images whose self-test passed; an immutable tag never moves to other contents."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from imagekit.effects.docker import Engine
from imagekit.effects.files import write_atomic
from imagekit.effects.registry import RegistryClient, Remote
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.services.selftest import SelfTestReport


@dataclass(frozen=True)
class Published:
    immutable: str
    alias: str
    digest: str
    reused: bool  # the registry already had exactly this image under the immutable tag


def read_index(path: Path) -> dict:
    """The release index; a file that is not one (bad JSON, entries without tag/manifest) is a UsageError."""
    if not path.is_file():
        return {"schema": 1, "images": {}}
    hint = f"restore {path} from version control, or move it aside and publish again"
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"cannot read the release index {path}: {exc}", hint) from None
    images = doc.get("images", {}) if isinstance(doc, dict) else None
    if not isinstance(images, dict):
        raise UsageError(f"{path} is not a release index (no 'images' object)", hint)
    for tag, entry in images.items():
        ok = isinstance(entry, dict) and isinstance(entry.get("tag"), str) and isinstance(entry.get("manifest"), dict)
        if not ok or not isinstance(entry["manifest"].get("cell"), dict):
            raise UsageError(f"{path}: the entry {tag!r} lacks its tag or manifest.cell", hint)
    return doc


def _same_contents(
    engine: Engine, registry: RegistryClient, remote: Remote, config_digest: str | None, image_id: str
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
    engine: Engine,
    registry: RegistryClient,
    *,
    image_id: str,
    repository: str,
    immutable_tag: str,
    alias_tag: str,
    report: SelfTestReport,
    auth: dict | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> Published:
    if not report.passed:
        raise CheckFailed(
            f"refusing to publish {repository}:{immutable_tag}: its self-test failed "
            f"({', '.join(report.failed) or 'no report'})",
            "fix the image; only tested images are pushed",
        )
    remote = Remote.parse(repository)
    existing = registry.manifest(remote, immutable_tag)
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
    if existing is not None:
        digest, reused = existing.digest, True
        log(f"{repository}:{immutable_tag} already published as {digest}")
    else:
        log(f"pushing {repository}:{immutable_tag}")
        digest = engine.push(repository, immutable_tag, auth, on_line=log)
        reused = False
    check = registry.manifest(remote, digest)
    expected = existing.config_digest if existing is not None else image_id
    if check is None or check.config_digest != expected:
        raise EnvironmentFailure(
            f"the registry does not serve {digest} with this image's config after the push", "retry the push"
        )
    registry.copy_tag(remote, digest, alias_tag)  # the alias names exactly the published manifest
    return Published(f"{repository}:{immutable_tag}", f"{repository}:{alias_tag}", digest, reused)


def record(index_path: Path, published: Published, *, lock_hash: str, manifest: dict, report: dict, size: int) -> dict:
    """Add the release to the index (atomically): tag, digest, lock hash, manifest, self-test report."""
    index = read_index(index_path)
    entry = {
        "tag": published.immutable,
        "alias": published.alias,
        "digest": published.digest,
        "reference": f"{published.immutable.rsplit(':', 1)[0]}@{published.digest}",
        "lock_hash": lock_hash,
        "size_bytes": size,
        "published_at": index.get("images", {}).get(published.immutable, {}).get("published_at")
        or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "manifest": manifest,
        "selftest": report,
    }
    index.setdefault("images", {})[published.immutable] = entry
    write_atomic(index_path, json.dumps(index, indent=2, sort_keys=True) + "\n")
    return entry
