"""Wheels that are on no index (flash-attn's release assets): named by URL with their sha256, locked, fetched,
verified and installed like any other pin; what a build cannot install reproducibly is refused before it runs."""

from __future__ import annotations

import hashlib
import json

import pytest

from imagekit.errors import UsageError
from imagekit.image import layering as layers
from imagekit.locking import direct_wheels, lockfile
from imagekit.locking import wheel_choice as wheels
from imagekit.trust import validate
from tests.hostile_index import honest_index
from tests.wheelfactory import build_wheel, serve, write_simple_index

FA_VERSION = "2.7.4.post1+cu12torch2.5cxx11abiFALSE"
FA_FILE = f"flash_attn-{FA_VERSION}-cp311-cp311-linux_x86_64.whl"
SHA = "a" * 64


def _ref(filename: str = FA_FILE, sha: str = SHA, host: str = "https://github.com/Dao-AILab/releases") -> str:
    return f"flash-attn @ {host}/{filename}#sha256={sha}"


# ---- the requirement a user writes in the matrix file ---------------------------------------------------------
def test_a_wheel_url_with_its_hash_is_a_requirement():
    assert direct_wheels.requirement(_ref()) == _ref()
    assert validate.requirement_name(direct_wheels.requirement(_ref())) == "flash-attn"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("flash-attn @ git+ssh://git@github.com/Dao-AILab/flash-attention@main", "only git over http(s)"),
        ("flash-attn @ hg+https://hg.example/flash-attention@1", "VCS reference"),
        ("flash-attn @ https://h/flash_attn-2.7.4.tar.gz", "not a wheel"),
        (f"flash-attn @ https://h/{FA_FILE}#md5=abc", "no #sha256"),
        (f"flash-attn @ file:///tmp/{FA_FILE}#sha256={SHA}", "relative to the project"),
        (f"flash-attn @ ftp://h/{FA_FILE}#sha256={SHA}", "only http(s)"),
        (f"flash-attn @ https://user:token@h/{FA_FILE}#sha256={SHA}", "carries a credential"),
        (f"xformers @ https://h/{FA_FILE}#sha256={SHA}", "a wheel of flash-attn, not of xformers"),
        (f"flash-attn @ https://h/flash_attn-1-x.whl#sha256={SHA}", "not a wheel file name"),
        (f"flash-attn @ https://h/{FA_FILE}?X-Amz-Signature=abc#sha256={SHA}", "signed or expiring"),
        ("x @ https://h.example/%1b]0;pwned%07%0aerror:%20fake.tar.gz", "not a wheel"),
    ],
)
def test_what_a_build_cannot_install_reproducibly_is_refused_with_the_fix(value, says):
    with pytest.raises(UsageError) as exc:
        direct_wheels.requirement(value)
    assert says in exc.value.message and exc.value.hint
    assert "user:token" not in exc.value.render()  # a credential in the URL is never echoed
    assert "\x1b" not in exc.value.render() and "\nerror: fake" not in exc.value.render()


def test_the_wheels_tags_and_local_version_are_checked_against_the_cell():
    supported = wheels.supported_tags("3.11", "2.28")
    wheel = direct_wheels.parse("flash-attn", f"https://h/{FA_FILE}#sha256={SHA}")
    assert direct_wheels.cell_problems(wheel, supported, "2.5.1", "12.4") == []
    assert direct_wheels.cell_problems(wheel, supported, "2.5.1", "12.1") == []  # cu12: any CUDA 12
    (torch,) = direct_wheels.cell_problems(wheel, supported, "2.4.1", "12.4")
    assert "built for torch 2.5, the cell has torch 2.4.1" in torch
    (cuda,) = direct_wheels.cell_problems(wheel, supported, "2.5.1", "11.8")
    assert "built for CUDA 12, the cell has CUDA 11.8" in cuda
    (python,) = direct_wheels.cell_problems(wheel, wheels.supported_tags("3.10", "2.28"), "2.5.1", "12.4")
    assert "cp311-cp311-linux_x86_64" in python and "do not run" in python
    exact = direct_wheels.parse("x", f"https://h/x-1.0+cu118-py3-none-any.whl#sha256={SHA}")
    assert direct_wheels.cell_problems(exact, supported, "2.5.1", "11.8") == []
    assert direct_wheels.cell_problems(exact, supported, "2.5.1", "12.1")  # cu118 is not 12.1


