"""Which wheel a build installs: platform tags against the image's Python and glibc, through the wheelhouse.

Every wheel here has a real-world name (CPython ABI tags, manylinux/musllinux/macOS platforms, abi3, py3-none-any);
the lock lists all their hashes, as a lock made on PyPI does, and `fetch_lock` downloads from a real index on
loopback. The choice must be the most specific wheel the image can load, and an unusable set a clean error.
"""

from __future__ import annotations

import hashlib
import html
import json
from pathlib import Path
from urllib.parse import quote

import pytest

from imagekit.errors import CheckFailed
from imagekit.locking import wheel_choice as wheels
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.services.wheels import fetch
from tests.wheelfactory import build_wheel, serve

TAGS = {
    "cp311": "cp311-cp311-manylinux_2_28_x86_64",
    "cp312": "cp312-cp312-manylinux_2_28_x86_64",
    "cp311-2_17": "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64",
    "cp311-2_34": "cp311-cp311-manylinux_2_34_x86_64",
    "cp311-manylinux1": "cp311-cp311-manylinux1_x86_64",
    "cp311-2014": "cp311-cp311-manylinux2014_x86_64",  # glibc 2.17 by its legacy name only
    "cp311-2_12": "cp311-cp311-manylinux_2_12_x86_64",
    "musl": "cp311-cp311-musllinux_1_2_x86_64",
    "macos": "cp311-cp311-macosx_11_0_arm64",
    "aarch64": "cp311-cp311-manylinux_2_28_aarch64",
    "win": "cp311-cp311-win_amd64",
    "abi3": "cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64",
    "any": "py3-none-any",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("tagged")
    return {key: build_wheel(out, "pkg", "1.0", tag=tag) for key, tag in TAGS.items()}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pep503(root: Path, project: str, files: list[Path]) -> None:
    """A PEP 503 page whose hrefs are percent-quoted, as PyPI and download.pytorch.org write them."""
    (root / "files").mkdir(parents=True, exist_ok=True)
    (root / "simple" / project).mkdir(parents=True, exist_ok=True)
    rows = []
    for f in files:
        (root / "files" / f.name).write_bytes(f.read_bytes())
        rows.append(f'<a href="../../files/{html.escape(quote(f.name))}#sha256={sha(f)}">{html.escape(f.name)}</a><br>')
    (root / "simple" / project / "index.html").write_text("<html><body>\n" + "\n".join(rows) + "\n</body></html>\n")


def pep691(root: Path, project: str, files: list[Path]) -> None:
    """A PEP 691 JSON page (relative urls, as an index may give them)."""
    (root / "files").mkdir(parents=True, exist_ok=True)
    (root / "simple" / project).mkdir(parents=True, exist_ok=True)
    page = {"meta": {"api-version": "1.1"}, "name": project, "files": []}
    for f in files:
        (root / "files" / f.name).write_bytes(f.read_bytes())
        page["files"].append({"filename": f.name, "url": f"../../files/{quote(f.name)}", "hashes": {"sha256": sha(f)}})
    (root / "simple" / project / "index.html").write_text(json.dumps(page))


def choose(tmp: Path, files: list[Path], python: str, glibc: str, *, locked: list[Path] | None = None, json_page=False):
    """The wheel `fetch_lock` downloads for ``python``/``glibc``, from an index listing ``files``."""
    root = tmp / "index"
    (pep691 if json_page else pep503)(root, files[0].name.split("-")[0], files)
    name, version = files[0].name.split("-")[:2]
    hashes = tuple(sorted(f"sha256:{sha(f)}" for f in (locked if locked is not None else files)))
    with serve(root) as url:
        lock = Lock((), (LockEntry(name, version, hashes),), {"index": f"{url}/simple"})
        (got,) = fetch.fetch_lock(lock, python, glibc)
    assert got.downloaded and sha(got.path) == got.path.parent.name
    return got.path.name


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))


