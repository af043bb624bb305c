"""The user's own code as the image's last layer (`[image] copy`). Pure: the effects read the folder.

The folder is copied to its place in the image (``/opt/app`` unless ``to`` says otherwise) as one small layer on top
of everything else, so a changed file rebuilds and pushes that layer only. Its bytes depend on the files alone: a
tarball sorted by path, owned by root, every entry dated SOURCE_DATE_EPOCH, modes 0644 (0755 where the owner may
execute). What to leave out is said the way `.dockerignore` says it (``exclude``, and the folder's own
`.dockerignore`): imagekit's own outputs, version-control folders and bytecode are always left out.
"""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
from dataclasses import dataclass
from fnmatch import fnmatchcase

from imagekit.errors import UsageError

DEFAULT_TO = "/opt/app"
# Never in an image: version control, imagekit's state (wheels, contexts), virtual environments, bytecode.
# At any depth, and a `!` line never brings them back.
ALWAYS_EXCLUDED = ("**/.git", "**/.hg", "**/.svn", "**/.imagekit", "**/.venv", "**/venv", "**/__pycache__", "**/*.pyc",
                   "**/.DS_Store")  # fmt: skip
MAX_FILES = 20_000
MAX_BYTES = 512 << 20  # code, not data: datasets and checkpoints belong on the pod's volume or the Hub
_PATH = re.compile(r"/[A-Za-z0-9._/-]*", re.ASCII)
# Where the copy may not go: the image's own folders, and the pod volume's mount point (it would hide the code).
_RESERVED = ("/opt/venv", "/opt/imagekit", "/opt/cuda-libs", "/workspace", "/etc", "/usr", "/bin", "/sbin", "/lib",
             "/proc", "/sys", "/dev", "/run", "/tmp", "/var", "/root", "/boot")  # fmt: skip


@dataclass(frozen=True)
class CopySpec:
    """`[image] copy`: the folder (resolved from the matrix file's folder), where it goes, what is left out."""

    source: str
    to: str = DEFAULT_TO
    exclude: tuple[str, ...] = ()
    project: str | None = None  # the matrix file's folder: ``source``, links resolved, must stay inside it


@dataclass(frozen=True)
class CodeLayer:
    """The folder as read: relative POSIX path -> (bytes, mode), and where it goes."""

    to: str
    files: tuple[tuple[str, bytes, int], ...]

    def tar(self, epoch: int) -> bytes:
        return tarball(self.files, self.to, epoch)

    def sha256(self, epoch: int) -> str:
        return hashlib.sha256(self.tar(epoch)).hexdigest()

    @property
    def size(self) -> int:
        return sum(len(data) for _, data, _ in self.files)


def destination_problem(to: object) -> str | None:
    """Why ``to`` cannot hold the code, or None."""
    if not isinstance(to, str) or not _PATH.fullmatch(to) or "//" in to or "/./" in f"{to}/" or "/../" in f"{to}/":
        return "expected an absolute path of letters, digits and . _ - / (such as /opt/app)"
    if len(to) > 200:
        return "expected a path of at most 200 characters"
    clean = to.rstrip("/") or "/"
    if clean == "/" or clean == "/opt":
        return f"{clean} is too wide: copy into a folder of its own (such as /opt/app)"
    for reserved in _RESERVED:
        if clean == reserved or clean.startswith(reserved + "/"):
            if reserved == "/workspace":
                return "the pod's volume is mounted on /workspace and would hide the code: use /opt/app"
            return f"{reserved} is the image's own; use a folder of its own (such as /opt/app)"
    return None


def _translate(pattern: str) -> tuple[bool, list[str]]:
    """(negated, path parts) of one `.dockerignore` line, cleaned as Docker cleans it."""
    negated = pattern.startswith("!")
    text = pattern[1:] if negated else pattern
    parts = [p for p in text.strip().strip("/").split("/") if p not in ("", ".")]
    return negated, parts


