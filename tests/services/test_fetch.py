"""The wheel cache hands out only wheels that fit the image's Python and platform."""

from __future__ import annotations

import hashlib

import pytest

from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.services.wheels import fetch, wheel_folders, wheel_forecast


def _cached(cache, filename: str, payload: bytes) -> str:
    sha = hashlib.sha256(payload).hexdigest()
    (cache / "wheels" / sha).mkdir(parents=True)
    (cache / "wheels" / sha / filename).write_bytes(payload)
    return f"sha256:{sha}"


def _lock(*hashes: str) -> Lock:
    entry = LockEntry("numpy", "1.26.4", tuple(sorted(hashes)))
    return Lock((), (entry,), {"index": "http://127.0.0.1:9/simple"})  # nothing listens there


def test_a_cache_hit_must_fit_the_image(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path))
    cp312 = _cached(tmp_path, "numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", b"312")
    cp311 = _cached(tmp_path, "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", b"311")
    (got,) = fetch.fetch_lock(_lock(cp312, cp311), "3.11", "2.36")
    assert "cp311" in got.path.name and not got.downloaded
    (got,) = fetch.fetch_lock(_lock(cp312, cp311), "3.12", "2.36")
    assert "cp312" in got.path.name


@pytest.mark.seconds
def test_a_cache_holding_only_another_pythons_wheel_is_a_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path))
    cp312 = _cached(tmp_path, "numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", b"312")
    with pytest.raises(EnvironmentFailure):  # goes to the index (unreachable here) instead of the cp312 wheel
        fetch.fetch_lock(_lock(cp312, "sha256:" + "0" * 64), "3.11", "2.36")


# ---- `fetch --into DIR`: the wheels folder is swapped in whole, and a link there is never followed -------------
CELL_ID = "cu124-torch2.5.1-py3.11-tf4.48.2"
NUMPY_WHEEL = "numpy-1.26.4-py3-none-any.whl"
MATRIX = '[[matrix.include]]\ncuda = "12.4"\ntorch = "2.5.1"\ntransformers = "4.48.2"\npython = "3.11"\n'


