"""Debian version comparison, as dpkg does it (deb-version(7), dpkg's lib/dpkg/version.c): epoch, then upstream
version and revision each compared by alternating runs of non-digits (letters sort before other characters, `~`
before everything, even the end) and numbers. Pure."""

from __future__ import annotations

import re

_VERSION = re.compile(r"(?:(?P<epoch>[0-9]+):)?(?P<upstream>[A-Za-z0-9.+~:-]+?)(?:-(?P<revision>[A-Za-z0-9.+~]+))?")


def split(version: str) -> tuple[int, str, str]:
    """(epoch, upstream, revision); a string that is no Debian version raises ValueError."""
    match = _VERSION.fullmatch(version.strip())
    if not match or not match["upstream"][0].isdigit():
        raise ValueError(f"not a Debian version: {version[:80]!r}")
    return int(match["epoch"] or 0), match["upstream"], match["revision"] or ""


def _order(c: str) -> int:
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    if c == "~":
        return -1
    return ord(c) + 256 if c else 0


def _compare_part(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return ac - bc
            i, j = i + 1, j + 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        first = 0
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first:
                first = ord(a[i]) - ord(b[j])
            i, j = i + 1, j + 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first:
            return first
    return 0


def compare(a: str, b: str) -> int:
    """<0, 0 or >0 as Debian version ``a`` sorts before, with or after ``b``."""
    ea, ua, ra = split(a)
    eb, ub, rb = split(b)
    if ea != eb:
        return ea - eb
    return _compare_part(ua, ub) or _compare_part(ra, rb)
