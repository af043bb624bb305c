"""Validation of every value that can reach a template, a lockfile or a command line. Pure.

Each validator returns the canonical value or raises UsageError; nothing is "cleaned up" silently, so a value
that is not already canonical (surrounding whitespace, a newline, a non-normalised version) is refused.
"""

from __future__ import annotations

import re
from functools import lru_cache

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from imagekit.errors import UsageError
from imagekit.in_image import facts
from imagekit.trust import registry_host
from imagekit.trust.redact import redact

_CUDA = re.compile(r"\d{1,2}\.\d{1,2}", re.ASCII)
_PYTHON = re.compile(r"3\.\d{1,2}", re.ASCII)
_DRIVER = re.compile(r"\d{2,4}(\.\d{1,4}){1,2}", re.ASCII)
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", re.ASCII)
_SAFE_TEXT = re.compile(r"[\x20-\x7e]*", re.ASCII)

# OCI distribution reference grammar (github.com/distribution/reference, regexp.go).
_ALNUM = r"[a-z0-9]+"
_SEP = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEP}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_NAME_RE = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REF = re.compile(rf"(?P<name>{_NAME_RE})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?", re.ASCII)
REPOSITORY = re.compile(_NAME_RE, re.ASCII)
TAG = re.compile(_TAG, re.ASCII)


MAX_VERSION = 64  # longer than any real version; a 10,000-digit one would overflow int() in `packaging`


def _bad(what: str, value: object, expected: str, hint: str | None = None) -> UsageError:
    from imagekit.trust.redact import redact_value

    shown = repr(redact_value(value) if isinstance(value, str) else value)  # never a password it was handed
    if len(shown) > 100:  # a 10,000-character value is named, not echoed
        shown = f"{shown[:60]}... ({len(value) if isinstance(value, str) else len(shown)} characters)"
    return UsageError(f"invalid {what} {shown}: expected {expected}", hint or f"give {what} as {expected}")


bad = _bad  # for the validators another package owns (locking.direct_wheels.requirement)
SAFE_TEXT = _SAFE_TEXT


def version(value: object, what: str = "version") -> str:
    """A PEP 440 version, already in canonical form (``4.48.2``, ``2.5.1``)."""
    if not isinstance(value, str):
        raise _bad(what, value, "a version string such as '2.5.1'")
    if len(value) > MAX_VERSION:
        raise _bad(what, value, f"a version of at most {MAX_VERSION} characters such as '2.5.1'")
    try:
        canonical = str(Version(value))
    except (InvalidVersion, ValueError):  # ValueError: a release number past int()'s digit limit
        raise _bad(what, value, "a PEP 440 version such as '2.5.1'") from None
    if canonical != value:
        raise _bad(what, value, f"the canonical form {canonical!r}", "write versions without spaces or prefixes")
    return value


def cuda(value: object) -> str:
    """A CUDA variant version, ``major.minor`` (``12.4``); ``cu124`` is accepted and normalised."""
    if isinstance(value, str) and re.fullmatch(r"cu\d{3,4}", value, re.ASCII):
        digits = value[2:]
        value = f"{digits[:-1]}.{digits[-1]}"
    if not isinstance(value, str) or not _CUDA.fullmatch(value):
        raise _bad("CUDA version", value, "major.minor such as '12.4' (or 'cu124')")
    major, minor = value.split(".")
    return f"{int(major)}.{int(minor)}"


_PLATFORM_ALIASES = {"amd64": "linux/amd64", "x86_64": "linux/amd64", "arm64": "linux/arm64", "aarch64": "linux/arm64"}


def platform(value: object) -> str:
    """An image platform as Docker names it (``linux/amd64``, ``linux/arm64``); ``arm64``/``aarch64`` (and ``amd64``,
    ``x86_64``) are accepted and normalised."""
    from imagekit.model import PLATFORMS

    if isinstance(value, str):
        value = _PLATFORM_ALIASES.get(value, value)
    if not isinstance(value, str) or value not in PLATFORMS:
        raise _bad(
            "platform",
            value,
            f"one of {', '.join(PLATFORMS)}",
            "linux/arm64 for Grace hosts (GH200, GB200), else linux/amd64",
        )
    return value


def python(value: object) -> str:
    if not isinstance(value, str) or not _PYTHON.fullmatch(value):
        raise _bad("Python version", value, "major.minor such as '3.11'")
    return value


def driver(value: object) -> str:
    if not isinstance(value, str) or not _DRIVER.fullmatch(value):
        raise _bad("driver version", value, "an NVIDIA driver version such as '535.104.05'")
    return value


def glibc(value: object) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"2\.\d{1,2}", value, re.ASCII):
        raise _bad("glibc version", value, "major.minor such as '2.36'")
    return value


def abs_path(value: object) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"/[A-Za-z0-9._/-]+", value, re.ASCII):
        raise _bad("path", value, "an absolute path such as '/usr/local/bin/python3.12'")
    return value


def driver_key(value: str) -> tuple[int, ...]:
    return tuple(int(p) for p in value.split("."))


def arch(value: object, gpus: dict[str, str] | None = None) -> str:
    """A compute capability as ``sm_XY`` from ``sm_90``, ``9.0``, ``90`` or a known GPU name (``H100``)."""
    if not isinstance(value, str):
        raise _bad("GPU architecture", value, "a compute capability such as 'sm_90'")
    if gpus:
        by_name = {k.lower(): v for k, v in gpus.items()}
        if value.lower() in by_name:
            value = by_name[value.lower()]
    parsed = None if value.startswith("compute_") else facts.parse_arch(value)  # a GPU, not PTX
    if parsed is None or value != value.strip():
        known = f"; known GPU names: {', '.join(sorted(gpus))}" if gpus else ""
        raise _bad("GPU architecture", value, f"a compute capability such as 'sm_90' or '9.0'{known}")
    return "sm_{}{}{}".format(*parsed)


