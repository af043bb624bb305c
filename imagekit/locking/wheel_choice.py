"""Which wheel of a locked distribution the image installs: tag compatibility for the image's platform. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from packaging import tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename


@dataclass(frozen=True)
class Candidate:
    filename: str
    url: str
    sha256: str
    size: int | None = None  # as the index declares it (PEP 700), when it does


def supported_tags(python: str, glibc: str = "2.28", machine: str = "x86_64") -> list[tags.Tag]:
    """Tags a CPython ``python`` on Linux ``machine`` (x86_64, aarch64) with ``glibc`` accepts, most preferred
    first."""
    major, minor = (int(x) for x in python.split("."))
    gmaj, gmin = (int(x) for x in glibc.split("."))
    # manylinux2010 and manylinux1 were x86 only; manylinux2014 (glibc 2.17) named aarch64 too (PEP 599)
    legacy = {17: f"manylinux2014_{machine}"}
    if machine == "x86_64":
        legacy |= {12: "manylinux2010_x86_64", 5: "manylinux1_x86_64"}
    plats = []
    oldest = 5 if machine == "x86_64" else 17
    for m in range(gmin, oldest - 1, -1):  # a legacy name right after its glibc, as pip and uv rank them
        plats.append(f"manylinux_{gmaj}_{m}_{machine}")
        if m in legacy:
            plats.append(legacy[m])
    plats.append(f"linux_{machine}")
    out = list(tags.cpython_tags((major, minor), platforms=plats))
    out += list(tags.compatible_tags((major, minor), f"cp{major}{minor}", plats))
    return out


def pick(candidates: list[Candidate], hashes: tuple[str, ...], supported: list[tags.Tag]) -> Candidate | None:
    """The most preferred wheel whose sha256 the lock allows."""
    rank = {t: i for i, t in enumerate(supported)}
    allowed = {h.split(":", 1)[1] for h in hashes}
    best: tuple[int, Candidate] | None = None
    for c in candidates:
        if c.sha256 not in allowed or not c.filename.endswith(".whl"):
            continue
        try:
            _, _, _, wheel_tags = parse_wheel_filename(c.filename)
        except InvalidWheelFilename:
            continue
        score = min((rank[t] for t in wheel_tags if t in rank), default=None)
        if score is not None and (best is None or score < best[0]):
            best = (score, c)
    return best[1] if best else None
