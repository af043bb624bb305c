"""Size budgets: how big a cell's image may get before `build` refuses it. Pure.

A budget is absolute ("6.5 GB", "6500 MB", "7000000000") or a growth over the cell's last release in the release
index ("+10%", the default). A cell with no earlier release has no limit under a growth budget: its first build
sets the size later builds are held to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from imagekit.errors import UsageError

DEFAULT = "+10%"
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_ABSOLUTE = re.compile(r"(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[a-z]*)", re.I)
_GROWTH = re.compile(r"\+(?P<pct>\d+(?:\.\d+)?)\s*%")


@dataclass(frozen=True)
class Budget:
    text: str
    absolute: int | None = None  # bytes
    growth: float | None = None  # fraction over the last release, e.g. 0.10

    def limit(self, previous: int | None) -> int | None:
        """The largest allowed size in bytes; None when there is nothing to hold the image to yet."""
        if self.absolute is not None:
            return self.absolute
        return int(previous * (1 + (self.growth or 0))) if previous else None

    def explain(self, previous: int | None) -> str:
        if self.absolute is not None:
            return f"the budget {self.text}"
        return f"the last release {previous / 1e9:.2f} GB + {self.growth:.0%}" if previous else "no earlier release"


def parse(text: object) -> Budget:
    hint = 'use a size such as "6.5 GB" or a growth over the last release such as "+10%"'
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"invalid size budget {text!r}", hint)
    value = text.strip()
    m = _GROWTH.fullmatch(value)
    if m:
        return Budget(value, growth=float(m["pct"]) / 100)
    m = _ABSOLUTE.fullmatch(value)
    if m and m["unit"].lower() in _UNITS and float(m["n"]) > 0:
        return Budget(value, absolute=int(float(m["n"]) * _UNITS[m["unit"].lower()]))
    raise UsageError(f"invalid size budget {text!r}", hint)


def over(size: int, budget: Budget, previous: int | None) -> str | None:
    """Why ``size`` breaks the budget, or None."""
    limit = budget.limit(previous)
    if limit is None or size <= limit:
        return None
    return f"the image is {size / 1e9:.2f} GB, over {limit / 1e9:.2f} GB ({budget.explain(previous)})"
