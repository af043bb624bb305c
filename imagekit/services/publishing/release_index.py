"""The release index and the record files, read and written: each checked by oci.release_record on the way in, the
index changed under its folder's lock, every file written atomically."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from imagekit.effects.files import read_input, write_atomic
from imagekit.errors import CheckFailed, UsageError
from imagekit.model import AMD64
from imagekit.oci import release_record
from imagekit.oci.release_record import Published, record_name
from imagekit.trust import untrusted


def _load(path: Path, text: str, what: str, hint: str) -> object:
    try:
        return untrusted.load_json(text, "it")
    except untrusted.UntrustedData as exc:
        raise UsageError(f"{what} {path} is not a {what}: {exc}", hint) from None


def read_index(path: Path) -> dict:
    """The release index (empty when missing); one of another shape is a usage error naming what is wrong."""
    hint = f"pass the index `imagekit build --push` writes, or move {path} aside"
    text = read_input(path, "release index", hint, missing_ok=True)
    if text is None:
        return release_record.empty_index()
    doc = _load(path, text, "release index", hint)
    problems = release_record.index_problems(doc)
    if problems:
        raise UsageError(f"release index {path} is not a release index: " + "; ".join(problems[:5]), hint)
    assert isinstance(doc, dict)
    return doc


def read_record(path: Path) -> dict:
    """A release record (one index entry); another shape is a usage error naming the file."""
    hint = f"pass the folder `imagekit build --push --release-records` writes, or move {path} aside"
    text = read_input(path, "release record", hint)
    doc = _load(path, text or "", "release record", hint)
    problems = release_record.record_problems(doc, path.name)
    if problems:
        raise UsageError(f"release record {path} is not a release record: " + "; ".join(problems[:5]), hint)
    assert isinstance(doc, dict)
    return doc


def newest_release(index_path: Path, ref: str, platform: str | None = None) -> dict:
    """The release ``ref`` names in the index (its immutable tag, alias or cell id; the newest when several do): what
    `runpod-template`, `vast-template` and `pod create` use. A cell published for several platforms names one release
    per platform: ``platform``'s (default linux/amd64) when there is one."""
    found = release_record.newest(read_index(index_path).get("images", {}), ref, platform)
    if found is None:
        from imagekit.trust.redact import redact_value

        shown = untrusted.printable(redact_value(ref), 300)  # an argument: a password in it is never echoed
        raise UsageError(f"{shown} is not in {index_path}", "publish it with `imagekit build --push` first")
    return found


def last_size(index_path: Path, cell_id: str, platform: str = AMD64) -> int | None:
    """The size of the cell's most recently published image for ``platform`` in the release index, if any."""
    return release_record.last_size(read_index(index_path).get("images", {}), cell_id, platform)


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
    """One release (oci.release_record.entry), published now unless ``published_at`` says when."""
    return release_record.entry(
        published,
        lock_hash=lock_hash,
        manifest=manifest,
        report=report,
        size=size,
        published_at=published_at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        layers=layers,
    )


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
    vouch(entry, "published on this machine")
    return entry


# ---- which records this machine vouches for (self-test reuse) ----------------------------------------------------
# The release index is a file of the project (often committed, merged from CI artifacts): what it says of a self-test
# is another party's word. A build reuses recorded results only from a release this machine published itself, or one
# `release merge --require-signature` verified as signed by that key: each is noted in this user's state folder
# (effects.cache.state_root, beside the pods it created), with the sha256 of the self-test report as recorded, so an
# index entry edited since (or planted in a cloned repository) matches no note.
MAX_NOTE = 4096


def _note_path(entry: dict) -> Path | None:
    from imagekit.effects.cache import state_root

    digest = entry.get("digest")
    return state_root() / "vouched" / f"{digest.split(':', 1)[1]}.json" if untrusted.is_digest(digest) else None


def _report_sha(entry: dict) -> str:
    return hashlib.sha256(json.dumps(entry.get("selftest"), sort_keys=True).encode()).hexdigest()


def vouch(entry: dict, how: str) -> None:
    """Note that this machine vouches for ``entry``'s self-test report (``how``: published here, or the key whose
    signature `release merge` verified)."""
    from imagekit.effects import foreign_files

    path = _note_path(entry)
    if path is not None:
        foreign_files.private_dir(path.parent)
        note = {"tag": entry.get("tag"), "digest": entry.get("digest"), "selftest": _report_sha(entry), "how": how}
        write_atomic(path, json.dumps(note, sort_keys=True) + "\n", 0o600)


def vouched(entry: dict) -> str | None:
    """How this machine vouches for ``entry``'s self-test report, or None: no note, or one of another tag or report
    (read as any file of another party: bounded, never through a link)."""
    from imagekit.effects import foreign_files

    path = _note_path(entry)
    if path is None:
        return None
    try:
        note = untrusted.load_json(foreign_files.read_bytes(path, MAX_NOTE), "a note", max_bytes=MAX_NOTE, max_depth=2)
    except (OSError, ValueError):  # missing, a link, a FIFO, not JSON
        return None
    if not isinstance(note, dict) or not isinstance(note.get("how"), str):
        return None
    same = (note.get("tag"), note.get("digest"), note.get("selftest")) == (
        entry.get("tag"),
        entry.get("digest"),
        _report_sha(entry),
    )
    return untrusted.printable(note["how"], 200) if same else None


def unvouched(entry: dict) -> str | None:
    """Why ``entry``'s self-test results may not be reused here (oci.selftest_reuse.find's ``origin``), or None."""
    if vouched(entry) is not None:
        return None
    return (
        "its record was neither published on this machine nor merged with its signature verified "
        "(`imagekit release merge --require-signature KEY.pub`)"
    )