# ---- the lock ----------------------------------------------------------------------------------------------------
LOCKED = f"""{_ref()} \\
    --hash=sha256:{SHA}
    # via imagekit-cell (pyproject.toml)
six==1.17.0 \\
    --hash=sha256:{"b" * 64}
"""


def test_a_locked_wheel_url_round_trips_and_installs_as_its_pin():
    fa, six = lockfile.parse_requirements(LOCKED)
    assert (fa.name, fa.version, fa.url) == (
        "flash-attn",
        FA_VERSION,
        f"https://github.com/Dao-AILab/releases/{FA_FILE}#sha256={SHA}",
    )
    assert six.url is None and six.spec == "six==1.17.0"
    lock = lockfile.Lock((), (fa, six))
    again = lockfile.parse(lock.render())
    assert again == lock and lockfile.integrity_problems(again, lock.render()) == []
    # the image installs it from the build's wheelhouse, by its pin and hash (no URL inside the build)
    (app,) = [layer for layer in layers.split(lock).layers if layer.name == "app"]
    assert f"flash-attn=={FA_VERSION} \\\n    --hash=sha256:{SHA}\n" in app.requirements
    assert "https://" not in app.requirements


def test_the_lock_hash_covers_the_wheel_url():
    fa, six = lockfile.parse_requirements(LOCKED)
    moved = lockfile.LockEntry(fa.name, fa.version, fa.hashes, fa.via, fa.url.replace("Dao-AILab", "someone-else"))
    assert lockfile.Lock((), (fa, six)).content_hash != lockfile.Lock((), (moved, six)).content_hash


def test_a_locked_hash_that_is_not_the_urls_is_an_integrity_problem():
    text = LOCKED.replace(f"--hash=sha256:{SHA}", f"--hash=sha256:{'c' * 64}")
    lock = lockfile.Lock((), tuple(lockfile.parse_requirements(text)))
    rendered = lock.render()
    assert any("not the sha256 its URL names" in p for p in lockfile.integrity_problems(lock, rendered))


def test_a_lock_line_with_a_source_archive_url_is_refused():
    text = LOCKED.replace(FA_FILE, "flash_attn-2.7.4.tar.gz")
    with pytest.raises(UsageError) as exc:
        lockfile.parse_requirements(text, "locks/x.txt")
    assert "locks/x.txt:1" in exc.value.message and "not a wheel" in exc.value.message


# ---- real uv against loopback: a release-asset server and an index ----------------------------------------------
MATRIX = """[[matrix.include]]
cuda = "12.4"
torch = "2.5.1"
transformers = "4.48.2"
python = "3.11"
packages = [{packages}]
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's project: the fake PyPI on loopback, and a second server of release assets (the flash-attn wheel)."""
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.chdir(tmp_path)
    assets = tmp_path / "assets"
    wheel = build_wheel(assets, "flash-attn", FA_VERSION, ["filelock"], tag="cp311-cp311-linux_x86_64")
    cp310 = build_wheel(assets, "flash-attn", FA_VERSION, [], tag="cp310-cp310-linux_x86_64")
    index = honest_index(tmp_path)
    with serve(index) as pypi, serve(assets) as host:
        yield {
            "index": f"{pypi}/simple",
            "url": f"{host}/{wheel.name}",
            "sha": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            "cp310": (f"{host}/{cp310.name}", hashlib.sha256(cp310.read_bytes()).hexdigest()),
            "wheel": wheel,
            "root": tmp_path,
            "index_root": index,
        }


def _lock(app, runner, project, *packages: str):
    (project["root"] / "m.toml").write_text(MATRIX.format(packages=", ".join(json.dumps(p) for p in packages)))
    return runner.invoke(app, ["lock", "--matrix", "m.toml", "--index-url", project["index"], "--dir", "locks"])


