"""imagekit.trust.urls held to the httpx parse it replaced, over a hostile corpus: for each URL the two agree, or the
new one is the stricter and the entry is listed below with why. The origin rule decides whether credentials follow a
redirect, so it is held to more than agreement: two URLs it calls one origin are one for httpx too, and its host is
the host httpx connects to."""

from __future__ import annotations

import itertools

import httpx
import pytest

from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.trust import urls

SECRET = "s3cr3t-Pa55"


# ---- the reference: imagekit/effects/http.py's URL helpers as they were, on httpx.URL ---------------------------
def ref_origin(url: str) -> tuple[str, str, int | None]:
    u = httpx.URL(str(url))
    default = {"http": 80, "https": 443}.get(u.scheme)
    return u.scheme, u.host.lower(), u.port or default


def ref_join(base: str, href: str) -> str:
    try:
        return str(httpx.URL(base).join(href))
    except httpx.InvalidURL:
        return href


def ref_filename(url: str) -> str:
    try:
        return httpx.URL(url).path.rsplit("/", 1)[-1]
    except httpx.InvalidURL:
        return ""


def ref_require_http(url: str, what: str = "URL", error: type[Exception] = UsageError, hint: str | None = None) -> str:
    try:
        u = httpx.URL(url)
        url.encode()
    except (httpx.InvalidURL, TypeError, UnicodeError) as exc:
        raise error(
            f"{what} {urls.display(url)!r} is not a valid URL: {urls.reason(exc)}", hint or "pass an http(s):// URL"
        ) from None
    if u.scheme not in ("http", "https") or not u.host:
        raise error(f"{what} {urls.display(url)!r} is not an http(s) URL", hint or "pass an http(s):// URL")
    return url


# ---- the corpus ------------------------------------------------------------------------------------------------
CORPUS = [
    # ordinary, and ordinary written oddly
    "http://example.org/simple/torch/",
    "https://download.pytorch.org/whl/cu121/torch-2.3.1%2Bcu121-cp311-cp311-linux_x86_64.whl",
    "HTTPS://EXAMPLE.ORG/A",
    "hTtP://Example.Org/",
    "http://example.org",
    "http://example.org?q",
    "http://example.org#f",
    "http://example.org/x?q=1&sig=abc#frag",
    "http://example.org/a/./b/../c",
    "http://example.org/a/../../../x",
    "http://example.org/%2e%2e/x",
    "http://example.org/é/€",
    # ports
    "http://example.org:80/",
    "https://example.org:443/",
    "https://example.org:80/",
    "http://example.org:443/",
    "ftp://example.org:21/",
    "http://example.org:8080/",
    "http://example.org:080/",
    "http://example.org:/x",
    "http://example.org:0/",
    "http://example.org:65535/",
    "http://example.org:65536/",
    "http://example.org:-1/",
    "http://example.org:abc/",
    "http://example.org:+80/",
    "http://example.org: 80/",
    "http://example.org:8_0/",
    "http://example.org:\u0668\u0660/",
    "http://example.org:1:2/",
    "http://example.org:" + "9" * 5000 + "/",
    # IP literals
    "http://127.0.0.1:5000/",
    "http://127.1/",
    "http://0x7f.0.0.1/",
    "http://256.1.1.1/",
    "http://01.1.1.1/",
    "http://[::1]/",
    "http://[::1]:8080/x",
    "http://[::FFFF:1.2.3.4]/",
    "http://[0:0:0:0:0:0:0:1]/",
    "http://[fe80::1%25eth0]/",
    "http://[fe80::1%eth0]/",
    "http://[::1]80/",
    "http://[::g]/",
    "http://[::1/",
    "http://::1/",
    "http://[]/",
    "http://[1:2:3:4:5:6:7:8:9]/",
    "http://[v1.x]/",
    # user-info
    f"http://user:{SECRET}@example.org/x",
    f"http://u:p@{SECRET}@example.org/",
    f"https://:{SECRET}@example.org/",
    "http://user@/x",
    "http://evil.example\\@good.example/",
    "http://good.example@evil.example/",
    "http://u%40x:p%3A@example.org/",
    # percent-encoding in the path
    "http://example.org/a%2Bb.whl",
    "http://example.org/a+b.whl",
    "http://example.org/dir/a%2Fb.whl",
    "http://example.org/..%2F..%2Fetc%2Fpasswd",
    "http://example.org/%2E%2E",
    "http://example.org/a%zz",
    "http://example.org/%ff.whl",
    "http://example.org/a b.whl",
    # hosts
    "http://exa mple.com/",
    "http://exa%20mple.com/",
    "http://%41.com/",
    'http://a"b/',
    "http://a{b}/",
    "http://a|b/",
    "http://a^b/",
    "http://a<b>/",
    "http://a`b/",
    "http://h]/",
    "http://h[/",
    "http://a;b.example/",
    "http://_h_/",
    "http://" + "a" * 300 + ".example/",
    # international names
    "http://bücher.example/x",
    "http://BÜCHER.example/x",
    "http://xn--bcher-kva.example/x",
    "http://中国.icom.museum/",
    "http://xn--fiqs8s.icom.museum/",
    "http://faß.de/",
    "http://xn--fa-hia.de/",
    "http://☃.example/",
    "http://example\u200b.org/",
    # control characters, whitespace, lone surrogates
    "http://example.org/\tx",
    "http://example.org/\nx",
    "http://exam\r\nple.org/x",
    "http://example.org/\x00",
    "http://example.org/\x7f",
    "http://example.org/\x1b[31m",
    "\x00",
    " http://example.org/",
    "http://example.org/ ",
    "http://example.org/\u202e",
    "http://example.org/\x85",
    "http://example.org/\udcff",
    "http://\udcff/",
    "\udcff",
    # not http(s), no host, not absolute
    "",
    "file:///etc/passwd",
    "ftp://example.org/x",
    "ftp://",
    "gopher://x/",
    "javascript:alert(1)",
    "data:text/plain,x",
    "http:example.org/x",
    "http:/example.org/x",
    "http:///nohost",
    "http://",
    "https://",
    "//host/x",
    "/etc/passwd",
    "x",
    "://example.org/x",
    ":x",
    "1http://example.org/",
    "localhost:8080/x",
    # long
    "http://example.org/" + "a" * 60000,
    "http://example.org/" + "a" * 65600,
]

