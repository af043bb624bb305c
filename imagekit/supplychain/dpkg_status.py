"""dpkg's status file (/var/lib/dpkg/status) as the packages it says are installed. Pure; the file comes out of an
image, so it is read as hostile data: bounded, and every field checked before it names anything."""

from __future__ import annotations

import re
from dataclasses import dataclass

from imagekit.errors import CheckFailed

MAX_BYTES = 32 << 20  # a full desktop's status file is a few MB
MAX_PACKAGES = 20_000
_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]{0,99}")
_VERSION = re.compile(r"(?:[0-9]{1,10}:)?[A-Za-z0-9.+~-]{1,200}")
_ARCH = re.compile(r"[a-z0-9-]{1,32}")
_SOURCE = re.compile(r"([a-z0-9][a-z0-9+.-]{0,99})(?: \(((?:[0-9]{1,10}:)?[A-Za-z0-9.+~-]{1,200})\))?")


@dataclass(frozen=True, order=True)
class DebPackage:
    name: str
    version: str
    architecture: str
    source: str  # the source package (what Debian's security trackers and OSV's Debian records name)
    source_version: str


def _stanzas(text: str):
    fields: dict[str, str] = {}
    last = ""
    for line in text.split("\n"):
        if not line.strip():
            if fields:
                yield fields
            fields, last = {}, ""
        elif line[0] in " \t":
            if last == "Source":  # no other continued field is read
                fields[last] += line
        else:
            key, sep, value = line.partition(":")
            if sep:
                last = key
                fields[key] = value.strip()
    if fields:
        yield fields


def parse(data: bytes, what: str = "the image's /var/lib/dpkg/status") -> list[DebPackage]:
    """The installed packages, sorted by name and architecture."""
    hint = "the image's package database is damaged or not Debian's; rebuild it from its base"
    if len(data) > MAX_BYTES:
        raise CheckFailed(f"{what} is larger than {MAX_BYTES >> 20} MiB", hint)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")  # descriptions may be in any encoding; the fields read are ASCII
    out: list[DebPackage] = []
    for fields in _stanzas(text):
        if not fields.get("Status", "").endswith(" installed"):
            continue  # removed, half-configured, config-files only: not in the image's filesystem as a package
        name, version, arch = fields.get("Package", ""), fields.get("Version", ""), fields.get("Architecture", "")
        if not (_NAME.fullmatch(name) and _VERSION.fullmatch(version) and _ARCH.fullmatch(arch)):
            raise CheckFailed(
                f"{what}: a package stanza with an invalid name, version or architecture: {name[:100]!r}", hint
            )
        source, source_version = name, version
        if "Source" in fields:
            match = _SOURCE.fullmatch(fields["Source"].strip())
            if not match:
                raise CheckFailed(f"{what}: package {name} names an invalid source {fields['Source'][:100]!r}", hint)
            source, source_version = match[1], match[2] or version
        out.append(DebPackage(name, version, arch, source, source_version))
        if len(out) > MAX_PACKAGES:
            raise CheckFailed(f"{what} lists more than {MAX_PACKAGES} packages", hint)
    return sorted(out)
