"""Acme's template API, made up for a test: the one module `effects/<name>_api.py` a provider adds. The key goes in a
header; the answer is checked before it is used."""

from __future__ import annotations

import json
import re

from imagekit.clouds import providers
from imagekit.effects import http
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.trust import urls

ACME = providers.named("acme")


def create_template(body: dict, api_key: str, url: str = ACME.template_url) -> dict:
    """POST the template; ``{"id": ...}`` exactly when Acme says it made one."""
    urls.require_http(url, "--api-url", UsageError, f"pass Acme's template endpoint, {ACME.template_url}")
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


def _call(method: str, url: str, api_key: str, body: dict | None = None, redirects: bool = False) -> object:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
    content = json.dumps(body).encode() if body is not None else None
    status, _, raw, final = http.request_final(method, url, headers=headers, content=content, max_bytes=1 << 20,
                                               redirects=redirects)  # fmt: skip
    http.provider_answer("Acme", url, final, status, ACME.account_key)
    if status == 404:
        raise CheckFailed("Acme has no such machine", "check the id")
    if status not in (200, 201, 204):
        raise EnvironmentFailure(f"the Acme API answered HTTP {status}", "retry later")
    return http.parse_json(raw, "the Acme API") if raw.strip() else {}


def create_pod(body: dict, api_key: str, base: str = ACME.api) -> dict:
    """POST /machines: the machine's id, exactly when Acme says it made one."""
    doc = _call("POST", base.rstrip("/") + "/machines", api_key, body)
    ident = doc.get("id") if isinstance(doc, dict) else None
    if not isinstance(ident, str) or not re.fullmatch(r"[a-z0-9]{1,32}", ident):
        raise EnvironmentFailure("the Acme API did not say which machine it made", "check --api-url")
    return doc


def pod_action(action: str, pod_id: str, api_key: str, base: str = ACME.api) -> dict:
    """The call of the facts row for ``action`` (start, stop, terminate)."""
    if not re.fullmatch(r"[a-z0-9]{1,32}", pod_id):
        raise UsageError(f"not an Acme machine id: {pod_id[:40]!r}", "ids are lower-case letters and digits")
    call = getattr(ACME.pod, action)
    doc = _call(call.method, base.rstrip("/") + call.path.replace("{id}", pod_id), api_key, call.body)
    return doc if isinstance(doc, dict) else {}


def list_pods(api_key: str, base: str = ACME.api) -> list[dict]:
    """GET /machines: the account's machines."""
    doc = _call("GET", base.rstrip("/") + "/machines", api_key, redirects=True)
    found = doc.get("machines") if isinstance(doc, dict) else None
    return [m for m in found if isinstance(m, dict)] if isinstance(found, list) else []
