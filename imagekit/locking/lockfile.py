"""Lockfiles: pip-tools-format requirements with hashes, split into a torch layer and an app layer. Pure.

A lock is one file, ``lockfiles/<cell id>.txt``: a header (the command that regenerates it, the input hash),
then ``# --- layer: torch ---`` (torch and everything it pulls in) and ``# --- layer: app ---`` (the rest).
Both sections come from one resolution; the whole file installs with
``pip install --require-hashes --no-deps -r``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from imagekit.errors import UsageError
from imagekit.in_image.facts import TORCH_FAMILY as TORCH_FAMILY  # one definition, shared with the image
from imagekit.locking import debs, direct_wheels

TORCH_MARK = "# --- layer: torch ---"
APP_MARK = "# --- layer: app ---"
APT_MARK = "# --- apt: Debian packages over the base (comments to pip) ---"
_PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(?P<version>[A-Za-z0-9.+!_-]+)(?:\s*;\s*(?P<marker>.+?))?\s*(\\)?$"
)
# A direct reference to a wheel (imagekit.locking.direct_wheels): ``name @ https://.../name-version-tags.whl#sha256=...``
_DIRECT = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*@\s*(?P<url>\S+?)(?:\s*;\s*(?P<marker>.+?))?\s*(\\)?$"
)
_HASH = re.compile(r"--hash=(?P<algo>sha256):(?P<digest>[0-9a-f]{64})")
BODY_KEY = "body-sha256"  # the lock's digest of its own pins and hashes
_META = re.compile(r"^# imagekit-(?P<key>[a-z0-9-]+): (?P<value>.*)$")


@dataclass(frozen=True)
class LockEntry:
    name: str  # canonical
    version: str
    hashes: tuple[str, ...]  # "sha256:<hex>", sorted
    via: tuple[str, ...] = ()
    url: str | None = (
        None  # a wheel that is on no index, named by URL (imagekit.locking.direct_wheels); version from its name
    )

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def spec(self) -> str:
        """What the lock says: the pin, or the wheel's URL (with its sha256) for a direct reference."""
        return f"{self.name} @ {self.url}" if self.url else self.pin

    def render(self, via: bool = True, installed: bool = False) -> str:
        """The entry as a lock writes it; ``installed``: as the image installs it, a direct reference as its pin
        (the wheel was fetched and verified on the host and is in the build's wheelhouse)."""
        lines = [(self.pin if installed else self.spec) + (" \\" if self.hashes else "")]
        for i, h in enumerate(self.hashes):
            lines.append(f"    --hash={h}" + (" \\" if i < len(self.hashes) - 1 else ""))
        if self.via and via:
            if len(self.via) == 1:
                lines.append(f"    # via {self.via[0]}")
            else:
                lines.append("    # via")
                lines.extend(f"    #   {v}" for v in self.via)
        return "\n".join(lines)


@dataclass(frozen=True)
class Lock:
    torch: tuple[LockEntry, ...]
    app: tuple[LockEntry, ...]
    meta: dict[str, str] = field(default_factory=dict)  # header "# imagekit-<key>: <value>" lines
    header: tuple[str, ...] = ()  # the free-text header lines (regeneration command)
    body_digest: str | None = field(default=None, compare=False)  # as read from the file ('# imagekit-body-sha256')
    apt: tuple[
        debs.DebPin, ...
    ] = ()  # `[image] apt`: the .debs apt installs over the cell's base (imagekit.locking.debs)

    @property
    def entries(self) -> tuple[LockEntry, ...]:
        return self.torch + self.app

    def pins(self) -> dict[str, str]:
        return {e.name: e.version for e in self.entries}

    @property
    def content_hash(self) -> str:
        """sha256 over what gets installed (pins and hashes of both layers), independent of comments."""
        body = "\n".join(
            f"{layer}:{e.spec}:{','.join(e.hashes)}"
            for layer, part in (("torch", self.torch), ("app", self.app))
            for e in part
        )
        if self.apt:  # absent from locks without apt packages: their digests stay what they were
            body += "\n" + debs.render(self.apt)
        return hashlib.sha256(body.encode()).hexdigest()

    @property
    def short_hash(self) -> str:
        return self.content_hash[:12]

    def layer_text(self, layer: str, via: bool = True) -> str:
        """One layer's pins and hashes; ``via=False`` drops the `# via` annotations (what the image installs from:
        a package that gains a dependent elsewhere must not change the torch layer's input)."""
        entries = self.torch if layer == "torch" else self.app
        return "".join(e.render(via) + "\n" for e in entries)

    def render(self) -> str:
        lines = list(self.header)
        meta = {**self.meta, BODY_KEY: self.content_hash}  # a digest of its own body: hand edits are detected
        lines += [f"# imagekit-{k}: {v}" for k, v in sorted(meta.items())]
        lines += ["#", TORCH_MARK]
        text = "\n".join(lines) + "\n" + self.layer_text("torch") + APP_MARK + "\n" + self.layer_text("app")
        if self.apt:
            text += APT_MARK + "\n" + debs.render(self.apt)
        return text


