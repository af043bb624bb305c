"""The commented matrix file `imagekit init` writes, from the schema's rows (:mod:`imagekit.matrix.schema`). Pure."""

from __future__ import annotations

from imagekit.matrix import schema
from imagekit.matrix.project_deps import DepsSource, toml_string

HEADER = (
    "# imagekit matrix (`imagekit matrix --help` shows every key, docs/cli.md the same). Each key not set here is\n"
    "# shown commented out with an example and its default.\n"
)


def toml_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(toml_string(v) for v in values) + "]"


def document(
    axes: dict[str, tuple[str, ...]],
    packages: tuple[str, ...],
    repository: str,
    table: str = "",
    apt: tuple[str, ...] = (),
    requirements: DepsSource | None = None,
    install: str | None = None,
) -> str:
    """The commented matrix: the axes, packages and repository set (and apt and requirements when given), every
    other key of the schema commented out with its example. ``table``: "tool.imagekit." for pyproject.toml's section,
    "" for a file of its own. ``install``: the folder of the project to install (its `.` / `-e ./sub` line), which
    the image then copies and installs."""
    given = {f"matrix.{a}": toml_list(v) for a, v in axes.items()}
    given |= {"matrix.packages": toml_list(packages), "image.repository": toml_string(repository)}
    if apt:
        given["image.apt"] = toml_list(apt)
    if install:
        given |= {"image.copy": toml_string("."), "image.install": toml_string(install)}
    if requirements is not None:
        given["matrix.requirements"] = requirements.toml()
    out = [HEADER]
    for section in schema.SECTIONS:
        rows = [k for k in schema.KEYS if schema.section_of(k) == section]
        heading = rows[0].section
        # a table's heading is written even with every key commented out, so uncommenting a key puts it in its
        # table; a base's table needs its keys, so its heading goes with them
        used = heading in schema.SECTIONS or any(k.path in given for k in rows)
        out += [f"# {line}" if not line.startswith("#") else line for line in _wrapped(schema.NOTES[heading])]
        out.append(f"{'' if used else '# '}[{table}{heading}]")
        for k in rows:
            out += schema.line(k, given.get(k.path), commented=k.path not in given)
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _wrapped(text: str) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=118, initial_indent="# ", subsequent_indent="# ")
