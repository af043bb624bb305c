"""Layers compressed into their publish blobs while the image is still being built and tested, so that publishing
is an upload of blobs that already exist.

`imagekit build --push` on an engine on this machine hands each image the build makes (each staged step's, then the
built image) to :class:`Prepare`. A background worker (effects.background: its own process at a lower CPU priority,
so the build's own steps, the engine and the self-test keep the cores they use) reads each new layer from the
engine's store, checks it against its diff id and compresses it exactly as the push would (blob_push.compress, the
same format, so the same blob digest), into the blob cache beside the digest blob_push remembers. The push then
uploads that file (blob_push.take_prepared) instead of reading and compressing the layer again. A build that fails
or is refused removes what it prepared; nothing here is ever fatal (a layer not prepared is compressed by the push,
as before)."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path

from imagekit.effects.background import Worker
from imagekit.effects.cache import cache_root
from imagekit.effects.layer_export import LayerMismatch
from imagekit.effects.registry import Remote
from imagekit.errors import ImagekitError
from imagekit.oci import layer_blobs
from imagekit.oci.layer_blobs import LayerFormat
from imagekit.services.ports import ContainerEngine, LayerStore, Registry
from imagekit.services.progress import human_bytes
from imagekit.services.publishing import blob_push

MIN_CPUS = 4  # below this, the build and the self-test leave no core to compress on (docs/findings.md: on two vCPUs
# the worker lengthened build + self-test by 53 s, and the whole `build --push` by 12 s)


def enabled(cpus: int | None = None) -> bool:
    """Whether builds prepare their blobs. IMAGEKIT_PREPARE_BLOBS=1 (true, yes, on) always, 0 (false, no, off)
    never (the push then compresses each layer after the self-test, on every core); unset or `auto`, when this
    process may use at least MIN_CPUS CPUs."""
    value = os.environ.get("IMAGEKIT_PREPARE_BLOBS", "auto").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    if value not in ("", "auto"):
        from imagekit.errors import UsageError

        raise UsageError(
            f"IMAGEKIT_PREPARE_BLOBS={value[:20]!r} is not on, off or auto",
            "set it to 1 (compress layers during the build), 0 (after the self-test) or auto, or unset it",
        )
    return (available_cpus() if cpus is None else cpus) >= MIN_CPUS


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's cpuset, `taskset`), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass
class Prepared:
    """What the worker did with the layers it was given."""

    layers: int = 0  # compressed here
    found: int = 0  # prepared already (another build of the same layer)
    present: int = 0  # in the registry already: nothing to prepare
    left: int = 0  # not prepared in time (or no room on the disk): the push compresses them
    skipped: str = ""
    read: int = 0  # layer tar bytes read
    blob_bytes: int = 0
    seconds: float = 0.0  # the worker's time on them
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        done = f"{self.layers} layer{'s' if self.layers != 1 else ''} compressed during the build"
        if self.layers:
            done += f" ({human_bytes(self.read)} to {human_bytes(self.blob_bytes)} in {self.seconds:.0f} s)"
        if self.found:
            done += f", {self.found} prepared already"
        if self.present:
            done += f", {self.present} in the registry already"
        if self.left:
            done += f", {self.left} left to the push" + (f" ({self.skipped})" if self.skipped else "")
        return done


MIN_FREE = 8 << 30  # bytes the disk keeps free: a prepared blob never takes the space the build's steps need
FINISH_WAIT = 120.0  # seconds the push waits for the worker's next layer before it compresses the rest itself


def prepare_layer(store: LayerStore, diff_ids: list[str], index: int, codec: LayerFormat, token: str) -> dict:
    """In the worker: layer ``index`` compressed into the blob cache (a temporary file, renamed once its tar hashed
    to its diff id); what it took. A layer whose blob waits there already is left as it is; with less than MIN_FREE
    bytes free on the cache's disk, nothing is written (the push compresses that layer)."""
    diff_id = diff_ids[index]
    final = blob_push.prepared_path(codec, diff_id)
    known = blob_push.remembered(codec, diff_id)
    if known is not None and blob_push.own_regular(final, known.size):
        return {"found": True}
    final.parent.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(final.parent).free < MIN_FREE:
        return {"found": False, "skipped": f"less than {human_bytes(MIN_FREE)} free on the cache's disk"}
    began = time.monotonic()
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".prepare-{token}-")
    read = 0

    def count(n: int) -> None:
        nonlocal read
        read += n

    try:
        with os.fdopen(fd, "wb") as out, ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
            got, blob = blob_push.compress(store.layer(diff_ids, index), out, codec, pool, count)
        if got != diff_id:
            raise LayerMismatch(f"layer {index} read from the engine's store hashes to {got}, not {diff_id}")
        blob_push.remember(codec, diff_id, blob)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {"found": False, "read": read, "size": blob.size, "seconds": time.monotonic() - began}


def for_push(engine: ContainerEngine, registry: Registry, remote: Remote, say: Callable[[str], None]) -> Prepare:
    """A build's Prepare for a push to ``remote`` in the default format: what that registry holds is not prepared."""

    def holds(blob: layer_blobs.Blob) -> bool:
        try:
            return registry.blob_size(remote, blob.digest) == blob.size
        except ImagekitError:  # no answer: not known to hold it
            return False

    return Prepare(engine, blob_push.default_gzip(), say, holds)


