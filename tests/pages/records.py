"""Release records as `imagekit build --push` writes them (oci.release_record.entry, a self-test report of the
image's shape), for the release page's tests and its bench: a cell tested on a GPU, one on a CPU-only runner, one
emulated, and an index of many."""

from __future__ import annotations

import hashlib

from imagekit.compat import contract
from imagekit.compat.catalog import CompatData
from imagekit.matrix import matrix_file as matrix
from imagekit.model import AMD64, Cell
from imagekit.oci import release_record
from imagekit.oci.release_record import Published

REPO = "ghcr.io/acme/train"
H100 = "NVIDIA H100 80GB HBM3"


def digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _check(cid: str, status: str, message: str, evidence: dict | None = None) -> dict:
    return {"id": cid, "status": status, "message": message, "fix": "", "evidence": evidence or {}}


def report(cell: Cell, *, gpu: str | None = H100, passed: bool = True, emulated: bool = False) -> dict:
    """The self-test's report as a record keeps it: the image's checks, then where it ran."""
    checks = [
        _check(
            "dists-match-lock",
            "pass" if passed else "fail",
            "39 distributions match the lock exactly"
            if passed
            else "torch 2.4.1+cu124 is installed, the lock pins torch 2.5.1+cu124",
        ),
        _check("pip-check", "pass", "pip check: ok"),
        _check("torch-cuda-version", "pass", f"torch {cell.torch}+{cell.variant} is built for CUDA {cell.cuda}"),
        _check("tiny-model", "pass", "forward/backward of a tiny model on cpu gave finite values"),
    ]
    if gpu and not emulated:
        checks += [
            _check("gpu-cuda-available", "pass", "torch sees 1 GPU(s)"),
            _check("gpu-arch", "pass", f"{gpu} (sm_90) runs via sm_90", {"device": 0, "name": gpu}),
            _check("gpu-matmul-bfloat16", "pass", f"{gpu}: bfloat16 matmul vs CPU float32, max relative error 3.1e-03"),
        ]
    else:
        checks.append(_check("gpu-cuda-available", "skip", "no GPU visible: GPU checks skipped"))
    failed = [c["id"] for c in checks if c["status"] == "fail"]
    return {
        "cell": cell.id,
        "lock_hash": "a" * 64,
        "python": f"{cell.python}.2",
        "checks": checks,
        "failed": failed,
        "passed": not failed,
        "scope": "full",
        "ran": {"emulated": emulated, "gpu": bool(gpu) and not emulated, "seconds": 22.7},
    }


def record(
    cell: Cell,
    data: CompatData,
    *,
    build: str = "0123456789ab",
    published_at: str = "2026-03-02T10:00:00Z",
    gpu: str | None = H100,
    emulated: bool = False,
    signed: bool = True,
    sbom: bool = True,
    layers: bool = True,
    revision: str | None = "4f2a9c1d3e5b",
    repo: str = REPO,
) -> dict:
    """The release record of ``cell``'s image, as publish writes it."""
    tag = f"{repo}:{cell.id}-{build}" if cell.platform == AMD64 else f"{repo}:{cell.id}-{build}-arm64"
    runtime = contract.of_cell(cell, data)
    manifest = {
        "cell": cell.to_json(),
        "driver": {"minimum": runtime.driver_min},
        "torch": {"archs": list(runtime.sass)},
        "runtime": runtime.to_json(),
        "image": {"ports": ["22/tcp"], "jupyter": False},
        **({"source_revision": revision} if revision is not None else {}),
    }
    image = digest(tag)
    published = Published(
        tag,
        f"{repo}:{cell.id}",
        image,
        False,
        config_digest=digest(tag + "config"),
        platform=cell.platform,
        sbom={"attestation": digest(tag + "sbom"), "python": 39, "dpkg": 131} if sbom else None,
        signature={"key": digest("cosign.pub"), "tags": [f"sha256-{image[7:]}.sig"]} if signed else None,
    )
    return release_record.entry(
        published,
        lock_hash="a" * 64,
        manifest=manifest,
        report=report(cell, gpu=gpu, emulated=emulated),
        size=5_318_482_994,
        published_at=published_at,
        layers=[{"digest": digest(tag + "layer"), "compressed_bytes": 2_912_345_678, "step": "torch"}]
        if layers
        else None,
    )


def index(*records: dict) -> dict:
    doc = {"schema": 1, "images": {r["tag"]: r for r in records}}
    assert release_record.index_problems(doc) == [], release_record.index_problems(doc)[:3]
    return doc


def many(data: CompatData, count: int) -> dict:
    """An index of ``count`` releases of the cells the compatibility data can build on a five-by-five torch × CUDA
    matrix over three Pythons and four transformers (the bench's input): every third tested without a GPU, a cell
    built again once the cells run out (its earlier release listed on its card)."""
    doc = {
        "matrix": {
            "cuda": ["11.8", "12.1", "12.4", "12.6", "12.8"],
            "torch": ["2.4.1", "2.5.1", "2.6.0", "2.7.1", "2.8.0"],
            "transformers": ["4.46.3", "4.47.1", "4.48.2", "4.57.6"],
            "python": ["3.10", "3.11", "3.12"],
        }
    }
    cells = [e.cell for e in matrix.evaluate(matrix.parse(doc, "<bench>", data), data) if e.verdict.compatible]
    made = []
    for n in range(count):
        gpu = None if n % 3 == 0 else H100
        day = f"2026-03-{1 + n % 28:02d}T10:00:00Z"
        made.append(record(cells[n % len(cells)], data, build=f"{n:012x}", published_at=day, gpu=gpu))
    return index(*made)
