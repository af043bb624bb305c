"""Push an image the way imagekit compresses it: every core gzips (libdeflate, fixed-size members), a layer the
registry already has is neither read nor sent, and the same layer gives the same blob on every machine.

`docker push` on this engine gzips each layer on one core with Go's gzip (about 20 MB/s for the demo image here)
and names blobs by what it happened to compress; here the layer tars come straight from the engine's store (or from
`docker save` where that cannot be read: imagekit.effects.layer_export), each is checked against its diff id, cut
into 16 MiB pieces compressed in parallel, and uploaded while the next layer is compressed. Which blob a layer made
is remembered in the cache (per compressor identity), so a re-publish or a rebuild that changed one layer reads only
that layer; the registry is asked (HEAD) before anything is trusted from that memory.

Into a repository that holds no image yet (no tag: the first publish of a project, or of a new repository), no layer
can be shared with it, so nothing is asked first: each layer is compressed straight into its upload (one streamed
PATCH, then the PUT naming its digest, which the registry checks), with no file between, and the upload ends with the
compression. Elsewhere each layer is compressed into a file, the registry is asked whether it has that blob (another
machine's push of the same layer), and only a blob it lacks is uploaded."""

from __future__ import annotations

import hashlib
import os
import queue
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from imagekit.effects import foreign_files
from imagekit.effects.cache import cache_root
from imagekit.effects.files import write_atomic
from imagekit.effects.layer_export import LayerMismatch, Saved, save_export
from imagekit.effects.registry import Remote, Upload
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.oci import layer_blobs
from imagekit.oci.layer_blobs import LayerFormat
from imagekit.oci.media_types import DOCKER_CONFIG
from imagekit.services.ports import ContainerEngine, LayerStore, Registry
from imagekit.services.progress import Activity, NullProgress, Progress, human_bytes

_CACHED = re.compile(r"(sha256:[0-9a-f]{64}) ([0-9]{1,15})\n?", re.ASCII)


@dataclass
class PushStats:
    """What a push read, compressed and sent."""

    layers: int = 0
    sent: int = 0  # layers uploaded
    present: int = 0  # layers the registry already had
    read_bytes: int = 0  # layer tar bytes read and compressed
    blob_bytes: int = 0  # compressed bytes uploaded
    seconds: float = 0.0
    compress_seconds: float = 0.0
    prepared: int = 0  # layers whose blob the build had compressed already (blob_prepare)
    streamed: int = 0  # layers compressed straight into their upload (a repository with no image yet)
    notes: list[str] = field(default_factory=list)
    codec: str = "gzip"

    def summary(self) -> str:
        rate = f", {self.read_bytes / self.seconds / 1e6:.0f} MB/s of layers read" if self.read_bytes else ""
        ready = f", {self.prepared} compressed during the build" if self.prepared else ""
        ready += f", {self.streamed} streamed as compressed" if self.streamed else ""
        return (
            f"{self.sent} layer{'s' if self.sent != 1 else ''} pushed ({human_bytes(self.read_bytes)} read, "
            f"{human_bytes(self.blob_bytes)} {self.codec}{ready}), {self.present} already there, in "
            f"{self.seconds:.0f} s{rate}"
        )


def default_gzip() -> layer_blobs.Gzip:
    """Level 4, or IMAGEKIT_GZIP_LEVEL (1-12: higher is smaller and slower; each level is other blob digests)."""
    raw = os.environ.get("IMAGEKIT_GZIP_LEVEL", "").strip()
    if not raw:
        return layer_blobs.Gzip()
    if not raw.isdigit() or int(raw) not in layer_blobs.LEVELS:
        raise UsageError(
            f"IMAGEKIT_GZIP_LEVEL={raw[:20]!r} is not a gzip level", "set it to a number from 1 to 12, or unset it"
        )
    return layer_blobs.Gzip(int(raw))


def blob_cache_dir(codec: LayerFormat) -> Path:
    return cache_root() / "blobs" / codec.identity


def remembered(codec: LayerFormat, diff_id: str) -> layer_blobs.Blob | None:
    """The blob this format made of the layer ``diff_id`` before, if this machine remembers one."""
    try:
        raw = foreign_files.read_bytes(blob_cache_dir(codec) / diff_id.split(":", 1)[-1], 4096)
        text = raw.decode()
    except (OSError, ValueError):  # missing, a link, a FIFO, too large, not text: not remembered
        return None
    m = _CACHED.fullmatch(text)
    return layer_blobs.Blob(m[1], int(m[2]), codec.media_type) if m else None