def parse_requirements(text: str, origin: str = "<lock>", first_line: int = 1) -> list[LockEntry]:
    """Entries of a pip-tools/uv ``requirements.txt`` (pins, hashes, via annotations), in file order.
    ``first_line``: the file line ``text`` starts on, so errors name the line of the whole file."""
    entries: list[LockEntry] = []
    name = version = None
    hashes: list[str] = []
    via: list[str] = []
    in_via = False

    url: str | None = None

    def flush() -> None:
        if name is not None:
            entry = LockEntry(canonicalize_name(name), version or "", tuple(sorted(hashes)), tuple(via), url)
            entries.append(entry)

    for lineno, raw in enumerate(text.splitlines(), first_line):
        line = raw.strip()
        if not line:
            continue
        if raw[:1] not in (" ", "\t") and not line.startswith("#"):
            if line.startswith("-"):
                continue  # options such as --index-url
            m = _PIN.match(line)
            d = None if m else _DIRECT.match(line)
            if not m and not d:
                raise UsageError(
                    f"{origin}:{lineno}: not an exact pin: {line!r}",
                    "locks contain only name==version lines and wheel URLs (name @ https://...whl#sha256=...)",
                )
            flush()
            if len((m or d)["name"]) > 200 or (m and len(m["version"]) > 64):
                raise UsageError(
                    f"{origin}:{lineno}: a name or version of {len(line)} characters",
                    "regenerate it with `imagekit lock`: no distribution's name or version is that long",
                )
            if m:
                name, version, url = m["name"], m["version"], None
            else:
                assert d is not None
                try:
                    wheel = direct_wheels.parse(d["name"], d["url"])
                except direct_wheels.NotAWheel as exc:
                    raise UsageError(f"{origin}:{lineno}: {exc}", exc.hint) from None
                name, version, url = d["name"], wheel.version, f"{wheel.url}#sha256={wheel.sha256}"
            hashes, via, in_via = [], [], False
            continue
        if line.startswith("--hash="):
            hm = _HASH.match(line)
            if not hm:
                raise UsageError(f"{origin}:{lineno}: bad hash {line!r}", "only sha256 hashes are accepted")
            hashes.append(f"sha256:{hm['digest']}")
        elif line.startswith("# via") and name is not None:
            rest = line[len("# via") :].strip()
            in_via = not rest
            if rest:
                via.append(rest)
        elif in_via and line.startswith("#   "):  # a multi-line "# via" list
            via.append(line.lstrip("#").strip())
        elif line.startswith("#") and raw[:1] not in (" ", "\t"):
            in_via = False
    flush()
    return entries


