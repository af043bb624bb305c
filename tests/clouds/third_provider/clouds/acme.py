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
)
