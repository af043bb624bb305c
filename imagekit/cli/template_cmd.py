"""`imagekit <name>-template`: a published image as a GPU cloud's template (printed, or created through its API), one
command for each row of the provider registry, built from the spec its module (`clouds/<name>.py`) declares."""

from __future__ import annotations

import importlib
import inspect
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from imagekit.cli import guard_options
from imagekit.cli.common import err_console, handles_errors, out_json
from imagekit.cli.options import ReleaseIndexOpt, ReleasePlatformOpt
from imagekit.clouds import guard_defaults, providers
from imagekit.clouds.provider_spec import Provider, TemplateCommand, TemplateOption
from imagekit.clouds.pull import unreachable_registry
from imagekit.errors import UsageError
from imagekit.trust import validate
from imagekit.trust.validate import http_url as validate_http_url

RefArg = Annotated[
    str,
    typer.Argument(
        metavar="CELL_OR_TAG",
        help="A cell id or tag from the release index, or a published image as REGISTRY/REPO:TAG (or @sha256:...), "
        "read from its labels in the registry when the index does not record it.",
    ),
]
AllowPrivateRegistryOpt = Annotated[
    bool,
    typer.Option("--allow-private-registry", help="Create it even though the image is on a loopback/private registry."),
]


def register(app: typer.Typer, only: str | None = None) -> None:
    """Each provider's template command, in the registry's order (``only``: the command of that name alone)."""
    for provider in providers.PROVIDERS:
        if only in (None, provider.template_command):
            _register(app, provider)


def _register(app: typer.Typer, provider: Provider) -> None:
    def template_command(**values: Any) -> None:
        _run(provider, values)

    params = _parameters(provider)
    template_command.__doc__ = provider.command.summary
    template_command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    template_command.__annotations__ = {p.name: p.annotation for p in params}
    app.command(provider.template_command, epilog=_epilog(provider))(handles_errors(template_command))


def _parameters(provider: Provider) -> list[inspect.Parameter]:
    """The command's parameters: the shared ones, with the spec's options before --create and after --api-url."""
    spec = provider.command
    create = typer.Option("--create", help=f"Call {spec.display}'s API (needs {provider.account_key}).")
    rows: list[tuple[str, Any, Any]] = [
        ("ref", RefArg, inspect.Parameter.empty),
        ("release_index", ReleaseIndexOpt, Path("releases/index.json")),
        ("platform", ReleasePlatformOpt, None),
        *((o.name, _annotation(o), o.default) for o in spec.options if not o.after_api_url),
        *guard_options.PARAMETERS,
        ("create", Annotated[bool, create], False),
        ("api_url", Annotated[str, typer.Option(metavar="URL", help=spec.api_url_help)], provider.template_url),
        *((o.name, _annotation(o), o.default) for o in spec.options if o.after_api_url),
        ("allow_private_registry", AllowPrivateRegistryOpt, False),
    ]
    names = [name for name, _, _ in rows]
    if len(names) != len(set(names)):
        raise TypeError(f"{provider.template_command}: an option of its spec repeats a shared one ({names})")
    kind = inspect.Parameter.KEYWORD_ONLY
    return [inspect.Parameter(name, kind, annotation=hint, default=default) for name, hint, default in rows]


def _annotation(option: TemplateOption) -> Any:
    kind = option.kind if option.default is not None else option.kind | None
    flag = "--" + option.name.replace("_", "-")
    info = typer.Option(flag, help=option.help, metavar=option.metavar, min=option.minimum, max=option.maximum)
    return Annotated[kind, info]


def _epilog(provider: Provider) -> str:
    command, key = provider.template_command, provider.account_key
    examples = [
        (f"{key}=... " if "--create" in args.split() else "") + f"imagekit {command} {args}"
        for args in provider.command.examples
    ]
    return "Examples: " + "; ".join(examples)


def _check(spec: TemplateCommand, options: dict[str, Any], *, first: bool) -> None:
    for option in spec.options:
        if option.check is not None and option.check_first == first and options[option.name] is not None:
            option.check(options[option.name])


