"""POST a GraphQL request to RunPod (base URL overridable). The API key goes in a header, never in logs, and never
to another origin (see imagekit.effects.http)."""

from __future__ import annotations

import json

from imagekit.effects import http
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError

DEFAULT_API = "https://api.runpod.io/graphql"


def post(body: dict, api_key: str, url: str = DEFAULT_API) -> dict:
    http.require_http(url, "--api-url", UsageError, "pass the RunPod GraphQL endpoint, https://api.runpod.io/graphql")
    try:
        status, _, raw = http.request(
            "POST",
            url,
            content=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
        )
    except EnvironmentFailure as exc:
        raise EnvironmentFailure(f"cannot reach the RunPod API: {exc.message}", "check the network") from None
    if status in (401, 403):
        raise CheckFailed(f"RunPod refused the API key (HTTP {status})", "check RUNPOD_API_KEY")
    if status != 200:
        raise EnvironmentFailure(f"RunPod API answered HTTP {status}", "retry later")
    doc = http.parse_json(raw, "the RunPod API", "check --api-url: it must be RunPod's GraphQL endpoint")
    if not isinstance(doc, dict):
        raise EnvironmentFailure("the RunPod API answered JSON that is not an object", "check --api-url")
    if doc.get("errors"):
        first = doc["errors"][0] if isinstance(doc["errors"], list) and doc["errors"] else {}
        message = first.get("message") if isinstance(first, dict) else first
        raise CheckFailed(f"RunPod rejected the template: {message}", "fix the template input")
    return doc
