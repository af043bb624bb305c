"""Push an image the way imagekit compresses it: every core gzips (libdeflate, fixed-size members), a layer the
registry already has is neither read nor sent, and the same layer gives the same blob on every machine.

`docker push` on this engine gzips each layer on one core with Go's gzip (about 20 MB/s for the demo image here)
and names blobs by what it happened to compress; here the layer tars come straight from the engine's store (or from
`docker save` where that cannot be read: imagekit.effects.layer_export), each is checked against its diff id, cut
into 16 MiB pieces compressed in parallel, and uploaded while the next layer is compressed. Which blob a layer made
is remembered in the cache (per compressor identity), so a re-publish or a rebuild that changed one layer reads only
that layer; the registry is asked (HEAD) before anything is trusted from that memory."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from imagekit.effects import foreign_files
from imagekit.effects.cache import cache_root
from imagekit.effects.files import write_atomic
from imagekit.effects.layer_export import LayerMismatch, save_export
from imagekit.effects.registry import Remote
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.oci import layer_blobs
from imagekit.services.ports import ContainerEngine, Registry
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
    notes: list[str] = field(default_factory=list)
    codec: str = "gzip"

    def summary(self) -> str:
        rate = f", {self.read_bytes / self.seconds / 1e6:.0f} MB/s of layers read" if self.read_bytes else ""
        return (
            f"{self.sent} layer{'s' if self.sent != 1 else ''} pushed ({human_bytes(self.read_bytes)} read, "
            f"{human_bytes(self.blob_bytes)} {self.codec}), {self.present} already there, in {self.seconds:.0f} s{rate}"
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


def blob_cache_dir(gzip: layer_blobs.Codec) -> Path:
    return cache_root() / "blobs" / gzip.identity


def remembered(gzip: layer_blobs.Codec, diff_id: str) -> layer_blobs.Blob | None:
    """The blob this compressor made of the layer ``diff_id`` before, if this machine remembers one."""
    try:
        raw = foreign_files.read_bytes(blob_cache_dir(gzip) / diff_id.split(":", 1)[-1], 4096)
        text = raw.decode()
    except (OSError, ValueError):  # missing, a link, a FIFO, too large, not text: not remembered
        return None
    m = _CACHED.fullmatch(text)
    return layer_blobs.Blob(m[1], int(m[2]), gzip.media_type) if m else None


def remember(gzip: layer_blobs.Codec, diff_id: str, blob: layer_blobs.Blob) -> None:
    try:
        folder = blob_cache_dir(gzip)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / diff_id.split(":", 1)[-1], f"{blob.digest} {blob.size}\n")
    except OSError:
        pass  # a cache only: the next push compresses the layer again


def compress(
    chunks: Iterator[bytes],
    out: IO[bytes],
    gzip: layer_blobs.Codec,
    pool: ThreadPoolExecutor,
    on_bytes: Callable[[int], None] = lambda _: None,
) -> tuple[str, layer_blobs.Blob]:
    """Compress a layer's tar into ``out``: (the tar's digest, the blob written). Pieces are compressed on the pool's
    threads (libdeflate releases the GIL) and written in order, a bounded number in flight."""
    raw, packed = hashlib.sha256(), hashlib.sha256()
    size = 0
    pending: deque[Future[bytes]] = deque()
    limit = 2 * (pool._max_workers or 1) + 1

    def drain(keep: int) -> None:
        nonlocal size
        while len(pending) > keep:
            data = pending.popleft().result()
            packed.update(data)
            out.write(data)
            size += len(data)

    def hashed() -> Iterator[bytes]:
        for chunk in chunks:
            raw.update(chunk)
            on_bytes(len(chunk))
            yield chunk

    for piece in layer_blobs.pieces(hashed()):
        pending.append(pool.submit(gzip.compress, piece))
        drain(limit)
    drain(0)
    out.flush()
    return "sha256:" + raw.hexdigest(), layer_blobs.Blob("sha256:" + packed.hexdigest(), size, gzip.media_type)


def push_image(
    engine: ContainerEngine,
    registry: Registry,
    remote: Remote,
    image_id: str,
    tag: str | None,
    *,
    gzip: layer_blobs.Codec | None = None,
    progress: Progress | None = None,
    label: str = "",
    log: Callable[[str], None] = lambda _: None,
    stats: PushStats | None = None,
) -> str:
    """Upload every layer the registry lacks and the config, then the manifest under ``tag`` (``None``: under its
    digest alone, for an index to name); returns the manifest's digest. Nothing is tagged unless every blob is in
    the registry."""
    gzip = gzip or default_gzip()
    progress = progress or NullProgress()
    stats = stats if stats is not None else PushStats()
    stats.codec = gzip.name
    began = time.monotonic()
    inspect = engine.image(image_id)
    if inspect is None:
        raise EnvironmentFailure(f"{image_id} is not in the engine", "build it again")
    diff_ids = list(inspect.get("RootFS", {}).get("Layers") or [])
    stats.layers = len(diff_ids)
    blobs: dict[int, layer_blobs.Blob] = {}
    for i, diff_id in enumerate(diff_ids):
        known = remembered(gzip, diff_id)
        if known is not None and registry.blob_size(remote, known.digest) == known.size:
            blobs[i] = known
            stats.present += 1
            progress.line(label, f"layer {_short(diff_id)}: already in the registry")
    scratch: Path | None = cache_root() / "tmp"  # beside the wheels: the disk `build --dry-run` sized
    try:
        scratch.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
    except OSError:
        scratch = None  # a cache that cannot take files: the system's temporary folder
    workers = max(2, os.cpu_count() or 2)
    with (
        tempfile.TemporaryDirectory(prefix="imagekit-push-", dir=scratch) as tmp,
        ThreadPoolExecutor(workers, thread_name_prefix="gzip") as pool,
        ThreadPoolExecutor(2, thread_name_prefix="upload") as uploads,
    ):
        sending: list[Future[None]] = []
        counting = threading.Lock()

        def send(index: int, diff_id: str, blob: layer_blobs.Blob, path: Path, seconds: float) -> None:
            blobs[index] = blob
            remember(gzip, diff_id, blob)
            if registry.blob_size(remote, blob.digest) == blob.size:
                with counting:
                    stats.present += 1
                progress.line(
                    label, f"layer {_short(diff_id)}: {human_bytes(blob.size)} {gzip.name}, already in the registry"
                )
                path.unlink(missing_ok=True)
                return

            def upload() -> None:
                t0 = time.monotonic()
                registry.upload_blob(remote, blob.digest, blob.size, path)
                path.unlink(missing_ok=True)
                with counting:
                    stats.sent += 1
                    stats.blob_bytes += blob.size
                progress.line(
                    label,
                    f"layer {_short(diff_id)}: pushed {human_bytes(blob.size)} {gzip.name} "
                    f"(compressed in {seconds:.1f} s, "
                    f"uploaded in {time.monotonic() - t0:.1f} s)",
                )

            sending.append(uploads.submit(upload))

        export = engine.layer_export(image_id)
        if export is not None:
            config = export.config()
            for i, diff_id in enumerate(diff_ids):
                if i in blobs:
                    continue
                if diff_id in diff_ids[:i]:  # the same layer twice in one image: one blob
                    blobs[i] = blobs[diff_ids.index(diff_id)]
                    continue
                path = Path(tmp) / f"layer-{i}"
                act = progress.begin(label, f"compress layer {_short(diff_id)}", unit="B")
                t0 = time.monotonic()
                meter = _Meter(act)
                try:
                    with open(path, "wb") as out:
                        got, blob = compress(export.layer(diff_ids, i), out, gzip, pool, meter)
                except OSError as exc:
                    raise LayerMismatch(
                        f"layer {i} cannot be read from the engine's store: {exc}", _SAVE_HINT
                    ) from None
                finally:
                    act.finish("")
                if got != diff_id:
                    raise LayerMismatch(
                        f"layer {i} read from the engine's store hashes to {got}, not its diff id {diff_id}", _SAVE_HINT
                    )
                stats.read_bytes += meter.read
                stats.compress_seconds += time.monotonic() - t0
                send(i, diff_id, blob, path, time.monotonic() - t0)
        else:
            t0 = time.monotonic()
            act = progress.begin(label, "compress layers from docker save", unit="B")
            meter = _Meter(act)

            def squeeze(chunks: Iterator[bytes], out: IO[bytes]) -> tuple[str, layer_blobs.Blob]:
                return compress(chunks, out, gzip, pool, meter)

            config, saved = save_export(lambda: engine.save(image_id), image_id, diff_ids, squeeze, Path(tmp))
            act.finish("")
            stats.read_bytes += meter.read
            stats.compress_seconds += time.monotonic() - t0
            for i, diff_id in enumerate(diff_ids):
                if i in blobs or diff_id in diff_ids[:i]:
                    blobs[i] = blobs.get(i) or saved[diff_id].blob
                    continue
                layer = saved[diff_id]
                send(i, diff_id, layer.blob, layer.path, time.monotonic() - t0)
        for future in sending:
            future.result()
        for layer in saved.values() if export is None else ():
            layer.path.unlink(missing_ok=True)
    config_blob = layer_blobs.Blob(layer_blobs.sha256(config), len(config), layer_blobs.CONFIG_TYPE)
    if config_blob.digest != image_id:
        raise LayerMismatch(f"the config read for {image_id} is another image's", "check the engine")
    if registry.blob_size(remote, config_blob.digest) != config_blob.size:
        registry.upload_blob(remote, config_blob.digest, config_blob.size, config)
    body = layer_blobs.manifest(config, [blobs[i] for i in range(len(diff_ids))])
    digest = registry.put_manifest(remote, tag or layer_blobs.sha256(body), body, layer_blobs.manifest_type(body))
    stats.seconds = time.monotonic() - began
    log(f"pushed {remote.registry}/{remote.name}{f':{tag}' if tag else '@' + digest}: {stats.summary()}")
    return digest


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
