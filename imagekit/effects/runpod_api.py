"""POST a GraphQL request to RunPod (base URL overridable). The API key goes in a header, never in logs, and never
to another origin (see imagekit.effects.http)."""

from __future__ import annotations

import json
import re

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
        raise EnvironmentFailure(f"RunPod refused the API key (HTTP {status})", "check RUNPOD_API_KEY")
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


DEFAULT_REST = "https://rest.runpod.io/v1"
_POD_ID = re.compile(r"[A-Za-z0-9]{4,64}", re.ASCII)


def pod_action(action: str, pod_id: str, api_key: str, base: str = DEFAULT_REST) -> dict:
    """RunPod's REST API: ``stop`` (POST /pods/{id}/stop: billing for the GPU ends, the volume stays) or
    ``terminate`` (DELETE /pods/{id}: the pod and its container disk are gone)."""
    if not _POD_ID.fullmatch(pod_id or ""):
        raise UsageError(f"not a RunPod pod id: {pod_id!r}", "give the id from the console or API, e.g. abc123xyz456")
    http.require_http(base, "--api-url", UsageError, f"pass RunPod's REST base, {DEFAULT_REST}")
    method, path = ("POST", f"/pods/{pod_id}/stop") if action == "stop" else ("DELETE", f"/pods/{pod_id}")
    try:
        status, _, raw = http.request(method, base.rstrip("/") + path, headers={"Authorization": f"Bearer {api_key}"})
    except EnvironmentFailure as exc:
        raise EnvironmentFailure(f"cannot reach the RunPod API: {exc.message}", "check the network") from None
    if status in (401, 403):
        raise EnvironmentFailure(f"RunPod refused the API key (HTTP {status})", "check RUNPOD_API_KEY")
    if status == 404:
        raise CheckFailed(f"RunPod has no pod {pod_id}", "check the id (imagekit never guesses one)")
    if status not in (200, 201, 202, 204):
        raise EnvironmentFailure(f"RunPod API answered HTTP {status} to {action} {pod_id}", "retry later")
    if not raw.strip():
        return {}
    doc = http.parse_json(raw, "the RunPod API", f"check --api-url: it must be RunPod's REST base ({DEFAULT_REST})")
    return doc if isinstance(doc, dict) else {"answer": doc}