@pytest.fixture
def locked(app, runner, fake_index, tmp_path, monkeypatch):
    """A locked cell of small real wheels served from a loopback index; the working folder is tmp_path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.toml").write_text(MATRIX)
    res = runner.invoke(app, ["lock", "--matrix", "m.toml", "--index-url", fake_index, "--dir", "locks"])
    assert res.exit_code == 0, res.output
    return ["fetch", "--matrix", "m.toml", "--lock-dir", "locks", "--quiet"]


def _precious(root):
    root.mkdir()
    (root / "thesis.tex").write_text("years of work\n")
    (root / "data").mkdir()
    (root / "data" / "run1.csv").write_text("1,2,3\n")
    return root


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.resolver  # `locked` resolves the cell with real uv
@pytest.mark.parametrize("linked", ["wheels", "cell"])
def test_fetch_into_never_empties_the_folder_a_link_points_to(app, runner, locked, tmp_path, linked):
    precious = _precious(tmp_path / "precious")
    if linked == "cell":
        (precious / "wheels").mkdir()  # DIR/<cell>/wheels reached through the link is the user's folder too
        (precious / "wheels" / "keep.txt").write_text("mine\n")
    before = _tree(precious)
    into = tmp_path / "build"
    (into / CELL_ID).mkdir(parents=True) if linked == "wheels" else into.mkdir()
    link = into / CELL_ID / "wheels" if linked == "wheels" else into / CELL_ID
    link.symlink_to(precious, target_is_directory=True)
    res = runner.invoke(app, [*locked, "--into", str(into)])
    assert _tree(precious) == before, "fetch --into deleted files through a symlink"
    assert res.exit_code == 2, res.output
    assert "error:" in res.output and "symbolic link" in res.output and "hint:" in res.output
    assert "Traceback" not in res.output and link.is_symlink()


@pytest.mark.resolver
def test_fetch_into_swaps_in_exactly_the_locked_wheels(app, runner, locked, tmp_path):
    into = tmp_path / "build"
    wheels = into / CELL_ID / "wheels"
    wheels.mkdir(parents=True)
    (wheels / "stale-0.1-py3-none-any.whl").write_text("old")
    (wheels / "leftover").mkdir()
    res = runner.invoke(app, [*locked, "--into", str(into)])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in wheels.iterdir())
    assert "stale-0.1-py3-none-any.whl" not in names and "leftover" not in names
    assert any(n.startswith("torch-2.5.1") for n in names) and "requirements-torch.txt" in names
    assert not any(p.is_symlink() for p in wheels.iterdir())
    assert sorted(p.name for p in (into / CELL_ID).iterdir()) == ["wheels"]  # no staging folder left over
    # DIR itself may be a link: the user named it
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    res = runner.invoke(app, [*locked, "--into", str(tmp_path / "via")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "elsewhere" / CELL_ID / "wheels" / "requirements-torch.txt").is_file()


def test_the_build_wheelhouse_refuses_a_link_and_leaves_its_target_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    sha = _cached(tmp_path / "cache", NUMPY_WHEEL, b"wheel")
    wheel = fetch.FetchedWheel("numpy", tmp_path / "cache" / "wheels" / sha.split(":")[1] / NUMPY_WHEEL, False)
    precious = _precious(tmp_path / "precious")
    before = _tree(precious)
    for linked in ("wheelhouse", "wheelhouse/cell"):
        state = tmp_path / f"state-{linked.count('/')}"
        (state / linked).parent.mkdir(parents=True, exist_ok=True)
        (state / linked).symlink_to(precious, target_is_directory=True)
        with pytest.raises(UsageError, match="is a symbolic link"):
            wheel_folders.wheelhouse([wheel], state / "wheelhouse" / "cell")
        assert _tree(precious) == before
    house = wheel_folders.wheelhouse([wheel], tmp_path / "state" / "wheelhouse" / "cell")
    assert [p.name for p in house.iterdir()] == [NUMPY_WHEEL] and (house / NUMPY_WHEEL).is_symlink()
    assert wheel_folders.wheelhouse([], house) == house and not any(house.iterdir())  # swapped whole: nothing left over


def test_a_planted_picks_memo_never_ends_a_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path))
    lock = _lock("sha256:" + "a" * 64)
    memo = wheel_forecast._picks_file(lock, "3.11", "2.36")
    memo.parent.mkdir(parents=True)
    for text in ("[" * 100_000 + "]" * 100_000, '{"numpy==1.26.4": {"sha256": "' + "a" * 64 + '", "size": 1e308}}'):
        memo.write_text(text)
        picks = wheel_forecast._load_picks(lock, "3.11", "2.36")
        assert picks in ({}, {"numpy==1.26.4": ("a" * 64, None)})


def test_a_locked_sdist_beside_the_wheel_is_passed_over_not_refused():
    """PyPI lists a release's sdist with its wheels, and a lock hashes both: the sdist is never downloaded, so its
    name (not a wheel's) is no reason to refuse the index; a hostile `.whl` name still is."""
    from imagekit.errors import EnvironmentFailure
    from imagekit.locking.lockfile import LockEntry
    from imagekit.locking.wheel_choice import Candidate, supported_tags
    from imagekit.services.wheels import wheel_index

    wheel, sdist = "a" * 64, "b" * 64
    entry = LockEntry("filelock", "4.3.1", (f"sha256:{wheel}", f"sha256:{sdist}"))
    found = [
        Candidate("filelock-4.3.1.tar.gz", "filelock-4.3.1.tar.gz", sdist),
        Candidate("filelock-4.3.1-py3-none-any.whl", "filelock-4.3.1-py3-none-any.whl", wheel),
    ]
    pages = {("https://pypi.example/simple", "filelock"): found}
    picked = wheel_index.remote_wheel(
        entry, "https://pypi.example/simple", "3.11", "2.28", supported_tags("3.11"), pages
    )
    assert picked.filename == "filelock-4.3.1-py3-none-any.whl"
    hostile = [*found, Candidate("filelock-4.3.1-py3-none-any.x/../../evil.whl", "x", sdist)]
    pages = {("https://pypi.example/simple", "filelock"): hostile}
    with pytest.raises(EnvironmentFailure, match="not a wheel file name"):
        wheel_index.remote_wheel(entry, "https://pypi.example/simple", "3.11", "2.28", supported_tags("3.11"), pages)
