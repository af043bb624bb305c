"""The one reader of far-side data: shapes, sizes and characters checked before anything uses them."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagekit.trust import untrusted
from imagekit.trust.untrusted import UntrustedData
from tests.props import examples


@pytest.mark.seconds
@settings(derandomize=True, max_examples=examples(300))
@given(st.text())
def test_printable_never_passes_a_control_character_or_a_line_break(text):
    shown = untrusted.printable(text)
    assert not re.search(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", shown)
    assert len(shown) <= untrusted.MAX_TEXT


@pytest.mark.parametrize(
    "text",
    [
        "\x1b[31mred\x1b[0m",
        "\x1b]0;title\x07x",
        "ok\nerror: spoofed",
        "\x9b31mC1",
        "a\u202etxt.exe",
        "\x85next line",
    ],
)
def test_printable_removes_what_would_steer_the_terminal(text):
    shown = untrusted.printable(text)
    assert "\x1b" not in shown and "\n" not in shown and "\x9b" not in shown and "\u202e" not in shown
    assert "\x85" not in shown


def test_printable_keeps_lines_when_asked_and_cuts_long_text():
    assert untrusted.printable("a\r\nb", lines=True) == "a\nb"
    assert untrusted.printable("x" * 1000, 10) == "x" * 9 + "…"


def test_json_depth_and_number_size_are_bounded():
    assert untrusted.load_json(b'{"a": [1, 2.5, {"b": null}]}', "doc") == {"a": [1, 2.5, {"b": None}]}
    with pytest.raises(UntrustedData, match="nested 100001 levels"):
        untrusted.load_json("[" * 100_001 + "]" * 100_001, "doc")
    with pytest.raises(UntrustedData, match="5000 digits"):
        untrusted.load_json("1" * 5000, "doc")
    with pytest.raises(UntrustedData, match="NaN"):
        untrusted.load_json("[NaN]", "doc")
    with pytest.raises(UntrustedData, match="not UTF-8"):
        untrusted.load_json(b"\xff\xfe", "doc")
    with pytest.raises(UntrustedData, match="larger than"):
        untrusted.load_json(b"[]" * 10, "doc", max_bytes=4)
    # brackets inside strings are not nesting
    assert untrusted.load_json(json.dumps({"s": "[" * 500}), "doc") == {"s": "[" * 500}


@pytest.mark.parametrize(
    "value", ["../../admin/delete?all=1#", "sha256:" + "A" * 64, "sha256:" + "0" * 63, "sha512:" + "0" * 64, 7, None]
)
def test_a_digest_is_exactly_sha256_and_64_hex_digits(value):
    with pytest.raises(UntrustedData):
        untrusted.digest(value)


def test_a_good_digest_passes():
    d = "sha256:" + "ab" * 32
    assert untrusted.digest(d) == d
    assert untrusted.is_digest(d) and not untrusted.is_digest(d + "\n") and not untrusted.is_digest(None)


def test_a_character_is_named_not_shown():
    assert untrusted.char_name("\r") == "a carriage return (CR)"
    assert untrusted.char_name("\x1b") == "the character U+001B"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("key\r", "carriage return"),
        ("key\nX-Evil: 1", "line feed"),
        ("kéy", r"U\+00E9"),
        ("", "empty"),
        (" k", "spaces"),
    ],
)
def test_header_values_refuse_what_would_split_or_not_encode_and_never_echo_it(value, why):
    with pytest.raises(UntrustedData, match=why) as err:
        untrusted.header_value(value, "RUNPOD_API_KEY")
    assert value.strip() not in str(err.value) or not value.strip()


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", "", "a\nb", "C:\\x", "a\\..\\b", "\x1b[2J"])
def test_archive_members_stay_inside(name):
    with pytest.raises(UntrustedData):
        untrusted.relative_member(name)


def test_archive_members_are_normalised():
    assert str(untrusted.relative_member("./a//b/")) == "a/b"
    assert str(untrusted.relative_member(".")) == "."


@pytest.mark.parametrize(
    "name",
    [
        "numpy-1.26.4-py3-none-any.x/../../evil.whl",
        "../numpy-1.26.4-py3-none-any.whl",
        "numpy-1.26.4-py3-none-any.\x1b]0;pwned\x07.whl",
        "numpy-1.26.4-1\x1b-py3-none-any.whl",
        "numpy-1.26.4-py3-none-any\\..\\x.whl",
        "numpy-1.26.4-py3-none-an y.whl",
        "numpy-1.26.4.whl",
        "numpy-1.26.4-py3-none-any.tar.gz",
        "numpy-1.26.4-py3-none-" + "a" * 300 + ".whl",
        "",
        None,
    ],
)
def test_a_wheel_file_name_from_an_index_is_one_plain_path_component(name):
    with pytest.raises(UntrustedData) as exc:
        untrusted.wheel_filename(name)
    assert "\x1b" not in str(exc.value) and "\x07" not in str(exc.value)


def test_real_wheel_file_names_pass():
    for name in (
        "torch-2.5.1+cu124-cp311-cp311-linux_x86_64.whl",
        "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "pkg-1!2.0-1build-py2.py3-none-any.whl",
    ):
        assert untrusted.wheel_filename(name) == name


def test_an_index_sha256_is_hex_or_nothing():
    assert untrusted.sha256_lenient("AB" * 32) == "ab" * 32
    for bad in ("ab" * 31, "zz" * 32, "../" * 22, 7, None, "ab" * 32 + "\n"):
        assert untrusted.sha256_lenient(bad) == ""


# ---- tree_members: a tar of a folder, checked as a whole --------------------------------------------------------
def _info(name: str, kind: bytes = b"0", link: str = "", mode: int = 0o644):
    import tarfile

    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info


def test_tree_members_keeps_an_ordinary_folder():
    got = untrusted.tree_members(
        [
            _info(".", b"5"),
            _info("./bin", b"5", mode=0o775),
            _info("./bin/tool", mode=0o6755),
            _info("./bin/python", b"2", "tool"),
            _info("./lib64", b"2", "bin"),
            _info("./lib/up", b"2", "../bin/python"),
            _info("./hard", b"1", "bin/tool"),
        ]
    )
    assert [(str(m.path), m.kind, oct(m.mode), m.link) for m in got] == [
        ("bin", "dir", "0o755", ""),
        ("bin/tool", "file", "0o755", ""),  # setuid and setgid gone
        ("bin/python", "symlink", "0o644", "tool"),
        ("lib64", "symlink", "0o644", "bin"),
        ("lib/up", "symlink", "0o644", "../bin/python"),
        ("hard", "hardlink", "0o644", "bin/tool"),  # a hardlink shares the mode of what it repeats
    ]


@pytest.mark.parametrize(
    ("members", "said"),
    [
        ([_info("/etc/passwd")], "absolute"),
        ([_info("../x")], "leaves the destination"),
        ([_info("a", b"2", "/etc")], "points outside"),
        ([_info("a", b"2", "..")], "points outside"),
        ([_info("a", b"2", "b/../.."), _info("b", b"5")], "points outside"),
        ([_info("b", b"2", "c/d"), _info("c", b"2", ".."), _info("a", b"2", "b/..")], "points outside"),
        ([_info("loop", b"2", "loop/x")], "points outside"),
        ([_info("d", b"5"), _info("l", b"2", "d"), _info("l/x")], "inside a link"),
        ([_info("f"), _info("f/x")], "inside a file"),
        ([_info("h", b"1", "/etc/passwd")], "absolute"),
        ([_info("h", b"1", "later"), _info("later")], "does not repeat a file"),
        ([_info("h", b"1", "d"), _info("d", b"5")], "does not repeat a file"),
        ([_info("c", b"3")], "character device"),
        ([_info("b", b"4")], "block device"),
        ([_info("p", b"6")], "FIFO"),
        ([_info("s", b"S")], "unknown type"),
        ([_info("x"), _info("./x")], "twice"),
        ([_info("a", b"2", "")], "empty target"),
        ([_info("a", b"2", "b\x1b[2J")], "control character"),
    ],
)
def test_tree_members_refuses_what_could_write_outside_or_is_not_a_folder(members, said):
    with pytest.raises(UntrustedData, match=said):
        untrusted.tree_members(members)


def test_tree_members_names_the_first_link_leaving_and_counts_the_rest():
    with pytest.raises(untrusted.LinkLeaves) as err:
        untrusted.tree_members([_info("bin/python3", b"2", "/usr/bin/python3"), _info("up", b"2", "../..")])
    assert err.value.first == "bin/python3 -> /usr/bin/python3" and err.value.count == 2


@pytest.mark.seconds
@settings(derandomize=True, max_examples=examples(300))
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "a/b", "b/c", "c"]),
            st.sampled_from([b"0", b"5", b"2"]),
            st.sampled_from(["a", "b", "..", "../..", "a/..", "b/../..", "c/../a", "/x", "."]),
        ),
        max_size=6,
    )
)
def test_tree_members_never_lets_a_link_resolve_outside(entries):
    """Whatever links an archive holds, every path the kernel would follow through them stays inside (checked
    here by a real folder: the accepted members are made, then every link is resolved by the OS)."""
    import os
    import tempfile
    from pathlib import Path

    try:
        members = untrusted.tree_members(_info(n, k, link if k == b"2" else "") for n, k, link in entries)
    except UntrustedData:
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        for m in members:
            path = root.joinpath(*m.path.parts)
            if m.kind == "dir":
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                if m.kind == "file":
                    path.write_text("")
        for m in members:
            if m.kind == "symlink":
                os.symlink(m.link, root.joinpath(*m.path.parts))
        for m in members:
            if m.kind == "symlink":
                real = Path(os.path.realpath(root.joinpath(*m.path.parts)))
                assert real == root.resolve() or root.resolve() in real.parents, (entries, m)
