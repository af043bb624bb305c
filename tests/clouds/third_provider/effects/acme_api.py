"""Acme's template API, made up for a test: the one module `effects/<name>_api.py` a provider adds. The key goes in a
header; the answer is checked before it is used."""

from __future__ import annotations

import json
import re

from imagekit.clouds import providers
from imagekit.effects import http
from imagekit.errors import EnvironmentFailure, UsageError

ACME = providers.named("acme")


def create_template(body: dict, api_key: str, url: str = ACME.template_url) -> dict:
    """POST the template; ``{"id": ...}`` exactly when Acme says it made one."""
    http.require_http(url, "--api-url", UsageError, f"pass Acme's template endpoint, {ACME.template_url}")
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
    status, _, raw, final = http.request_final(
        "POST", url, headers=headers, content=json.dumps(body).encode(), max_bytes=1 << 16
    )
    http.provider_answer("Acme", url, final, status, ACME.account_key)
    doc = http.parse_json(raw, "the Acme API")
    ident = doc.get("id") if isinstance(doc, dict) else None
    if status != 201 or not isinstance(ident, str) or not re.fullmatch(r"[a-z0-9]{1,32}", ident):
        raise EnvironmentFailure("the Acme API did not say which template it made", "check --api-url")
    return {"id": ident}