def arch_key(value: str) -> tuple[int, int]:
    """``sm_120`` -> (12, 0); ``sm_90a`` -> (9, 0)."""
    key = facts.arch_key(value) if value.startswith("sm_") and value == value.strip() else None
    if key is None:
        raise _bad("GPU architecture", value, "'sm_XY'")
    return key


def cc_to_sm(cc: str) -> str:
    major, minor = cc.split(".")
    return f"sm_{int(major)}{int(minor)}"


@lru_cache(maxsize=4096)
def requirement_name(value: str) -> str:
    return canonicalize_name(Requirement(value).name)


@lru_cache(maxsize=4096)
def pinned_version(value: str) -> str | None:
    """The exact version of an ``name==X`` requirement, else None."""
    req = Requirement(value)
    pins = [s.version for s in req.specifier if s.operator in ("==", "===")]
    return pins[0] if len(req.specifier) == 1 and pins and "*" not in pins[0] else None


def package_name(value: object) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise _bad("package name", value, "a distribution name such as 'transformers'")
    return canonicalize_name(value)


def _domain_ok(name: str) -> bool:
    """Docker's normalisation: a first component that names no registry (registry_host) is a path: lower case."""
    host, path = registry_host.split(name)
    if host is not None or "/" not in path:
        return True
    return re.fullmatch(_PATH_COMPONENT, path.partition("/")[0], re.ASCII) is not None


def image_ref(value: object, what: str = "image reference") -> str:
    """An OCI image reference (``registry:5000/team/img:tag@sha256:...``) by the distribution grammar."""
    m = IMAGE_REF.fullmatch(value) if isinstance(value, str) and len(value) <= 512 else None
    if m is None or not _domain_ok(m["name"]):
        raise _bad(
            what,
            value,
            "an OCI reference such as 'registry.example.com/team/image:tag'",
            "name it as REGISTRY/NAME:TAG or REGISTRY/NAME@sha256:DIGEST, in lower case",
        )
    return value


def repository(value: object) -> str:
    if not isinstance(value, str) or len(value) > 255 or not REPOSITORY.fullmatch(value) or not _domain_ok(value):
        raise _bad(
            "image repository",
            value,
            "an OCI repository such as '127.0.0.1:5000/imagekit/train'",
            "give REGISTRY/NAMESPACE/NAME in lower case, without a tag",
        )
    return value


def tag(value: object) -> str:
    if not isinstance(value, str) or not TAG.fullmatch(value):
        raise _bad("image tag", value, "up to 128 characters of [A-Za-z0-9_.-], not starting with '.' or '-'")
    return value


def label_text(value: object, what: str = "label value") -> str:
    """Free text that may appear in a label: printable ASCII on one line."""
    if not isinstance(value, str) or not _SAFE_TEXT.fullmatch(value):
        raise _bad(what, value, "printable ASCII on a single line")
    return value


_DATE = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})", re.ASCII)


def exclude_newer(value: object) -> str:
    """An RFC 3339 date (``2024-06-01``) or timestamp (``2024-06-01T00:00:00Z``) that names a real instant."""
    from datetime import date, datetime

    if isinstance(value, str) and (_DATE.fullmatch(value) or _TIMESTAMP.fullmatch(value)):
        try:
            if len(value) == 10:
                date.fromisoformat(value)
            else:
                datetime.fromisoformat(value.replace("Z", "+00:00"))
            return value
        except ValueError:
            pass
    raise _bad("--exclude-newer", value, "an RFC 3339 date or timestamp such as '2024-06-01' or '2024-06-01T00:00:00Z'")


_INDEX_URL = re.compile(r"https?://[^\s/?#@]+(@[^\s/?#@]+)?(/[^\s]*)?", re.ASCII)


def index_url(value: object, what: str = "index URL") -> str:
    """An http(s) package index URL: no whitespace or control characters (they would reach the resolver's input)."""
    if not isinstance(value, str) or not value:
        raise _bad(
            what,
            value,
            "an http(s) index URL such as https://pypi.org/simple",
            "pass a URL, or leave the option out for its default",
        )
    if not _SAFE_TEXT.fullmatch(value) or not _INDEX_URL.fullmatch(value) or not _parses(value):
        url = "https://download.pytorch.org/whl" if what == "--pytorch-index" else "https://example.com/simple"
        example = f"{what} {url}" if what.startswith("--") else url
        raise UsageError(
            f"invalid {what} {redact(value)!r}: expected an http(s) URL without spaces or control characters",
            f"pass one URL per option, e.g. {example}",
        )
    return value


def _parses(url: str) -> bool:
    """urllib can take it apart: a port that is a number in range, a closed IPv6 bracket."""
    from urllib.parse import urlsplit

    try:
        urlsplit(url).port  # noqa: B018 - the port is checked when read
    except ValueError:
        return False
    return True


def http_url(value: object, what: str) -> str:
    """An http(s) URL on one line (an API endpoint): anything else would reach urllib as an unknown scheme."""
    if isinstance(value, str) and _SAFE_TEXT.fullmatch(value) and _INDEX_URL.fullmatch(value) and _parses(value):
        return value
    raise _bad(what, redact(value) if isinstance(value, str) else value, "an http(s) URL such as https://host/path")
