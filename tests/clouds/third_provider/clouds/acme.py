"""Acme, a GPU cloud made up for a test: the one module `clouds/<name>.py` a provider adds, with all the host needs of
it: its row of the provider registry, its template builder and the options of `imagekit acme-template`. Pure."""

from __future__ import annotations

import math
from typing import Any

from imagekit.clouds.provider_spec import Provider, TemplateCommand, TemplateOption
from imagekit.errors import UsageError
from imagekit.in_image import facts

REGIONS = ("eu", "us")


def check_region(value: str) -> None:
    """--region: one of Acme's regions, or a usage error."""
    if value not in REGIONS:
        raise UsageError(f"invalid --region {value[:40]!r}", f"pass one of {', '.join(REGIONS)}")


def template(
    entry: dict,
    *,
    region: str = "eu",
    spot: bool = False,
    require_gpu: bool = True,
    runtime: Any = None,
    data: Any = None,
    guard: dict[str, str] | None = None,
) -> dict:
    """From a release-index entry: the image by its immutable tag, where and how it runs, the disk sized from it,
    the lifetime guard's env (``guard``, as `imagekit acme-template` passes it from the shared guard options)."""
    return {
        "name": f"imagekit {entry['manifest']['cell']['id']}",
        "image": entry["tag"],
        "region": region,
        "interruptible": spot,
        "env": {"IMAGEKIT_REQUIRE_GPU": "1" if require_gpu else "0", **(guard or {})},
        "disk_gb": max(20, math.ceil(entry.get("size_bytes", 0) / 1e9 * 1.5 + 10)),
        "min_cuda": runtime.cuda if runtime is not None else None,
    }


def pod_body(entry: dict, data: Any, gpu: str, *, count: int = 1, cloud: str = "eu", volume_gb: int = 50,
             registry_auth: str | None = None, arch: str | None = None, guard: dict[str, str] | None = None,
             env: dict[str, str] | None = None) -> dict:  # fmt: skip
    """`imagekit pod create --provider acme`: a machine for the image, its guard and `pod reap`'s marks in its env."""
    check_region(cloud)
    return {"name": f"imagekit {entry['manifest']['cell']['id']}", "image": entry["tag"], "region": cloud,
            "gpu": gpu, "gpus": count, "disk_gb": volume_gb, "env": {**(guard or {}), **(env or {})}}  # fmt: skip


def reap_pod(doc: dict, records: list) -> Any:
    """A machine of Acme's `GET /machines` as `pod reap` reads it."""
    import datetime as dt

    from imagekit.clouds import reap

    ident, env = doc.get("id"), doc.get("env") if isinstance(doc.get("env"), dict) else {}
    if not isinstance(ident, str) or not ident.isalnum():
        return None
    status = {"on": "RUNNING", "off": "EXITED"}.get(doc.get("state"), "?")
    started = dt.datetime.fromtimestamp(doc["since"], dt.UTC) if isinstance(doc.get("since"), int) else None
    ours, created, deadline = reap.whose(ident, env, records, started)
    util = reap.percent(doc.get("gpu_percent"))
    return reap.Pod(ident, str(doc.get("name", "?"))[:80], status, ours, created, started, deadline,
                    reap.price(doc, ("usd_per_hour",)), None if util is None else (util,))  # fmt: skip


PROVIDER = Provider(
    facts.provider_named("acme"),
    account_key="ACME_API_KEY",
    template_api="/templates",
    template=template,
    command=TemplateCommand(
        display="Acme",
        summary="Print the Acme template for a published image; --create makes it on Acme.",
        api_url_help="Acme's template endpoint.",
        examples=("cu121-torch2.1.2-py3.11-tf4.48.2", "CELL --region us --create"),
        options=(
            TemplateOption(
                "region", str, "eu", "Where its machines run.", "eu|us", check=check_region, check_first=True
            ),
            TemplateOption("spot", bool, False, "Rent interruptible machines."),
        ),
        unit="machine",
        created_note=" in {region}",
    ),
    pod_body=pod_body,
    pod_price=lambda answer: f"{answer.get('usd_per_hour', '?')} $/h",
    pod_clouds=REGIONS,
    reap_pod=reap_pod,
)