def _match(parts: list[str], path: list[str]) -> bool:
    """Does the pattern match ``path`` or one of its parent folders (a matched folder leaves out all below)? Each
    (pattern part, path part) pair is judged once: `**/**/**/...` against a deep path stays polynomial, not the
    exponential number of ways the ``**`` could share the folders out."""
    parts = [p for i, p in enumerate(parts) if not (p == "**" and i and parts[i - 1] == "**")]  # ** ** is **
    memo: dict[tuple[int, int], bool] = {}

    def at(i: int, j: int) -> bool:  # parts[i:] against path[j:]
        if (i, j) in memo:
            return memo[(i, j)]
        if i == len(parts):
            found = False
        elif parts[i] == "**":
            found = i + 1 == len(parts) or any(at(i + 1, k) for k in range(j, len(path)))
        elif j == len(path) or not fnmatchcase(path[j], parts[i]):
            found = False
        else:
            found = i + 1 == len(parts) or at(i + 1, j + 1)  # the last part matched: this entry and all below it
        memo[(i, j)] = found
        return found

    return at(0, 0)


def excluded(rel: str, patterns: tuple[str, ...]) -> bool:
    """Is ``rel`` (a POSIX path relative to the folder) left out? `.dockerignore` rules: the last matching line
    wins, ``!`` brings a path back, ``**`` matches any number of folders, a matched folder leaves out its contents."""
    path = rel.split("/")
    if always_excluded(rel):
        return True
    out = False
    for pattern in patterns:
        if not pattern.strip() or pattern.lstrip().startswith("#"):
            continue
        negated, parts = _translate(pattern)
        if _match(parts, path):
            out = not negated
    return out


def always_excluded(rel: str) -> bool:
    path = rel.split("/")
    return any(_match(_translate(p)[1], path) for p in ALWAYS_EXCLUDED)


def may_bring_back(patterns: tuple[str, ...]) -> bool:
    """Is there a `!` line? Then an excluded folder is still walked: a line may bring back a file below it."""
    return any(p.lstrip().startswith("!") for p in patterns)


MAX_IGNORE_BYTES = 256 << 10  # a .dockerignore of thousands of lines is a few tens of KB
MAX_PATTERNS, MAX_PATTERN = 2000, 1024


def dockerignore_lines(text: str, where: str = ".dockerignore") -> tuple[str, ...]:
    """The patterns of a `.dockerignore` (or `[image] copy`'s exclude): bounded in number and length, since every
    file of the folder is matched against every pattern."""
    lines = tuple(line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    return bounded_patterns(lines, where)


def bounded_patterns(patterns: tuple[str, ...], where: str) -> tuple[str, ...]:
    long = next((p for p in patterns if len(p) > MAX_PATTERN), None)
    if len(patterns) > MAX_PATTERNS or long is not None:
        said = f"a pattern of {len(long)} characters" if long is not None else f"{len(patterns)} patterns"
        raise UsageError(
            f"[image] copy: {where} has {said} (at most {MAX_PATTERNS} patterns of {MAX_PATTERN} characters)",
            "leave out folders by name (data/, **/*.ckpt): every file is matched against every pattern",
        )
    return patterns


def tarball(files: tuple[tuple[str, bytes, int], ...], to: str, epoch: int) -> bytes:
    """The layer's tarball, unpacked at / (deterministic: same files, same bytes)."""
    root = to.strip("/")
    members: dict[str, tuple[bytes, int] | None] = {}
    parts = root.split("/")
    for i in range(1, len(parts) + 1):
        members["/".join(parts[:i])] = None
    for rel, data, mode in files:
        full = f"{root}/{rel}"
        segs = full.split("/")
        for i in range(len(parts) + 1, len(segs)):
            members["/".join(segs[:i])] = None
        members[full] = (data, 0o755 if mode & 0o100 else 0o644)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "root", "root"
            item = members[name]
            if item is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(item[0]), item[1]
                tar.addfile(info, io.BytesIO(item[0]))
    return out.getvalue()