BASES = [
    "https://files.example/simple/pkg/",
    "https://files.example/simple/pkg",
    "http://files.example:8080/a/b/?q#f",
    f"https://u:{SECRET}@files.example/x/",
    "http://[::1]/s/",
    "https://bücher.example/simple/",
    "http://files.example:0/",
    "no url\n",
    "",
    "/rel/base/",
]
HREFS = [
    "../x.whl",
    "/abs/x.whl",
    "//other.example/x",
    "?q",
    "#f",
    "https://other.example/",
    "x.whl",
    "./x%2Bcu121.whl",
    "../../../../x",
    "%2e%2e/x",
    "a b.whl",
    "",
    "http:x",
    "javascript:alert(1)",
    "file:///etc/passwd",
    "//evil.example@good.example/",
    "//[::1]:99/x",
    "http://files.example:0/x",
    "https://bücher.example/x",
    "://evil.example/x",
    ":x",
    "\udcff",
    "\nx",
]

# ---- where the new parse is the stricter: it refuses what httpx accepted -----------------------------------------
PORT = "a port is ASCII digits from 1 to 65535 (httpx took any int(): a sign, spaces, '_', other scripts' digits, 0)"
IDN = "a host is ASCII: IDNA needs tables the standard library lacks (its codec is IDNA 2003, which maps some names "
IDN += "to other hosts than httpx's IDNA 2008); the xn-- form is accepted"
HOST = 'a host holds no space or "<>[]^`{|}\\ (httpx percent-encoded them into a name no resolver knows)'
ZONE = "an IPv6 zone is no part of a URL (httpx passed it on)"
NO_SCHEME = "an empty scheme is none (httpx read '://h/x' as '//h/x', which a join makes an absolute URL)"
SURROGATE = "a lone surrogate is no text (httpx raised UnicodeEncodeError out of join and filename)"
STRICTER = {
    "http://example.org:0/": PORT,
    "http://example.org:65536/": PORT,
    "http://example.org:-1/": PORT,
    "http://example.org:+80/": PORT,
    "http://example.org: 80/": PORT,
    "http://example.org:8_0/": PORT,
    "http://example.org:\u0668\u0660/": PORT,
    "http://[::1]80/": PORT + "; and it follows a ':'",
    "http://files.example:0/": PORT,
    "http://files.example:0/x": PORT,
    "http://bücher.example/x": IDN,
    "http://BÜCHER.example/x": IDN,
    "http://中国.icom.museum/": IDN,
    "http://faß.de/": IDN,
    "https://bücher.example/simple/": IDN,
    "https://bücher.example/x": IDN,
    "http://exa mple.com/": HOST,
    'http://a"b/': HOST,
    "http://a{b}/": HOST,
    "http://a|b/": HOST,
    "http://a^b/": HOST,
    "http://a<b>/": HOST,
    "http://a`b/": HOST,
    "http://h]/": HOST,
    "http://h[/": HOST,
    "http://[fe80::1%25eth0]/": ZONE,
    "http://[fe80::1%eth0]/": ZONE,
    "://example.org/x": NO_SCHEME,
    "://evil.example/x": NO_SCHEME,
    ":x": NO_SCHEME,
    "http://example.org/\udcff": SURROGATE,
    "http://\udcff/": SURROGATE,
    "\udcff": SURROGATE,
}
# ---- where both accept and the origins are written differently ------------------------------------------------
# httpx decoded a host that begins "xn--" to Unicode; the new one keeps the form that is sent. Equal only when the
# ASCII forms are equal, so it never calls one origin what httpx called two (test_origins_never_merge).
ORIGIN_WRITTEN_ASCII = {"http://xn--bcher-kva.example/x", "http://xn--fiqs8s.icom.museum/", "http://xn--fa-hia.de/"}


