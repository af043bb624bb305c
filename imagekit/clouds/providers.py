"""The provider registry: each GPU cloud imagekit rents and publishes templates for, its in-pod facts joined with what
only the host uses.

A row joins what the cloud's pods know (`facts.PROVIDERS`, the table the image's doctor and guard read) with the
account's key variable, the template and pod endpoints, the template builder, the CLI command and what `imagekit pod`
does there. The API clients (`effects/*_api.py`), the commands (`cli/`) and pod creation take their provider facts
from here.

Another provider: its row of `facts.PROVIDERS`, its row of `PROVIDERS` below, its template module (`clouds/<name>.py`),
its API client (`effects/<name>_api.py`) and its command (`cli/<name>_template_cmd.py`, registered by the CLI from
`template_command`). A cloud only the doctor and the guard need is its facts row alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from imagekit.clouds import runpod, vast
from imagekit.in_image import facts


@dataclass(frozen=True)
class Provider:
    """A GPU cloud as the host knows it."""

    pod: facts.ProviderFacts  # what its pods know: in-pod variables, the API base, the stop and terminate calls
    account_key: str  # the variable the account's API key is read from
    template_api: str  # where `--create` sends a template: a URL, or a path under the pods' API base
    template_command: str  # the command that prints (and creates) its template, defined in cli/<name, - as _>_cmd.py
    template: Callable[..., dict]  # the template builder: a release-index entry -> the body its API takes
    pod_create: bool = False  # `imagekit pod create|stop|terminate` rent and end its pods, through its pods' API
    pod_clouds: tuple[str, ...] = ()  # what `pod create --cloud` takes (the first is the default)
    ssh_gateway: str = ""  # the host of its proxied SSH gateway: a terminal only (no exec channel, no SFTP)

    @property
    def name(self) -> str:
        return self.pod.name

    @property
    def api(self) -> str:
        """The REST base its pods are rented and ended through (the guard's, in the image, too)."""
        return self.pod.api

    @property
    def template_url(self) -> str:
        """The default endpoint of `--create` (``--api-url``)."""
        return self.template_api if "://" in self.template_api else self.pod.api + self.template_api


PROVIDERS = (
    Provider(
        facts.provider_named("runpod"),
        account_key="RUNPOD_API_KEY",
        template_api="https://api.runpod.io/graphql",
        template_command="runpod-template",
        template=runpod.template,
        pod_create=True,
        pod_clouds=("secure", "community"),
        ssh_gateway="ssh.runpod.io",
    ),
    Provider(
        facts.provider_named("vast"),
        account_key="VAST_API_KEY",
        template_api="/template/",
        template_command="vast-template",
        template=vast.template,
    ),
)


def named(name: str) -> Provider:
    """The row called ``name`` (KeyError if none is)."""
    for provider in PROVIDERS:
        if provider.name == name:
            return provider
    raise KeyError(name)


def pod_provider() -> Provider:
    """The provider `imagekit pod create|stop|terminate` talks to: the one row with ``pod_create``."""
    (found,) = (p for p in PROVIDERS if p.pod_create)
    return found


def ssh_gateways() -> frozenset[str]:
    """The hosts of the providers' proxied SSH gateways (lower case)."""
    return frozenset(p.ssh_gateway.lower() for p in PROVIDERS if p.ssh_gateway)
