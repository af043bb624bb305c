"""Does the built image say what it holds? Its config (labels, ENV, WORKDIR, ENTRYPOINT, CMD) against the runtime
config imagekit set, and its labels' claims against what the self-test found inside it. Pure: a self-test check."""

from __future__ import annotations

from imagekit.image.imageconfig import RuntimeConfig

CHECK = "labels-match-contents"


def _major_minor(version: object) -> str:
    return ".".join(str(version or "").split("+")[0].split(".")[:2])


def findings(config: dict, runtime: RuntimeConfig, report: dict) -> list[str]:
    """What differs, each as ``what: the image says X, ... Y`` (empty: the image tells the truth)."""
    out: list[str] = []
    labels = config.get("Labels") or {}
    want = dict(runtime.labels)
    for key in sorted(set(labels) | set(want)):
        if labels.get(key) != want.get(key):
            out.append(f"label {key}: the image says {labels.get(key)!r}, imagekit set {want.get(key)!r}")
    env = dict(e.partition("=")[::2] for e in config.get("Env") or [])
    out += [f"ENV {k}: the image says {env.get(k)!r}, imagekit set {v!r}" for k, v in runtime.env if env.get(k) != v]
    for name, got, meant in (
        ("WORKDIR", config.get("WorkingDir") or "", runtime.workdir),
        ("ENTRYPOINT", list(config.get("Entrypoint") or []), list(runtime.entrypoint)),
        ("CMD", list(config.get("Cmd") or []), list(runtime.cmd)),
    ):
        if got != meant:
            out.append(f"{name}: the image says {got!r}, imagekit set {meant!r}")
    # the labels' claims, against the self-test's own readings inside the image
    checks = {c.get("id"): c for c in report.get("checks") or [] if isinstance(c, dict)}
    torch = (checks.get("torch-cuda-version") or {}).get("evidence") or {}
    claims = (
        ("imagekit.cell", report.get("cell"), "the image's manifest names cell"),
        ("imagekit.lock.hash", report.get("lock_hash"), "the image's manifest has lock"),
        ("imagekit.python", _major_minor(report.get("python")), "its Python is"),
        ("imagekit.torch.version", torch.get("torch"), "its torch is"),
        ("imagekit.torch.cuda", _major_minor(torch.get("torch.version.cuda")), "its torch is built for CUDA"),
    )
    for key, found, what in claims:
        if key in want and found and not _same(key, want[key], found):
            out.append(f"label {key}={want[key]!r}, but {what} {found!r}")
    return out


def _same(key: str, claimed: str, found: str) -> bool:
    """torch from PyPI names its CUDA build in ``__version__`` (2.1.2+cu121) but not in its distribution's version
    (2.1.2, what the lock and the label say): the release must be equal, and a local part the label names too."""
    if key != "imagekit.torch.version":
        return claimed == found
    release, _, local = claimed.partition("+")
    return found.partition("+")[0] == release and (not local or found == claimed)


def check(config: dict, runtime: RuntimeConfig, report: dict) -> dict:
    """The check as the in-image ones report (id, status, message, fix, evidence)."""
    found = findings(config, runtime, report)
    if found:
        return {
            "id": CHECK,
            "status": "fail",
            "message": "; ".join(found)[:3000],
            "fix": "the image does not match its name; rebuild it (nothing was published)",
            "evidence": {},
        }
    return {
        "id": CHECK,
        "status": "pass",
        "evidence": {"labels": len(runtime.labels)},
        "fix": "",
        "message": f"{len(runtime.labels)} labels, ENV, WORKDIR, ENTRYPOINT and CMD as set; the labels' torch, "
        "CUDA, Python, cell and lock are what the self-test found inside",
    }
