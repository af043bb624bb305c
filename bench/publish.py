"""Publish: `docker push` against imagekit's own push (imagekit.services.publishing.blob_push) of the same image, on
the same
engine and registry, against the disk's own read rate (the physical limit of reading the layers here).

1. disk: the largest file of the image's layers read cold (page cache dropped where this process may drop it).
2. docker push of IMAGE to REGISTRY/imagekit-bench/push-docker (the engine's gzip, one core per layer).
3. imagekit's push to REGISTRY/imagekit-bench/push-a with an empty blob cache, then to push-b with another empty
   cache (the same blob digests and manifest digest: deterministic), then push-a again (nothing read or sent).
4. what `imagekit build --push` does: the layers' blobs prepared as during a build (services/publishing/blob_prepare,
   timed on its own: during a build it runs on the cores the build leaves idle), then the push to push-c, which
   uploads them: the same blob digests and manifest digest as 3.
All into a new, empty registry of its own (Debian's docker-registry on a free loopback port, removed at the end: an
engine that pushed the same layers anywhere before would only mount them). Both pushes start from a dropped page
cache. Prints seconds, MB/s of layer bytes, the compressed bytes, and the ratio.

Run: .venv/bin/python bench/publish.py IMAGE [--level 4]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.effects.docker import Engine  # noqa: E402
from imagekit.effects.registry import RegistryClient, Remote  # noqa: E402
from imagekit.oci import layer_blobs  # noqa: E402
from imagekit.services.publishing import blob_push  # noqa: E402


def drop_caches() -> str:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "page cache dropped"
    except OSError:
        return "page cache NOT dropped (not root): reads may come from memory"


def disk_rate(engine: Engine, image_id: str) -> tuple[float, int]:
    """MB/s reading the image's largest layer file cold."""
    info = engine.client.info()
    root, driver = Path(info["DockerRootDir"]), info["Driver"]
    biggest: tuple[int, Path] | None = None
    for diff in layer_blobs.chain_ids(engine.image(image_id)["RootFS"]["Layers"]):
        cache_id = (root / "image" / driver / "layerdb" / "sha256" / diff.split(":")[1] / "cache-id").read_text()
        for path in (root / driver / cache_id.strip() / "diff").rglob("*.so*"):
            if path.is_file() and not path.is_symlink():
                size = path.stat().st_size
                if biggest is None or size > biggest[0]:
                    biggest = (size, path)
    assert biggest is not None
    drop_caches()
    t0 = time.perf_counter()
    with open(biggest[1], "rb") as fh:
        while fh.read(8 << 20):
            pass
    return biggest[0] / (time.perf_counter() - t0) / 1e6, biggest[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("image")
    ap.add_argument("--level", type=int, default=blob_push.default_gzip().level)
    ap.add_argument("--skip-docker", action="store_true")
    args = ap.parse_args()
    engine = Engine()
    image_id = engine.image(args.image)["Id"]
    print(f"image {args.image} ({image_id[:19]}), {os.cpu_count()} CPUs, {drop_caches()}", flush=True)
    rate, size = disk_rate(engine, image_id)
    print(f"disk: {rate:.0f} MB/s reading the largest layer file cold ({size / 1e9:.2f} GB)", flush=True)
    client = RegistryClient()
    from tests.registry import Registry, free_port

    # a registry of its own: an engine that pushed these layers to a registry before only mounts them there
    fresh = Registry(Path(tempfile.mkdtemp(prefix="imagekit-bench-registry-")), free_port()).start()
    args.registry = fresh.address
    print(f"registry: a new one at {fresh.address} (empty)", flush=True)
    try:
        run(args, engine, image_id, client, rate)
    finally:
        fresh.stop()
        import shutil

        shutil.rmtree(fresh.root, ignore_errors=True)


def run(args: argparse.Namespace, engine: Engine, image_id: str, client: RegistryClient, rate: float) -> None:
    docker_s = None
    if not args.skip_docker:
        repo = f"{args.registry}/imagekit-bench/push-docker"
        tag = f"t{int(time.time())}"
        subprocess.run(["docker", "tag", image_id, f"{repo}:{tag}"], check=True)
        drop_caches()
        t0 = time.perf_counter()
        subprocess.run(["docker", "push", f"{repo}:{tag}"], check=True, stdout=subprocess.DEVNULL)
        docker_s = time.perf_counter() - t0
        man = client.oci_manifest_json(Remote.parse(repo), tag)
        packed = sum(layer["size"] for layer in man["layers"])
        subprocess.run(["docker", "rmi", f"{repo}:{tag}"], check=True, stdout=subprocess.DEVNULL)
        print(f"docker push: {docker_s:.1f} s, {packed / 1e9:.2f} GB gzip", flush=True)

    gzip = layer_blobs.Gzip(args.level)
    runs = []
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as two:
        for repo_name, cache, what in (("push-a", one, "empty cache"), ("push-b", two, "another empty cache"),
                                       ("push-a", one, "again")):  # fmt: skip
            os.environ["IMAGEKIT_CACHE"] = cache
            remote = Remote.parse(f"{args.registry}/imagekit-bench/{repo_name}")
            stats = blob_push.PushStats()
            drop_caches()
            tag = f"t{int(time.time())}-{len(runs)}"
            digest = blob_push.push_image(engine, client, remote, image_id, tag, gzip=gzip, stats=stats)
            blobs = [layer["digest"] for layer in client.oci_manifest_json(remote, digest)["layers"]]
            runs.append((stats, digest, blobs))
            print(
                f"imagekit push ({gzip.identity}) to {repo_name}, {what}: {stats.seconds:.1f} s, {stats.summary()}; "
                f"manifest {digest[:19]}",
                flush=True,
            )
    with tempfile.TemporaryDirectory() as three:
        os.environ["IMAGEKIT_CACHE"] = three
        from imagekit.services.publishing import blob_prepare

        drop_caches()
        t0 = time.perf_counter()
        prep = blob_prepare.Prepare(engine, gzip, print)
        prep.add(image_id)
        prepared = prep.finish()
        prep_s = time.perf_counter() - t0
        remote = Remote.parse(f"{args.registry}/imagekit-bench/push-c")
        stats = blob_push.PushStats()
        drop_caches()
        d4 = blob_push.push_image(engine, client, remote, image_id, "t-prepared", gzip=gzip, stats=stats)
        b4 = [layer["digest"] for layer in client.oci_manifest_json(remote, d4)["layers"]]
        prep.discard()
    print(f"blobs prepared as during a build: {prep_s:.1f} s ({prepared.summary()}); then the push: "
          f"{stats.seconds:.1f} s, {stats.summary()}; manifest {d4[:19]}", flush=True)  # fmt: skip
    (first, d1, b1), (_, d2, b2), (again, d3, _) = runs
    print(f"same blob digests on both cold pushes: {b1 == b2}; same manifest digest on all three: {d1 == d2 == d3}")
    print(f"prepared during a build: the same blob digests {b4 == b1} and manifest digest {d4 == d1}")
    print(f"re-publish: {again.sent} layers sent, {again.read_bytes} bytes read, {again.seconds:.1f} s")
    mbs = first.read_bytes / first.seconds / 1e6
    print(f"imagekit: {mbs:.0f} MB/s of layer bytes = {mbs / rate:.2f}x the disk's cold read rate ({rate:.0f} MB/s)")
    if docker_s:
        print(
            f"docker push: {first.read_bytes / docker_s / 1e6:.0f} MB/s; "
            f"ratio docker push / imagekit push: {docker_s / first.seconds:.2f}x; "
            f"docker push / the push of `build --push` (blobs prepared in the build): {docker_s / stats.seconds:.1f}x"
        )


if __name__ == "__main__":
    main()
