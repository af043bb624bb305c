"""Mutation score per module from mutmut's results (mutants/**/*.meta), after `mutmut run`. See docs/mutation.md.

A timeout counts as detected (the mutant made the tests hang). render.py is also reported for its digest/quoting
subset (the functions that decide the immutable tag and what may enter a Dockerfile).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code

RENDER_DIGEST_QUOTING = ("x__dq", "x_context_digest", "x__url")


def function_of(mutant: str) -> str:
    return mutant.rsplit(".", 1)[1].split("__mutmut_")[0]


def score(statuses: Counter) -> str:
    detected = statuses["killed"] + statuses["timeout"]
    total = sum(statuses.values())
    pct = 100 * detected / total if total else 100.0
    other = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()) if s not in ("killed", "timeout"))
    return f"{detected}/{total} killed ({pct:.1f}%)" + (f"; {other}" if other else "")


def main(root: Path) -> int:
    metas = sorted(root.glob("mutants/**/*.py.meta"))
    if not metas:
        print("no mutmut results under mutants/: run `make mutation` first", file=sys.stderr)
        return 1
    survivors = []
    for meta in metas:
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        statuses = Counter(status_by_exit_code[c] for c in codes.values())
        module = meta.relative_to(root / "mutants").as_posix().removesuffix(".meta")
        print(f"{module:24} {score(statuses)}")
        if module.endswith("render.py"):
            sub = Counter(status_by_exit_code[c] for k, c in codes.items() if function_of(k) in RENDER_DIGEST_QUOTING)
            print(f"{'  digest/quoting subset':24} {score(sub)}")
        survivors += [k for k, c in codes.items() if status_by_exit_code[c] not in ("killed", "timeout")]
    for name in sorted(survivors):
        print(f"  not killed: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path.cwd()))
