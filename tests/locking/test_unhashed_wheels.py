"""Wheels a matrix file names without their sha256 (a release-asset URL) or as a file committed with the project
(``file:wheels/...whl``): `imagekit lock` learns the hash once, records it, says so, and never downloads again."""

from __future__ import annotations

import hashlib
import http.server
import json
from contextlib import contextmanager
from pathlib import Path

import pytest

from imagekit.errors import CheckFailed, UsageError
from imagekit.locking import direct_wheels, lockfile
from imagekit.services.wheels import direct_sources
from tests import loopback
from tests.hostile_index import honest_index
from tests.wheelfactory import build_wheel, serve

FA_VERSION = "2.7.4.post1+cu12torch2.5cxx11abiFALSE"
FA_TAG = "cp311-cp311-linux_x86_64"
MATRIX = """[[matrix.include]]
cuda = "12.4"
torch = "2.5.1"
transformers = "4.48.2"
python = "3.11"
packages = [{packages}]
"""


# ---- what the matrix file may say ----------------------------------------------------------------------------
def test_a_wheel_url_without_a_hash_and_a_project_wheel_are_requirements():
    url = f"flash-attn @ https://github.com/o/r/releases/download/v1/flash_attn-{FA_VERSION}-{FA_TAG}.whl"
    assert direct_wheels.requirement(url) == url
    local = "deepspeed @ file:wheels/deepspeed-0.19.8-py3-none-any.whl"
    assert direct_wheels.requirement(local) == local
    wheel = direct_wheels.parse("deepspeed", local.split(" @ ")[1] + "#sha256=" + "a" * 64)
    assert wheel.url == "file:wheels/deepspeed-0.19.8-py3-none-any.whl" and direct_wheels.is_local(wheel.url)
    with pytest.raises(direct_wheels.NotAWheel, match="no #sha256"):  # a lock's entry always has its hash
        direct_wheels.parse("flash-attn", url.split(" @ ")[1])


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("deepspeed @ file:../deepspeed-0.19.8-py3-none-any.whl", "may not leave the project"),
        ("deepspeed @ file:wheels/../../deepspeed-0.19.8-py3-none-any.whl", "may not leave the project"),
        ("deepspeed @ file:///tmp/deepspeed-0.19.8-py3-none-any.whl", "relative to the project"),
        ("deepspeed @ file://host/deepspeed-0.19.8-py3-none-any.whl", "relative to the project"),
        ("xformers @ file:wheels/deepspeed-0.19.8-py3-none-any.whl", "a wheel of deepspeed, not of xformers"),
        ("xformers @ https://h/deepspeed-0.19.8-py3-none-any.whl", "a wheel of deepspeed, not of xformers"),
        ("deepspeed @ file:wheels/deepspeed-0.19.8.tar.gz", "not a wheel"),
        ("deepspeed @ https://h/deepspeed-0.19.8-py3-none-any.whl?sig=1", "signed or expiring"),
        ("deepspeed @ https://u:t@h/deepspeed-0.19.8-py3-none-any.whl", "carries a credential"),
    ],
)
def test_a_reference_that_leaves_the_project_or_names_another_package_is_refused(value, says):
    with pytest.raises(UsageError) as exc:
        direct_wheels.requirement(value)
    assert says in exc.value.message and exc.value.hint


