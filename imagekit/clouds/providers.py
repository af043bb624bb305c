"""The provider registry: each GPU cloud imagekit rents and publishes templates for, its in-pod facts joined with what
only the host uses.

The rows are found, never listed: for each row of `facts.PROVIDERS` (the table the image's doctor and guard read), the
module `clouds/<name>.py`, when there is one, declares the cloud's host row as ``PROVIDER`` (`provider_spec.Provider`:
the account's key variable, the template endpoint, the template builder, the template command's spec, what `imagekit
pod` does there). The API clients (`effects/<name>_api.py`), the commands (`cli/template_cmd.py`, `cli/pod_cmd.py`)
and pod creation take their provider facts from here.

Another provider: its row of `facts.PROVIDERS`, its module `clouds/<name>.py` (host row, template builder, command
spec) and its API client `effects/<name>_api.py` (``create_template``); `imagekit <name>-template` follows. A cloud
only the doctor and the guard need is its facts row alone.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable

from imagekit.clouds.provider_spec import Provider
from imagekit.in_image import facts

__all__ = [
    "PROVIDERS",
    "Provider",
    "discover",
    "enders",
    "named",
    "pod_provider",
    "pod_providers",
    "reapers",
    "ssh_gateways",
]


def discover(rows: Iterable[facts.ProviderFacts]) -> tuple[Provider, ...]:
    """The host rows of ``rows``, in their order: the ``PROVIDER`` of each one's module `imagekit.clouds.<name>` (a
    row without a module is the doctor's and the guard's only)."""
    found = []
    for row in rows:
        module = f"{__package__}.{row.name}"
        if not row.name.isidentifier() or importlib.util.find_spec(module) is None:
            continue
        host = getattr(importlib.import_module(module), "PROVIDER", None)
        if not isinstance(host, Provider) or host.pod is not row:
            raise TypeError(f"{module} declares no PROVIDER (a provider_spec.Provider of facts' row {row.name!r})")
        found.append(host)
    return tuple(found)


PROVIDERS = discover(facts.PROVIDERS)


def named(name: str) -> Provider:
    """The row called ``name`` (KeyError if none is)."""
    for provider in PROVIDERS:
        if provider.name == name:
            return provider
    raise KeyError(name)


def pod_provider() -> Provider:
    """The provider `imagekit pod create|start|stop|terminate` talk to unless told `--provider`: the first row that
    rents pods (RunPod)."""
    return next(p for p in PROVIDERS if p.pod_create)


def pod_providers() -> tuple[str, ...]:
    """The providers `imagekit pod create --provider` rents pods at (those with a create request)."""
    return tuple(p.name for p in PROVIDERS if p.pod_create)


def enders() -> tuple[str, ...]:
    """The providers `imagekit pod start|stop|terminate --provider` reach (their facts row has the calls)."""
    return tuple(p.name for p in PROVIDERS if p.pod.stop is not None and p.pod.terminate is not None)


def reapers() -> tuple[str, ...]:
    """The providers `imagekit pod reap --provider` lists and ends pods of (those with ``reap_pod``)."""
    return tuple(p.name for p in PROVIDERS if p.reap_pod is not None)


def ssh_gateways() -> frozenset[str]:
    """The hosts of the providers' proxied SSH gateways (lower case)."""
    return frozenset(p.ssh_gateway.lower() for p in PROVIDERS if p.ssh_gateway)
