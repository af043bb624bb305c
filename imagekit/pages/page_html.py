"""The release page as files: ``index.html`` from its Jinja template, with every value escaped (autoescape: a record
is another party's data), and the stylesheet and copy script beside it, as they are. Pure: a Page in, file texts out.

The page needs no network and no script to be read: the grid, the states and the start commands are plain HTML (the
commands in code blocks); ``copy.js`` only adds a copy button to each command. Its Content-Security-Policy allows
the page's own stylesheet and script and nothing else (no inline script, no other origin), so even a value that got
past the escaping could not run.
"""

from __future__ import annotations

from functools import cache

import jinja2

from imagekit.image.render import sources
from imagekit.pages.cell_facts import STATES
from imagekit.pages.release_grid import Page

TEMPLATE = "index.html.j2"
ASSETS = ("page.css", "copy.js")  # copied as they are
PAGE = "index.html"
FILES = (PAGE, *ASSETS)  # everything the page is: a folder holding anything else is not one `release page` wrote


@cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(sources().root / "templates" / "page")),
        autoescape=True,  # every {{ value }} is HTML-escaped, in text and in attributes alike
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(page: Page) -> dict[str, str]:
    """``{file name: text}`` for the page's folder; the same page gives the same bytes."""
    env = environment()
    html = env.get_template(TEMPLATE).render(page=page, states=STATES)
    files = {PAGE: html}
    for name in ASSETS:
        text, _, _ = env.loader.get_source(env, name)  # type: ignore[union-attr]
        files[name] = text
    return files