class Prepare:
    """One build's prepared blobs: ``add`` each image as the build makes it (its new layers are queued, bottom
    first), ``finish`` before the push (waits while the worker keeps finishing layers; what it does not finish is
    left to the push, which compresses at full priority), ``discard`` when the build ends (the blobs this build
    prepared and no push took removed, the worker stopped). Nothing here fails the build: a failure turns preparing
    off and is said once."""

    def __init__(
        self,
        engine: ContainerEngine,
        codec: LayerFormat,
        say: Callable[[str], None],
        published: Callable[[layer_blobs.Blob], bool] = lambda _: False,
    ) -> None:
        """``published``: whether the registry the build pushes to holds a blob this machine remembers making (a
        layer it holds is not compressed again: a rebuild compresses only what changed)."""
        self.engine, self.codec, self.say, self.published = engine, codec, say, published
        self.token = secrets.token_hex(8)
        self.worker = Worker()
        self.queued: set[str] = set()
        self.made: list[str] = []  # the diff ids whose blob this build wrote
        self.pending: list[tuple[str, Future]] = []
        self.stats = Prepared()
        self.off = False

    def add(self, image_id: str) -> None:
        """Queue the layers of ``image_id`` not queued before (an engine whose store cannot be read: none)."""
        if self.off:
            return
        try:
            self._add(image_id)
        except Exception as exc:  # never the build's failure: the push compresses what is not prepared
            self.off = True
            self.worker.stop()
            self.say(f"warning: layers not prepared during the build ({type(exc).__name__}: {str(exc)[:200]}); "
                     "the push compresses them")  # fmt: skip

    def _add(self, image_id: str) -> None:
        diff_ids = list(((self.engine.image(image_id) or {}).get("RootFS") or {}).get("Layers") or [])
        store = self.engine.layer_export(image_id) if diff_ids else None
        if store is None:
            return
        for index, diff_id in enumerate(diff_ids):
            if diff_id in self.queued:
                continue
            self.queued.add(diff_id)
            known = blob_push.remembered(self.codec, diff_id)
            if known is not None and self.published(known):
                self.stats.present += 1
                continue
            task = self.worker.submit(prepare_layer, store, diff_ids, index, self.codec, self.token)
            self.pending.append((diff_id, task))

    def finish(self, wait: float = FINISH_WAIT) -> Prepared:
        """What is prepared, for the push. The build's work is over, so the worker has the cores to itself: each
        layer is waited for while the worker keeps finishing one within ``wait`` seconds; once it does not (another
        build holds the cores: an idle-priority worker is starved), the layers not done are cancelled and left to
        the push, which compresses at full priority. A failed layer is said and left to the push too."""
        starved = False
        for diff_id, task in self.pending:
            if starved:
                task.cancel()
            if task.cancelled():
                self.stats.left += 1
                continue
            try:
                done = task.result(timeout=0 if starved else wait)
            except FutureTimeout:
                starved = True
                self.stats.left += 1
                continue
            except Exception as exc:  # never fatal: the push compresses the layer itself
                self.stats.failures.append(f"{diff_id[:19]}: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            self._count(diff_id, done)
        self.pending = []
        for failure in self.stats.failures:
            self.say(f"warning: a layer's blob was not prepared ({failure}); the push compresses it")
        self.worker.stop()
        return self.stats

    def _count(self, diff_id: str, done: dict) -> None:
        if done.get("skipped"):
            self.stats.left += 1
            self.stats.skipped = done["skipped"]
        elif done["found"]:
            self.stats.found += 1
        else:
            self.made.append(diff_id)
            self.stats.layers += 1
            self.stats.read += done["read"]
            self.stats.blob_bytes += done["size"]
            self.stats.seconds += done["seconds"]

    def discard(self) -> None:
        """The worker stopped and the blobs this build prepared and no push took removed (a blob another build
        prepared stays its own)."""
        self.worker.stop()
        for diff_id, task in self.pending:  # a build that failed before its push: what finished is counted
            if task.done() and not task.cancelled() and task.exception() is None:
                self._count(diff_id, task.result())
        self.pending = []
        for diff_id in self.made:
            blob_push.drop_prepared(self.codec, diff_id)
        for leftover in blob_push.blob_cache_dir(self.codec).glob(f".prepare-{self.token}-*"):
            leftover.unlink(missing_ok=True)
        self.made.clear()


LEFTOVER_AGE = 3600  # seconds: a younger prepared blob may belong to a build under way


def leftovers(now: float | None = None) -> list[tuple[Path, int]]:
    """Prepared blobs (and unfinished ones) no build took: a build that was killed left them. (path, size), each a
    regular file of the blob cache older than LEFTOVER_AGE, in a folder of the cache that is no link (anything else
    there is left alone)."""
    import stat

    now = time.time() if now is None else now
    found = []
    root = cache_root() / "blobs"
    for folder in sorted(root.glob("*")):
        if folder.is_symlink() or not folder.is_dir() or root.is_symlink():
            continue
        for path in sorted(folder.glob("*.blob")) + sorted(folder.glob(".prepare-*")):
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and now - info.st_mtime > LEFTOVER_AGE:
                found.append((path, info.st_size))
    return found
