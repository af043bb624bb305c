"""`imagekit release page`: the release page from the release index, the matrix and the self-test reports of builds
that failed, written as one folder that is swapped in whole (a reader sees the old page or the new one).

Everything is read and checked before anything is written: a broken index, matrix or report is a usage error and the
folder is left as it was. The folder is replaced whole, so one holding anything but an earlier page is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from imagekit.effects.files import read_input, refuse_links, replace_folder, write_tree_atomic
from imagekit.errors import UsageError
from imagekit.matrix import matrix_file as matrix
from imagekit.pages import page_html, release_grid
from imagekit.pages.release_grid import FailedRun, Page
from imagekit.services import inputs
from imagekit.services.publishing.release_index import read_index
from imagekit.trust import untrusted

OUT_HINT = (
    "pass a new or empty folder to --out (e.g. --out site), or the folder an earlier `imagekit release page` wrote"
)
REPORTS_HINT = (
    "pass the folders of self-test reports `imagekit build` leaves in its state folder (.imagekit/reports, one "
    "<cell slug>.json each; CI uploads them), or leave --reports out"
)


@dataclass(frozen=True)
class Written:
    out: Path
    page: Page
    files: tuple[str, ...]
    size: int  # bytes written


def read_reports(folders: list[Path]) -> list[FailedRun]:
    """The failed runs among the self-test reports under ``folders`` (searched recursively: download-artifact puts
    each artifact in a subfolder); a file that is not a report of its cell is a usage error naming it."""
    runs: dict[str, FailedRun] = {}
    for folder in folders:
        if not folder.is_dir():
            what = "is not a folder" if folder.exists() or folder.is_symlink() else "does not exist"
            raise UsageError(f"--reports {folder} {what}", REPORTS_HINT)
        for path in sorted(p for p in folder.rglob("*.json") if not p.name.startswith(".")):
            text = read_input(path, "self-test report", REPORTS_HINT) or ""
            try:
                run = release_grid.failed_run(untrusted.load_json(text, "it"), path.name)
            except untrusted.UntrustedData as exc:
                raise UsageError(f"self-test report {path} is not JSON: {exc}", REPORTS_HINT) from None
            except UsageError as exc:
                raise UsageError(f"self-test report {path}: {exc.message}", REPORTS_HINT) from None
            if run is not None:
                runs.setdefault(release_grid.key_of(run.cell, run.platform), run)
    return list(runs.values())


def page(index_path: Path, matrix_path: Path | None, report_dirs: list[Path]) -> Page:
    """The page's content, every input read and checked."""
    if not (index_path.exists() or index_path.is_symlink()):
        raise UsageError(
            f"release index {index_path} does not exist",
            "pass --release-index FILE: the index `imagekit build --push` or `imagekit release merge` writes",
        )
    index = read_index(index_path)
    data = inputs.compat_data()
    config = inputs.load_matrix(matrix_path, data)
    digest = hashlib.sha256(json.dumps(index, sort_keys=True).encode()).hexdigest()
    return release_grid.build(
        index.get("images", {}),
        matrix.evaluate(config, data),
        read_reports(report_dirs),
        data,
        index_digest=digest,
        matrix=config.origin,
    )


def _check_out(out: Path) -> Path:
    """``out`` as an absolute path, when the page may replace it: new, empty, or an earlier page; never a link, the
    working folder or a folder above it."""
    out = Path(os.path.abspath(out))
    refuse_links(out, 1, "--out", OUT_HINT)
    here = Path(os.getcwd())
    if out == here or out in here.parents:
        raise UsageError(f"--out {out} is the working folder or holds it; the page replaces its folder whole", OUT_HINT)
    if out.is_dir():
        other = sorted(p.name for p in out.iterdir() if p.name not in page_html.FILES)
        if other:
            shown = ", ".join(untrusted.printable(n, 60) for n in other[:5]) + (", ..." if len(other) > 5 else "")
            raise UsageError(
                f"--out {out} holds files a release page does not ({shown}); the page replaces its folder whole",
                OUT_HINT,
            )
    return out


def write(index_path: Path, matrix_path: Path | None, report_dirs: list[Path], out: Path) -> Written:
    """Make the page and swap it in for ``out``; nothing is written when an input is refused."""
    target = _check_out(out)
    made = page(index_path, matrix_path, report_dirs)
    files = page_html.render(made)
    replace_folder(target, lambda staging: write_tree_atomic(staging, files))
    size = sum(len(text.encode()) for text in files.values())
    return Written(out, made, tuple(sorted(files)), size)
