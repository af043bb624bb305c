"""imagekit.toml's keys, one table: each key's section, type, default, example and what it does. Pure.

Everything that names the file's keys is derived from :data:`KEYS`: the keys ``matrix_file.parse`` accepts (an
unknown key is refused with the allowed ones), the reference behind ``imagekit matrix --help`` (and so docs/cli.md),
and the commented file ``imagekit init`` writes. ``tests/matrix/test_schema.py`` checks that ``ImageOptions``, the
parser and the examples agree with it. A new key: its row here, its line in README.md's key table, its check in
``matrix_file`` (a true/false ``[image]`` key needs none: ``ImageOptions.switches``; an ``[image]`` key is a field of
``ImageOptions``) and where it takes effect.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

#: The file's tables, in the order the file and the reference list them.
SECTIONS = ("matrix", "targets", "image", "lock", "bases")
#: Tables inside a section's key: the keys of an include or exclude entry, of `copy`'s table, of a base.
SUB_TABLES = ("matrix.include", "matrix.exclude", "image.copy", 'bases."3.11"')


@dataclass(frozen=True)
class Key:
    """One key of imagekit.toml. ``example``: the value as the file writes it (a TOML value); ``needs``: keys of the
    same section it cannot go without."""

    section: str
    name: str
    type: str
    default: str
    example: str
    doc: str
    since: str = "0.1.0"
    needs: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}"


_AXIS = "list of versions"
KEYS: tuple[Key, ...] = (
    # ---- [matrix]: the cells
    Key("matrix", "cuda", _AXIS, "none", '["12.4", "12.8"]', "the CUDA version of torch's wheel variant (12.4: cu124)"),
    Key("matrix", "torch", _AXIS, "none", '["2.5.1", "2.8.0"]', "torch releases"),
    Key("matrix", "transformers", _AXIS, "none", '["4.48.2"]', "transformers releases"),
    Key("matrix", "python", _AXIS, "none", '["3.11"]', "Python versions (3.11: bookworm's, 3.13: trixie's)"),
    Key(
        "matrix",
        "packages",
        "list of PEP 508 requirements",
        "none",
        '["accelerate==1.2.1", "peft"]',
        "installed in every cell, hash-locked with the rest",
    ),
    Key(
        "matrix",
        "requirements",
        "path, or a table {file, extras, without}",
        "none",
        '"requirements.txt"',
        "the project's own dependency list, read again by every command: a requirements file with its -r/-c "
        'includes, { file = "pyproject.toml", extras = ["train"] } ([project] dependencies and groups), or '
        '"setup.py"/"setup.cfg" (its build backend\'s metadata, read in a container of the base, network off). Its '
        "torch, transformers and Python requirements must allow every cell; the rest joins packages, one "
        "requirement per name; `without` leaves names out; a change to it makes locks stale",
    ),
    Key(
        "matrix",
        "from_source",
        "list of package names",
        "none",
        '["deepspeed"]',
        "packages with no wheel for the cell, built once from their source archive (network off) and locked",
    ),
    Key(
        "matrix",
        "platforms",
        "list of platforms",
        '["linux/amd64"]',
        '["linux/amd64", "linux/arm64"]',
        "each cell on each (arm64: Grace hosts); an include or exclude entry may name one: platform = ...",
    ),
    Key(
        "matrix",
        "exclude",
        "list of tables",
        "none",
        '[{cuda = "12.8", torch = "2.5.1"}]',
        "drops the product's cells that match every key an entry gives (cuda, torch, transformers, python, platform)",
    ),
    Key(
        "matrix",
        "include",
        "list of tables",
        "none",
        '[{cuda = "12.9", torch = "2.8.0", transformers = "5.9.0", python = "3.12"}]',
        "adds one whole cell (the four axes; optionally platform, and packages in place of [matrix] packages); "
        "it replaces a product cell with the same axes, and exclude never drops it",
    ),
    # ---- [targets]: the fleet
    Key(
        "targets",
        "gpus",
        "list of GPU names",
        "not checked",
        '["A100", "H100"]',
        "a cell whose torch build lacks one of their architectures is excluded (`imagekit explain --help` names "
        "the GPUs)",
    ),
    Key(
        "targets",
        "archs",
        "list of compute capabilities",
        "not checked",
        '["sm_80", "sm_90"]',
        "the same, by architecture",
    ),
    Key(
        "targets",
        "min_driver",
        "driver version",
        "not checked",
        '"580.65.06"',
        "the hosts' oldest NVIDIA driver: a cell whose CUDA needs a newer one is excluded",
    ),
    # ---- [image]: what each image holds beyond its lock, and where it is published
    Key(
        "image",
        "repository",
        "REGISTRY/REPO",
        '"127.0.0.1:5000/imagekit/train"',
        '"ghcr.io/acme/train"',
        "where `imagekit build --push` publishes",
    ),
    Key(
        "image",
        "jupyter",
        "true or false",
        "false",
        "true",
        "JupyterLab locked into the image, started when JUPYTER_PASSWORD is set",
    ),
    Key(
        "image",
        "compiler",
        "true or false",
        "true",
        "true",
        "gcc/g++ and the Python headers, so torch.compile works (false: about 200 MB less, no torch.compile)",
    ),
    Key(
        "image",
        "cuda_toolkit",
        "true or false",
        "false",
        "false",
        "nvcc, the CUDA headers and ninja from NVIDIA's pinned wheels, CUDA_HOME set, so extensions compile at run "
        "time (CUDA 13 cells)",
    ),
    Key(
        "image",
        "size_budget",
        'growth ("+10%") or a size ("6.5 GB")',
        '"+10%"',
        '"6.5 GB"',
        "an image over it is refused: a size, or growth over the cell's last release",
    ),
    Key(
        "image",
        "copy",
        "folder, or a table {from, to, exclude}",
        "none",
        '"."',
        "the project's folder as the image's last layer in /opt/app (a code change pushes it alone); "
        '{ from = "src", to = "/opt/app", exclude = ["data/", "**/*.ckpt"] } (.dockerignore patterns)',
    ),
    Key(
        "image",
        "command",
        "list of strings",
        "none",
        '["python", "/opt/app/train.py"]',
        "the default command: a container started without one runs it (job mode)",
    ),
    Key(
        "image",
        "apt",
        "list of Debian package names",
        "none",
        '["git-lfs", "ffmpeg"]',
        "Debian packages over the base, their .debs pinned by sha256 in each cell's lock",
    ),
    Key(
        "image",
        "install",
        "folder of the copied project",
        "none",
        '"."',
        "the project's own wheel, built offline in the cell's base and installed without its dependencies (the "
        "lock must hold them)",
        needs=("copy",),
    ),
    Key(
        "image",
        "skip_imports",
        "list of top-level module names",
        "none",
        '["recipes"]',
        "modules of the project's wheel the self-test's project-imports leaves out (one that raises on import on "
        "purpose, say)",
        needs=("copy", "install"),
    ),
    Key(
        "image",
        "env",
        "table of strings",
        "none",
        '{ WANDB_PROJECT = "sft" }',
        "variables in the image's config (not PATH, LD_*, NVIDIA_*, IMAGEKIT_*; no secrets: give those when the "
        "pod starts)",
    ),
    Key(
        "image",
        "smoke",
        "list of shell commands",
        "none",
        "[\"python -c 'import mypkg'\"]",
        "run by the self-test in the image after its own checks: one failing blocks the publish",
    ),
    # ---- [lock]: private indexes
    Key(
        "lock",
        "index_url",
        "URL",
        "PyPI",
        '"https://pypi.org/simple"',
        "the index the lock resolves against (URL only: credentials come from IMAGEKIT_INDEX_USER/_PASSWORD or "
        "~/.netrc)",
    ),
    Key(
        "lock",
        "extra_index_urls",
        "list of URLs",
        "none",
        '["https://pkgs.example.com/simple"]',
        "more indexes, each bound to its origin's credentials",
    ),
    # ---- [bases."3.11"]: a base of your own, per Python version
    Key(
        'bases."3.11"',
        "reference",
        "image reference by digest",
        "imagekit's bootstrapped Debian base",
        '"registry.example.com/base/python@sha256:<64 hex digits>"',
        "FROM this base for this Python, by digest",
    ),
    Key('bases."3.11"', "glibc", "version", "none", '"2.36"', "the base's glibc (torch wheels need a minimum)"),
    Key(
        'bases."3.11"',
        "python",
        "absolute path",
        "/usr/bin/python3.X",
        '"/usr/local/bin/python3.11"',
        "its interpreter, when not /usr/bin/python3.X",
    ),
)

#: A section's heading in the reference and init's file: what the section is for.
NOTES = {
    "matrix": "Cells: every combination of the four axes (the product), minus the exclude entries, plus the "
    "include entries, as in a GitHub Actions matrix; the compatibility rules then drop what cannot work "
    "(`imagekit matrix --explain`).",
    "targets": "The fleet the images must run on (unset: not checked).",
    "image": "What each image holds beyond its lock, and where it is published.",
    "lock": "Private package indexes.",
    'bases."3.11"': "Build FROM your registry's base instead of the Debian base imagekit bootstraps, per Python "
    "version.",
}
#: The keys of an entry of a table inside a key (not rows of their own: their key's row describes them).
ENTRY_KEYS = {
    "matrix.include": ("cuda", "torch", "transformers", "python", "platform", "packages"),
    "matrix.exclude": ("cuda", "torch", "transformers", "python", "platform"),
    "image.copy": ("from", "to", "exclude"),
}


def section_of(key: Key) -> str:
    """The file's table a key belongs to (``bases."3.11"`` is one of ``bases``)."""
    return key.section.split(".", 1)[0]


