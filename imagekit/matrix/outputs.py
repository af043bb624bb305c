"""Matrix -> machine-readable outputs: JSON, GitHub Actions matrix, Docker Buildx Bake, Markdown grid. Pure."""

from __future__ import annotations

import re

from packaging.version import Version

from imagekit.compat import contract, rules
from imagekit.compat.catalog import CompatData
from imagekit.errors import UnknownVersionError, UsageError
from imagekit.matrix.matrix_file import EvaluatedCell, MatrixConfig
from imagekit.model import AMD64, Query, variant_of

GITHUB_JOB_LIMIT = 256


def cell_row(e: EvaluatedCell, data: CompatData) -> dict:
    c = e.cell
    runtime = contract.of_cell(c, data)
    source = "pypi" if data.torch_from_pypi(c.torch, c.variant, c.platform) else "pytorch"
    return {
        **c.to_json(),
        "platform": c.platform,
        "key": c.key,
        "compatible": e.verdict.compatible,
        "violations": [v.to_json() for v in e.verdict.violations],
        "torch_source": source,
        "archs": [*runtime.sass, *([f"{runtime.ptx}+PTX"] if runtime.ptx else [])],
        "min_driver": runtime.driver_min,
    }


def shard(items: list, spec: str | None) -> list:
    """``--shard 2/3``: the second of three near-equal slices, for matrices over the job limit."""
    if not spec:
        return items
    try:
        index, total = (int(x) for x in spec.split("/"))
    except ValueError:
        raise UsageError(f"invalid --shard {spec!r}", "use I/N, e.g. 1/2") from None
    if not 1 <= index <= total:
        raise UsageError(f"invalid --shard {spec!r}: I must be between 1 and N", "use I/N, e.g. 1/2")
    return items[index - 1 :: total]


def github_matrix(cells: list[EvaluatedCell], data: CompatData, shard_spec: str | None = None) -> dict:
    """A `strategy.matrix` object for `fromJSON`: compatible cells only, under GitHub's 256-job limit."""
    rows = shard([e for e in cells if e.verdict.compatible], shard_spec)
    if len(rows) > GITHUB_JOB_LIMIT:
        need = -(-len(rows) // GITHUB_JOB_LIMIT)
        raise UsageError(
            f"{len(rows)} cells exceed GitHub Actions' {GITHUB_JOB_LIMIT}-job matrix limit",
            f"split into {need} jobs with --shard 1/{need} ... --shard {need}/{need}",
        )
    include = []
    for e in rows:
        c = e.cell
        include.append(
            {
                "cell": c.id,
                "platform": c.platform,  # the build job runs `imagekit build --cell CELL --platform PLATFORM`
                "slug": c.slug,  # its report, artifact and job name
                "cuda": c.cuda,
                "torch": c.torch,
                "transformers": c.transformers,
                "python": c.python,
                "torch_source": cell_row(e, data)["torch_source"],
            }
        )
    return {"include": include}


def bake(targets: list[tuple[str, str, list[str], str]], context_root: str = "build") -> dict:
    """docker-bake.json over `imagekit render --out <context_root>` (BuildKit Dockerfiles) plus
    `imagekit fetch --into <context_root>`: one target per (context folder, Dockerfile digest, tags, platform).
    Wheels are bind-mounted from each context: no network, no entitlement."""
    out = {}
    for folder, _digest, tags, platform in targets:
        out[folder.replace(".", "-")] = {
            "context": f"{context_root}/{folder}",
            "dockerfile": "Dockerfile",
            "tags": tags,
            "platforms": [platform],
        }
    return {"group": {"default": {"targets": sorted(out)}}, "target": out}


def markdown_cells(cells: list[EvaluatedCell], data: CompatData) -> str:
    platforms = any(e.cell.platform != AMD64 for e in cells)  # a column only when a cell is not linux/amd64
    lines = [
        "| cell |" + (" platform |" if platforms else "") + " torch | CUDA | transformers | Python | torch from | "
        "min driver | status |",
        "|---|" + ("---|" if platforms else "") + "---|---|---|---|---|---|---|",
    ]
    for e in cells:
        r = cell_row(e, data)
        status = (
            "✓" if e.verdict.compatible else "✗ " + "; ".join(f"{v.rule}: {v.message}" for v in e.verdict.violations)
        )
        lines.append(
            f"| `{r['id']}` |" + (f" {r['platform']} |" if platforms else "") + f" {r['torch']} | {r['cuda']} | "
            f"{r['transformers']} | {r['python']} | {r['torch_source']} | {r['min_driver']} | {status} |"
        )
    return "\n".join(lines) + "\n"


def short_reason(rule: str, message: str) -> str:
    """A grid-sized reason: 'no wheels', 'driver >= 580.65.06', 'no sm_70'."""
    if rule == "cuda-variant":
        return "no such wheels"
    if rule == "driver-floor":
        m = re.search(r">= (\S+)", message)
        return f"needs driver >= {m[1]}" if m else rule
    if rule == "gpu-arch":
        m = re.search(r"no kernels for (sm_\w+)", message)
        return f"no {m[1]} kernels" if m else rule
    if rule == "platform-wheels":
        return "CPU-only on aarch64" if "CPU-only" in message else "no aarch64 build"
    return rule


def markdown_grid(config: MatrixConfig, data: CompatData) -> str:
    """torch × CUDA for the matrix's torch releases and variants, checked against its fleet and driver; one grid
    per platform when the matrix names more than linux/amd64."""
    torches = sorted({c.torch for c in config.cells}, key=Version)
    cudas = sorted({c.cuda for c in config.cells}, key=Version)
    platforms = sorted({c.platform for c in config.cells})
    lines: list[str] = []
    for platform in platforms:
        if len(platforms) > 1:
            lines += [*([""] if lines else []), f"**{platform}**", ""]
        head = "| torch \\ CUDA | " + " | ".join(variant_of(c) for c in cudas) + " |"
        lines += [head, "|---|" + "---|" * len(cudas)]
        for t in torches:
            row = [f"**{t}**"]
            for c in cudas:
                query = Query(
                    cuda=c, torch=t, archs=config.targets.archs, driver=config.targets.min_driver, platform=platform
                )
                try:
                    verdict = rules.evaluate(query, data)
                except UnknownVersionError:
                    if platform == AMD64:
                        raise
                    row.append("? (no facts)")  # the PyTorch index's aarch64 builds: their GPUs are not known
                    continue
                if verdict.compatible:
                    pypi = " (PyPI)" if data.torch_from_pypi(t, variant_of(c), platform) else ""
                    row.append("✓" + pypi)
                else:
                    row.append("✗ " + "; ".join(sorted({short_reason(v.rule, v.message) for v in verdict.violations})))
            lines.append("| " + " | ".join(row) + " |")
    fleet = ", ".join(config.targets.archs) or "any GPU"
    driver = config.targets.min_driver or "any driver"
    lines.append("")
    lines.append(
        f"Fleet: {fleet}; oldest host driver: {driver}. ✓ (PyPI) marks the variant `pip install torch` gets; "
        "`imagekit explain --cuda X --torch Y` gives each reason with its source."
    )
    return "\n".join(lines) + "\n"
