"""`[image] apt`: apt itself resolves the packages in a container of the cell's base (fresh package lists, no
recommends), so the pins are what apt would install over that base; ``imagekit.locking.debs`` checks its answer."""

from __future__ import annotations

import threading
from collections.abc import Callable

from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.image import cuda_toolkit
from imagekit.image.buildplan import BaseRef
from imagekit.locking import debs, driver_stub
from imagekit.model import Cell
from imagekit.services.ports import ContainerEngine
from imagekit.trust import untrusted

AptResolver = Callable[[Cell], tuple[debs.DebPin, ...]]
TIMEOUT = 600


def resolve(engine: ContainerEngine, base: BaseRef, packages: tuple[str, ...]) -> tuple[debs.DebPin, ...]:
    """The .debs apt installs for ``packages`` over ``base`` (the container reaches the base's archive)."""
    bad = [p for p in packages if debs.package_name(p) is None]
    if bad:  # the matrix parser refuses these; never let one reach a shell
        raise UsageError(f"not a Debian package name: {untrusted.printable(bad[0], 60)}", debs.REQUEST_HINT)
    # `[image] cuda_toolkit` (CUDA 11, 12): Debian's toolkit is in non-free, and the driver stub stands in for
    # the driver's libraries it depends on (imagekit.locking.driver_stub)
    toolkit = cuda_toolkit.DEB_PACKAGE in packages
    stub = driver_stub.deb_bytes() if toolkit else None
    code, out, err = engine.run(
        base.reference,
        ["sh", "-c", debs.resolve_script(packages, non_free=toolkit, preinstalled=stub)],
        user="root",
        timeout=TIMEOUT,
        network=True,
    )
    if code != 0:
        said = untrusted.printable(err.strip()[-1500:] or out.strip()[-1500:], 1500, lines=True)
        if "Unable to locate package" in err or "has no installation candidate" in err:
            raise UsageError(
                f"apt cannot install {', '.join(packages)} on {base.name}:\n{said}",
                f"check the names in [image] apt for {base.name} (apt-cache search NAME)",
            )
        raise EnvironmentFailure(
            f"apt could not resolve {', '.join(packages)} in {base.reference} (exit {code}):\n{said}",
            "the base's package archive must be reachable from a container (docker run --network bridge)",
        )
    simulation, uris = debs.split_output(out)
    try:
        pins = debs.parse_resolution(simulation, uris)
        return tuple(sorted((*pins, driver_stub.pin()))) if toolkit else pins
    except untrusted.UntrustedData as exc:
        raise EnvironmentFailure(
            f"apt's answer in {base.reference} was refused: {exc}", "retry; bootstrap the base again if it repeats"
        ) from None


def resolver_for(engine: ContainerEngine, base_of: Callable[[str], BaseRef]) -> AptResolver:
    """A resolver for the lock step (cells are locked side by side): each Python's base made present once
    (``base_of``: bootstrapped or pulled), then apt in a container of it."""
    bases: dict[str, BaseRef] = {}
    guard = threading.Lock()

    def run(cell: Cell) -> tuple[debs.DebPin, ...]:
        with guard:
            if cell.python not in bases:
                bases[cell.python] = base_of(cell.python)
            base = bases[cell.python]
        return resolve(engine, base, cell.apt)

    return run
