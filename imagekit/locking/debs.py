"""Debian/Ubuntu packages an image adds (`[image] apt`): what may be asked for, what apt's answer must look like,
and how the pins read in a lock. Pure.

apt resolves in a container of the cell's base (``services/locks/apt_resolve.py``), so the answer is for the base as it
is: only the packages apt would install or upgrade there are pinned, each with its exact version, architecture, size,
sha256 and URL. The build installs those files and nothing else (no package lists, no network): a rebuild installs
the same bytes or refuses.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from imagekit.trust.untrusted import UntrustedData

# Debian Policy 5.6.1 (Package), 5.6.12 (Version): lower-case name, then an optional epoch, upstream and revision.
_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]{1,99}", re.ASCII)
_VERSION = re.compile(r"(?:[0-9]{1,9}:)?[A-Za-z0-9][A-Za-z0-9.+~-]{0,99}", re.ASCII)
_ARCH = re.compile(r"[a-z0-9][a-z0-9-]{0,19}", re.ASCII)
_INST = re.compile(r"^Inst (?P<name>\S+)(?: \[(?P<old>[^\]]*)\])? \((?P<version>\S+) .*\[(?P<arch>[a-z0-9-]+)\]\)")
_URI = re.compile(r"^'(?P<url>[^' ]+)' (?P<file>\S+) (?P<size>[0-9]{1,12}) SHA256:(?P<sha>[0-9a-f]{64})$")
LINE = "# apt: "  # a pin's line in a lock: a comment, so the lock still installs with pip
_LINE = re.compile(
    r"^# apt: (?P<name>\S+)=(?P<version>\S+) (?P<arch>\S+) (?P<size>[0-9]{1,12}) "
    r"sha256:(?P<sha>[0-9a-f]{64}) (?P<url>\S+)$"
)
MAX_PACKAGES = 2000  # an apt closure of a few hundred is large (ffmpeg's is under 200)
REQUEST_HINT = 'list Debian package names, such as apt = ["git-lfs", "ffmpeg"] (apt-cache search NAME finds one)'


@dataclass(frozen=True, order=True)
class DebPin:
    """One .deb the image installs: exactly this file."""

    name: str
    version: str  # with its epoch, as dpkg reports it
    arch: str  # amd64, arm64, or all
    size: int
    sha256: str  # hex
    url: str

    @property
    def filename(self) -> str:
        """The file's name in the wheelhouse: named by its contents (a hostile URL names nothing on disk)."""
        return f"{self.sha256}.deb"

    def line(self) -> str:
        return f"{LINE}{self.name}={self.version} {self.arch} {self.size} sha256:{self.sha256} {self.url}"


def package_name(value: object) -> str | None:
    """A Debian package name as `[image] apt` may list it, or None."""
    return value if isinstance(value, str) and _NAME.fullmatch(value) else None


def _pool_file(name: str, version: str, arch: str) -> str:
    """The file name Debian's pool gives a package: the version without its epoch."""
    return f"{name}_{version.split(':', 1)[-1]}_{arch}.deb"


def _checked(name: str, version: str, arch: str) -> None:
    if not _NAME.fullmatch(name):
        raise UntrustedData("apt named a package outside Debian's name rules")
    if not _VERSION.fullmatch(version):
        raise UntrustedData(f"apt gave {name} a version outside Debian's version rules")
    if not _ARCH.fullmatch(arch):
        raise UntrustedData(f"apt gave {name} an unknown architecture")


