"""POST a GraphQL request to RunPod (base URL overridable). The API key goes in a header, never in logs."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from imagekit.errors import CheckFailed, EnvironmentFailure

DEFAULT_API = "https://api.runpod.io/graphql"


def post(body: dict, api_key: str, url: str = DEFAULT_API) -> dict:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise CheckFailed(f"RunPod refused the API key (HTTP {exc.code})", "check RUNPOD_API_KEY") from None
        raise EnvironmentFailure(f"RunPod API answered HTTP {exc.code}", "retry later") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EnvironmentFailure(
            f"cannot reach the RunPod API: {exc.__class__.__name__}", "check the network"
        ) from None
    if doc.get("errors"):
        raise CheckFailed(f"RunPod rejected the template: {doc['errors'][0].get('message')}", "fix the template input")
    return doc
