"""The doctor's standard-library PEP 440 code (it cannot assume `packaging` is installed in an image) against
`packaging` itself, on many generated versions: what parses, how versions order, and which specifiers match.

Left out on purpose: `===` (arbitrary equality compares the text as written, which the doctor does too, while
`packaging` compares its normalised form); pre-releases always count (the doctor asks what *is* installed).
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from imagekit.in_image import imagekit_doctor as doc
from tests.props import examples

SEP = st.sampled_from(["", ".", "-", "_"])
NUMBER = st.one_of(st.just(""), st.integers(0, 12).map(str))
PRE_WORDS = ["a", "b", "c", "rc", "alpha", "beta", "pre", "preview", "RC", "Alpha", "B"]


@st.composite
def versions(draw, local: bool = True) -> str:
    """A PEP 440 version in any spelling `packaging` accepts: epochs, long releases, every pre/post/dev form and
    separator, implicit post-releases, local labels, upper case, a leading v."""
    text = draw(st.sampled_from(["", "", "v", "V"]))
    if draw(st.booleans()):
        text += f"{draw(st.integers(0, 2))}!"
    text += ".".join(str(n) for n in draw(st.lists(st.integers(0, 11), min_size=1, max_size=4)))
    if draw(st.booleans()):
        text += draw(SEP) + draw(st.sampled_from(PRE_WORDS)) + draw(SEP) + draw(NUMBER)
    kind = draw(st.sampled_from(["", "", "implicit", "word"]))
    if kind == "implicit":
        text += f"-{draw(st.integers(0, 9))}"
    elif kind == "word":
        text += draw(SEP) + draw(st.sampled_from(["post", "rev", "r", "POST"])) + draw(SEP) + draw(NUMBER)
    if draw(st.booleans()):
        text += draw(SEP) + draw(st.sampled_from(["dev", "DEV"])) + draw(SEP) + draw(NUMBER)
    if local and draw(st.integers(0, 3)) == 0:
        text += "+" + draw(st.from_regex(r"[a-zA-Z0-9]{1,4}(?:[-_.][a-zA-Z0-9]{1,4}){0,2}", fullmatch=True))
    return text


def _packaging(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


@settings(derandomize=True, max_examples=examples(200))
@given(versions())
def test_every_version_packaging_reads_the_doctor_reads_alike(text):
    parsed = doc.parse_version(text)
    version = Version(text)
    assert parsed is not None, text
    key, release, local = parsed
    assert release == version.release and key[0] == version.epoch
    assert local == (version.local or "")


@settings(derandomize=True, max_examples=examples(200))
@given(st.one_of(versions(), st.text(alphabet="0123456789.!+-_ abcdeilnoprstuvwxyzRV٣\n", max_size=14)))
def test_the_doctor_refuses_exactly_what_packaging_refuses(text):
    assert (doc.parse_version(text) is None) == (_packaging(text) is None), repr(text)


def _sign(a, b) -> int:
    return (a > b) - (a < b)


@settings(derandomize=True, max_examples=examples(200))
@given(versions(), versions())
def test_versions_order_as_packaging_orders_them(a, b):
    """The doctor's sort key orders public versions; a local label does not take part (as in every specifier but
    `==V+local`)."""
    public_a, public_b = Version(Version(a).public), Version(Version(b).public)
    assert _sign(doc.parse_version(a)[0], doc.parse_version(b)[0]) == _sign(public_a, public_b), (a, b)


OPS = ["==", "!=", ">=", "<=", ">", "<", "~="]


@st.composite
def specifiers(draw) -> tuple[str, str]:
    op = draw(st.sampled_from(OPS))
    if op in ("==", "!=") and draw(st.booleans()):
        release = draw(st.lists(st.integers(0, 11), min_size=1, max_size=3))
        return op, ".".join(map(str, release)) + ".*"
    return op, draw(versions(local=op in ("==", "!=")))


@settings(derandomize=True, max_examples=examples(500))
@given(versions(), specifiers())
def test_specifiers_match_what_packaging_matches(have, spec):
    """`--expect` a requirements file: the installed version against each clause, as pip would judge it."""
    op, want = spec
    try:
        specifier = SpecifierSet(f"{op}{want}")
    except InvalidSpecifier:
        assume(False)
    expected = specifier.contains(have, prereleases=True)
    assert doc.version_satisfies(have, op, want) is expected, (have, op, want)


@pytest.mark.parametrize(
    ("have", "op", "want", "ok"),
    [
        ("2.5.1+cu121", "==", "2.5.1", True),
        ("2.5.1+cu121", "==", "2.5.1+cu124", False),
        ("1.0+ubuntu-1", "==", "1.0+ubuntu.1", True),  # local labels compare normalised
        ("1.0+01", "==", "1.0+1", True),  # numeric local segments compare as numbers
        ("1.0.post1", ">", "1.0", False),
        ("1.0rc1", "<", "1.0", False),
        ("2.1.0", "==", "2.1.*", True),
        ("2.10.0", "==", "2.1.*", False),
        ("4-0+0", ">", "4a", True),  # 4.post0 is not a post-release of 4a (packaging >= 26)
        ("4a.post1", ">", "4a", False),
        ("0a", "<", "0-0", True),  # nor 0a a pre-release of 0.post0
        ("0.post0.dev1", "<", "0.post0", False),
        ("1!6+0", "~=", "6.0", False),  # another epoch
    ],
)
def test_the_cases_that_once_differed(have, op, want, ok):
    """What the properties found (the doctor's answers before they agreed): local labels compared as written,
    `>V`/`<V` excluding versions packaging includes, `~=` ignoring the epoch, and (below) a non-ASCII digit."""
    assert doc.version_satisfies(have, op, want) is ok
    assert SpecifierSet(f"{op}{want}").contains(have, prereleases=True) is ok


def test_only_ascii_digits_make_a_version():
    assert doc.parse_version("٣") is None and doc.parse_version("1.٣") is None and _packaging("٣") is None
