"""What the far side sends — a pod, a registry, a package index, a release record, a provider's API — is data to
check before it reaches a file, a path, a header, a command line or the terminal. Pure.

Each reader here either returns a value of the expected shape, size and characters, or raises
:class:`UntrustedData` (a ``ValueError``) saying what was wrong without echoing the hostile bytes; the effect
that received the data turns it into the command's error (usually exit 3: the environment failed).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from imagekit.in_image.facts import json_depth

MAX_JSON_DEPTH = 64  # no API imagekit reads nests deeper than about 8; 64 is far below Python's recursion limit
MAX_JSON_BYTES = 64 << 20
MAX_TEXT = 300  # characters of a far side's message shown in an error

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}", re.ASCII)
_HEX64 = re.compile(r"[0-9a-f]{64}", re.ASCII)
# C0 and C1 controls (tab and newline are dealt with by the caller's choice), DEL, and the Unicode format characters
# that reorder or hide text on a terminal (bidi overrides and isolates, zero-width joiners).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
CONTROL = _CONTROL  # what podwire.clean strips from a terminal's text (tab and newline are kept)
_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?"  # two-byte and nF sequences, or a lone ESC
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
)
_HEADER_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?", re.ASCII)


class UntrustedData(ValueError):
    """Data from the far side that is not of the expected shape, size or characters."""


def printable(text: object, limit: int = MAX_TEXT, *, lines: bool = False) -> str:
    """``text`` as it may be shown on the user's terminal: escape sequences and control characters (C0, C1, DEL,
    bidi overrides) removed, newlines kept only with ``lines`` (else each run of whitespace is one space, so a far
    side cannot start a spoofed ``error:`` line), at most ``limit`` characters (an ellipsis marks the cut)."""
    if not isinstance(text, str):
        text = repr(text) if not isinstance(text, bytes) else text.decode("utf-8", "replace")
    text = _ESCAPE.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if lines:
        text = _CONTROL.sub("", text.replace("\t", "    "))
    else:
        text = " ".join(_CONTROL.sub("", text.replace("\n", " ").replace("\t", " ")).split())
    text = "".join(ch for ch in text if unicodedata.category(ch) not in ("Cs", "Co", "Cn") or ch == "\n")
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def load_json(data: bytes | str, what: str, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON from the far side: at most ``max_bytes``, nested at most ``max_depth`` deep, numbers of reasonable size
    (a 5,000-digit integer would make every later ``int()`` or ``str()`` fail), no NaN or Infinity."""
    if len(data) > max_bytes:
        raise UntrustedData(f"{what} is larger than {max_bytes} bytes")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise UntrustedData(f"{what} is not UTF-8") from None

    def _number(text: str) -> int | float:
        if len(text) > 40:
            raise UntrustedData(f"{what} has a number of {len(text)} digits")
        return float(text) if any(c in text for c in ".eE") else int(text)

    def _constant(name: str) -> Any:
        raise UntrustedData(f"{what} has {name}, which JSON does not allow")

    depth = json_depth(data)
    if depth > max_depth:
        raise UntrustedData(f"{what} is nested {depth} levels deep (at most {max_depth})")
    try:
        return json.loads(data, parse_int=_number, parse_float=_number, parse_constant=_constant)
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise UntrustedData(f"{what} is nested too deep") from None
    except json.JSONDecodeError as exc:
        raise UntrustedData(f"{what} is not JSON ({exc.msg} at line {exc.lineno})") from None


MAX_TOML_DEPTH = 32  # tables and arrays within each other: a project's files nest a handful; tomllib recurses per level


def load_toml(text: str, what: str, *, max_chars: int = 4 << 20, max_depth: int = MAX_TOML_DEPTH) -> dict:
    """TOML another party wrote (a project's pyproject.toml, a matrix file, an archive's pyproject.toml): at most
    ``max_chars``, nested at most ``max_depth`` deep (tomllib recurses once per nested array or inline table, so a
    few thousand ``[`` end in RecursionError, and a document it did parse may still be too deep for what reads it
    next). A malformed one is :class:`UntrustedData` saying where, never the traceback."""
    import tomllib

    if len(text) > max_chars:
        raise UntrustedData(f"{what} is larger than {max_chars} characters")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UntrustedData(f"{what} is not valid TOML: {printable(str(exc), 200)}") from None
    except RecursionError:
        raise UntrustedData(f"{what} is nested too deep (at most {max_depth} levels of tables and arrays)") from None
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:  # without recursion: the depth is what is checked
        value, depth = stack.pop()
        if depth > max_depth:
            raise UntrustedData(f"{what} is nested more than {max_depth} levels of tables and arrays deep")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return doc