# ---- a server of release assets that counts what it serves ----------------------------------------------------
@contextmanager
def assets_server(root: Path, redirects: dict[str, str] | None = None):
    """Serve ``root`` on 127.0.0.1; ``redirects``: path -> Location. Yields (base URL, the GET paths served)."""
    served: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            served.append(self.path)
            if redirects and self.path in redirects:
                self.send_response(302)
                self.send_header("Location", redirects[self.path])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a, **kw: Handler(*a, directory=str(root), **kw))
    loopback.start(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        loopback.stop(server)


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    root = tmp_path / "proj"
    root.mkdir()
    monkeypatch.chdir(root)
    assets = tmp_path / "assets"
    wheel = build_wheel(assets, "flash-attn", FA_VERSION, ["filelock"], tag=FA_TAG)
    local = build_wheel(root / "wheels", "deepspeed", "0.19.8", ["numpy"])
    with serve(honest_index(tmp_path)) as pypi, assets_server(assets) as (host, served):
        yield {
            "root": root,
            "index": f"{pypi}/simple",
            "url": f"{host}/{wheel.name}",
            "sha": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            "wheel": wheel,
            "served": served,
            "local": local,
            "local_sha": hashlib.sha256(local.read_bytes()).hexdigest(),
        }


def _lock(app, runner, project, *packages: str, extra: tuple[str, ...] = ()):
    (project["root"] / "m.toml").write_text(MATRIX.format(packages=", ".join(json.dumps(p) for p in packages)))
    return runner.invoke(app, ["lock", "--matrix", "m.toml", "--index-url", project["index"], "--dir", "locks", *extra])


def _lock_text(project) -> str:
    (path,) = (project["root"] / "locks").glob("*.txt")
    return path.read_text()


@pytest.mark.resolver
@pytest.mark.loopback
def test_a_wheel_url_without_a_hash_is_downloaded_once_recorded_and_said(app, runner, project):
    ref = f"flash-attn @ {project['url']}"
    res = _lock(app, runner, project, ref)
    assert res.exit_code == 0, res.output
    assert f"flash-attn: recorded sha256:{project['sha']} of {project['wheel'].name} (downloaded once" in res.output
    text = _lock_text(project)
    assert f"{ref}#sha256={project['sha']} \\\n    --hash=sha256:{project['sha']}" in text
    assert project["served"] == [f"/{project['wheel'].name}"]  # uv read the cached file, not the URL again
    input_hash = lockfile.parse(text).meta["input-hash"]
    # a second lock: up to date, nothing downloaded
    res = _lock(app, runner, project, ref)
    assert res.exit_code == 0 and "up-to-date" in res.output, res.output
    # re-resolved (the lock deleted): the cache's note gives the hash, still no download, same input hash
    (path,) = (project["root"] / "locks").glob("*.txt")
    path.unlink()
    res = _lock(app, runner, project, ref)
    assert res.exit_code == 0, res.output
    assert project["served"] == [f"/{project['wheel'].name}"]
    assert lockfile.parse(_lock_text(project)).meta["input-hash"] == input_hash
    # the lock fetches and verifies like a hashed URL
    res = runner.invoke(app, ["fetch", "--matrix", "m.toml", "--lock-dir", "locks"])
    assert res.exit_code == 0, res.output


@pytest.mark.resolver
@pytest.mark.loopback
def test_a_project_wheel_is_hash_locked_and_fetched_from_the_project(app, runner, project, monkeypatch, tmp_path):
    ref = "deepspeed @ file:wheels/deepspeed-0.19.8-py3-none-any.whl"
    res = _lock(app, runner, project, ref)
    assert res.exit_code == 0, res.output
    sha = project["local_sha"]
    text = _lock_text(project)
    assert f"{ref}#sha256={sha} \\\n    --hash=sha256:{sha}" in text and "numpy==1.26.4" in text
    assert str(tmp_path) not in text  # no host path in the lock
    # a fresh machine: an empty cache; fetch copies the project's wheel into it
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache2"))
    res = runner.invoke(app, ["fetch", "--matrix", "m.toml", "--lock-dir", "locks"])
    assert res.exit_code == 0, res.output
    cached = tmp_path / "cache2" / "wheels" / sha / project["local"].name
    assert cached.read_bytes() == project["local"].read_bytes()
    # the file is rebuilt with other bytes: fetch refuses it, lock locks it again
    build_wheel(project["root"] / "wheels", "deepspeed", "0.19.8", ["numpy", "filelock"])
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache3"))
    res = runner.invoke(app, ["fetch", "--matrix", "m.toml", "--lock-dir", "locks"])
    assert res.exit_code != 0 and "the file changed since it was locked" in res.output, res.output
    res = _lock(app, runner, project, ref)
    assert res.exit_code == 0 and "locked" in res.output, res.output
    assert sha not in _lock_text(project)


@pytest.mark.resolver
@pytest.mark.loopback
def test_a_project_wheel_linked_from_outside_is_refused(app, runner, project, tmp_path):
    outside = build_wheel(tmp_path / "elsewhere", "deepspeed", "0.19.9", [])
    (project["root"] / "wheels" / outside.name).symlink_to(outside)
    res = _lock(app, runner, project, f"deepspeed @ file:wheels/{outside.name}")
    assert res.exit_code != 0 and "leads out of the project through a link" in res.output, res.output
    assert "hint:" in res.output
    assert not list((project["root"] / "locks").glob("*.txt"))


# ---- the download itself ---------------------------------------------------------------------------------------
def _unhashed(url: str) -> direct_wheels.DirectWheel:
    return direct_wheels.parse("flash-attn", url, hashed=False)


@pytest.mark.loopback
def test_a_url_serving_more_than_the_limit_is_refused_and_nothing_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    wheel = build_wheel(tmp_path / "assets", "flash-attn", FA_VERSION, [], tag=FA_TAG, payload="x = 1\n" * 5000)
    monkeypatch.setattr(direct_sources, "MAX_WHEEL", 1000)
    with assets_server(tmp_path / "assets") as (host, _):
        with pytest.raises(CheckFailed) as exc:
            direct_sources._learn(_unhashed(f"{host}/{wheel.name}"), None, lambda _: None)
    assert "serves more than 1000 bytes" in exc.value.message and exc.value.hint
    assert not [p for p in (tmp_path / "cache" / "wheels").rglob("*") if p.is_file()]


@pytest.mark.loopback
def test_a_redirect_to_another_host_is_followed_and_said_one_outside_http_is_refused(tmp_path, monkeypatch):
    """Release assets are served from another host (github.com redirects to a signed storage URL): followed, with no
    credential, and the line says which host served the bytes. A redirect to file: is refused."""
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    wheel = build_wheel(tmp_path / "assets", "flash-attn", FA_VERSION, [], tag=FA_TAG)
    lines: list[str] = []
    with assets_server(tmp_path / "assets") as (storage, _):
        target = storage.replace("127.0.0.1", "localhost") + f"/{wheel.name}"
        moves = {f"/{wheel.name}": target, f"/x/{wheel.name}": f"file:///etc/{wheel.name}"}
        with assets_server(tmp_path / "assets", moves) as (host, _):
            path = direct_sources._learn(_unhashed(f"{host}/{wheel.name}"), None, lines.append)
            with pytest.raises(Exception) as exc:
                direct_sources._learn(_unhashed(f"{host}/x/{wheel.name}"), None, lines.append)
    assert path.read_bytes() == wheel.read_bytes()
    assert any("served by localhost after a redirect" in line for line in lines), lines
    assert "outside http(s)" in exc.value.hint


def test_the_resolvers_answer_names_what_the_lock_keeps():
    sha = "b" * 64
    sourced = direct_sources.Sourced({}, ((sha, f"file:wheels/x-1.0-py3-none-any.whl#sha256={sha}"),))
    cached = f"file:///home/u/.cache/imagekit/wheels/{sha}/x-1.0-py3-none-any.whl"
    out = f"x @ {cached}#sha256={sha} \\\n    --hash=sha256:{sha}\n"
    assert sourced.undo(out).splitlines()[0] == f"x @ file:wheels/x-1.0-py3-none-any.whl#sha256={sha} \\"