def remember(codec: LayerFormat, diff_id: str, blob: layer_blobs.Blob) -> None:
    """Remember the blob ``codec`` made of the layer (not one with annotations or another diff id: the cache holds
    a digest and a size, so such a format encodes the layer on each push)."""
    if blob.annotations or blob.diff_id:
        return
    try:
        folder = blob_cache_dir(codec)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / diff_id.split(":", 1)[-1], f"{blob.digest} {blob.size}\n")
    except OSError:
        pass  # a cache only: the next push compresses the layer again


def prepared_path(codec: LayerFormat, diff_id: str) -> Path:
    """Where a build left the blob ``codec`` made of the layer ``diff_id`` (blob_prepare), for the push to upload."""
    return blob_cache_dir(codec) / (diff_id.split(":", 1)[-1] + ".blob")


def take_prepared(codec: LayerFormat, diff_id: str, dest: Path) -> layer_blobs.Blob | None:
    """The blob a build prepared for the layer, moved to ``dest`` (a rename: no link followed, and another push of
    the same layer gets it at most once) and checked there as another party's file: a regular file of this user's,
    no other name, the size remembered, bytes that hash to the digest remembered. None (and nothing left at
    ``dest``) when there is none or it is not that blob: the push compresses the layer itself."""
    known = remembered(codec, diff_id)
    source = prepared_path(codec, diff_id)
    if known is None or not own_regular(source, known.size):
        return None
    try:
        os.rename(source, dest)
    except OSError:  # none, or taken by another push
        return None
    try:
        fd = os.open(dest, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        _remove(dest)
        return None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        sha = hashlib.sha256()
        if _own_file(info, known.size):
            while chunk := fh.read(4 << 20):
                sha.update(chunk)
    if "sha256:" + sha.hexdigest() != known.digest:
        _remove(dest)
        return None
    return known


def _remove(path: Path) -> None:
    """What a swap put where a prepared blob was moved to: removed, whatever it is (no link followed)."""
    if path.is_dir() and not path.is_symlink():
        foreign_files.remove_tree(path)
    else:
        path.unlink(missing_ok=True)


def _own_file(info: os.stat_result, size: int) -> bool:
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink == 1 and info.st_size == size


def own_regular(path: Path, size: int) -> bool:
    """Whether ``path`` is a regular file of this user's of ``size`` bytes with no other name (not a link)."""
    try:
        return _own_file(os.lstat(path), size)
    except OSError:
        return False


def drop_prepared(codec: LayerFormat, diff_id: str) -> None:
    """A prepared blob the registry holds already: not needed."""
    prepared_path(codec, diff_id).unlink(missing_ok=True)


def compress(
    chunks: Iterator[bytes],
    out: IO[bytes],
    codec: LayerFormat,
    pool: ThreadPoolExecutor,
    on_bytes: Callable[[int], None] = lambda _: None,
) -> tuple[str, layer_blobs.Blob]:
    """Encode a layer's tar into ``out`` in ``codec``'s format, on the pool's threads: (the tar's digest, the blob
    written)."""
    raw = hashlib.sha256()

    def hashed() -> Iterator[bytes]:
        for chunk in chunks:
            raw.update(chunk)
            on_bytes(len(chunk))
            yield chunk

    blob = codec.encode(hashed(), out.write, pool)
    out.flush()
    return "sha256:" + raw.hexdigest(), blob


def push_image(
    engine: ContainerEngine,
    registry: Registry,
    remote: Remote,
    image_id: str,
    tag: str | None,
    *,
    gzip: LayerFormat | None = None,
    progress: Progress | None = None,
    label: str = "",
    log: Callable[[str], None] = lambda _: None,
    stats: PushStats | None = None,
) -> str:
    """Upload every layer the registry lacks and the config, then the manifest under ``tag`` (``None``: under its
    digest alone, for an index to name); returns the manifest's digest. Nothing is tagged unless every blob is in
    the registry. ``gzip``: the layers' format (default: gzip at IMAGEKIT_GZIP_LEVEL)."""
    push = _Push(engine, registry, remote, gzip or default_gzip(), progress or NullProgress(), label, stats)
    began = time.monotonic()
    inspect = engine.image(image_id)
    if inspect is None:
        raise EnvironmentFailure(f"{image_id} is not in the engine", "build it again")
    diff_ids = list(inspect.get("RootFS", {}).get("Layers") or [])
    push.stats.layers = len(diff_ids)
    push.reuse_remembered(diff_ids)
    workers = max(2, os.cpu_count() or 2)
    with (
        tempfile.TemporaryDirectory(prefix="imagekit-push-", dir=_scratch()) as tmp,
        ThreadPoolExecutor(workers, thread_name_prefix="encode") as pool,
        ThreadPoolExecutor(2, thread_name_prefix="upload") as uploads,
    ):
        push.uploads = uploads
        export = engine.layer_export(image_id)
        if export is not None:
            config = export.config()
            # a repository with no image cannot hold a blob of these layers: they stream as they are compressed
            push.stream = push.stats.present < len(diff_ids) and registry.holds_tags(remote) is False
            push.from_store(export, diff_ids, Path(tmp), pool)
        else:
            config = push.from_save(lambda: engine.save(image_id), image_id, diff_ids, Path(tmp), pool)
        push.wait()
    digest = push.finish(image_id, config, diff_ids, tag)
    push.stats.seconds = time.monotonic() - began
    log(f"pushed {remote.registry}/{remote.name}{f':{tag}' if tag else '@' + digest}: {push.stats.summary()}")
    return digest


def _scratch() -> Path | None:
    """Where layers are compressed to: beside the wheels (the disk `build --dry-run` sized), else (a cache that
    cannot take files) the system's temporary folder."""
    scratch = cache_root() / "tmp"
    try:
        scratch.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return scratch


class _Push:
    """One image's push, step by step: the layers the registry has, each other layer compressed and uploaded (two
    uploads beside the compression), the config, the manifest."""

    def __init__(
        self,
        engine: ContainerEngine,
        registry: Registry,
        remote: Remote,
        codec: LayerFormat,
        progress: Progress,
        label: str,
        stats: PushStats | None,
    ) -> None:
        self.engine, self.registry, self.remote, self.codec = engine, registry, remote, codec
        self.progress, self.label = progress, label
        self.stats = stats if stats is not None else PushStats()
        self.stats.codec = codec.name
        self.blobs: dict[int, layer_blobs.Blob] = {}
        self.uploads: ThreadPoolExecutor | None = None
        self.sending: list[Future[None]] = []
        self.counting = threading.Lock()
        self.saved: dict[str, Saved] = {}
        self.stream = False  # compress each layer straight into its upload (stream_layer)

    def reuse_remembered(self, diff_ids: list[str]) -> None:
        """The layers whose blob this machine remembers and the registry holds: neither read nor sent."""
        for i, diff_id in enumerate(diff_ids):
            known = remembered(self.codec, diff_id)
            if known is not None and self.registry.blob_size(self.remote, known.digest) == known.size:
                self.blobs[i] = known
                self.stats.present += 1
                drop_prepared(self.codec, diff_id)
                self.progress.line(self.label, f"layer {_short(diff_id)}: already in the registry")

    def from_store(self, export: LayerStore, diff_ids: list[str], tmp: Path, pool: ThreadPoolExecutor) -> None:
        """Each other layer read from the engine's store, checked against its diff id, compressed, sent."""
        for i, diff_id in enumerate(diff_ids):
            if i in self.blobs:
                continue
            if diff_id in diff_ids[:i]:  # the same layer twice in one image: one blob
                self.blobs[i] = self.blobs[diff_ids.index(diff_id)]
                continue
            path = tmp / f"layer-{i}"
            ready = take_prepared(self.codec, diff_id, path)
            if ready is not None:  # compressed while the image was built and tested
                self.stats.prepared += 1
                self.send(i, diff_id, ready, path, None)
                continue
            if self.stream and self.stream_layer(export, diff_ids, i, pool):
                continue
            act = self.progress.begin(self.label, f"compress layer {_short(diff_id)}", unit="B")
            t0 = time.monotonic()
            meter = _Meter(act)
            try:
                with open(path, "wb") as out:
                    got, blob = compress(export.layer(diff_ids, i), out, self.codec, pool, meter)
            except OSError as exc:
                raise LayerMismatch(f"layer {i} cannot be read from the engine's store: {exc}", _SAVE_HINT) from None
            finally:
                act.finish("")
            if got != diff_id:
                raise LayerMismatch(
                    f"layer {i} read from the engine's store hashes to {got}, not its diff id {diff_id}", _SAVE_HINT
                )
            self.stats.read_bytes += meter.read
            self.stats.compress_seconds += time.monotonic() - t0
            self.send(i, diff_id, blob, path, time.monotonic() - t0)

    def stream_layer(self, export: LayerStore, diff_ids: list[str], i: int, pool: ThreadPoolExecutor) -> bool:
        """Layer ``i`` read from the store, checked against its diff id and compressed straight into an upload (the
        registry checks the bytes against the digest the PUT names). False when the registry refused the stream:
        this layer and the rest then go through files."""
        diff_id = diff_ids[i]
        upload = self.registry.start_upload(self.remote)
        pipe = _Pipe()
        assert self.uploads is not None
        sending = self.uploads.submit(self._stream, upload, pipe)
        act = self.progress.begin(self.label, f"compress and upload layer {_short(diff_id)}", unit="B")
        t0 = time.monotonic()
        meter = _Meter(act)
        got = blob = None
        try:
            got, blob = compress(export.layer(diff_ids, i), pipe, self.codec, pool, meter)
        except _Ended:  # the upload ended before the layer did: its answer says why
            pass
        except BaseException as exc:
            pipe.fail()
            _settle(sending)
            self.registry.cancel_upload(upload)
            if isinstance(exc, OSError):
                raise LayerMismatch(f"layer {i} cannot be read from the engine's store: {exc}", _SAVE_HINT) from None
            raise
        finally:
            act.finish("")
        pipe.close()
        try:
            upload = sending.result()
        except EnvironmentFailure as exc:
            self.stream = False
            self.progress.line(self.label, f"warning: {exc.message}; each layer is uploaded from a file")
            return False
        if got is None or blob is None:
            raise EnvironmentFailure(f"the upload of layer {i} ended before the layer", "retry the publish")
        if got != diff_id:
            self.registry.cancel_upload(upload)
            raise LayerMismatch(
                f"layer {i} read from the engine's store hashes to {got}, not its diff id {diff_id}", _SAVE_HINT
            )
        seconds = time.monotonic() - t0
        self.stats.read_bytes += meter.read
        self.stats.compress_seconds += seconds
        self.blobs[i] = blob
        remember(self.codec, diff_id, blob)
        if self.registry.blob_size(self.remote, blob.digest) == blob.size:  # another push sent it meanwhile
            self.registry.cancel_upload(upload)
            self.stats.present += 1
            return True
        self.registry.finish_upload(upload, blob.digest)
        self.stats.sent += 1
        self.stats.streamed += 1
        self.stats.blob_bytes += blob.size
        self.progress.line(
            self.label,
            f"layer {_short(diff_id)}: pushed {human_bytes(blob.size)} {self.codec.name} "
            f"(compressed and uploaded in {seconds:.1f} s)",
        )
        return True

    def _stream(self, upload: Upload, pipe: _Pipe) -> Upload:
        try:
            return self.registry.stream_upload(upload, pipe)
        finally:
            pipe.ended.set()

    def from_save(
        self,
        save: Callable[[], Iterator[bytes]],
        image_id: str,
        diff_ids: list[str],
        tmp: Path,
        pool: ThreadPoolExecutor,
    ) -> bytes:
        """Every layer compressed as it streams out of `docker save`, then each one not in the registry sent;
        returns the image's config."""
        t0 = time.monotonic()
        act = self.progress.begin(self.label, "compress layers from docker save", unit="B")
        meter = _Meter(act)

        def squeeze(chunks: Iterator[bytes], out: IO[bytes]) -> tuple[str, layer_blobs.Blob]:
            return compress(chunks, out, self.codec, pool, meter)

        config, self.saved = save_export(save, image_id, diff_ids, squeeze, tmp)
        act.finish("")
        self.stats.read_bytes += meter.read
        self.stats.compress_seconds += time.monotonic() - t0
        for i, diff_id in enumerate(diff_ids):
            if i in self.blobs or diff_id in diff_ids[:i]:
                self.blobs[i] = self.blobs.get(i) or self.saved[diff_id].blob
                continue
            layer = self.saved[diff_id]
            self.send(i, diff_id, layer.blob, layer.path, time.monotonic() - t0)
        return config

    def send(self, index: int, diff_id: str, blob: layer_blobs.Blob, path: Path, seconds: float | None) -> None:
        """Remember the layer's blob; upload it on the upload threads unless the registry has it."""
        self.blobs[index] = blob
        remember(self.codec, diff_id, blob)
        if self.registry.blob_size(self.remote, blob.digest) == blob.size:
            with self.counting:
                self.stats.present += 1
            self.progress.line(
                self.label,
                f"layer {_short(diff_id)}: {human_bytes(blob.size)} {self.codec.name}, already in the registry",
            )
            path.unlink(missing_ok=True)
            return

        def upload() -> None:
            t0 = time.monotonic()
            self.registry.upload_blob(self.remote, blob.digest, blob.size, path)
            path.unlink(missing_ok=True)
            with self.counting:
                self.stats.sent += 1
                self.stats.blob_bytes += blob.size
            self.progress.line(
                self.label,
                f"layer {_short(diff_id)}: pushed {human_bytes(blob.size)} {self.codec.name} "
                f"({'compressed during the build' if seconds is None else f'compressed in {seconds:.1f} s'}, "
                f"uploaded in {time.monotonic() - t0:.1f} s)",
            )

        assert self.uploads is not None
        self.sending.append(self.uploads.submit(upload))

    def wait(self) -> None:
        """Every upload done (its failure raised here); the blobs `docker save` left removed."""
        for future in self.sending:
            future.result()
        for layer in self.saved.values():
            layer.path.unlink(missing_ok=True)

    def finish(self, image_id: str, config: bytes, diff_ids: list[str], tag: str | None) -> str:
        """The config (naming what the blobs hold, where the format rewrote a tar), then the manifest; its digest."""
        if layer_blobs.sha256(config) != image_id:
            raise LayerMismatch(f"the config read for {image_id} is another image's", "check the engine")
        layers = [self.blobs[i] for i in range(len(diff_ids))]
        if any(layer.diff_id for layer in layers):
            config = layer_blobs.config_naming(
                config, [layer.diff_id or d for layer, d in zip(layers, diff_ids, strict=True)]
            )
        config_blob = layer_blobs.Blob(layer_blobs.sha256(config), len(config), DOCKER_CONFIG)
        if self.registry.blob_size(self.remote, config_blob.digest) != config_blob.size:
            self.registry.upload_blob(self.remote, config_blob.digest, config_blob.size, config)
        body = layer_blobs.manifest(config, layers)
        return self.registry.put_manifest(
            self.remote, tag or layer_blobs.sha256(body), body, layer_blobs.manifest_type(body)
        )


class _Ended(Exception):
    """The upload stopped reading the layer's bytes (the registry answered, or the connection broke)."""


class _Aborted(Exception):
    """The layer could not be compressed to the end: its upload is abandoned."""


class _Pipe:
    """A layer's compressed bytes from the compressing thread to the upload's, a few pieces in flight. A writer
    whose reader has ended gets _Ended instead of waiting for good; a reader whose writer failed gets _Aborted (so
    the request ends unfinished, and the registry never completes it)."""

    _FAILED = object()

    def __init__(self, depth: int = 4) -> None:
        self.queue: queue.Queue[object] = queue.Queue(depth)
        self.ended = threading.Event()

    def write(self, data: bytes) -> None:
        if not self._put(data):
            raise _Ended()

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._put(None)

    def fail(self) -> None:
        self._put(self._FAILED)

    def _put(self, item: object) -> bool:
        while not self.ended.is_set():
            try:
                self.queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[bytes]:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if item is self._FAILED:
                raise _Aborted("the layer could not be compressed to its end")
            yield item  # type: ignore[misc]


def _settle(future: Future) -> None:
    """Wait for an abandoned upload to end; its failure is the abandonment's, not news."""
    try:
        future.result()
    except Exception:
        pass


_SAVE_HINT = (
    "the engine's store is not laid out as imagekit reads it; "
    "IMAGEKIT_PUSH_FROM=save reads layers through `docker save`"
)


class _Meter:
    """Counts the bytes read for a progress line."""

    def __init__(self, act: Activity) -> None:
        self.act, self.read = act, 0

    def __call__(self, n: int) -> None:
        self.read += n
        self.act.update(self.read, None)


def _short(diff_id: str) -> str:
    return diff_id.split(":", 1)[-1][:12]