def digest(value: object, what: str = "digest") -> str:
    """A content digest as registries and imagekit write it: ``sha256:`` and 64 lower-case hex digits, nothing
    else (a digest becomes a URL path segment: ``../../admin`` must never get there)."""
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise UntrustedData(f"{what} {printable(value, 80)!r} is not a sha256 digest (sha256:<64 hex digits>)")
    return value


def is_digest(value: object) -> bool:
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


def sha256_hex(value: object, what: str = "sha256") -> str:
    """64 lower-case hex digits."""
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise UntrustedData(f"{what} {printable(value, 80)!r} is not a sha256 (64 hex digits)")
    return value


def header_value(value: str, what: str) -> str:
    """A value that may go into an HTTP header: visible ASCII and inner spaces only. A CR or LF would split the
    header (and httpx would quote the secret in its error); a non-ASCII one cannot be encoded."""
    if not _HEADER_VALUE.fullmatch(value):
        bad = next((c for c in value if not 0x20 <= ord(c) <= 0x7E), None) if value else None
        why = "is empty" if not value else ("has surrounding spaces" if bad is None else f"holds {_char_name(bad)}")
        raise UntrustedData(f"{what} {why}")
    return value


def _char_name(ch: str) -> str:
    names = {"\r": "a carriage return (CR)", "\n": "a line feed (LF)", "\t": "a tab", "\x00": "a NUL"}
    return names.get(ch, f"the character U+{ord(ch):04X}")


def char_name(ch: str) -> str:
    """A character named for an error message (so the message never has to show it)."""
    return _char_name(ch)