@pytest.mark.resolver
def test_a_wheel_url_is_locked_fetched_and_verified(app, runner, project):
    ref = f"flash-attn @ {project['url']}#sha256={project['sha']}"
    res = _lock(app, runner, project, ref)
    assert res.exit_code == 0, res.output
    (path,) = (project["root"] / "locks").glob("*.txt")
    text = path.read_text()
    assert f"{ref} \\\n    --hash=sha256:{project['sha']}" in text
    lock = lockfile.parse(text)
    assert lock.pins()["flash-attn"] == FA_VERSION and lock.pins()["filelock"] == "3.16.1"  # its dependency too
    res = runner.invoke(app, ["fetch", "--matrix", "m.toml", "--lock-dir", "locks"])
    assert res.exit_code == 0, res.output
    cached = project["root"] / "cache" / "wheels" / project["sha"] / project["wheel"].name
    assert cached.read_bytes() == project["wheel"].read_bytes()
    # the server now sends other bytes under the same URL: the fetch refuses them and keeps nothing
    cached.unlink()
    project["wheel"].write_bytes(project["wheel"].read_bytes() + b"tampered")
    res = runner.invoke(app, ["fetch", "--matrix", "m.toml", "--lock-dir", "locks"])
    assert res.exit_code != 0 and "sha256" in res.output, res.output
    assert not cached.exists()


@pytest.mark.resolver
def test_a_wheel_for_another_python_is_refused_at_lock_time(app, runner, project):
    url, sha = project["cp310"]
    res = _lock(app, runner, project, f"flash-attn @ {url}#sha256={sha}")
    assert res.exit_code != 0, res.output
    assert "cannot run in this cell" in res.output and "cp310" in res.output and "hint:" in res.output
    assert not list((project["root"] / "locks").glob("*.txt"))


@pytest.mark.resolver
def test_a_package_with_only_a_source_archive_is_refused_at_lock_time_naming_the_fix(app, runner, project):
    sdist = project["index_root"] / "files" / "onlysource-1.0.tar.gz"
    sdist.write_bytes(b"not built here")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    (project["index_root"] / "simple" / "onlysource").mkdir()
    (project["index_root"] / "simple" / "onlysource" / "index.html").write_text(
        f'<a href="../../files/onlysource-1.0.tar.gz#sha256={digest}">onlysource-1.0.tar.gz</a>'
    )
    res = _lock(app, runner, project, "onlysource==1.0")
    assert res.exit_code != 0, res.output
    assert "onlysource has no wheel for Python 3.11" in res.output
    assert "prebuilt wheel by URL" in res.output and "own index" in res.output


@pytest.mark.resolver
def test_a_dry_run_of_a_pin_without_a_fitting_wheel_is_a_blocker_not_ok(app, runner, project):
    """The index lists the locked version, but no wheel of it fits the image (a pure sdist, or another platform):
    the plan says BLOCKED and exits non-zero, never 'index unreadable ... ok'."""
    res = _lock(app, runner, project)
    assert res.exit_code == 0, res.output
    # the index now lists filelock 3.16.1 only as a wheel for another platform (same hash the lock allows? no:
    # another file): the locked hash matches no wheel the image can install
    files = project["index_root"] / "files"
    (files / "filelock-3.16.1-py3-none-any.whl").rename(files / "filelock-3.16.1-py3-none-win_amd64.whl")
    write_simple_index(project["index_root"], sorted(files.glob("*.whl")))
    res = runner.invoke(app, ["build", "--matrix", "m.toml", "--lock-dir", "locks", "--dry-run"])
    assert res.exit_code == 1, res.output
    assert "BLOCKED" in res.output and "filelock==3.16.1" in res.output and "cannot be built" in res.output
    assert "index unreadable" not in res.output


def test_an_at_sign_in_a_marker_is_not_a_url():
    from imagekit.locking import resolution

    assert not resolution.is_direct('accelerate==1.2.1 ; platform_machine != "a@b"')
    assert resolution.is_direct(_ref())
