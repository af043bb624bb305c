"""Vast.ai's template API (base URL overridable): the API key goes in a header (never in logs or errors, never to
another origin); what Vast answers is checked (shape, size, characters) before any of it is used or shown."""

from __future__ import annotations

import json
import re

from imagekit.clouds import providers
from imagekit.effects import http
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.trust import untrusted, urls
from imagekit.trust.redact import redact_text

VAST = providers.named("vast")
DEFAULT_API = VAST.template_url
KEY_VARIABLE = VAST.account_key
MAX_KEY = 4096
_HASH_ID = re.compile(r"[A-Za-z0-9]{1,128}", re.ASCII)


def authorization(api_key: str) -> dict[str, str]:
    """The Authorization header; a key that cannot be one is a usage error naming the variable, never the value."""
    try:
        if len(api_key) > MAX_KEY:
            raise untrusted.UntrustedData(f"{KEY_VARIABLE} is longer than {MAX_KEY} characters")
        untrusted.header_value(api_key, KEY_VARIABLE)
    except untrusted.UntrustedData as exc:
        raise UsageError(
            f"{exc}: it cannot be sent as an API key",
            f"set {KEY_VARIABLE} to the key as Vast's console shows it (Account, Keys), nothing around it",
        ) from None
    return {"Authorization": f"Bearer {api_key}"}


def create_template(body: dict, api_key: str, url: str = DEFAULT_API) -> dict:
    """Create the template (`imagekit vast-template --create`); ``{"id": ..., "hash_id": ...}`` exactly when Vast says
    it made one."""
    headers = {"Content-Type": "application/json", "Accept": "application/json", **authorization(api_key)}
    urls.require_http(url, "--api-url", UsageError, f"pass Vast's template endpoint, {DEFAULT_API}")
    try:
        status, _, raw, final = http.request_final(
            "POST", url, headers=headers, content=json.dumps(body).encode(), max_bytes=1 << 20
        )
    except EnvironmentFailure as exc:
        raise EnvironmentFailure(f"cannot reach the Vast API: {exc.message}", "check the network") from None
    http.provider_answer("Vast", url, final, status, KEY_VARIABLE)
    doc = http.parse_json(raw, "the Vast API", "check --api-url: it must be Vast's template endpoint")
    if not isinstance(doc, dict):
        raise EnvironmentFailure("the Vast API answered JSON that is not an object", "check --api-url")
    if status != 200 or doc.get("success") is not True:
        why = doc.get("msg") or doc.get("error")
        shown = untrusted.printable(redact_text(why), 300) if isinstance(why, str) else f"HTTP {status}"
        raise CheckFailed(f"Vast did not create the template: {shown}", "fix the template, or retry later")
    made = doc.get("template")
    ident = made.get("id") if isinstance(made, dict) else None
    hash_id = made.get("hash_id") if isinstance(made, dict) else None
    if isinstance(ident, bool) or not isinstance(ident, int) or not isinstance(hash_id, str):
        raise EnvironmentFailure("the Vast API did not say which template it made", "check --api-url")
    if not _HASH_ID.fullmatch(hash_id):
        raise EnvironmentFailure("the Vast API answered a template hash_id that is not one", "check --api-url")
    return {"id": ident, "hash_id": hash_id}


_INSTANCE_ID = re.compile(r"[0-9]{1,12}", re.ASCII)
MAX_ANSWER = 32 << 20  # bytes of an instance list read (an instance is about 3 kB: ten thousand of them)


def _base(base: str) -> str:
    """The API base as given, checked: http(s), no query or fragment (a path is appended to it)."""
    urls.require_http(base, "--api-url", UsageError, f"pass Vast's API base, {VAST.api}")
    if "?" in base or "#" in base:
        raise UsageError(f"--api-url {untrusted.printable(base, 80)!r} has a query or a fragment", f"pass {VAST.api}")
    return base.rstrip("/")


def _send(method: str, url: str, api_key: str, body: dict | None = None) -> tuple[int, bytes]:
    headers = {"Accept": "application/json", **authorization(api_key)}
    content = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        content = json.dumps(body).encode()
    try:  # a stop or a delete is sent once, where it was aimed: a redirect is an answer, not a new target
        status, _, raw, final = http.request_final(
            method, url, headers=headers, content=content, max_bytes=MAX_ANSWER, redirects=method == "GET"
        )
    except EnvironmentFailure as exc:
        raise EnvironmentFailure(f"the Vast API: {exc.message}", exc.hint) from None
    http.provider_answer("Vast", url, final, status, KEY_VARIABLE)
    # whatever Vast echoes back (a body quoted in an error, its own message) is shown without the key
    return status, raw.replace(api_key.encode(), f"<{KEY_VARIABLE}>".encode())


def list_pods(api_key: str, base: str = VAST.api) -> list[dict]:
    """Vast's API: GET /instances/, the account's instances (``{"instances": [...]}``; each entry an object, its
    fields checked where they are read, `clouds.reap.read_vast`). Anything else is exit 3."""
    status, raw = _send("GET", _base(base) + "/instances/", api_key)
    if status != 200:
        hint = f"check --api-url: Vast's API base is {VAST.api}" if status == 404 else "retry later"
        raise EnvironmentFailure(f"Vast API answered HTTP {status} to list the instances", hint)
    doc = http.parse_json(raw, "the Vast API", f"check --api-url: it must be Vast's API base ({VAST.api})")
    found = doc.get("instances") if isinstance(doc, dict) else None
    if not isinstance(found, list):
        raise EnvironmentFailure("Vast's answer to GET /instances/ has no list of instances", "check --api-url")
    return [instance for instance in found if isinstance(instance, dict)]


def pod_action(action: str, pod_id: str, api_key: str, base: str = VAST.api) -> dict:
    """Vast's API, the calls of ``facts``' row (the guard makes the first two in the pod): ``stop`` (PUT
    /instances/{id}/ with state stopped: the GPU's billing ends, the disk stays, billed), ``terminate`` (DELETE
    /instances/{id}/: the instance and its disk are gone) or ``start`` (state running: a stopped instance runs again,
    when its machine has room)."""
    if not isinstance(pod_id, str) or not _INSTANCE_ID.fullmatch(pod_id):
        raise UsageError(f"not a Vast instance id: {untrusted.printable(str(pod_id), 80)!r}", "ids are numbers")
    if action not in ("start", "stop", "terminate"):
        raise UsageError(f"not an instance action: {untrusted.printable(action, 40)!r}", "start, stop or terminate")
    call = getattr(VAST.pod, action)
    url = _base(base) + call.path.replace("{id}", pod_id)
    status, raw = _send(call.method, url, api_key, dict(call.body) if call.body is not None else None)
    if status == 404:
        raise CheckFailed(f"Vast has no instance {pod_id}", "check the id (imagekit never guesses one)")
    if status in (401, 403):
        raise UsageError(f"Vast refused to {action} instance {pod_id} (HTTP {status})", f"check {KEY_VARIABLE}")
    if status not in (200, 201, 202, 204):
        raise EnvironmentFailure(f"Vast API answered HTTP {status} to {action} {pod_id}", "retry later")
    doc = http.parse_json(raw, "the Vast API", "check --api-url") if raw.strip() else {}
    if not isinstance(doc, dict) or doc.get("success", True) is not True:
        why = doc.get("msg") or doc.get("error") if isinstance(doc, dict) else None
        shown = untrusted.printable(redact_text(why), 300) if isinstance(why, str) else "no success: true"
        raise CheckFailed(f"Vast did not {action} instance {pod_id}: {shown}", "retry, or end it in Vast's console")
    return doc