def _outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except Exception as exc:  # what each side raises is compared by the tests, not here
        return "refused", type(exc).__name__


def _httpx_parses(url: str) -> bool:
    try:
        httpx.URL(url).raw_host  # noqa: B018  (the host as httpx connects to it: IDNA-encoded)
        url.encode()
    except Exception:
        return False
    return True


def test_the_corpus_lists_each_url_once_and_each_listed_one_is_refused():
    assert len(set(CORPUS)) == len(CORPUS) and len(set(HREFS)) == len(HREFS)
    for url in STRICTER:
        assert url in CORPUS + BASES + HREFS and _outcome(urls.parse, url)[0] == "refused", url


def _problems(check, cases) -> list[str]:
    """What ``check`` finds wrong with each case ("" when nothing): every disagreement at once, not the first."""
    return [f"{case!r:.120}: {problem}" for case in cases if (problem := check(*case))]


def _parse(url: str) -> str:
    new = _outcome(lambda u: str(urls.parse(u)), url)
    if new[0] == "ok":
        if not _httpx_parses(url):
            return "accepted what httpx refuses"
        return "" if new[1] == str(httpx.URL(url)) else f"written {new[1]!r}, httpx {httpx.URL(url)!s}"
    return "" if not _httpx_parses(url) or url in STRICTER else "refused what httpx accepts, and not listed"


def test_parse_accepts_only_what_httpx_accepts_and_writes_it_the_same():
    assert not _problems(_parse, [(u,) for u in CORPUS])


def _origin(url: str) -> str:
    new, ref = _outcome(urls.origin, url), _outcome(ref_origin, url)
    if new[0] != "ok":
        return "" if ref[0] != "ok" or url in STRICTER else f"refused, httpx's origin {ref[1]}"
    if ref[0] != "ok":
        return "an origin where httpx had none"
    if url in ORIGIN_WRITTEN_ASCII:
        if not (new[1][1].startswith("xn--") and new[1][1] != ref[1][1] and new[1][::2] == ref[1][::2]):
            return f"{new[1]} vs {ref[1]}"
    elif new != ref:
        return f"{new[1]} vs {ref[1]}"
    u = httpx.URL(url)  # whom httpx connects to: scheme, IDNA-encoded host, port (httpcore: port or the default)
    sent = (u.scheme, u.raw_host.decode().lower(), u.port or {"http": 80, "https": 443}.get(u.scheme))
    return "" if new[1] == sent else f"{new[1]}, but httpx connects to {sent}"


def test_origin_is_httpx_origin_and_the_host_it_connects_to():
    assert not _problems(_origin, [(u,) for u in CORPUS + BASES + HREFS])


def test_origins_never_merge():
    """Two URLs the new rule calls one origin are one origin for httpx too (credentials follow only there)."""
    by_origin: dict[tuple, set[tuple]] = {}
    for url in CORPUS + BASES + HREFS:
        if _outcome(urls.origin, url)[0] == "ok":
            by_origin.setdefault(urls.origin(url), set()).add(ref_origin(url))
    assert len(by_origin) > 30
    merged = {new: refs for new, refs in by_origin.items() if len(refs) > 1}
    assert not merged, merged


