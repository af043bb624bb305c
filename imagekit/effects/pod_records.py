"""The pods this machine created, written down before anything waits on them, so none is ever unknown.

`imagekit pod create` writes a pending record (the ``IMAGEKIT_CREATED`` mark it sends, the pod's name, its provider)
before the request leaves, and the pod's id the moment the provider's answer is read, before anything is printed: a
client killed between the two leaves the mark, by which `imagekit pod reap` finds the pod among the account's. One
small file per record, each written atomically (0600, in a 0700 folder): two creates at once never lose each other's.

Where: ``$IMAGEKIT_STATE/pods``, else ``$XDG_STATE_HOME/imagekit/pods``, else ``~/.local/state/imagekit/pods``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from imagekit.clouds.reap import Record
from imagekit.effects.cache import state_root
from imagekit.effects.files import write_atomic
from imagekit.trust import untrusted

MAX_RECORD = 64 << 10  # bytes: a record is a few hundred
_NAME = re.compile(r"(pod-[A-Za-z0-9]{4,64}|pending-[0-9a-f]{16})\.json", re.ASCII)
_STAMP = re.compile(r"[0-9T:Z-]{20}", re.ASCII)


def folder() -> Path:
    return state_root() / "pods"


def _write(name: str, doc: dict) -> Path:
    where = folder()
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = where / name
    write_atomic(path, json.dumps(doc, sort_keys=True) + "\n", 0o600)
    return path


def pending(created: str, name: str, deadline: str | None, api: str, provider: str = "runpod") -> Path:
    """Before the create is sent: what the pod will carry (its mark), at which provider, so it can be found whatever
    happens next."""
    doc = {"created": created, "name": name, "deadline": deadline, "api": api, "provider": provider}
    return _write(f"pending-{secrets.token_hex(8)}.json", doc)


def created(pending_path: Path, pod_id: str) -> Path:
    """The pod's id, the moment it is known; the pending record it came from goes."""
    doc = _document(pending_path) or {}  # written moments ago, read back as any record: bounded, never a link
    path = _write(f"pod-{pod_id}.json", {**doc, "pod": pod_id})
    drop(pending_path)
    return path


def drop(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def load(warn: Callable[[str], None]) -> list[tuple[Path, Record]]:
    """Every record here (one that cannot be read is said and skipped, never followed through a link)."""
    where = folder()
    if not where.is_dir():
        return []
    found = []
    for path in sorted(where.iterdir()):
        if not _NAME.fullmatch(path.name):
            continue
        record = _read(path)
        if record is None:
            warn(f"warning: skipped {path}: not a pod record imagekit wrote")
            continue
        found.append((path, record))
    return found


def _document(path: Path) -> dict | None:
    """The JSON object a record file holds, or None: not a regular file (a FIFO or a device never blocks or floods
    this), a link, larger than a record, or not a JSON object of bounded depth (a deep one would end in
    RecursionError)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        raw = fh.read(MAX_RECORD + 1)
    try:
        doc = untrusted.load_json(raw, "a pod record", max_bytes=MAX_RECORD, max_depth=4)
    except untrusted.UntrustedData:
        return None
    return doc if isinstance(doc, dict) else None


def _read(path: Path) -> Record | None:
    doc = _document(path)
    if doc is None:
        return None
    pod, made, name, deadline = doc.get("pod"), doc.get("created"), doc.get("name"), doc.get("deadline")
    provider = doc.get("provider", "runpod")  # a record from before providers were named: RunPod's (the only one)
    if not (isinstance(made, str) and _STAMP.fullmatch(made) and isinstance(name, str)):
        return None
    if not (isinstance(provider, str) and re.fullmatch(r"[a-z][a-z0-9_]{0,31}", provider)):
        return None
    if pod is not None and not (isinstance(pod, str) and path.name == f"pod-{pod}.json"):
        return None
    if deadline is not None and not (isinstance(deadline, str) and _STAMP.fullmatch(deadline)):
        return None
    return Record(pod, made, name[:200], deadline, provider)
