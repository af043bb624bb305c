"""What a pod host downloads, what a registry stores, and what a cold build costs: imagekit's layer layout measured.

1. pull: build and push cells A and B (default: the torch 2.5.1 and 2.6.0 cells of CUDA 12.4 on Python 3.11, which
   pin the same 12 `nvidia-*` wheels), drop B from the engine, keep A, then `docker pull` B from the registry and
   add up the compressed sizes of the layers the engine had to download (Docker's graph driver reuses a layer only
   when the whole chain below it is the same). Also: the bytes a blob-deduplicating puller (containerd, a registry
   mirror) would fetch, which only needs the same layer digest.
2. storage: the compressed bytes the registry stores for the cells pushed (each blob once).
3. sharing: from the rendered layer inputs of every locked cell of the default matrix, which cells share a layer
   (the CUDA runtime layers, per the layer plan), against the layout where the whole torch closure was one layer in
   the venv's site-packages (only cells with the same Python and the same torch closure could share it).
4. cold (--cold CELL): `imagekit build --no-cache` of one cell with its wheels cached, split by step, then peers
   fed the same wheels from loopback with the same lock on the same base and engine (one RUN each: pip, uv, uv with
   --compile-bytecode), and the naive peer that downloads from PyPI itself (one RUN: venv + `pip install torch==...
   transformers==...`; the network counts against it, --skip-naive leaves it out); image sizes from the engine.

--dockerfile-too also builds the whole Dockerfile with the legacy builder (what `imagekit build` does on a remote
engine), --skip-pip leaves out the pip peer.

Run: .venv/bin/python bench/layers.py [--cold CELL] [--imagekit-root DIR]   (--imagekit-root: another checkout to
measure, e.g. an earlier revision in a git worktree). Needs the local registry (`make registry`). Tags are removed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.compat import catalog as compat  # noqa: E402
from imagekit.effects.docker import Engine  # noqa: E402
from imagekit.effects.registry import RegistryClient, Remote  # noqa: E402
from imagekit.image.buildplan import bootstrap_base  # noqa: E402
from imagekit.locking import lockfile  # noqa: E402
from imagekit.matrix import matrix_file as matrix  # noqa: E402
from imagekit.services import inputs  # noqa: E402

PAIR = ["cu124-torch2.5.1-py3.11-tf4.48.2", "cu124-torch2.6.0-py3.11-tf5.9.0"]
REGISTRY = "127.0.0.1:5000"
REPO = "imagekit-bench/layers"
FINISHED = re.compile(r"^(?P<cell>\S+) (?P<label>[^:]+): (?P<seconds>\d+(?:\.\d+)?) s")
SELFTEST = re.compile(r"^(?P<cell>\S+) self-test (passed|failed): .* in (?P<seconds>\d+(?:\.\d+)?) s")
BUILT = re.compile(r"^(?P<cell>\S+):? built \S+ \(.*\) in (?P<seconds>\d+) s")


def imagekit(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(root), "IMAGEKIT_PROGRESS_INTERVAL": "100000", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "imagekit", *args], cwd=root, env=environ, text=True, capture_output=True
    )


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.2f} {unit}" if unit == "GB" else f"{n:.0f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


def blobs(cell: str) -> list[tuple[str, int]]:
    """(digest, compressed size) of each layer of the pushed alias tag, bottom first."""
    man = RegistryClient().oci_manifest_json(Remote.parse(f"{REGISTRY}/{REPO}"), cell)
    return [(layer["digest"], int(layer["size"])) for layer in man["layers"]]


def build_and_push(
    root: Path, cells: list[str], state: Path, extra: tuple[str, ...] = (), env: dict | None = None
) -> dict:
    sel = [a for c in cells for a in ("--cell", c)]
    t0 = time.perf_counter()
    res = imagekit(
        root, "build", *sel, *extra, "--push", "--gpus", "off", "--json", "--registry", f"{REGISTRY}/{REPO}",
        "--state-dir", str(state), "--release-index", str(state / "index.json"),
        "--release-records", str(state / "records"), env=env,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"imagekit build failed ({res.returncode}):\n{res.stderr[-4000:]}")
    (state / "stderr.log").write_text(res.stderr)
    steps: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for line in res.stderr.splitlines():
        for pattern, label in ((SELFTEST, "self-test"), (BUILT, "docker build (all steps)"), (FINISHED, None)):
            m = pattern.match(line)
            if m and m["cell"].rstrip(":") in cells:
                steps[m["cell"].rstrip(":")].append((label or m["label"], float(m["seconds"])))
                break
    return {"wall": wall, "results": json.loads(res.stdout), "steps": steps}


def pull_bytes(engine: Engine, first: str, second: str) -> tuple[int, int, int, int]:
    """(bytes Docker downloaded, bytes of the second's layers above the chain it shares with the first, bytes a
    blob-deduplicating puller would fetch, the second's compressed size)."""
    a, b = blobs(first), blobs(second)
    for image in engine.client.images.list():  # every tag of the second (alias, immutable, local), then its chain
        for t in image.tags:
            if t.rsplit(":", 1)[-1].startswith(second):
                engine.remove(t)
    engine.client.images.prune(filters={"dangling": True})
    fetched = 0
    for event in engine.client.api.pull(f"{REGISTRY}/{REPO}", tag=second, stream=True, decode=True):
        if event.get("status") == "Download complete":
            short = event.get("id", "")
            fetched += next(size for digest, size in b if digest.split(":", 1)[1].startswith(short))
    common = 0
    while common < min(len(a), len(b)) and a[common][0] == b[common][0]:
        common += 1
    chain = sum(size for _, size in b[common:])
    have = {d for d, _ in a}
    by_blob = sum(size for d, size in dict(b).items() if d not in have)
    return fetched, chain, by_blob, sum(size for _, size in b)


def default_cells(data: compat.CompatData) -> list:
    config = matrix.parse(matrix.default_document(), "<default matrix>", data)
    return [e.cell for e in matrix.evaluate(config, data) if e.verdict.compatible]


def sharing(data: compat.CompatData) -> None:
    """Which locked cells of the default matrix share layers: before (torch closure in site-packages) and now."""
    from imagekit.image import layering as layers

    cells = [c for c in default_cells(data) if (ROOT / "lockfiles" / f"{c.id}.txt").exists()]
    before: dict[tuple, list[str]] = defaultdict(list)
    now: dict[str, list[str]] = defaultdict(list)
    names: dict[str, str] = {}
    for cell in cells:
        lock = lockfile.parse((ROOT / "lockfiles" / f"{cell.id}.txt").read_text())
        before[(cell.python, lock.layer_text("torch", via=False))].append(cell.id)
        for layer in layers.split(lock).cuda:
            now[layer.key].append(cell.id)
            names[layer.key] = f"{layer.name} ({len(layer.entries)} dists)"
    shared_before = [ids for ids in before.values() if len(ids) > 1]
    print(f"\nsharing across the {len(cells)} locked cells of the default matrix:")
    print(f"  before (torch closure in site-packages): {len(shared_before)} layers shared by more than one cell")
    for ids in shared_before:
        print(f"    {', '.join(ids)}")
    storage(data, cells)
    shared_now = {k: ids for k, ids in now.items() if len(ids) > 1}
    print(f"  now (CUDA runtime layers, Python-independent): {len(shared_now)} layers shared by more than one cell")
    for key, ids in sorted(shared_now.items(), key=lambda kv: (-len(kv[1]), names[kv[0]])):
        print(f"    {names[key]} [{key[:12]}]: {', '.join(ids)}")


def storage(data: compat.CompatData, cells: list) -> None:
    """Registry storage for the cells buildable here (torch from PyPI), before and after, in wheel bytes (a layer's
    compressed size follows its wheels'): before, every cell stored its whole torch closure and app layer; now the
    CUDA layers are stored once per distinct set of pins. Sizes from the wheel cache or the index (PEP 700)."""
    from imagekit.image import layering as layers
    from imagekit.locking import uv_pin as tools
    from imagekit.services.wheels import wheel_forecast

    def wheel_bytes(entries: tuple, lock: lockfile.Lock, python: str) -> int:
        part = lockfile.Lock(tuple(entries), (), dict(lock.meta))
        got = wheel_forecast.forecast_lock(part, python, data.bases[python].glibc)
        if got.error:
            raise SystemExit(f"cannot size {len(entries)} wheels: {got.error}")
        return got.cached_bytes + got.download_bytes - tools.UV.size

    local = []
    for cell in cells:
        lock = lockfile.parse((ROOT / "lockfiles" / f"{cell.id}.txt").read_text())
        if not lock.meta.get("torch-index", "").startswith("http"):
            local.append((cell, lock))
    before = after = 0
    seen: set[str] = set()
    for cell, lock in local:
        plan = layers.split(lock)
        venv = wheel_bytes(plan.torch.entries + plan.app.entries, lock, cell.python)
        cuda = {layer.key: wheel_bytes(layer.entries, lock, cell.python) for layer in plan.cuda}
        before += venv + sum(cuda.values())
        after += venv + sum(size for key, size in cuda.items() if key not in seen)
        seen |= set(cuda)
    print(
        f"  registry storage for the {len(local)} cells buildable here (torch from PyPI), in wheel bytes: before "
        f"{human(before)}, now {human(after)} ({after / before:.0%}); bases not counted"
    )


def naive_peer(engine: Engine, base: str, torch: str, transformers: str) -> tuple[float, int]:
    """One RUN: a venv and `pip install torch==X transformers==Y` from PyPI. Where this host reaches PyPI through a
    TLS-intercepting proxy (SSL_CERT_FILE), its CA bundle is copied in first and named by PIP_CERT for that RUN."""
    ca = os.environ.get("SSL_CERT_FILE")
    cert = "COPY ca.crt /tmp/ca.crt\n" if ca and Path(ca).is_file() else ""
    dockerfile = (
        f"FROM {base}\n{cert}RUN {'export PIP_CERT=/tmp/ca.crt && ' if cert else ''}python3 -m venv /opt/venv && "
        f"/opt/venv/bin/pip install --no-cache-dir torch=={torch} transformers=={transformers}\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "Dockerfile").write_text(dockerfile)
        if cert:
            (Path(tmp) / "ca.crt").write_bytes(Path(ca).read_bytes())
        t0 = time.perf_counter()
        subprocess.run(
            ["docker", "build", "--no-cache", "--network", "host", "-t", f"{REPO}-naive:peer", tmp],
            check=True, env={**os.environ, "DOCKER_BUILDKIT": "0"}, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        seconds = time.perf_counter() - t0
    size = int(engine.image(f"{REPO}-naive:peer")["Size"])
    engine.remove(f"{REPO}-naive:peer")
    return seconds, size


PEERS = {
    # what a user writes today with each installer, one RUN, fed the same wheels (the lock's, from loopback)
    "pip": "RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links {url} "
    "--require-hashes --no-deps -r /tmp/requirements.txt",
    "uv": "RUN python3 -m venv /opt/venv && /tmp/uv pip install --python /opt/venv/bin/python --no-index "
    "--find-links {url} --require-hashes --no-deps -r /tmp/requirements.txt",
    "uv --compile-bytecode": "RUN python3 -m venv /opt/venv && /tmp/uv pip install --python /opt/venv/bin/python "
    "--no-index --find-links {url} --require-hashes --no-deps --compile-bytecode -r /tmp/requirements.txt",
}


def fed_peers(
    engine: Engine, base: str, cell, data: compat.CompatData, skip: tuple[str, ...] = (), keep: bool = False
) -> dict[str, tuple[float, int]]:
    """Each of PEERS as a cold `docker build` (legacy builder, --no-cache) on imagekit's base: the lock as
    requirements.txt and uv's binary COPYed in (one small layer), then one RUN installing from the same wheels
    imagekit builds from, served on loopback (`--network host`). (seconds, image bytes) per peer."""
    import shutil
    import zipfile

    from imagekit.effects import wheelserver
    from imagekit.services.wheels import fetch, wheel_folders

    lock_path = ROOT / "lockfiles" / f"{cell.id}.txt"
    lock = lockfile.parse(lock_path.read_text())
    fetched = fetch.fetch_for_build(lock, cell.python, data.bases[cell.python].glibc)
    out: dict[str, tuple[float, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        house = wheel_folders.wheelhouse(fetched, Path(tmp) / "house")
        ctx = Path(tmp) / "ctx"
        ctx.mkdir()
        shutil.copy(lock_path, ctx / "requirements.txt")
        uv_wheel = next(w.path for w in fetched if w.name == "uv")
        with zipfile.ZipFile(uv_wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(".data/scripts/uv"))
            (ctx / "uv").write_bytes(zf.read(member))
        (ctx / "uv").chmod(0o755)
        with wheelserver.serve(house) as address:
            url = f"http://{address}:{wheelserver.PORT}/"
            for name, run in PEERS.items():
                if name in skip:
                    continue
                (ctx / "Dockerfile").write_text(f"FROM {base}\nCOPY uv requirements.txt /tmp/\n{run.format(url=url)}\n")
                tag = f"{REPO}-peer:{name.split()[0]}"
                t0 = time.perf_counter()
                subprocess.run(
                    ["docker", "build", "--no-cache", "--network", "host", "-t", tag, str(ctx)],
                    check=True, env={**os.environ, "DOCKER_BUILDKIT": "0"}, stdout=subprocess.DEVNULL,
                )  # fmt: skip
                out[name] = (time.perf_counter() - t0, int(engine.image(tag)["Size"]))
                if not keep:  # (keep: the caller pushes it, then removes it)
                    engine.remove(tag)
                print(f"  peer {name} (one RUN, the same wheels from loopback): {out[name][0]:.0f} s, "
                      f"{human(out[name][1])}", flush=True)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--imagekit-root", type=Path, default=ROOT, help="the checkout whose imagekit builds")
    ap.add_argument("--pair", nargs=2, default=PAIR, metavar="CELL")
    ap.add_argument("--cold", metavar="CELL", help="also time a cold build of CELL against a naive peer")
    ap.add_argument("--skip-pull", action="store_true")
    ap.add_argument("--skip-sharing", action="store_true")
    ap.add_argument("--naive-only", metavar="CELL", help="only the naive peer of CELL")
    ap.add_argument("--skip-naive", action="store_true", help="--cold without the naive peer")
    ap.add_argument("--skip-pip", action="store_true", help="--cold without the pip peer")
    ap.add_argument(
        "--dockerfile-too", action="store_true",
        help="--cold also builds the whole Dockerfile with the legacy builder (IMAGEKIT_BUILD_STEPS=dockerfile)",
    )  # fmt: skip
    args = ap.parse_args()
    engine = Engine()
    data = inputs.compat_data()
    root = args.imagekit_root.resolve()
    rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"imagekit from {root} ({rev.stdout.strip()})", flush=True)
    if args.naive_only:
        cell = next(c for c in default_cells(data) if c.id == args.naive_only)
        base = "imagekit/base:" + bootstrap_base(data.bases[cell.python]).reference.split(":", 1)[1]
        seconds, size = naive_peer(engine, base, cell.torch, cell.transformers)
        print(f"naive peer of {cell.id} (one RUN, pip from PyPI, {base}): {seconds:.0f} s, {human(size)}")
        return
    if not args.skip_sharing:
        sharing(data)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        if not args.skip_pull:
            first, second = args.pair
            out = build_and_push(root, [first, second], state / "pair")
            fetched, chain, by_blob, total = pull_bytes(engine, first, second)
            print(f"\npull {second} into an engine holding {first}:")
            print(f"  {second}: {human(total)} compressed in {len(blobs(second))} layers")
            print(f"  Docker (graph driver, chain): {human(fetched)} downloaded = {fetched / total:.1%}")
            print(f"    (above the shared chain, from the manifests: {human(chain)} = {chain / total:.1%})")
            print(f"  containerd / registry (blob digest): {human(by_blob)} = {by_blob / total:.1%}")
            stored = {d: s for c in (first, second) for d, s in blobs(c)}
            separate = sum(s for c in (first, second) for _, s in blobs(c))
            print(f"  registry storage for both: {human(sum(stored.values()))} (each alone: {human(separate)})")
            for cell in (first, second):
                print(f"  {cell} layers (MB): {', '.join(str(round(s / 1e6)) for _, s in blobs(cell))}")
            for image in engine.client.images.list():
                for t in image.tags:
                    if t.startswith(f"{REGISTRY}/{REPO}:"):
                        engine.remove(t)
            print(f"  build wall time for both: {out['wall']:.0f} s")
        if args.cold:
            timings = {}
            ways = [("staged", {})] + (
                [("dockerfile", {"IMAGEKIT_BUILD_STEPS": "dockerfile"})] if args.dockerfile_too else []
            )
            for way, env in ways:
                out = build_and_push(root, [args.cold], state / f"cold-{way}", ("--no-cache",), env)
                res = out["results"][0] if isinstance(out["results"], list) else out["results"]["cells"][0]
                what = f"{way} steps, --no-cache, wheels cached"
                print(f"\ncold build of {args.cold} ({what}): {res['seconds']:.0f} s in all")
                for label, seconds in out["steps"].get(args.cold, []):
                    print(f"  {seconds:7.1f} s  {label}")
                inside = re.compile(r"(step \d+/\d+ \w+: \d+\.\d s$|install-layer:|finalize-layer:|staged-layer: \d)")
                for line in (state / f"cold-{way}" / "stderr.log").read_text().splitlines():  # inside each RUN
                    if inside.search(line):
                        print(f"    {line.split(' ', 1)[1]}")
                image = engine.image(f"{REGISTRY}/{REPO}:{args.cold}")
                size = int(image["Size"]) if image else 0
                took = dict(out["steps"].get(args.cold, []))
                timings[way] = (
                    took.get("docker build (all steps)", 0),
                    took.get("self-test", 0),
                    took.get("publish", 0),
                )
                print(f"  imagekit ({way}): build {timings[way][0]:.0f} s + self-test {timings[way][1]:.0f} s "
                      f"(then push {timings[way][2]:.0f} s), {human(size)}")  # fmt: skip
                if way != ways[-1][0]:
                    for image in engine.client.images.list():
                        for t in image.tags:
                            if t.startswith(f"{REGISTRY}/{REPO}:"):
                                engine.remove(t)
            base = next(
                (line.split("FROM ", 1)[1].split()[0] for line in
                 (state / "cold-staged" / "build" / args.cold / "Dockerfile").read_text().splitlines()
                 if line.startswith("FROM ") and " AS base" in line), None,
            )  # fmt: skip
            cell = next(c for c in default_cells(data) if c.id == args.cold)
            docker_build, selftest, _ = timings["staged"]
            built = docker_build + selftest
            peers = fed_peers(engine, base, cell, data, skip=("pip",) if args.skip_pip else ())
            for name, (seconds, _) in peers.items():
                print(f"  ratio imagekit build / {name} peer: {docker_build / seconds:.2f}x; "
                      f"build + self-test / {name} peer: {built / seconds:.2f}x")  # fmt: skip
                if "dockerfile" in timings:
                    print(f"    (the whole Dockerfile on the legacy builder / {name} peer: "
                          f"{timings['dockerfile'][0] / seconds:.2f}x)")  # fmt: skip
            if not args.skip_naive:
                seconds, naive_size = naive_peer(engine, base, cell.torch, cell.transformers)
                print(f"  naive peer (one RUN, pip downloading from PyPI itself, same base; the network counts): "
                      f"{seconds:.0f} s, {human(naive_size)}")  # fmt: skip
                print(f"  ratio imagekit (build + self-test) / naive PyPI-download peer: {built / seconds:.2f}x")
            for image in engine.client.images.list():
                for t in image.tags:
                    if t.startswith(f"{REGISTRY}/{REPO}:"):
                        engine.remove(t)


if __name__ == "__main__":
    main()