def _run(provider: Provider, values: dict[str, Any]) -> None:
    """Print the template, or create it (--create): the same steps and checks for every provider."""
    from imagekit.compat import contract
    from imagekit.services import inputs
    from imagekit.services.pods import remote_contract

    spec, platform = provider.command, values["platform"]
    options = {o.name: values[o.name] for o in spec.options}
    validate_http_url(values["api_url"], "--api-url")
    _check(spec, options, first=True)
    guard = guard_defaults.env(guard_options.choice(values))  # every template is guarded unless --no-guard
    wanted = validate.platform(platform) if platform is not None else None
    entry = remote_contract.release(values["release_index"], values["ref"], wanted)
    if "source" in entry:
        err_console().print(f"{provider.template_command}: from {entry['source']}", markup=False)
    _check(spec, options, first=False)
    data = inputs.compat_data()
    keywords = {o.keyword or o.name: options[o.name] for o in spec.options if o.keyword is not None}
    built = provider.template(entry, **keywords, runtime=contract.of_record(entry, data), data=data, guard=guard)
    body = spec.request(built)
    _say_armed(provider, guard)
    for warning in spec.warnings(entry, body):
        err_console().print(warning, markup=False)
    unreachable, unit = unreachable_registry(entry["tag"]), spec.unit
    hint = (
        f"publish to a registry {unit}s can pull from (`imagekit build --push --registry ghcr.io/ORG/REPO`), "
        f"or pass --allow-private-registry if your {unit}s reach it"
    )
    if not values["create"]:
        if unreachable:
            err_console().print(
                f"warning: no {unit} can pull {entry['tag']}: {unreachable}\nhint: {hint}", markup=False
            )
        out_json(body)
        return
    if unreachable and not values["allow_private_registry"]:
        raise UsageError(f"no {unit} can pull {entry['tag']}: {unreachable}", hint)
    _create(provider, entry, body, options, values["api_url"])


def _say_armed(provider: Provider, guard: dict[str, str]) -> None:
    """What the template's lifetime guard does, and how to turn it off (stderr: stdout is the template)."""
    said = guard_defaults.armed(guard)
    command = f"imagekit {provider.template_command}"
    line = (
        f"lifetime guard armed: {'; '.join(said)}; off: {command} --no-guard (or a trigger's flag with off)"
        if said
        else f"lifetime guard: off ({command} --no-guard): nothing stops these {provider.command.unit}s but you"
    )
    err_console().print(line, markup=False)


def _create(provider: Provider, entry: dict, body: dict, options: dict[str, Any], api_url: str) -> None:
    """--create: the provider's API client (`imagekit.effects.<name>_api`) makes the template."""
    spec, tag = provider.command, entry["tag"]
    if spec.pull_credentials is not None and options[spec.pull_credentials] is None:
        _refuse_a_private_image(tag, entry["digest"] if entry.get("pinned") is True else None, spec)
    key = os.environ.get(provider.account_key)
    if not key:
        raise UsageError(
            f"--create needs {provider.account_key} in the environment", f"export {provider.account_key}=..."
        )
    client = importlib.import_module(f"imagekit.effects.{provider.name}_api")
    made = client.create_template(body, key, api_url)
    out_json({spec.answer_key: made})
    note = spec.created_note.format(**options)
    err_console().print(f"created {spec.display} template {made[spec.made_id]} for {tag}{note}", markup=False)


def _refuse_a_private_image(tag: str, digest: str | None, spec: TemplateCommand) -> None:
    """A template without registry credentials for an image only credentials can pull gives pods that never start
    (the image as the template names it: by ``digest`` when it is pinned to one)."""
    from imagekit.effects import registry
    from imagekit.errors import EnvironmentFailure

    repository, name = tag.rsplit(":", 1)
    try:
        why = registry.anonymous_refusal(registry.Remote.parse(repository), digest or name)
    except EnvironmentFailure as exc:
        err_console().print(f"warning: could not check that {spec.unit}s can pull {tag}: {exc.message}", markup=False)
        return
    if why:
        raise UsageError(
            f"a {spec.unit} without registry credentials cannot pull {tag}: {why}", spec.pull_credentials_hint
        )
