"""Plain frozen data handed from one step to the next."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

AMD64, ARM64 = "linux/amd64", "linux/arm64"
PLATFORMS = (AMD64, ARM64)  # what images are built for (Docker's names); Grace hosts (GH200, GB200) are arm64
MACHINES = {AMD64: "x86_64", ARM64: "aarch64"}  # the platform's CPU architecture as wheel tags and uname name it
DEBIAN_ARCH = {AMD64: "amd64", ARM64: "arm64"}  # ... as Debian, an image config and Docker's short names name it


def variant_of(cuda: str) -> str:
    """The torch wheel variant of a CUDA version: ``12.4`` -> ``cu124``."""
    return "cu" + cuda.replace(".", "")


def variant_of_runtime(version: str) -> str:
    """The torch wheel variant of the CUDA runtime a wheel requires: ``13.2.2`` -> ``cu132``."""
    return variant_of(".".join(version.split(".")[:2]))


@dataclass(frozen=True, order=True)
class Cell:
    """One image: a torch CUDA variant, torch, transformers and Python, plus extra pinned packages."""

    cuda: str  # "12.4": the CUDA version of the torch wheel variant
    torch: str
    transformers: str
    python: str
    packages: tuple[str, ...] = ()  # canonical requirement strings, sorted
    apt: tuple[str, ...] = ()  # Debian packages over the base (`[image] apt`), sorted; pinned in the cell's lock
    platform: str = AMD64  # the image's platform: its id is the same on every platform (one tag, one image index)
    from_source: tuple[str, ...] = ()  # packages built once from their source archives (`[matrix] from_source`)

    @property
    def variant(self) -> str:
        return variant_of(self.cuda)

    @property
    def key(self) -> str:
        """The cell on its platform: the id on linux/amd64, ``ID@linux/arm64`` on another."""
        return self.id if self.platform == AMD64 else f"{self.id}@{self.platform}"

    @property
    def slug(self) -> str:
        """The cell on its platform as one word for a file, folder or tag: the id on linux/amd64, ``ID-arm64``."""
        return self.id if self.platform == AMD64 else f"{self.id}-{DEBIAN_ARCH[self.platform]}"

    @property
    def id(self) -> str:
        return f"{self.variant}-torch{self.torch}-py{self.python}-tf{self.transformers}"

    def to_json(self) -> dict[str, object]:
        doc = {**asdict(self), "packages": list(self.packages), "id": self.id, "variant": self.variant}
        if self.apt:
            doc["apt"] = list(self.apt)
        else:  # a cell without apt packages is described (and its lock's input hash computed) as before they existed
            del doc["apt"]
        if not self.from_source:  # likewise for packages built from source
            del doc["from_source"]
        if self.platform == AMD64:  # likewise, a linux/amd64 cell is described as before platforms existed
            del doc["platform"]
        return doc


@dataclass(frozen=True)
class Targets:
    """The fleet images must run on: compute capabilities (``sm_80``) and the oldest host driver."""

    archs: tuple[str, ...] = ()
    min_driver: str | None = None


@dataclass(frozen=True)
class Query:
    """What `explain` checks: any axis may be omitted and then goes unchecked."""

    cuda: str | None = None
    torch: str | None = None
    transformers: str | None = None
    python: str | None = None
    packages: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()
    driver: str | None = None
    base_glibc: str | None = None
    platform: str = AMD64

    @classmethod
    def of(cls, cell: Cell, targets: Targets, base_glibc: str | None = None) -> Query:
        return cls(
            cell.cuda,
            cell.torch,
            cell.transformers,
            cell.python,
            cell.packages,
            targets.archs,
            targets.min_driver,
            base_glibc,
            cell.platform,
        )


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str
    source: str

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message, "source": self.source}


@dataclass(frozen=True)
class Verdict:
    violations: tuple[Violation, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def compatible(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, object]:
        return {"compatible": self.compatible, "violations": [v.to_json() for v in self.violations]}
