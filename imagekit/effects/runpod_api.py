"""RunPod's APIs (base URLs overridable): GraphQL (``saveTemplate``: the template's readme has no REST v2 field) and
REST v2 (create, list, look up, start, stop, terminate a pod: v1 was retired on 2026-11-15; docs/pods.md, "Provider
APIs"). The API key goes in a header, checked first (never in logs or errors, never to another origin:
imagekit.effects.http); a request that changes something is sent once, where it was aimed (a redirect is an answer,
not a new target); what RunPod answers is checked here (shape, size, characters: imagekit.trust.untrusted) before any
of it is used or shown."""

from __future__ import annotations

import json
import re

from imagekit.clouds import providers
from imagekit.effects import http
from imagekit.errors import CheckFailed, EnvironmentFailure, NotSent, PodMayExist, UsageError
from imagekit.trust import untrusted, urls
from imagekit.trust.redact import redact_text

RUNPOD = providers.named("runpod")
DEFAULT_API = RUNPOD.template_url  # GraphQL
KEY_VARIABLE = RUNPOD.account_key
MAX_KEY = 4096
_TEMPLATE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)
MAX_ANSWER = 4 << 20  # bytes of an answer read
# httpx's errors that mean the request never left (http.stream names the class in its message): nothing was created
_NOT_SENT = ("ConnectError", "ConnectTimeout", "UnsupportedProtocol", "ProxyError")


def authorization(api_key: str) -> dict[str, str]:
    """The Authorization header for ``api_key``; a key that cannot be one (a CR or LF read from a file, a non-ASCII
    character, surrounding spaces) is a usage error naming the variable and what is wrong, never the value."""
    try:
        if len(api_key) > MAX_KEY:
            raise untrusted.UntrustedData(f"{KEY_VARIABLE} is longer than {MAX_KEY} characters")
        untrusted.header_value(api_key, KEY_VARIABLE)
    except untrusted.UntrustedData as exc:
        hint = (
            f"strip the line ending: export {KEY_VARIABLE}=$(tr -d '\\r\\n' < key.txt)"
            if "\r" in api_key or "\n" in api_key
            else f"set {KEY_VARIABLE} to the key as RunPod's console shows it (Settings, API Keys), nothing around it"
        )
        raise UsageError(f"{exc}: it cannot be sent as an API key", hint) from None
    return {"Authorization": f"Bearer {api_key}"}


def _send(
    method: str, url: str, headers: dict[str, str], content: bytes | None = None, follow: bool | None = None
) -> tuple[int, bytes]:
    """(status, answer) of one request; a redirect is followed (on the same origin: http's rule) only by a GET and
    by ``follow`` (GraphQL's template save): a pod action is sent once, where it was aimed (Vast's client too)."""
    try:
        status, _, raw, final = http.request_final(
            method, url, headers=headers, content=content, max_bytes=MAX_ANSWER,
            redirects=method == "GET" if follow is None else follow,
        )  # fmt: skip
    except EnvironmentFailure as exc:
        raise EnvironmentFailure(f"cannot reach the RunPod API: {exc.message}", "check the network") from None
    http.provider_answer("RunPod", url, final, status, KEY_VARIABLE)
    return status, raw


