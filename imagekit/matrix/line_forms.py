"""The forms a requirements line takes besides PEP 508 (pip's own), each read into what imagekit does with it. Pure.

| line | becomes |
|---|---|
| ``git+https://host/org/repo@<commit>#egg=name`` | ``name @ git+https://host/org/repo@<commit>`` |
| ``git+https://host/org/repo@<commit>`` | the same, the name read from the commit's metadata (``vcs``) |
| ``https://host/name-1.0-py3-none-any.whl`` | ``name @ https://...whl`` (the name from the wheel's file name) |
| ``./wheels/name-1.0-py3-none-any.whl`` | ``name @ file:wheels/name-1.0-py3-none-any.whl`` |
| ``.``, ``./sub``, ``-e .``, ``-e ./sub`` | the project's folder to install (``local``: `[image] install`) |
| ``--index-url URL`` / ``--extra-index-url URL`` | an index the lock uses (``index`` / ``extra-index``) |

Paths are relative to the project's folder (the matrix file's, where pip is run from) and stay inside it.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from imagekit.errors import UsageError
from imagekit.locking import vcs_refs
from imagekit.trust import untrusted, validate
from imagekit.trust.redact import redact_value

_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", re.ASCII)
_URL_START = re.compile(r"(?:https?|file):", re.ASCII)
_LOCAL_START = re.compile(r"(?:\.\.?(?:/|\[|$)|/|~)", re.ASCII)
_MARKER_SEP = re.compile(r"\s*;\s+|;\s*(?=[a-z_]+\s*(?:[<>=!~]|in\b|not\b))")
_NOT_A_PATH = re.compile(r"[\s;<>=!~@]|://")
_ARCHIVES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip", ".tar")
SOURCE_HINT = (
    "an archive is built from source: name the package on an index (and in [matrix] from_source to build it once), "
    "or name a wheel by URL with its sha256 (`name @ https://...whl#sha256=...`)"
)


@dataclass(frozen=True)
class Index:
    """An index a requirements file names: the main one (``--index-url``) or another (``--extra-index-url``)."""

    url: str
    main: bool
    where: str


@dataclass(frozen=True)
class Local:
    """A folder of the project a requirements file installs (``.``, ``-e ./sub``), relative to the project's
    folder (where pip is run from), inside it."""

    folder: str
    where: str
    editable: bool = False


@dataclass(frozen=True)
class Nameless:
    """A VCS line without a name (``git+https://host/org/repo@<commit>``), read into ``name @ url`` once its
    metadata says the name (services.requirement_forms)."""

    url: str
    marker: str
    where: str


def one_main_index(indexes: list[Index]) -> None:
    mains = [i for i in indexes if i.main]
    other = next((i for i in mains if i.url != mains[0].url), None)
    if other is not None:
        raise UsageError(
            f"{other.where}: --index-url {redact_value(other.url)} replaces {redact_value(mains[0].url)} "
            f"({mains[0].where}): a lock has one main index",
            "keep one --index-url; name the others with --extra-index-url",
        )


def swallowed(first: int) -> str:
    return (
        f"joined into the comment of line {first}, which ends in a backslash: pip reads nothing of it, nor does "
        "imagekit (end the comment without one to read the line)"
    )


def form(text: str, where: str) -> tuple[str, str]:
    """``(kind, value)`` of a line that is no option: ``("req", a PEP 508 text to check)``, ``("vcs", "url[ ;
    marker]")`` (a VCS URL without a name) or ``("local", folder)``."""
    if vcs_refs.is_vcs(text):
        return vcs(text, where)
    if _URL_START.match(text):
        url, marker = _split_marker(text)
        return "req", _named_url(url, marker, where)
    if _looks_local(text):
        return local(text, where)
    return "req", text


def editable(value: str, where: str) -> tuple[str, str]:
    """``-e VALUE``: a folder of the project (installed as `[image] install` installs it: a wheel, not editable), or
    a VCS URL (a wheel built from the commit)."""
    if not value:
        raise UsageError(f"{where}: -e names nothing", "write -e . (the project) or -e ./sub (a package of it)")
    if vcs_refs.is_vcs(value):
        return vcs(value, where)
    kind, folder = local(value, where, editable=True)
    return ("editable" if kind == "local" else kind), folder


def vcs(text: str, where: str) -> tuple[str, str]:
    """A VCS line: with ``#egg=name``, the requirement ``name @ url``; without, ``("vcs", url)`` (checked: git over
    https, no credential) whose name its metadata gives."""
    url, marker = _split_marker(text)
    fragment = url.partition("#")[2]
    eggs = [item.partition("=")[2] for item in fragment.split("&") if item.startswith("egg=")] if fragment else []
    if eggs:
        egg = eggs[0]
        if not _NAME.fullmatch(egg):
            raise UsageError(
                f"{where}: #egg={untrusted.printable(egg, 80)} is not a distribution name",
                "write #egg=NAME (the package's name, without extras or a version), or `NAME @ git+https://...`",
            )
        return "req", f"{canonicalize_name(egg)} @ {url}" + (f" ; {marker}" if marker else "")
    try:
        vcs_refs.parse("(unnamed)", url)
    except vcs_refs.NotARef as exc:
        raise UsageError(f"{where}: {exc}", exc.hint) from None
    return "vcs", url + (f" ; {marker}" if marker else "")


def _split_marker(text: str) -> tuple[str, str]:
    """pip's ``URL ; marker`` (a URL's own ``;`` is kept: the separator is followed by a space or a marker name)."""
    found = _MARKER_SEP.search(text)
    if found is None:
        return text, ""
    return text[: found.start()].strip(), text[found.end() :].strip()


def _named_url(url: str, marker: str, where: str) -> str:
    """A URL line without a name: a wheel's file name says its name (``name @ url``); anything else is refused."""
    path = url.split("#", 1)[0].split("?", 1)[0]
    filename = posixpath.basename(path)
    if filename.endswith(".whl"):
        name = _wheel_name(filename, where)
        return f"{name} @ {url}" + (f" ; {marker}" if marker else "")
    if filename.endswith(_ARCHIVES):
        raise UsageError(f"{where}: {untrusted.printable(redact_value(url), 200)} is a source archive", SOURCE_HINT)
    raise UsageError(
        f"{where}: {untrusted.printable(redact_value(url), 200)} names no wheel",
        "a URL line must end in the wheel's file name (NAME-VERSION-TAGS.whl); or write `NAME @ URL`",
    )


def _looks_local(text: str) -> bool:
    """pip's test: a path when it starts like one, or holds a ``/`` and nothing a requirement has (a version, a
    marker, ``@``)."""
    return _LOCAL_START.match(text) is not None or ("/" in text and _NOT_A_PATH.search(text) is None)


def local(text: str, where: str, *, editable: bool = False) -> tuple[str, str]:
    """A path line: a wheel of the project (``name @ file:...``), else a folder of it to install, normalised;
    refused when absolute, under ``~``, outside the project, or with extras (they choose groups of a declaration)."""
    shown = untrusted.printable(text, 200)
    path, extras = text, ""
    if text.endswith("]") and "[" in text:
        path, _, extras = text[:-1].partition("[")
    if path.startswith("~") or posixpath.isabs(path):
        raise UsageError(
            f"{where}: {shown} is an absolute path",
            "name a folder of the project relative to its folder (the matrix file's), such as . or ./pkg",
        )
    if "\\" in path or not path.isprintable():
        raise UsageError(f"{where}: {shown} is not a path imagekit reads", "write a path with forward slashes")
    norm = posixpath.normpath(path)
    if norm == ".." or norm.startswith("../"):
        raise UsageError(
            f"{where}: {shown} is outside the project (the matrix file's folder)",
            "install a folder inside the project only: move the matrix file up to reach it",
        )
    if norm.endswith(".whl"):
        if editable or extras:
            raise UsageError(f"{where}: {shown}: a wheel is installed as it is", "drop -e and the extras")
        return "req", f"{_wheel_name(posixpath.basename(norm), where)} @ file:{norm}"
    if norm.endswith(_ARCHIVES):
        raise UsageError(f"{where}: {shown} is a source archive", SOURCE_HINT)
    if extras:
        raise UsageError(
            f"{where}: {shown} installs the project with extras [{untrusted.printable(extras, 80)}]",
            'name the declaration itself: [matrix] requirements = { file = "pyproject.toml", extras = [...] } '
            "reads those groups; [image] install installs the project's own wheel",
        )
    return "local", norm


def _wheel_name(filename: str, where: str) -> str:
    try:
        return str(parse_wheel_filename(filename)[0])
    except InvalidWheelFilename as exc:
        raise UsageError(f"{where}: {untrusted.printable(filename, 120)} is not a wheel's name ({exc})",
                         "name the wheel file as pip does: NAME-VERSION-PYTHON-ABI-PLATFORM.whl") from None  # fmt: skip


def index(option: str, value: str, where: str) -> str:
    """An index URL a requirements file names: http(s), and never a credential (the file is committed; they come
    from IMAGEKIT_INDEX_USER / IMAGEKIT_INDEX_PASSWORD or a netrc, sent to that index's host only)."""
    if not value:
        raise UsageError(f"{where}: {option} names no URL", f"write {option} https://host/simple")
    try:
        url = validate.index_url(value, option)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc.message}", exc.hint) from None
    if "@" in url.split("//", 1)[-1].split("/", 1)[0]:
        raise UsageError(
            f"{where}: {option} {untrusted.printable(redact_value(url), 200)} carries a credential, which the "
            "committed file and every lock would keep",
            "give the URL alone; credentials come from IMAGEKIT_INDEX_USER / IMAGEKIT_INDEX_PASSWORD or ~/.netrc, "
            "sent to that index's host only",
        )
    return url