def relative_member(name: str) -> PurePosixPath:
    """A path inside an archive or a listing that stays inside its destination: relative, no ``..``, no empty or
    control-character names. Returns it normalised (``./a//b`` -> ``a/b``)."""
    if not isinstance(name, str) or not name or re.search(r"[\x00-\x1f]", name) or _CONTROL.search(name):
        raise UntrustedData(f"archive member {printable(name, 80)!r} has an empty name or a control character")
    if name.startswith("/") or re.match(r"[A-Za-z]:[\\/]", name) or "\\" in name:
        raise UntrustedData(f"archive member {printable(name, 80)!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise UntrustedData(f"archive member {printable(name, 80)!r} leaves the destination (..)")
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


@dataclass(frozen=True)
class TreeMember:
    """One checked member of an archive of a folder: where it goes, what it is, and the mode it gets."""

    path: PurePosixPath
    kind: str  # file | dir | symlink | hardlink
    mode: int  # 0o644 or 0o755 (files, dirs); no setuid, setgid, sticky or group/other write
    link: str = ""  # symlink: its (relative) target as written; hardlink: the member it repeats
    source: Any = None  # what the caller read it from (a tarfile.TarInfo)


class LinkLeaves(UntrustedData):
    """A symlink in the archive points outside the folder (absolute, or up through ``..``)."""

    def __init__(self, message: str, first: str, count: int) -> None:
        super().__init__(message)
        self.first, self.count = first, count


_KINDS = {b"0": "file", b"\0": "file", b"7": "file", b"5": "dir", b"2": "symlink", b"1": "hardlink"}
_SPECIAL = {b"3": "a character device", b"4": "a block device", b"6": "a FIFO"}
MAX_LINK_HOPS = 40  # as the kernel's ELOOP limit


def tree_members(members: Iterable[Any]) -> list[TreeMember]:
    """The members of a tar of a folder (``tarfile.TarInfo``s), checked as a whole before anything is written: every
    name relative and inside (:func:`relative_member`), each once; only files, folders, symlinks and hardlinks; no
    member inside a symlink or a file (so nothing is ever written through a link, whatever the links are); every
    symlink relative and, followed through the archive's own links, inside the folder (else :class:`LinkLeaves`);
    every hardlink to a file of the archive listed before it. Modes made safe. The root entry (``.``) is dropped."""
    out: list[TreeMember] = []
    seen: dict[PurePosixPath, TreeMember] = {}
    for info in members:
        path = relative_member(info.name)
        kind = _KINDS.get(info.type)
        if kind is None:
            what = _SPECIAL.get(info.type, f"of the unknown type {printable(info.type, 10)!r}")
            raise UntrustedData(f"archive member {printable(str(path), 120)!r} is {what}")
        if path == PurePosixPath("."):
            if kind != "dir":
                raise UntrustedData("the archive's root entry is not a folder")
            continue
        if path in seen:
            raise UntrustedData(f"archive member {printable(str(path), 120)!r} is in the archive twice")
        link = ""
        if kind in ("symlink", "hardlink"):
            link = info.linkname
            if not isinstance(link, str) or not link or _CONTROL.search(link) or re.search(r"[\x00-\x1f]", link):
                raise UntrustedData(f"link {printable(str(path), 120)!r} has an empty target or a control character")
        if kind == "hardlink":
            target = relative_member(link)
            if seen.get(target) is None or seen[target].kind != "file":
                raise UntrustedData(
                    f"hardlink {printable(str(path), 120)!r} does not repeat a file listed before it in the archive"
                )
            link = str(target)
        executable = kind == "dir" or (kind != "symlink" and bool(info.mode & 0o111))
        member = TreeMember(path, kind, 0o755 if executable else 0o644, link, info)
        seen[path] = member
        out.append(member)
    for member in out:
        for parent in member.path.parents:
            if parent in seen and seen[parent].kind != "dir":
                raise UntrustedData(
                    f"archive member {printable(str(member.path), 120)!r} lies inside "
                    f"{'a link' if seen[parent].kind == 'symlink' else 'a file'} ({printable(str(parent), 120)!r})"
                )
    links = {m.path.parts: m.link for m in out if m.kind == "symlink"}
    leaving = [m for m in out if m.kind == "symlink" and _resolve(list(m.path.parts[:-1]), m.link, links) is None]
    if leaving:
        first = f"{leaving[0].path} -> {leaving[0].link}"
        more = f" (and {len(leaving) - 1} more)" if len(leaving) > 1 else ""
        raise LinkLeaves(f"the link {printable(first, 200)}{more} points outside the folder", first, len(leaving))
    return out


def _resolve(base: list[str], target: str, links: dict[tuple[str, ...], str], hops: list[int] | None = None):
    """``target`` (a link's text, relative to the folder ``base``) followed through ``links`` as the kernel would
    in a folder holding only the archive: the parts of where it ends, or None when it leaves the folder (or loops)."""
    hops = hops if hops is not None else [0]
    if target.startswith("/"):
        return None
    at = list(base)
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not at:
                return None
            at.pop()
            continue
        at.append(part)
        if tuple(at) in links:
            hops[0] += 1
            if hops[0] > MAX_LINK_HOPS:
                return None
            resolved = _resolve(at[:-1], links[tuple(at)], links, hops)
            if resolved is None:
                return None
            at = resolved
    return at


def bounded_text(value: object, what: str, limit: int = 256) -> str:
    """A short single-line string of printable characters (a version, a tag, a name a far side gives)."""
    if not isinstance(value, str) or not value or len(value) > limit or value != printable(value, limit):
        raise UntrustedData(f"{what} {printable(value, 80)!r} is not a short single-line text")
    return value


# PEP 427: {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl, each part of letters, digits, `_` `.` `+` `!`
# (compressed tag sets join with `.`). No `/`, `\`, space or control character: the name becomes a file name.
_WHEEL_FILENAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.+!]*)(?:-[A-Za-z0-9_.+!]+){4,5}\.whl", re.ASCII)
MAX_FILENAME = 255  # a file name longer than this cannot be created on Linux


def wheel_filename(value: object, what: str = "wheel file name") -> str:
    """A wheel's file name as an index lists it, safe to use as one path component: the PEP 427 grammar, at most
    255 characters, never ``.`` or ``..`` (a name like ``any.x/../../evil.whl`` that `packaging` may accept as a
    tag set is refused here)."""
    if not isinstance(value, str) or len(value) > MAX_FILENAME or not _WHEEL_FILENAME.fullmatch(value):
        raise UntrustedData(f"{what} {printable(value, 80)!r} is not a wheel file name")
    return value


def sha256_lenient(value: object) -> str:
    """A sha256 as an index writes it (hex digits of either case), lower-cased; "" for anything else, which
    matches no hash a lock allows."""
    if isinstance(value, str) and len(value) == 64 and _HEX64.fullmatch(value.lower()):
        return value.lower()
    return ""
