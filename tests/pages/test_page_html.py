"""The release page's HTML (pages.page_html): the same index gives the same bytes; every value from a record is
escaped, in text and in attributes, so the page's only script is its own copy script; the page fetches nothing."""

from __future__ import annotations

import html
import json
from html.parser import HTMLParser

from imagekit.model import Cell
from imagekit.pages import page_html, release_grid
from imagekit.services.publishing.release_index import read_index
from tests.conftest import ROOT
from tests.pages import records
from tests.pages.test_release_grid import CPU_CELL, GPU_CELL, _evaluated

SCRIPT = "<script>window.__pwned=1</script>"
BREAKOUT = '" onmouseover="window.__pwned=1" x="\'><img src=x onerror=window.__pwned=1>'
LONG = "N" * 10_000
CONTROL = "bell\x07 escape\x1b[31m red\x1b]0;title\x07 nul\x00 del\x7f bidi\u202e gnp.exe"


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text, as a browser's parser reads them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parsed(text: str) -> Tags:
    tags = Tags()
    tags.feed(text)
    tags.close()
    return tags


def _render(data, images: dict, failed: tuple = ()) -> dict[str, str]:
    page = release_grid.build(images, _evaluated(data), list(failed), data, index_digest="f" * 64, matrix="x.toml")
    return page_html.render(page)


def hostile_record(data) -> dict:
    """A record that passes the record's check (tags, digests, sizes are of their grammar) and carries another
    party's text everywhere the check leaves it as written: the self-test report, the source revision, the
    manifest's platform, a GPU's name."""
    entry = records.record(GPU_CELL, data, gpu=SCRIPT)
    report = entry["selftest"]
    report["checks"] += [
        {"id": SCRIPT, "status": BREAKOUT, "message": BREAKOUT + CONTROL, "evidence": {}},
        {"id": LONG, "status": "pass", "message": LONG, "reused": {"tag": SCRIPT}},
        {"id": "quotes", "status": "pass", "message": "'single' \"double\" `back` &amp; </td></tr></table>"},
    ]
    report["failed"] = []
    entry["manifest"]["source_revision"] = BREAKOUT
    entry["manifest"]["cell"]["platform"] = "linux/amd64" + BREAKOUT
    entry["manifest"]["torch"]["archs"] = ['"><i>sm</i>']  # the check holds these to short single-line texts
    entry["manifest"]["cell"]["transformers"] = "4.48.2<script>x</script>"
    return entry


def test_the_same_index_gives_the_same_bytes_whatever_its_order(data, tmp_path):
    entries = [records.record(GPU_CELL, data), records.record(CPU_CELL, data, gpu=None),
               records.record(Cell("12.6", "2.7.1", "4.48.2", "3.12"), data, sbom=False)]  # fmt: skip
    forward = records.index(*entries)["images"]
    backward = dict(reversed(list(forward.items())))
    first, again, reordered = _render(data, forward), _render(data, forward), _render(data, backward)
    assert first == again == reordered
    assert sorted(first) == ["copy.js", "index.html", "page.css"]
    # ... and through the file, as the command reads it
    path = tmp_path / "index.json"
    path.write_text(json.dumps(records.index(*entries), indent=2))
    assert _render(data, read_index(path)["images"]) == first


def test_the_page_is_its_own_html_with_one_script_of_its_own_and_nothing_from_elsewhere(data):
    files = _render(data, records.index(records.record(GPU_CELL, data))["images"])
    tags = parsed(files["index.html"])
    scripts = [a for t, a in tags.tags if t == "script"]
    assert scripts == [{"src": "copy.js", "defer": None}]
    links = [a["href"] for t, a in tags.tags if t == "link"]
    assert links == ["page.css"]
    [csp] = [a["content"] for t, a in tags.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    urls = [v for _, a in tags.tags for k, v in a.items() if k in ("href", "src") and v]
    assert all(u.startswith("#") or u in ("copy.js", "page.css") for u in urls), urls  # no network at view time
    assert "innerHTML" not in files["copy.js"] and "textContent" in files["copy.js"]
    assert "http" not in files["page.css"] and "@import" not in files["page.css"]


def test_every_value_from_a_record_is_escaped_in_text_and_in_attributes(data):
    files = _render(data, records.index(hostile_record(data))["images"])
    text = files["index.html"]
    tags = parsed(text)
    assert [t for t, _ in tags.tags].count("script") == 1 and "img" not in [t for t, _ in tags.tags]
    handlers = [(t, k) for t, a in tags.tags for k in a if k.startswith("on")]
    assert handlers == []
    assert SCRIPT not in text and html.escape(SCRIPT) in text  # as text, escaped
    assert "&#34; onmouseover=&#34;window.__pwned=1&#34;" in text  # a quote never closes an attribute
    shown = "".join(tags.text)
    assert SCRIPT in shown and 'onmouseover="window.__pwned=1"' in shown  # what a reader sees: the text itself
    classes = [a.get("class") or "" for _, a in tags.tags]
    assert any(c.startswith('status-" onmouseover=') for c in classes)  # inside the attribute, whole
    assert "'single' \"double\" `back` &amp; </td></tr></table>" in shown


def test_control_characters_are_removed_and_a_long_value_is_cut_saying_how_long(data):
    text = _render(data, records.index(hostile_record(data))["images"])["index.html"]
    assert not any(ch in text for ch in "\x00\x07\x1b\x7f\u202e")
    assert "bell escape red" in text or "bell escape" in text
    assert LONG not in text and "N" * 150 in text and "… (10,000 characters)" in text
    assert len(text) < 200_000


def test_a_hostile_gpu_name_never_reaches_a_command(data):
    text = _render(data, records.index(hostile_record(data))["images"])["index.html"]
    pods = [line for line in text.splitlines() if "imagekit pod create" in line]
    assert pods and all("--gpu GPU_TYPE_ID" in line for line in pods)


def test_the_state_legend_and_each_chip_say_their_state_in_words(data):
    text = _render(data, records.index(records.record(GPU_CELL, data))["images"])["index.html"]
    tags = parsed(text)
    chips = [a for t, a in tags.tags if "data-cells" in a]
    assert {a["data-state"] for a in chips} == {"passed", "excluded", "unpublished"}
    [mine] = [a for a in chips if a["data-cells"] == GPU_CELL.id]
    assert mine["href"] == f"#cell-{GPU_CELL.id}" and "passed" in mine["class"]
    assert mine["title"].startswith(GPU_CELL.id)
    assert f'id="cell-{GPU_CELL.id}"' in text
    assert "(passed)" in "".join(tags.text) and "(excluded)" in "".join(tags.text)  # not by colour alone


def test_the_readme_shows_the_page_below_its_first_screen():
    """The screenshot the browser test takes (`--update-golden` writes it) is in docs/ and the README shows it, in a
    section of its own after the quick tour; docs/release-page.md too."""
    png = (ROOT / "docs" / "release-page.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and int.from_bytes(png[16:20], "big") == 1280
    readme = (ROOT / "README.md").read_text()
    assert "](docs/release-page.png)" in readme
    assert readme.index("## Quick tour") < readme.index("## The release page") < readme.index("docs/release-page.png")
    assert "](release-page.png)" in (ROOT / "docs" / "release-page.md").read_text()