def post(body: dict, api_key: str, url: str = DEFAULT_API) -> dict:
    """A GraphQL request; its answer, an object without ``errors`` (RunPod's rejection is exit 1, quoted as
    plain text; an answer of another shape is exit 3)."""
    headers = {"Content-Type": "application/json", **authorization(api_key)}
    urls.require_http(url, "--api-url", UsageError, f"pass the RunPod GraphQL endpoint, {DEFAULT_API}")
    status, raw = _send("POST", url, headers, json.dumps(body).encode(), follow=True)
    if status != 200:
        raise EnvironmentFailure(f"RunPod API answered HTTP {status}", "retry later")
    doc = http.parse_json(raw, "the RunPod API", "check --api-url: it must be RunPod's GraphQL endpoint")
    if not isinstance(doc, dict):
        raise EnvironmentFailure("the RunPod API answered JSON that is not an object", "check --api-url")
    errors = doc.get("errors")
    if errors is not None and errors != []:
        messages = [e.get("message") for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []
        if not messages or not all(isinstance(m, str) for m in messages):
            raise EnvironmentFailure(
                "the RunPod API answered errors of an unknown shape", "check --api-url: it must be RunPod's GraphQL"
            )
        raise CheckFailed(
            f"RunPod rejected the request: {untrusted.printable(redact_text(messages[0]))}", "fix the template input"
        )
    return doc


def create_template(body: dict, api_key: str, url: str = DEFAULT_API) -> dict:
    """``saveTemplate``, as `imagekit runpod-template --create` calls it; the saved template's fields, exactly when
    RunPod says it saved one (``data.saveTemplate`` with a template id). Anything else (an empty answer after a
    redirect turned the POST into a GET) is exit 3."""
    doc = post(body, api_key, url)
    data = doc.get("data")
    saved = data.get("saveTemplate") if isinstance(data, dict) else None
    template_id = saved.get("id") if isinstance(saved, dict) else None
    if not isinstance(template_id, str) or not _TEMPLATE_ID.fullmatch(template_id):
        raise EnvironmentFailure(
            "the RunPod API did not say it saved the template (no data.saveTemplate.id in its answer)",
            "check --api-url: it must be RunPod's GraphQL endpoint, reached without a redirect",
        )
    return {
        k: v if isinstance(v, int | float | bool) or v is None else untrusted.printable(v) for k, v in saved.items()
    }


DEFAULT_REST = RUNPOD.api  # REST v2
_POD_ID = re.compile(r"[A-Za-z0-9_]{4,64}", re.ASCII)
ACTIONS = ("start", "stop", "terminate")


def _pod_id(pod_id: str) -> None:
    if not isinstance(pod_id, str) or not _POD_ID.fullmatch(pod_id):
        raise UsageError(
            f"not a RunPod pod id: {untrusted.printable(pod_id, 80)!r}",
            "give the id from the console or API, e.g. abc123xyz456",
        )


def problem(raw: bytes) -> str:
    """What RunPod's error answer says (REST v2's ``application/problem+json``: title, detail, errors), as plain text
    without credentials; the answer itself, cut short, when it is not that."""
    try:
        doc = json.loads(raw[:65536])
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        said = [doc[k] for k in ("title", "detail") if isinstance(doc.get(k), str)]
        errors = doc.get("errors")
        said += [e for e in errors if isinstance(e, str)][:3] if isinstance(errors, list) else []
        if said:
            return untrusted.printable(redact_text(": ".join(said)), 300)
    return untrusted.printable(redact_text(raw.decode("utf-8", "replace")), 300) or "no detail"


def _rest(base: str) -> str:
    urls.require_http(base, "--api-url", UsageError, f"pass RunPod's REST base, {DEFAULT_REST}")
    return base.rstrip("/")


def get_pod(pod_id: str, api_key: str, base: str = DEFAULT_REST) -> dict:
    """RunPod's REST API: GET /pods/{id} (an object; the fields read from it are checked where they are read,
    `runpod.volumes`, `clouds.reap`)."""
    _pod_id(pod_id)
    status, raw = _send("GET", _rest(base) + f"/pods/{pod_id}", authorization(api_key))
    if status == 404:
        raise CheckFailed(f"RunPod has no pod {pod_id}", "check the id (imagekit never guesses one)")
    if status != 200:
        raise EnvironmentFailure(f"RunPod API answered HTTP {status} to look up pod {pod_id}", "retry later")
    doc = http.parse_json(raw, "the RunPod API", f"check --api-url: it must be RunPod's REST base ({DEFAULT_REST})")
    if not isinstance(doc, dict):
        raise EnvironmentFailure("RunPod's answer is not a pod", "check --api-url: it must be RunPod's REST base")
    return doc


def list_pods(api_key: str, base: str = DEFAULT_REST) -> list[dict]:
    """RunPod's REST API: GET /pods, the account's pods (``{"pods": [...]}``; each entry an object, its fields checked
    where they are read, `clouds.reap`). Anything else is exit 3."""
    status, raw = _send("GET", _rest(base) + "/pods", authorization(api_key))
    if status != 200:
        raise EnvironmentFailure(f"RunPod API answered HTTP {status} to list the pods", "retry later")
    doc = http.parse_json(raw, "the RunPod API", f"check --api-url: it must be RunPod's REST base ({DEFAULT_REST})")
    found = doc.get("pods") if isinstance(doc, dict) else None
    if not isinstance(found, list):
        raise EnvironmentFailure("RunPod's answer to GET /pods has no list of pods", "check --api-url: RunPod's REST")
    return [pod for pod in found if isinstance(pod, dict)]


def pod_action(action: str, pod_id: str, api_key: str, base: str = DEFAULT_REST) -> dict:
    """RunPod's REST API: POST /pods/{id}/action with ``start`` (a stopped pod runs again, its volume as it was),
    ``stop`` (billing for the GPU ends, the volume stays) or ``terminate`` (the pod, its container disk and its pod
    volume are gone). The pod as RunPod answers it ({} after a terminate); an action its status does not allow (a
    start of a running pod) is exit 1, with what RunPod said."""
    if action not in ACTIONS:
        raise UsageError(f"not a pod action: {untrusted.printable(action, 40)!r}", " or ".join(ACTIONS))
    _pod_id(pod_id)
    headers = {"Content-Type": "application/json", **authorization(api_key)}
    url = _rest(base) + f"/pods/{pod_id}/action"
    status, raw = _send("POST", url, headers, json.dumps({"action": action}).encode())
    if status == 404:
        raise CheckFailed(f"RunPod has no pod {pod_id}", "check the id (imagekit never guesses one)")
    if status == 409:
        raise CheckFailed(
            f"RunPod will not {action} pod {pod_id} in the state it is in: {problem(raw)}",
            "imagekit pod reap --dry-run lists your pods with their state",
        )
    if status not in (200, 201, 202, 204):
        raise EnvironmentFailure(f"RunPod API answered HTTP {status} to {action} {pod_id}: {problem(raw)}", "retry")
    if not raw.strip():
        return {}
    doc = http.parse_json(raw, "the RunPod API", f"check --api-url: it must be RunPod's REST base ({DEFAULT_REST})")
    return doc if isinstance(doc, dict) else {"answer": doc}


def create_pod(body: dict, api_key: str, base: str = DEFAULT_REST) -> dict:
    """RunPod's REST API: POST /pods (v2's body: `clouds.pod_create.body`). The new pod's id (checked) and the fields
    shown of it, as plain text.

    Once RunPod has the request, a pod may exist and bill whatever comes back: an accepted request (2xx) whose answer
    cannot be read (not JSON, no usable id, cut short), or a request sent but never answered, is exit 3 saying so
    and how to find and stop the pod (:class:`PodMayExist`)."""
    headers = {"Content-Type": "application/json", **authorization(api_key)}
    url = _rest(base) + "/pods"
    status, raw, unread = _send_create(url, headers, json.dumps(body).encode(), body)
    if status in (400, 402, 422):  # a rule, no capacity; the balance; a body RunPod's contract refuses
        why = {402: "the account's balance is too low", 422: "the request does not fit RunPod's API"}.get(status, "")
        raise CheckFailed(
            f"RunPod refused the pod (HTTP {status}{': ' + why if why else ''}): {problem(raw)}",
            "add credit in RunPod's console" if status == 402 else "check --gpu, --cloud, --volume and the image",
        )
    if status == 429:
        raise EnvironmentFailure("RunPod asked to slow down (HTTP 429): nothing was created", "retry in a minute")
    if status not in (200, 201):
        raise EnvironmentFailure(f"RunPod API answered HTTP {status} to create a pod", "retry later")
    if unread is not None:
        raise _may_exist(
            f"RunPod accepted the request (HTTP {status}), but its answer was cut short ({unread})", base, body
        )
    try:
        doc = http.parse_json(raw, "the RunPod API")
    except EnvironmentFailure as exc:
        raise _may_exist(f"RunPod accepted the request (HTTP {status}), but {exc.message}", base, body) from None
    pod_id = doc.get("id") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or pod_id is None:
        what = "its answer has no pod id" if isinstance(doc, dict) else "its answer is not a JSON object"
        raise _may_exist(f"RunPod accepted the request (HTTP {status}), but {what}", base, body)
    if not isinstance(pod_id, str) or not _POD_ID.fullmatch(pod_id):
        shown = untrusted.printable(pod_id if isinstance(pod_id, str) else json.dumps(pod_id), 80)
        raise _may_exist(
            f"RunPod accepted the request (HTTP {status}), but its answer has no pod id imagekit can use (it said "
            f"{shown!r}, shown as plain text)",
            base,
            body,
        )
    return doc


def _may_exist(what: str, base: str, body: dict) -> PodMayExist:
    """The error of a create whose outcome is unknown, with how to find the pod and end it."""
    name = untrusted.printable(body.get("name", "?"), 120)
    image = untrusted.printable(body.get("image", "?"), 200)
    listing = f"{urls.display(base).rstrip('/')}/pods"
    return PodMayExist(
        f"{what}: a pod may exist and bill from now on; imagekit does not know its id",
        f"look for a pod named {name!r} (image {image}) in RunPod's console (console.runpod.io, Pods) or "
        f'with curl -H "Authorization: Bearer ${KEY_VARIABLE}" {listing}, then end it: imagekit pod stop ID (the '
        "volume stays, billed) or imagekit pod terminate ID; do not run pod create again before you have looked",
    )


def _send_create(url: str, headers: dict[str, str], content: bytes, body: dict) -> tuple[int, bytes, str | None]:
    """POST the create: (status, the answer's bytes, why they were cut short or None). A failure before any answer
    is :class:`PodMayExist` unless the connection itself failed (then nothing was sent)."""
    import httpx

    try:
        with http.stream("POST", url, headers=headers, content=content, redirects=False) as resp:
            status, final = resp.status_code, str(resp.url)
            raw, unread = bytearray(), None
            try:
                for chunk in resp.iter_bytes():
                    raw += chunk
                    if len(raw) > MAX_ANSWER:
                        unread = f"more than {MAX_ANSWER} bytes"
                        break
            except httpx.HTTPError as exc:
                unread = untrusted.printable(redact_text(str(exc)), 200) or exc.__class__.__name__
    except EnvironmentFailure as exc:
        if any(name in exc.message for name in _NOT_SENT):
            raise NotSent(f"cannot reach the RunPod API: {exc.message}", "check the network") from None
        base = url.removesuffix("/pods")
        raise _may_exist(f"the request was sent, but no answer came ({exc.message})", base, body) from None
    http.provider_answer("RunPod", url, final, status, KEY_VARIABLE)
    return status, bytes(raw), unread
