"""`imagekit release page` (services.release_page), in-process: the folder it writes, byte-identical twice; bad input
is `error:`/`hint:`, exit 2, and the folder is left as it was; a folder holding anything but a page is never
replaced."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.pages import records
from tests.pages.test_release_grid import CPU_CELL, GPU_CELL


@pytest.fixture
def index(in_tmp: Path, data) -> Path:
    path = in_tmp / "releases" / "index.json"
    path.parent.mkdir()
    doc = records.index(records.record(GPU_CELL, data), records.record(CPU_CELL, data, gpu=None))
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))
    return path


def _page(app, runner, *args: str):
    return runner.invoke(app, ["release", "page", *args])


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_it_writes_the_page_folder_and_the_same_bytes_twice(app, runner, index, in_tmp):
    res = _page(app, runner, "--out", "site")
    assert res.exit_code == 0, res.output
    first = _tree(in_tmp / "site")
    assert sorted(first) == ["copy.js", "index.html", "page.css"]
    assert "wrote site/index.html" in res.output and "1 passed, 1 GPU checks skipped" in res.output
    res = _page(app, runner, "--out", "site", "--json")
    assert res.exit_code == 0 and _tree(in_tmp / "site") == first
    said = json.loads(res.stdout)
    assert said["cells"]["passed"] == 1 and said["files"] == ["copy.js", "index.html", "page.css"]
    assert sorted(p.name for p in in_tmp.iterdir()) == ["releases", "site"]  # no staging folder left
    assert GPU_CELL.id.encode() in first["index.html"]


def test_a_failed_report_marks_its_cell_failed(app, runner, index, in_tmp):
    reports = in_tmp / "reports" / "selftest-report-x"
    reports.mkdir(parents=True)
    (reports / f"{CPU_CELL.id}.json").write_text(json.dumps(records.report(CPU_CELL, passed=False)))
    (reports / f"{GPU_CELL.id}.json").write_text(json.dumps(records.report(GPU_CELL)))  # passed: adds nothing
    res = _page(app, runner, "--out", "site", "--reports", "reports", "--json")
    assert res.exit_code == 0, res.output
    cells = json.loads(res.stdout)["cells"]
    assert (cells["passed"], cells["gpu-skipped"], cells["failed"]) == (1, 0, 1)


@pytest.mark.parametrize(
    ("setup", "args", "says"),
    [
        (lambda d: None, ["--release-index", "missing.json"], "error: release index missing.json does not exist"),
        (lambda d: (d / "bad.json").write_text("[1, 2]"), ["--release-index", "bad.json"], "is not a release index"),
        (
            lambda d: (d / "bad.json").write_text('{"images": {"x": {"tag": "a b"}}}'),
            ["--release-index", "bad.json"],
            "is not a release index",
        ),
        (lambda d: (d / "r").mkdir() or (d / "r" / "x.json").write_text("{"), ["--reports", "r"], "is not JSON"),
        (
            lambda d: (
                (d / "r").mkdir() or (d / "r" / "x.json").write_text('{"cell": "c", "passed": false, "checks": []}')
            ),
            ["--reports", "r"],
            "its name is not its cell's",
        ),
        (lambda d: None, ["--reports", "nowhere"], "--reports nowhere does not exist"),
        (lambda d: (d / "m.toml").write_text("[matrix]\ncuda = 3\n"), ["--matrix", "m.toml"], "m.toml"),
    ],
)
def test_bad_input_is_a_usage_error_and_nothing_is_written(app, runner, index, in_tmp, setup, args, says):
    setup(in_tmp)
    (in_tmp / "site").mkdir()
    (in_tmp / "site" / "index.html").write_text("the earlier page\n")
    res = _page(app, runner, "--out", "site", *args)
    assert res.exit_code == 2, res.output
    assert says in res.output and "hint:" in res.output and "Traceback" not in res.output
    assert _tree(in_tmp / "site") == {"index.html": b"the earlier page\n"}
    assert not [p for p in in_tmp.iterdir() if p.name.startswith(".site")]


@pytest.mark.seconds
def test_a_folder_holding_other_files_is_never_replaced(app, runner, index, in_tmp):
    docs = in_tmp / "docs"
    docs.mkdir()
    (docs / "guide.md").write_text("mine\n")
    res = _page(app, runner, "--out", "docs")
    assert res.exit_code == 2 and "holds files a release page does not (guide.md)" in res.output, res.output
    assert _tree(docs) == {"guide.md": b"mine\n"}
    res = _page(app, runner, "--out", ".")
    assert res.exit_code == 2 and "is the working folder" in res.output
    (in_tmp / "afile").write_text("x\n")
    res = _page(app, runner, "--out", "afile")
    assert res.exit_code == 2 and "is a file" in res.output and (in_tmp / "afile").read_text() == "x\n"
    os.symlink(docs, in_tmp / "link")
    res = _page(app, runner, "--out", "link")
    assert res.exit_code == 2 and "symbolic link" in res.output and _tree(docs) == {"guide.md": b"mine\n"}


def test_an_earlier_page_is_replaced_whole(app, runner, index, in_tmp):
    site = in_tmp / "site"
    site.mkdir()
    (site / "index.html").write_text("old\n")
    (site / "copy.js").write_text("old\n")
    res = _page(app, runner, "--out", "site")
    assert res.exit_code == 0, res.output
    assert sorted(_tree(site)) == ["copy.js", "index.html", "page.css"]
    assert _tree(site)["index.html"].startswith(b"<!doctype html>") and _tree(site)["copy.js"] != b"old\n"