def names(section: str) -> tuple[str, ...]:
    """The keys of ``section`` (``bases`` for each base's table), in the table's order."""
    return tuple(k.name for k in KEYS if section_of(k) == section)


def key(path: str) -> Key:
    """The row of ``section.name``."""
    for k in KEYS:
        if k.path == path:
            return k
    raise KeyError(path)


_COLUMN = 37  # where the comment beside a value starts


def line(k: Key, value: str | None = None, *, commented: bool = False, width: int = 118) -> list[str]:
    """``k`` as the file writes it, with what it does as a comment beside it (wrapped, aligned under itself):
    ``value`` when given, else its example, commented out when ``commented``."""
    assignment = f"{'# ' if commented else ''}{k.name} = {value if value is not None else k.example}"
    # "(default: X)" is kept on one line: a comment line starting "# [" would read as a table's heading
    doc = k.doc if k.default == "none" else f"{k.doc} (default:\u00a0{k.default})"

    def wrap(text: str, width: int) -> list[str]:
        lines = textwrap.wrap(text, width=width, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)
        return [line.replace("\u00a0", " ") for line in lines]

    if len(assignment) > _COLUMN - 2:  # a long value: what it does above it, then the value on its own line
        return [*wrap(doc, width), assignment]
    wrapped = wrap(doc, width - _COLUMN)
    return [f"{assignment.ljust(_COLUMN)}{wrapped[0]}", *(" " * _COLUMN + rest for rest in wrapped[1:])]


def reference() -> str:
    """Every key, by section: what ``imagekit matrix --help`` shows (each paragraph kept as written)."""
    out: list[str] = []
    for section in SECTIONS:
        rows = [k for k in KEYS if section_of(k) == section]
        heading = rows[0].section
        out += ["\b", f"[{heading}]"]
        for k in rows:
            out += line(k)
    return "\n".join(out)


def table_markdown() -> str:
    """The schema as a Markdown table (docs)."""
    rows = ["| key | type | default | what it does | since |", "|---|---|---|---|---|"]
    for k in KEYS:
        doc = k.doc.replace("|", "\\|")
        rows.append(f"| `[{k.section}] {k.name}` | {k.type} | {k.default} | {doc} | {k.since} |")
    return "\n".join(rows)