def test_origin_makes_the_default_port_explicit_and_lowercases():
    assert urls.origin("HTTP://Example.ORG/a") == ("http", "example.org", 80) == urls.origin("http://example.org:80/")
    assert urls.origin("https://example.org:8443/") == ("https", "example.org", 8443)
    assert urls.origin("http://[::FFFF:1.2.3.4]/") == ("http", "::ffff:1.2.3.4", 80)
    assert urls.origin("http://example.org/") != urls.origin("https://example.org/")
    with pytest.raises(urls.InvalidURL):
        urls.origin("http://example.org:0/")  # httpx: port 0, connected to as 80


def _filename(url: str) -> str:
    new, ref = _outcome(urls.filename, url), _outcome(ref_filename, url)
    if new[0] != "ok":
        return "raised"  # never: what is no URL has the name ""
    return "" if new == ref or (url in STRICTER and new == ("ok", "")) else f"{new[1]!r}, httpx {ref}"


def test_filename_is_httpx_filename():
    assert not _problems(_filename, [(u,) for u in CORPUS])


def test_filename_decodes_after_splitting_never_into_a_path():
    assert urls.filename("http://example.org/whl/torch-2.3.1%2Bcu121-cp311.whl") == "torch-2.3.1+cu121-cp311.whl"
    assert urls.filename("http://example.org/..%2F..%2Fetc%2Fpasswd") == "passwd"
    assert urls.filename("not a url\n") == ""


def _join(base: str, href: str) -> str:
    new, ref = _outcome(urls.join, base, href), _outcome(ref_join, base, href)
    if new[0] != "ok":
        return "raised"  # never: what is no URL comes back as it is
    if new == ref or (new == ("ok", href) and (base in STRICTER or href in STRICTER)):
        return ""
    return f"{new[1]!r}, httpx {ref}"


def test_join_is_httpx_join():
    assert not _problems(_join, list(itertools.product(BASES, HREFS)))


def test_join_resolves_an_index_link():
    assert urls.join("https://files.example/simple/pkg/", "../../x/a%2Bb.whl#sha256=00") == (
        "https://files.example/x/a%2Bb.whl#sha256=00"
    )
    assert urls.join("https://files.example/simple/", "//other.example/x") == "https://other.example/x"
    assert urls.join("https://files.example/simple/", "://evil.example/x") == "://evil.example/x"


def _refusal(fn, url, *args):
    try:
        fn(url, *args)
    except (UsageError, EnvironmentFailure) as exc:
        kind = "invalid" if "is not a valid URL" in exc.message else "not http"
        return type(exc), kind, exc.message.split(" is not ")[0], exc.hint
    return None


def _require_http(url: str, *args) -> str:
    new, ref = _refusal(urls.require_http, url, *args), _refusal(ref_require_http, url, *args)
    if new is None:
        u = urls.parse(url)
        ok = ref is None and urls.require_http(url, *args) == url and u.scheme in ("http", "https") and u.host
        return "" if ok else f"accepted, httpx {ref}"
    if SECRET in str(new):
        return "shows the secret"
    if new[0] is not (args[1] if args else UsageError) or new[3] != (args[2] if args else "pass an http(s):// URL"):
        return f"refused as {new}"
    if ref is None or new[1] != ref[1]:
        return "" if url in STRICTER and new[1] == "invalid" else f"refused as {new}, httpx {ref}"
    return "" if new == ref else f"refused as {new}, httpx {ref}"


@pytest.mark.parametrize("args", [(), ("--index-url", EnvironmentFailure, "use another index")])
def test_require_http_refuses_what_it_refused_the_same_way(args):
    assert not _problems(_require_http, [(u, *args) for u in CORPUS])


def test_require_http_says_why():
    with pytest.raises(UsageError, match="is not an http") as exc:
        urls.require_http(f"ftp://u:{SECRET}@h.example/x")
    assert SECRET not in exc.value.message and exc.value.hint == "pass an http(s):// URL"
    with pytest.raises(UsageError, match=r"is not a valid URL: Invalid port: '0'"):
        urls.require_http("http://h.example:0/")
    with pytest.raises(UsageError, match="is not a valid URL: not text"):
        urls.require_http(None)  # type: ignore[arg-type]
    assert urls.require_http("https://h.example/simple/") == "https://h.example/simple/"