@pytest.mark.loopback
@pytest.mark.parametrize(
    ("offered", "python", "glibc", "chosen"),
    [
        (list(TAGS), "3.11", "2.28", "cp311"),  # the exact ABI and the newest platform the image's glibc allows
        (list(TAGS), "3.12", "2.28", "cp312"),
        (list(TAGS), "3.11", "2.17", "cp311-2_17"),  # glibc 2.17 cannot load manylinux_2_28 or _2_34
        (list(TAGS), "3.11", "2.35", "cp311-2_34"),
        (["cp311-2_17", "abi3", "any"], "3.11", "2.28", "cp311-2_17"),  # a CPython build beats abi3 and pure Python
        (["cp311-manylinux1", "abi3", "any"], "3.11", "2.28", "cp311-manylinux1"),
        # a legacy name ranks as its glibc (pip's order): manylinux2014 is 2.17, newer than 2.12
        (["cp311-2_12", "cp311-2014"], "3.11", "2.28", "cp311-2014"),
        (["cp311-2_12", "cp311-2014", "cp311-2_17"], "3.11", "2.28", "cp311-2_17"),
        (["cp311", "cp312", "abi3", "any"], "3.13", "2.28", "abi3"),  # abi3 (cp39+) loads on 3.13; cp311/12 do not
        (["cp311", "cp312", "any"], "3.13", "2.28", "any"),
        (["musl", "macos", "aarch64", "win", "any"], "3.11", "2.28", "any"),
    ],
)
def test_the_most_specific_loadable_wheel_is_chosen(tmp_path, built, offered, python, glibc, chosen):
    got = choose(tmp_path, [built[k] for k in offered], python, glibc)
    assert got == built[chosen].name


@pytest.mark.loopback
def test_same_choice_from_a_pep691_json_page(tmp_path, built):
    got = choose(tmp_path, list(built.values()), "3.11", "2.17", json_page=True)
    assert got == built["cp311-2_17"].name


@pytest.mark.loopback
@pytest.mark.parametrize(
    ("offered", "python", "glibc"),
    [
        (["musl", "macos", "aarch64", "win"], "3.11", "2.28"),  # no Linux x86_64 glibc wheel at all
        (["cp311", "cp311-2_34"], "3.11", "2.17"),  # too new for the image's glibc
        (["cp311", "cp311-2_17"], "3.12", "2.28"),  # another Python's ABI
        (["cp311-2_34"], "3.11", "2.28"),
    ],
)
def test_an_unusable_set_is_a_clean_error(tmp_path, built, offered, python, glibc):
    with pytest.raises(CheckFailed) as exc:
        choose(tmp_path, [built[k] for k in offered], python, glibc)
    assert f"no wheel for Python {python} / manylinux glibc {glibc}" in exc.value.message
    assert "pkg==1.0" in exc.value.message and exc.value.hint


@pytest.mark.loopback
def test_only_hashes_in_the_lock_are_candidates(tmp_path, built):
    """The index offers the cp311 wheel, but the lock pinned only cp312's hash: never install unlocked bytes."""
    with pytest.raises(CheckFailed, match=r"no wheel for Python 3\.11"):
        choose(tmp_path, [built["cp311"], built["cp312"]], "3.11", "2.28", locked=[built["cp312"]])
    got = choose(tmp_path / "b", [built["cp311"], built["any"]], "3.11", "2.28", locked=[built["any"]])
    assert got == built["any"].name


@pytest.mark.loopback
def test_local_version_wheels_from_a_pytorch_style_index(tmp_path):
    """download.pytorch.org names: `torch-2.5.1+cu124-cp311-cp311-linux_x86_64.whl`, quoted `%2B` in hrefs."""
    out = tmp_path / "w"
    files = [
        build_wheel(out, "torch", "2.5.1+cu124", tag="cp311-cp311-linux_x86_64"),
        build_wheel(out, "torch", "2.5.1+cu124", tag="cp312-cp312-linux_x86_64"),
        build_wheel(out, "torch", "2.5.1+cu124", tag="cp311-none-macosx_11_0_arm64"),
    ]
    assert choose(tmp_path, files, "3.12", "2.28") == "torch-2.5.1+cu124-cp312-cp312-linux_x86_64.whl"


@pytest.mark.parametrize(
    ("python", "glibc", "wanted", "unwanted"),
    [
        (
            "3.11",
            "2.28",
            ["cp311-cp311-manylinux_2_28_x86_64", "cp311-abi3-manylinux2014_x86_64", "py3-none-any"],
            [
                "cp311-cp311-manylinux_2_29_x86_64",
                "cp312-cp312-manylinux_2_28_x86_64",
                "cp311-cp311-musllinux_1_2_x86_64",
            ],
        ),
        (
            "3.9",
            "2.17",
            ["cp39-cp39-manylinux2014_x86_64", "cp39-cp39-manylinux1_x86_64", "py39-none-any"],
            ["cp39-cp39-manylinux_2_18_x86_64", "cp39-cp39-manylinux_2_28_x86_64", "cp311-abi3-linux_x86_64"],
        ),
    ],
)
def test_supported_tags(python, glibc, wanted, unwanted):
    from packaging.tags import parse_tag

    supported = set(wheels.supported_tags(python, glibc))
    assert all(parse_tag(t) <= supported for t in wanted)
    assert not any(parse_tag(t) & supported for t in unwanted)