def parse(text: str, origin: str = "<lock>") -> Lock:
    """Parse an imagekit lock (with layer marks)."""
    if TORCH_MARK not in text or APP_MARK not in text:
        raise UsageError(f"{origin}: not an imagekit lock (no layer marks)", "regenerate it with `imagekit lock`")
    head, rest = text.split(TORCH_MARK, 1)
    torch_text, app_text = rest.split(APP_MARK, 1)
    app_text, _, apt_text = app_text.partition(APT_MARK)
    meta, header = {}, []
    for line in head.splitlines():
        m = _META.match(line)
        if m:
            meta[m["key"]] = m["value"]
        else:
            header.append(line)
    if header and header[-1] == "#":
        header.pop()  # the separator render() writes before the torch mark
    digest = meta.pop(BODY_KEY, None)
    torch_line = head.count("\n") + 1  # the torch mark's line; its section text starts on that same line
    app_line = torch_line + torch_text.count("\n")
    apt = []
    for lineno, line in enumerate(apt_text.splitlines(), app_line + app_text.count("\n")):
        if line.strip():
            try:
                apt.append(debs.parse_line(line, f"{origin}:{lineno}"))
            except ValueError as exc:
                raise UsageError(str(exc), "regenerate it with `imagekit lock`") from None
    return Lock(
        tuple(parse_requirements(torch_text, origin, torch_line)),
        tuple(parse_requirements(app_text, origin, app_line)),
        meta,
        tuple(header),
        digest,
        tuple(apt),
    )


def integrity_problems(lock: Lock, text: str) -> list[str]:
    """What makes a lock untrustworthy on its own, each naming the line: a body that does not match its digest
    (a hand-edited pin, even with genuine hashes of another version), pins without hashes, duplicated pins, no pins."""

    def line_of(name: str) -> int:
        # any spelling that canonicalizes to ``name``: Foo_Bar, foo.bar, FOO-bar
        pattern = re.compile("^" + "[-_.]+".join(re.escape(part) for part in name.split("-")) + r"(==|\s*@)", re.I)
        for i, line in enumerate(text.splitlines(), 1):
            if pattern.match(line):
                return i
        return 0

    problems = []
    if not lock.entries:
        problems.append("no pins")
    seen: set[str] = set()
    for e in lock.entries:
        if e.name in seen:
            problems.append(f"line {line_of(e.name)}: {e.name} is pinned twice")
        seen.add(e.name)
        if not e.hashes:
            problems.append(f"line {line_of(e.name)}: {e.pin} has no --hash")
        elif e.url and e.hashes != ("sha256:" + e.url.rsplit("#sha256=", 1)[-1],):
            problems.append(f"line {line_of(e.name)}: {e.name}'s --hash is not the sha256 its URL names")
    debs_seen: set[tuple[str, str]] = set()
    for pin in lock.apt:
        if (pin.name, pin.arch) in debs_seen:
            problems.append(f"apt: {pin.name}:{pin.arch} is pinned twice")
        debs_seen.add((pin.name, pin.arch))
    want = lock.body_digest
    if want is None:
        problems.append(f"no '# imagekit-{BODY_KEY}' line: not written by this imagekit")
    elif want != lock.content_hash:
        problems.append(f"its pins and hashes do not match its {BODY_KEY} (edited by hand)")
    return problems


def torch_closure(entries: list[LockEntry]) -> set[str]:
    """Names reachable from the torch family through the `# via` graph (torch and everything it pulls in)."""
    needed_by: dict[str, set[str]] = {}
    for e in entries:
        for parent in e.via:
            pname = canonicalize_name(parent.split(" ")[0]) if not parent.startswith("-r ") else ""
            if pname:
                needed_by.setdefault(pname, set()).add(e.name)
    roots = {e.name for e in entries if e.name in TORCH_FAMILY}
    seen, stack = set(), list(roots)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(needed_by.get(n, ()))
    return seen


def split(entries: list[LockEntry]) -> tuple[tuple[LockEntry, ...], tuple[LockEntry, ...]]:
    """(torch closure, the rest), each sorted by name."""
    closure = torch_closure(entries)
    torch_part = sorted((e for e in entries if e.name in closure), key=lambda e: e.name)
    app_part = sorted((e for e in entries if e.name not in closure), key=lambda e: e.name)
    return tuple(torch_part), tuple(app_part)
