"""What a GPU cloud's module (`clouds/<name>.py`) declares: its host row (`Provider`) and the spec of its template
command (`TemplateCommand`, its `TemplateOption`s). Pure data: `clouds/providers.py` finds the rows, and
`cli/template_cmd.py` turns each spec into `imagekit <name>-template`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from imagekit.in_image import facts


def _as_built(body: dict) -> dict:
    return body


def _no_warnings(entry: dict, body: dict) -> list[str]:
    return []


@dataclass(frozen=True)
class TemplateOption:
    """An option of a provider's template command, ``--NAME`` (``_`` as ``-``): a flag (``kind`` bool, default
    False), a number or a text (a default of None: optional)."""

    name: str
    kind: type  # bool, int or str
    default: Any
    help: str
    metavar: str | None = None
    minimum: int | None = None  # a number's range, as click checks it
    maximum: int | None = None
    keyword: str | None = ""  # the template builder's parameter it sets ("": its own name; None: none)
    check: Callable[[Any], None] | None = None  # raises UsageError for a value it refuses (never given None)
    check_first: bool = False  # checked before the release index is read (else after)
    after_api_url: bool = False  # listed after --api-url (else before --create)


@dataclass(frozen=True)
class TemplateCommand:
    """How `imagekit <name>-template` differs from one provider to the next; the rest of it is the same for all:
    CELL_OR_TAG, --release-index, --platform, the options before --create, --create, --api-url, the options after
    it, --allow-private-registry."""

    display: str  # the provider as help and messages name it: "Call {display}'s API", "created {display} template"
    summary: str  # the command's help
    api_url_help: str  # --api-url's help (its default is the row's template_url)
    examples: tuple[str, ...]  # the epilog: `imagekit <command> EXAMPLE` each, the account key before one with --create
    options: tuple[TemplateOption, ...] = ()
    request: Callable[[dict], dict] = _as_built  # the builder's template -> the body its API takes
    warnings: Callable[[dict, dict], list[str]] = _no_warnings  # (entry, body) -> warnings, printed in both modes
    unit: str = "pod"  # what the cloud runs an image as ("no pod can pull ...", "... if your pods reach it")
    answer_key: str = "template"  # --create prints {answer_key: what the API client returned}
    made_id: str = "id"  # the field of that answer named in "created {display} template ID for TAG"
    created_note: str = ""  # appended to that line, formatted with the options: " (launch mode {launch})"
    pull_credentials: str | None = None  # the option naming registry credentials: --create without it checks first
    pull_credentials_hint: str = ""  # that the image pulls without credentials, else refuses with this hint


def _unknown_price(answer: dict) -> str:
    return "?"


@dataclass(frozen=True)
class Provider:
    """A GPU cloud as the host knows it: its in-pod row of ``facts.PROVIDERS`` joined with what only the host uses,
    its whole pod lifecycle behind one interface. Its API client is ``imagekit/effects/<name>_api.py``:
    ``create_template(body, api_key, url)`` (`--create` of its template command), and as far as the cloud offers
    them ``create_pod(body, api_key, base)`` (an object with the pod's ``id``), ``pod_action(action, pod_id,
    api_key, base)`` (``start``, ``stop``, ``terminate``: the calls of its facts row), ``list_pods(api_key, base)``
    and ``get_pod(pod_id, api_key, base)``."""

    pod: facts.ProviderFacts  # what its pods know: in-pod variables, the API base, the stop and terminate calls
    account_key: str  # the variable the account's API key is read from
    template_api: str  # where `--create` sends a template: a URL, or a path under the pods' API base
    template: Callable[..., dict]  # the template builder: a release-index entry -> its template
    command: TemplateCommand  # the spec of `imagekit <name>-template`
    # `imagekit pod create --provider NAME`: the create request from (release-index entry, compat data, GPU type id;
    # count, cloud, volume_gb, registry_auth, arch, guard, env as keywords); None: its pods are rented from its
    # console or its template only
    pod_body: Callable[..., dict] | None = None
    pod_price: Callable[[dict], str] = _unknown_price  # the price shown from its create answer ("0.44 $/h")
    # what `pod terminate` says first of a pod (its id, `get_pod`'s answer) whose files die with it; None: nothing
    terminate_warning: Callable[[str, dict], str | None] | None = None
    pod_clouds: tuple[str, ...] = ()  # what `pod create --cloud` takes (the first is the default)
    ssh_gateway: str = ""  # the host of its proxied SSH gateway: a terminal only (no exec channel, no SFTP)
    # `imagekit pod reap --provider NAME`: one entry of its API client's list_pods() -> a `clouds.reap.Pod` (or None)
    reap_pod: Callable[[dict, list], Any] | None = None

    @property
    def name(self) -> str:
        return self.pod.name

    @property
    def pod_create(self) -> bool:
        """`imagekit pod create` rents its pods (it has a create request)."""
        return self.pod_body is not None

    @property
    def api(self) -> str:
        """The REST base its pods are rented and ended through (the guard's, in the image, too)."""
        return self.pod.api

    @property
    def template_url(self) -> str:
        """The default endpoint of `--create` (``--api-url``)."""
        return self.template_api if "://" in self.template_api else self.pod.api + self.template_api

    @property
    def template_command(self) -> str:
        """The command that prints (and creates) its template."""
        return f"{self.name.replace('_', '-')}-template"
