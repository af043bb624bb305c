"""Two cells built by `docker buildx bake` (BuildKit, the engine's `docker` driver) against `imagekit build` of the
same two cells one after the other (the legacy builder), both cold (--no-cache) from the same cached wheels and the
same base, on this machine. Then: do the torch layers of one cell agree across the two builders?

- imagekit: `imagekit build --cell A --cell B --no-cache --gpus off --quiet` (lock, fetch from cache, render, build,
  self-test); its per-cell build and self-test seconds are read from its --json output
- bake: `imagekit render --out DIR`, `imagekit fetch --into DIR`, `imagekit matrix --format bake`, then
  `docker buildx bake --no-cache --load`; the self-test of each bake-built image is timed on its own, so both
  columns cover the same work
- layers: the torch layer's diff id from each builder, and a digest of the installed files' paths, sizes, modes,
  mtimes and bytes inside each image (same files, or not)

Run: .venv/bin/python bench/scaleout.py   (about 25 minutes on 2 cores; tags are removed afterwards)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.effects.docker import Engine  # noqa: E402
from imagekit.services.builds import selftest_runner  # noqa: E402

CELLS = ["cu121-torch2.1.2-py3.11-tf4.48.2", "cu121-torch2.4.1-py3.11-tf4.57.6"]
IMAGEKIT = [sys.executable, "-m", "imagekit"]
REPO = "imagekit-bench/scaleout"
# paths, sizes, modes, mtimes and a content hash of every file under /opt/venv: "the same files" across builders
TREE = (
    "cd /opt/venv && find . -xdev -print0 | sort -z | xargs -0 stat -c '%n %s %a %Y %F' | sha256sum | cut -c1-16 && "
    "find . -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16"
)


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, text=True, capture_output=True, cwd=ROOT, **kw)


def tree(image: str) -> str:
    res = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c", TREE],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return " ".join(res.stdout.split())


def torch_layer(engine: Engine, image: str) -> str:
    """The diff id of the layer that `pip install -r requirements-torch.txt` made. History entries map to layers in
    order: those with bytes, and BuildKit's RUN/COPY/ADD/WORKDIR (which make a layer, empty or not)."""
    made = []
    for h in reversed(engine.history(image)):  # oldest first
        cmd = h.get("CreatedBy", "")
        buildkit = "buildkit" in (h.get("Comment") or "")
        if h.get("Size", 0) > 0 or (buildkit and cmd.startswith(("RUN", "COPY", "ADD", "WORKDIR"))):
            made.append(cmd)
    layers = engine.layers(image)
    if len(made) != len(layers):
        return f"? ({len(made)} history layers, {len(layers)} layers)"
    at = next(i for i, cmd in enumerate(made) if "pip install" in cmd and "requirements-torch.txt" in cmd)
    return layers[at]


def main() -> None:
    engine = Engine()
    sel = [a for c in CELLS for a in ("--cell", c)]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        run([*IMAGEKIT, "fetch", *sel, "--quiet"])  # wheels cached: neither side downloads
        start = time.perf_counter()
        res = run(
            [*IMAGEKIT, "build", *sel, "--no-cache", "--gpus", "off", "--quiet", "--json",
             "--registry", f"127.0.0.1:5000/{REPO}", "--state-dir", str(t / "state"), "--release-index",
             str(t / "rel.json")]
        )  # fmt: skip
        legacy_s = time.perf_counter() - start
        legacy = {r["cell"]: r for r in json.loads(res.stdout)}

        build = t / "build"
        run([*IMAGEKIT, "render", *sel, "--out", str(build)])
        run([*IMAGEKIT, "fetch", *sel, "--into", str(build), "--quiet"])
        bake = json.loads(run([*IMAGEKIT, "matrix", "--format", "bake", *sel, "--context-root", str(build)]).stdout)
        for target in bake["target"].values():
            target["tags"] = [
                tag.replace("127.0.0.1:5000/imagekit/train", f"127.0.0.1:5000/{REPO}-bake") for tag in target["tags"]
            ]
        (t / "docker-bake.json").write_text(json.dumps(bake))
        start = time.perf_counter()
        run(["docker", "buildx", "bake", "-f", str(t / "docker-bake.json"), "--no-cache", "--load"])
        bake_build_s = time.perf_counter() - start
        bake_test_s = 0.0
        bake_images = {}
        for target in bake["target"].values():
            image = target["tags"][1]
            bake_images[target["context"].rsplit("/", 1)[1]] = image
            start = time.perf_counter()
            report = selftest_runner.run(engine, image, gpus=False, require_gpu=False)
            bake_test_s += time.perf_counter() - start
            assert report.passed, report.failed

        print(f"machine: {os.cpu_count()} cores; engine {engine.client.version()['Version']}, buildx docker driver")
        print(f"imagekit build, 2 cells one after the other (build + self-test): {legacy_s:.0f} s")
        for c in CELLS:
            print(f"  {c}: {legacy[c]['seconds']:.0f} s, {legacy[c]['status']}")
        print(f"docker buildx bake, 2 cells: {bake_build_s:.0f} s build + {bake_test_s:.0f} s self-test = "
              f"{bake_build_s + bake_test_s:.0f} s")  # fmt: skip
        print(f"ratio bake / imagekit build: {(bake_build_s + bake_test_s) / legacy_s:.2f}")
        a = CELLS[0]
        lg, bk = legacy[a]["tag"], bake_images[a]
        print(f"{a} torch layer: legacy {torch_layer(engine, lg)[:19]}, bake {torch_layer(engine, bk)[:19]}")
        print(f"  installed tree (metadata digest, content digest): legacy {tree(lg)}; bake {tree(bk)}")
        for c in CELLS:
            for image in (legacy[c]["tag"], bake_images[c]):
                for tag in {image, image.rsplit("-", 1)[0]}:
                    engine.remove(tag)


if __name__ == "__main__":
    main()
