"""What a setup.py's or setup.cfg's build backend answers for its dependencies (services/locks/project_metadata.py
runs the
hook in a container and hands its answer here as text): core metadata, or setuptools' egg-info. Pure; every
requirement, group name, marker and version is checked as project_deps checks a requirements file's."""

from __future__ import annotations

from email.message import Message
from email.parser import HeaderParser

from packaging.utils import canonicalize_name

from imagekit.matrix import project_deps as deps
from imagekit.matrix.project_deps import Declared, DepsSource, ProjectDeps
from imagekit.trust import untrusted


def from_metadata(text: str, source: DepsSource, files: tuple[str, ...]) -> ProjectDeps:
    """Core metadata (a METADATA file): ``Requires-Dist`` (its ``extra == "g"`` markers: the groups),
    ``Requires-Python``, ``Provides-Extra``."""
    where = f"{source.file} (its build backend's metadata)"
    message = HeaderParser().parsestr(text)
    name = canonicalize_name(message.get("Name", "") or "")
    declared = [Declared(deps.checked_requirement(r, where), where) for r in message.get_all("Requires-Dist") or []]
    groups = [deps.group_name(g, f"{where}: Provides-Extra") for g in message.get_all("Provides-Extra") or []]
    return deps.chosen_groups(source, declared, _requires_python(message, where), name, groups, files)


def from_egg_info(pkg_info: str, requires: str, source: DepsSource, files: tuple[str, ...]) -> ProjectDeps:
    """setuptools' egg-info (PKG-INFO and requires.txt, what its metadata hook writes before it converts them): each
    ``[group:marker]`` section of requires.txt becomes the markers of its requirements (a section whose group is not
    a name, or whose marker is not one, is refused)."""
    where = f"{source.file} (its build backend's metadata)"
    message = HeaderParser().parsestr(pkg_info)
    declared: list[Declared] = []
    groups: list[str] = []
    section = ""
    for raw in requires.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            group, _, marker = section.partition(":")
            at = f"{where}: requires.txt [{untrusted.printable(section, 80)}]"
            if group:
                group = deps.group_name(group, at)
                groups += [group] if group not in groups else []
            if marker:
                deps.checked_requirement(f"x ; {marker}", at)
            continue
        group, _, marker = section.partition(":")
        text = deps.checked_requirement(line, where)
        if marker:
            text = deps.checked_requirement(f"{text.partition(' ; ')[0]} ; {marker}", where)
        declared.append(Declared(deps.with_extra(text, canonicalize_name(group)) if group else text, where))
    name = canonicalize_name(message.get("Name", "") or "")
    return deps.chosen_groups(source, declared, _requires_python(message, where), name, groups, files)


def _requires_python(message: Message, where: str) -> tuple[str, str] | None:
    rp = message.get("Requires-Python")
    return (deps.python_specifier(rp, f"{where}: Requires-Python"), f"{where}: Requires-Python") if rp else None
