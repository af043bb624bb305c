"""Time to make the release page for 200 release records, against a plain peer fed the same records.

imagekit: `pages.release_grid.build` (every record read by shape, each cell's state, the grids, the notes) and
`pages.page_html.render` (Jinja, autoescape) over an index of N records (tests/pages/records.many: every third tested
without a GPU) and the shipped default matrix; then the whole command as a user runs it (`imagekit release page` as a
process: the index read and checked, the matrix evaluated, the page written and swapped in).
Peer: the least a page of the same records could do: one HTML table row per record, every field `html.escape`d and
the self-test report `json.dumps`ed into its cell (no grid, no states, no notes). The ratio is what the grid, the
per-cell facts and Jinja cost over that floor, on the same records, in the same process.

Run: .venv/bin/python bench/release_page.py [--records 200]
"""

from __future__ import annotations

import argparse
import html
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagekit.matrix import matrix_file as matrix  # noqa: E402
from imagekit.pages import page_html, release_grid  # noqa: E402
from imagekit.services import inputs  # noqa: E402
from tests.pages import records  # noqa: E402


def timed(fn, repeat: int = 5) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def peer(images: dict) -> str:
    """One escaped table row per record: the floor any page of these records costs."""
    rows = []
    for tag, entry in sorted(images.items()):
        cells = [tag, entry["digest"], str(entry.get("size_bytes")), str(entry.get("compressed_bytes")),
                 json.dumps(entry.get("selftest"), sort_keys=True), json.dumps(entry.get("sbom"), sort_keys=True),
                 json.dumps(entry.get("signature"), sort_keys=True)]  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return "<!doctype html><table>" + "\n".join(rows) + "</table>\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200)
    args = ap.parse_args()
    data = inputs.compat_data()
    index = records.many(data, args.records)
    images = index["images"]
    evaluated = matrix.evaluate(matrix.parse(matrix.default_document(), "<default>", data), data)

    def ours() -> dict[str, str]:
        page = release_grid.build(images, evaluated, [], data, index_digest="0" * 64, matrix="<default>")
        return page_html.render(page)

    ours()  # templates compiled and caches warm, as for the peer's first run
    t_ours, files = timed(ours)
    t_peer, table = timed(lambda: peer(images))
    size = len(files["index.html"].encode())  # type: ignore[index]
    print(f"{len(images)} records, {len(evaluated)} matrix cells, {os.cpu_count()} CPUs")
    print(f"imagekit (grid, states, notes, cards; Jinja autoescape): {t_ours * 1000:.1f} ms, {size // 1024} KiB")
    print(f"peer (an html.escape'd table row per record, json.dumps): {t_peer * 1000:.1f} ms, "
          f"{len(table.encode()) // 1024} KiB")  # fmt: skip
    print(f"ratio imagekit / peer: {t_ours / t_peer:.1f}x (what the grid and the per-cell facts cost over the floor)")

    with tempfile.TemporaryDirectory(prefix="imagekit-bench-page-") as tmp:
        work = Path(tmp)
        (work / "releases").mkdir()
        (work / "releases" / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
        argv = [sys.executable, "-m", "imagekit", "release", "page", "--out", "site"]
        walls = []
        for _ in range(3):
            start = time.perf_counter()
            subprocess.run(argv, cwd=work, check=True, capture_output=True)
            walls.append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "imagekit", "--version"], cwd=work, check=True, capture_output=True)
        bare = time.perf_counter() - start
    print(
        f"`imagekit release page` as a process: {statistics.median(walls):.2f} s (median of 3; "
        f"`imagekit --version` alone: {bare:.2f} s)"
    )


if __name__ == "__main__":
    main()