def _url(url: str, name: str, version: str, arch: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise UntrustedData(f"apt's URL for {name} is not a plain http(s) URL")
    if parts.query or parts.fragment or any(c in url for c in "\\\"' \t\n"):
        raise UntrustedData(f"apt's URL for {name} has a query or odd characters")
    if unquote(parts.path.rsplit("/", 1)[-1]) != _pool_file(name, version, arch):
        raise UntrustedData(f"apt's URL for {name} does not name {_pool_file(name, version, arch)}")
    return url


def parse_resolution(simulation: str, uris: str) -> tuple[DebPin, ...]:
    """The pins of apt's answer: ``apt-get install -s`` (what it would install or upgrade, ``Inst`` lines) and
    ``apt-get download --print-uris`` of exactly those (URL, size, sha256). Every package the simulation installs
    must have one file of the right name; anything else in either text is ignored, and nothing malformed passes."""
    wanted: dict[str, tuple[str, str]] = {}
    for line in simulation.splitlines():
        m = _INST.match(line)
        if not m:
            continue
        name = m["name"].split(":", 1)[0]  # a foreign architecture's package prints as name:arch
        _checked(name, m["version"], m["arch"])
        wanted[_pool_file(name, m["version"], m["arch"])] = (name, m["version"])
        if len(wanted) > MAX_PACKAGES:
            raise UntrustedData(f"apt would install more than {MAX_PACKAGES} packages")
    files: dict[str, tuple[str, int, str]] = {}
    for line in uris.splitlines():
        m = _URI.match(line)
        if m and m["file"] in wanted:
            files[m["file"]] = (m["url"], int(m["size"]), m["sha"])
    pins = []
    for file, (name, version) in sorted(wanted.items()):
        if file not in files:
            raise UntrustedData(f"apt gave no download (with a SHA256) for {file}")
        url, size, sha = files[file]
        arch = file.rsplit("_", 1)[1].removesuffix(".deb")
        pins.append(DebPin(name, version, arch, size, sha, _url(url, name, version, arch)))
    return tuple(sorted(pins))


def parse_line(line: str, origin: str) -> DebPin:
    m = _LINE.match(line)
    if not m:
        raise ValueError(f"{origin}: not an apt pin line: {line[:120]!r}")
    try:
        _checked(m["name"], m["version"], m["arch"])
        url = _url(m["url"], m["name"], m["version"], m["arch"])
    except UntrustedData as exc:
        raise ValueError(f"{origin}: {exc}") from None
    return DebPin(m["name"], m["version"], m["arch"], int(m["size"]), m["sha"], url)


def render(pins: tuple[DebPin, ...]) -> str:
    return "".join(p.line() + "\n" for p in pins)


def install_list(pins: tuple[DebPin, ...]) -> str:
    """What the image's install step reads (`install-layer --debs`): one ``<sha256>.deb <name>=<version> <arch>``
    line per file, in the lock's order."""
    return "".join(f"{p.filename} {p.name}={p.version} {p.arch}\n" for p in pins)


def resolve_script(packages: tuple[str, ...], non_free: bool = False, preinstalled: bytes | None = None) -> str:
    """The shell the base's container runs: fresh package lists, then what apt would install there
    (no recommends: only what the packages need), then where each of those files is and its SHA256.
    ``non_free``: the base's own archive lines with Debian's non-free component added (Debian's CUDA toolkit);
    ``preinstalled``: a .deb installed first (the driver stub: apt then resolves nothing of the driver)."""
    names = " ".join(packages)  # each checked by package_name
    extra = ""
    if non_free:  # one-line and deb822 sources alike: the same archive and suites, non-free beside main
        extra += (
            "sed -i 's/^\\(deb .* main\\)$/\\1 non-free/' /etc/apt/sources.list 2>/dev/null || true\n"
            'for f in /etc/apt/sources.list.d/*.sources; do [ -f "$f" ] && '
            "sed -i 's/^\\(Components: .*main\\)$/\\1 non-free/' \"$f\"; done\n"
        )
    if preinstalled is not None:
        encoded = base64.b64encode(preinstalled).decode()
        extra += f"echo {encoded} | base64 -d > /tmp/pre.deb && dpkg -i /tmp/pre.deb >/dev/null\n"
    return (
        "set -e\n"
        "export DEBIAN_FRONTEND=noninteractive\n"
        f"{extra}"
        "apt-get update -qq >/dev/null\n"
        f"apt-get install -s -qq --no-install-recommends {names} > /tmp/sim\n"
        "cat /tmp/sim\n"
        "echo '#--- uris ---'\n"
        "args=$(sed -n 's/^Inst \\([^ ]*\\)\\( \\[[^]]*\\]\\)\\? "
        "(\\([^ ]*\\) .*\\[\\([a-z0-9-]*\\)\\])$/\\1:\\4=\\3/p' /tmp/sim)\n"
        '[ -z "$args" ] || (cd /tmp && apt-get download --print-uris -qq $args)\n'
    )


def split_output(stdout: str) -> tuple[str, str]:
    simulation, _, uris = stdout.partition("#--- uris ---")
    return simulation, uris
