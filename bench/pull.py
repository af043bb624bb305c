"""Pull: what a cold host downloads and unpacks for an image, gzip against the zstd variant (`build --zstd`).

IMAGE is pushed by imagekit's own push twice into a new, empty registry of its own: gzip (the tag a Docker 20.10 host
pulls) and zstd (the `-zstd` tag, for Docker >= 23 and containerd). Then, each from a dropped page cache:
1. skopeo copies each tag down and decompresses every layer (`--dest-decompress`, what a zstd-capable puller does
   before it unpacks): seconds and bytes downloaded.
2. docker pulls the gzip tag into an engine that does not hold the image (this engine, the image removed first and
   tagged back at the end): seconds (Docker 20.10 cannot pull the zstd one).
Prints seconds, bytes and the ratios.

Run: .venv/bin/python bench/pull.py IMAGE
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.publish import drop_caches  # noqa: E402
from imagekit.effects.docker import Engine  # noqa: E402
from imagekit.effects.registry import RegistryClient, Remote  # noqa: E402
from imagekit.oci import layer_blobs  # noqa: E402
from imagekit.services.publishing import blob_push  # noqa: E402


def skopeo_pull(ref: str) -> tuple[float, int]:
    out = Path(tempfile.mkdtemp(prefix="imagekit-bench-pull-"))
    try:
        drop_caches()
        t0 = time.perf_counter()
        subprocess.run(
            ["skopeo", "copy", "--src-tls-verify=false", "--dest-decompress", f"docker://{ref}", f"dir:{out / 'x'}"],
            check=True,
            capture_output=True,
        )
        return time.perf_counter() - t0, sum(p.stat().st_size for p in (out / "x").iterdir())
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("image")
    args = ap.parse_args()
    if shutil.which("skopeo") is None:
        sys.exit("error: skopeo is missing\nhint: apt-get install skopeo (make setup installs it)")
    engine = Engine()
    image_id = engine.image(args.image)["Id"]
    print(f"image {args.image} ({image_id[:19]}), {os.cpu_count()} CPUs, {drop_caches()}", flush=True)
    from tests.registry import Registry, free_port

    fresh = Registry(Path(tempfile.mkdtemp(prefix="imagekit-bench-registry-")), free_port()).start()
    client = RegistryClient()
    try:
        remote = Remote.parse(f"{fresh.address}/imagekit-bench/pull")
        sizes = {}
        for codec, tag in ((layer_blobs.Gzip(), "gzip"), (layer_blobs.Zstd(), "zstd")):
            stats = blob_push.PushStats()
            t0 = time.perf_counter()
            digest = blob_push.push_image(engine, client, remote, image_id, tag, gzip=codec, stats=stats)
            blobs = client.oci_manifest_json(remote, digest)["layers"]
            sizes[tag] = sum(x["size"] for x in blobs)
            print(f"push {tag}: {time.perf_counter() - t0:.1f} s, {sizes[tag] / 1e9:.3f} GB of blobs "
                  f"({stats.compress_seconds:.1f} s compressing)", flush=True)  # fmt: skip
        pulls = {}
        for tag in ("gzip", "zstd"):
            seconds, unpacked = skopeo_pull(f"{fresh.address}/imagekit-bench/pull:{tag}")
            pulls[tag] = seconds
            print(f"skopeo pull {tag}: {seconds:.1f} s, {sizes[tag] / 1e9:.3f} GB downloaded, "
                  f"{unpacked / 1e9:.3f} GB of layers", flush=True)  # fmt: skip
        print(f"zstd/gzip: bytes {sizes['zstd'] / sizes['gzip']:.3f}, skopeo pull {pulls['zstd'] / pulls['gzip']:.3f}")
        tags = [t for t in engine.image(image_id).get("RepoTags") or []]
        engine.api.remove_image(image_id, force=True)
        drop_caches()
        t0 = time.perf_counter()
        pulled = engine.pull(f"{fresh.address}/imagekit-bench/pull@{client.oci_manifest(remote, 'gzip').digest}")
        back = "the same image back" if pulled == image_id else "ANOTHER image"
        print(f"docker pull gzip: {time.perf_counter() - t0:.1f} s ({back})")
        for ref in tags:
            repo, _, tag = ref.rpartition(":")
            engine.tag(pulled, repo, tag)
    finally:
        fresh.stop()
        shutil.rmtree(fresh.root, ignore_errors=True)


if __name__ == "__main__":
    main()
