"""The doctor's deep tier (standard library only, Python >= 3.8): whether the Hugging Face repositories a run
needs can be read with the token it will use (network, on demand)."""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.parse

if __package__:  # imported from the host's package, imagekit.in_image
    from . import nofollow
    from .doctor_expect import result
else:  # a program in the image, or sent to a pod: its sibling modules lie beside it
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import nofollow
    from doctor_expect import result


def hf_token(environ=None):
    """(token, where it came from) as huggingface_hub finds it: HF_TOKEN, else the file `hf auth login` saved
    ($HF_TOKEN_PATH, default $HF_HOME/token)."""
    env = os.environ if environ is None else environ
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if env.get(var, "").strip():
            return env[var].strip(), var
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface")
    path = os.path.expanduser(env.get("HF_TOKEN_PATH") or os.path.join(home, "token"))
    try:
        token = (nofollow.read_bytes(path, 1 << 16, follow=True) or b"").decode("utf-8", "replace").strip()
    except OSError:
        return None, None
    return (token, path) if token else (None, None)


def _origin(url):
    """(scheme, host, port) with the default port made explicit."""
    parts = urllib.parse.urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def _same_origin_redirect():
    """A redirect handler that follows a redirect within the origin (a renamed repo), token and all, and stops at one
    to another origin (the Hub sends file downloads to its CDN): the token never travels there, and the redirect
    itself already means the Hub granted access. Stopping surfaces the 3xx as an HTTPError, read as the answer.
    (urllib.request is imported here, when the Hub is asked: it costs every other command's start-up.)"""
    import urllib.request

    class SameOriginRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            if _origin(newurl) != _origin(req.full_url):
                return None
            return urllib.request.HTTPRedirectHandler.redirect_request(self, req, fp, code, msg, headers, newurl)

    return SameOriginRedirect


def _hub_get(url, token, timeout, extra=None):
    """(status, headers, body text, final url): same-origin redirects followed, others not (see above)."""
    import urllib.error
    import urllib.request

    headers = dict(extra or {})
    if token:
        headers["Authorization"] = "Bearer " + token
    req = urllib.request.Request(url, headers=headers)
    opener = urllib.request.build_opener(_same_origin_redirect())
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.headers, resp.read(1 << 20).decode("utf-8", "replace"), resp.geturl()
    except urllib.error.HTTPError as exc:
        body = exc.read(1 << 16).decode("utf-8", "replace") if exc.fp else ""
        return exc.code, exc.headers, body, exc.geturl() or url


def _hub_message(headers, body):
    text = (headers.get("X-Error-Message") if headers else None) or ""
    if not text:
        try:
            text = json.loads(body).get("error", "")
        except (ValueError, AttributeError):
            text = body
    return (text or "").strip()[:300]


def classify_hf_403(message):
    """The two 403s users meet on gated repos, told apart by the Hub's own message."""
    m = message.lower()
    if "fine-grained" in m or "public gated repositories" in m or ("token" in m and "scope" in m):
        return ("token-scope", "the token is fine-grained and lacks access to public gated repos",
                "enable 'Read access to contents of all public gated repos you can access' on the token "
                "(huggingface.co/settings/tokens), or use a read token")
    if any(k in m for k in ("authorized list", "awaiting", "accept", "ask for access", "request access",
                            "rejected", "restricted", "gated")):
        return ("licence", "the licence is not accepted (or the access request is pending) for this account",
                "accept the licence on the repo's page with the account that owns the token")
    return ("unknown", "the licence is not accepted for this account, or a fine-grained token lacks gated-repo access",
            "accept the licence on the repo's page, or enable 'public gated repos' on the token")


HF_REPO_ID = re.compile(r"((datasets|spaces)/)?([A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}", re.ASCII)


def check_hf_repo(repo, endpoint, token, timeout=15, token_source=None):
    """Can this token read the repo? Models, `datasets/ORG/NAME` and `spaces/ORG/NAME`; any files (adapters and
    GGUF repos have no config.json). The repo's info first, then, for a gated repo, one of its files."""
    import urllib.error

    cid = f"hf-access:{repo}"
    kind, name, prefix = "models", repo, ""
    for plural in ("datasets", "spaces"):
        if repo.startswith(plural + "/"):
            kind, name, prefix = plural, repo[len(plural) + 1:], plural + "/"
    base = endpoint.rstrip("/")
    sent = token_source or ("set" if token else "absent")
    ev = {"repo": repo, "token": sent}
    try:
        info_url = f"{base}/api/{kind}/{name}"
        code, headers, body, final = _hub_get(info_url, token, timeout)
        ev["info_status"] = code
        moved = ""
        if final != info_url:  # a renamed repo: followed within the Hub
            ev["moved_to"] = final
            moved = f" (moved to {final}; use the new id)"
        if code in (301, 302, 303, 307, 308):  # to another origin: not followed, the token stays here
            ev["moved_to"] = headers.get("Location")
            return result(cid, "pass", f"{repo}: moved to {headers.get('Location')} (readable; use the new id)", "",
                          ev)
        if code == 200:
            info = json.loads(body or "{}")
            if not isinstance(info, dict):
                raise ValueError("the Hub's repo info is not a JSON object")
            ev["gated"] = info.get("gated", False)
            if not info.get("gated"):
                return result(cid, "pass", f"{repo}: readable" + (" (private, the token has access)"
                                                                 if info.get("private") else "") + moved, "", ev)
            files = [f.get("rfilename") for f in info.get("siblings") or [] if f.get("rfilename")]
            pick = next((f for f in ("config.json", "README.md", ".gitattributes") if f in files),
                        files[0] if files else ".gitattributes")
            url = f"{base}/{prefix}{name}/resolve/main/{urllib.parse.quote(pick)}"
            code, headers, body, _ = _hub_get(url, token, timeout, {"Range": "bytes=0-0"})
            ev.update(file=pick, file_status=code)
            if code in (200, 206, 301, 302, 303, 307, 308):
                return result(cid, "pass", f"{repo}: gated, and this token has access" + moved, "", ev)
    except UnicodeError:
        return result(cid, "fail", f"{repo}: the token from {sent} has characters no HTTP header can carry",
                      "copy the token again (huggingface.co/settings/tokens)", ev)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return result(cid, "error", f"cannot reach {endpoint}: {exc}", "check network access", ev)
    message = _hub_message(headers, body)
    ev.update(status=code, hub_message=message)
    if code == 401:
        if not token:
            return result(cid, "fail", f"{repo}: HTTP 401, no token was sent (gated or private)",
                          "log in (`hf auth login`) or set HF_TOKEN (huggingface.co/settings/tokens)", ev)
        return result(cid, "fail", f"{repo}: HTTP 401, the token from {sent} was rejected (expired or revoked), "
                      "or the repo is private and not yours", "create a new token and `hf auth login` again", ev)
    if code == 403:
        cause, what, fix = classify_hf_403(message)
        ev["cause"] = cause
        return result(cid, "fail", f"{repo}: HTTP 403, {what}" + (f" (Hub: {message})" if message else ""), fix, ev)
    if code == 404:
        return result(cid, "fail", f"{repo}: HTTP 404, no such repo (or private and not yours)", "check the repo id",
                      ev)
    return result(cid, "error", f"{repo}: unexpected HTTP {code}", "", ev)


def hub_checks(ctx):
    """Each --hf-repo readable with the token a run would use (the deep tier)."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    token, source = hf_token()
    return [check_hf_repo(repo, endpoint, token, token_source=source) for repo in ctx.args.hf_repo or []]
