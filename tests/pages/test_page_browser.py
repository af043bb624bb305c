"""The release page in a real browser: `imagekit release page` run as a program, the page opened in a headless
Chromium started here (offline; tests/browser.py), its grid read back and checked against the index and the matrix,
a cell clicked, its start command copied, a screenshot taken (docs/release-page.png, with --update-golden); and a
record full of another party's markup renders as text with nothing run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from imagekit.matrix import matrix_file as matrix
from imagekit.model import Cell
from tests import browser
from tests.conftest import ROOT
from tests.pages import records
from tests.pages.test_page_html import BREAKOUT, CONTROL, LONG, SCRIPT, hostile_record

pytestmark = [
    pytest.mark.programs,
    pytest.mark.skipif(
        browser.find() is None, reason="needs Debian's chromium (apt-get install chromium; `make setup` installs it)"
    ),
]
SCREENSHOT = ROOT / "docs" / "release-page.png"
MATRIX = """[matrix]
cuda = ["11.8", "12.4", "12.6", "12.8"]
torch = ["2.5.1", "2.6.0", "2.7.1", "2.8.0"]
transformers = ["4.48.2"]
python = ["3.11", "3.12"]
packages = ["accelerate==1.2.1"]

[targets]
gpus = ["V100", "A100", "H100"]
"""
A100 = "NVIDIA A100-SXM4-80GB"
PUBLISHED = {  # cell -> (the GPU its self-test ran on, the state the page must show)
    Cell("12.4", "2.5.1", "4.48.2", "3.11"): (records.H100, "passed"),
    Cell("11.8", "2.5.1", "4.48.2", "3.11"): (None, "gpu-skipped"),
    Cell("12.6", "2.7.1", "4.48.2", "3.11"): (A100, "passed"),
    Cell("12.8", "2.8.0", "4.48.2", "3.11"): (records.H100, "passed"),
    Cell("12.4", "2.6.0", "4.48.2", "3.12"): (records.H100, "passed"),
    Cell("12.8", "2.8.0", "4.48.2", "3.12"): (None, "gpu-skipped"),
}
FAILED = Cell("12.6", "2.6.0", "4.48.2", "3.11")  # its build's self-test failed: no record, a report


def _release_page(work: Path, index: dict, reports: dict[str, dict] | None = None) -> Path:
    """`imagekit release page` as a user runs it, on files in ``work``; the page's folder."""
    (work / "imagekit.toml").write_text(MATRIX)
    (work / "releases").mkdir()
    (work / "releases" / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    (work / "reports").mkdir()
    for name, report in (reports or {}).items():
        (work / "reports" / name).write_text(json.dumps(report))
    argv = [sys.executable, "-m", "imagekit", "release", "page", "--out", "site", "--reports", "reports"]
    done = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "wrote site/index.html" in done.stderr
    return work / "site"


def _expected(data) -> dict[str, str]:
    """Every cell's state, from the index and the matrix, as the page must show it."""
    want = {e.cell.key: ("unpublished" if e.verdict.compatible else "excluded") for e in _evaluated(data)}
    want.update({cell.key: state for cell, (_, state) in PUBLISHED.items()})
    want[FAILED.key] = "failed"
    return want


def _evaluated(data) -> list[matrix.EvaluatedCell]:
    return matrix.evaluate(matrix.parse(tomllib.loads(MATRIX), "imagekit.toml", data), data)


def _wait(tab: browser.Tab, expression: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = tab.evaluate(expression)
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_the_page_shows_every_cell_in_its_state_and_how_to_start_it(tmp_path, data, update_golden):
    entries = [records.record(cell, data, gpu=gpu, build=f"{n:012x}") for n, (cell, (gpu, _)) in
               enumerate(PUBLISHED.items())]  # fmt: skip
    failed = {f"{FAILED.id}.json": records.report(FAILED, passed=False)}
    site = _release_page(tmp_path, records.index(*entries), failed)
    url = (site / "index.html").as_uri()
    with browser.Browser(tmp_path / "profile") as chromium:
        tab = chromium.tab(url)
        tab.grant_clipboard()
        shown = tab.evaluate(
            "[...document.querySelectorAll('table.grid [data-cells]')].map(e => [e.dataset.cells, e.dataset.state])"
        )
        states = {key: state for cells, state in shown for key in cells.split(" ")}
        assert states == _expected(data)
        # an exclusion: its rule's message and source on hover, and a note citing the source
        excluded = "cu128-torch2.7.1-py3.11-tf4.48.2"  # no sm_70 kernels, and the fleet has V100s
        [violation] = next(e for e in _evaluated(data) if e.cell.key == excluded).verdict.violations
        title, rule, note = tab.evaluate(
            f"(() => {{ const chip = document.querySelector('table.grid [data-cells=\"{excluded}\"]');"
            " const note = document.querySelector(chip.querySelector('sup a').getAttribute('href'));"
            " return [chip.title, note.querySelector('code').textContent, note.textContent]; })()"
        )
        assert violation.message in title and violation.source in title
        assert rule == violation.rule == "gpu-arch" and note == f"{violation.rule}: {violation.source}"
        # a cell clicked: its card, with the commands that start it
        cell, entry = next(iter(PUBLISHED)), entries[0]
        tab.evaluate(f"document.querySelector('table.grid a[data-cells=\"{cell.id}\"]').click(); 1")
        assert _wait(tab, "location.hash") == f"#cell-{cell.id}"
        commands = tab.evaluate(
            f"[...document.getElementById('cell-{cell.id}').querySelectorAll('pre.command')].map(p => p.textContent)"
        )
        assert commands == [
            f"docker pull {records.REPO}@{entry['digest']}",
            f"imagekit runpod-template {entry['tag']} --digest --create",
            f"imagekit pod create {entry['tag']} --gpu 'NVIDIA H100 80GB HBM3' --deadline 6h",
        ]
        tab.evaluate(f"document.getElementById('cell-{cell.id}').querySelector('button.copy').click(); 1")
        assert _wait(tab, f"document.getElementById('cell-{cell.id}').querySelector('button.copy').textContent "
                          "=== 'Copied'")  # fmt: skip
        assert tab.evaluate("navigator.clipboard.readText()") == commands[0]
        card = tab.evaluate(f"document.getElementById('cell-{cell.id}').innerText")
        assert "on a GPU: NVIDIA H100 80GB HBM3" in card and "Vulnerability gate" in card and "not recorded" in card
        failed_card = tab.evaluate(f"document.getElementById('cell-{FAILED.id}').innerText")
        assert "self-test failed" in failed_card and "dists-match-lock" in failed_card
        tab.evaluate("window.scrollTo(0, 0); location.hash = ''; 1")
        png = tab.screenshot(tmp_path / "release-page.png")
        assert all(u.startswith("file://") for u in tab.requests), tab.requests  # nothing from the network
        assert tab.dialogs == []
        # without JavaScript: the same grid, the commands as plain text, no buttons
        plain = chromium.tab(url, scripts=False)
        assert plain.evaluate("document.querySelectorAll('table.grid [data-cells]').length") == len(shown)
        assert commands[0] in plain.evaluate("document.body.innerText")
        assert plain.evaluate("document.querySelectorAll('button').length") == 0
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    if update_golden:
        SCREENSHOT.write_bytes(png)


def test_a_record_of_another_partys_markup_renders_as_text_and_runs_nothing(tmp_path, data):
    entry = hostile_record(data)
    report = records.report(FAILED, passed=False)
    report["checks"][0]["message"] = SCRIPT + BREAKOUT
    site = _release_page(tmp_path, records.index(entry), {f"{FAILED.id}.json": report})
    with browser.Browser(tmp_path / "profile") as chromium:
        tab = chromium.tab((site / "index.html").as_uri())
        # every element hovered, clicked and focused: an injected handler would run now
        tab.evaluate(
            "document.querySelectorAll('body *').forEach(e => ['mouseover', 'mouseenter', 'focus', 'click']"
            ".forEach(t => e.dispatchEvent(new Event(t, {bubbles: true})))); 1"
        )
        assert tab.evaluate("typeof window.__pwned") == "undefined"
        assert tab.dialogs == []
        assert tab.evaluate("[...document.scripts].map(s => s.getAttribute('src'))") == ["copy.js"]
        assert tab.evaluate("document.querySelectorAll('img, iframe, object, embed, form, base').length") == 0
        handlers = tab.evaluate(
            "[...document.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => a.name))"
            ".filter(n => n.startsWith('on'))"
        )
        assert handlers == []
        text = tab.evaluate("document.body.innerText")
        assert SCRIPT in text and 'onmouseover="window.__pwned=1"' in text  # shown, as text
        assert "N" * 150 in text and "(10,000 characters)" in text and LONG not in text
        assert not any(ch in text for ch in "\x07\x1b\x00\u202e") and "bell" in CONTROL
        blocked = [e for e in tab.events("Log.entryAdded") if "Content Security Policy" in e["entry"].get("text", "")]
        assert blocked == []  # nothing even tried to run
        assert tab.events("Runtime.exceptionThrown") == []
        assert all(u.startswith("file://") for u in tab.requests), tab.requests
