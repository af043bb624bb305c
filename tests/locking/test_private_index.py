"""A private package index: named in the matrix file (`[lock] index_url`, `extra_index_urls`), its credentials from
IMAGEKIT_INDEX_USER/IMAGEKIT_INDEX_PASSWORD or a netrc only, never in a lock, a render or the output; the resolver
(real uv) and imagekit's fetch both get them, and no other host does. A real loopback index that demands basic
auth stands in for Artifactory/GitLab/devpi."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from imagekit.effects import index_auth
from imagekit.errors import ConfigError
from imagekit.matrix import matrix_file as matrix
from tests.hostile_index import honest_index
from tests.wheelfactory import build_wheel, serve, serve_with_auth, write_simple_index

USER, PASSWORD = "ci-bot", "s3cret-token-value"
MATRIX = """[[matrix.include]]
cuda = "12.4"
torch = "2.5.1"
transformers = "4.48.2"
python = "3.11"
packages = [{packages}]

[lock]
index_url = "{index}"
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # the machine's own ~/.netrc plays no part
    monkeypatch.delenv(index_auth.USER_VARIABLE, raising=False)
    monkeypatch.delenv(index_auth.PASSWORD_VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _write(root, index: str, packages: tuple[str, ...] = ()) -> None:
    (root / "m.toml").write_text(MATRIX.format(index=index, packages=", ".join(json.dumps(p) for p in packages)))


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text and base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode() not in text


@pytest.mark.resolver
def test_env_credentials_reach_the_resolver_and_the_fetch_and_no_file(app, runner, project, monkeypatch):
    monkeypatch.setenv(index_auth.USER_VARIABLE, USER)
    monkeypatch.setenv(index_auth.PASSWORD_VARIABLE, PASSWORD)
    assets = project / "assets"
    other = build_wheel(assets, "extra-tool", "1.0", [])
    sha = hashlib.sha256(other.read_bytes()).hexdigest()
    with serve_with_auth(honest_index(project), USER, PASSWORD) as (url, seen), serve(assets) as asset_host:
        ref = f"extra-tool @ {asset_host}/{other.name}#sha256={sha}"
        _write(project, f"{url}/simple", (ref,))
        res = runner.invoke(app, ["lock", "--matrix", "m.toml", "--lock-dir", "locks"])
        assert res.exit_code == 0, res.output
        (path,) = (project / "locks").glob("*.txt")
        text = path.read_text()
        assert f"# imagekit-index: {url}/simple" in text
        _no_secret(text, res.output)
        fetched = runner.invoke(app, ["fetch", "--matrix", "m.toml", "--lock-dir", "locks"])
        assert fetched.exit_code == 0, fetched.output
        _no_secret(fetched.output)
        assert any(h and h.startswith("Basic ") for h in seen)  # the index was asked with them
        wheels = {p.name for p in (project / "cache" / "wheels").rglob("*.whl")}
        assert {"numpy-1.26.4-py3-none-any.whl", other.name} <= wheels
        rendered = runner.invoke(app, ["render", "--matrix", "m.toml", "--lock-dir", "locks", "--out", "ctx"])
        assert rendered.exit_code == 0, rendered.output
        for f in (project / "ctx").rglob("*"):
            if f.is_file():
                _no_secret(f.read_text(errors="replace"))


@pytest.mark.resolver
def test_a_netrc_entry_is_enough_and_without_credentials_the_hint_names_both(app, runner, project, monkeypatch):
    with serve_with_auth(honest_index(project), USER, PASSWORD) as (url, _):
        _write(project, f"{url}/simple")
        res = runner.invoke(app, ["lock", "--matrix", "m.toml", "--lock-dir", "locks"])
        assert res.exit_code != 0 and "refused access (HTTP 401)" in res.output, res.output
        assert "netrc" in res.output
        (project / "netrc").write_text(f"machine 127.0.0.1 login {USER} password {PASSWORD}\n")
        (project / "netrc").chmod(0o600)
        monkeypatch.setenv("NETRC", str(project / "netrc"))
        res = runner.invoke(app, ["lock", "--matrix", "m.toml", "--lock-dir", "locks"])
        assert res.exit_code == 0, res.output
        assert runner.invoke(app, ["fetch", "--matrix", "m.toml", "--lock-dir", "locks"]).exit_code == 0
        # the netrc gone: the fetch of a wheel not yet cached says which credentials it needs
        monkeypatch.setenv("NETRC", str(project / "no-netrc"))
        for whl in (project / "cache" / "wheels").rglob("filelock-*.whl"):
            whl.unlink()
        res = runner.invoke(app, ["fetch", "--matrix", "m.toml", "--lock-dir", "locks"])
        assert res.exit_code == 3 and "HTTP 401" in res.output and index_auth.USER_VARIABLE in res.output


def test_env_credentials_go_to_the_private_indexes_only(monkeypatch, tmp_path):
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv(index_auth.USER_VARIABLE, USER)
    monkeypatch.setenv(index_auth.PASSWORD_VARIABLE, PASSWORD)
    auth = index_auth.for_indexes(["https://pkgs.example.com:8443/simple", "https://pypi.org/simple"])
    assert auth.private == frozenset({"pkgs.example.com:8443"})
    assert auth.headers("https://pkgs.example.com:8443/simple/x/")["Authorization"].startswith("Basic ")
    assert auth.headers("https://pypi.org/simple/x/") == {}  # PyPI never gets a private index's token
    assert auth.headers("https://files.example.com/x.whl") == {}  # nor a file host the index did not name
    assert "machine pkgs.example.com login ci-bot" in auth.netrc_text()
    assert PASSWORD not in auth.source and repr(auth).count(PASSWORD) == 0


def test_a_credential_in_the_matrix_files_url_is_refused():
    import tomllib

    from imagekit.services import inputs

    doc = tomllib.loads(MATRIX.format(index=f"https://{USER}:{PASSWORD}@pkgs.example.com/simple", packages=""))
    with pytest.raises(ConfigError) as exc:
        matrix.parse(doc, "imagekit.toml", inputs.compat_data())
    assert "lock.index_url" in exc.value.render() and "IMAGEKIT_INDEX_USER" in exc.value.render()
    _no_secret(exc.value.render())


def test_the_matrix_files_indexes_are_the_defaults_an_option_overrides():
    import tomllib

    from imagekit.cli.options import ResolverOptions
    from imagekit.services import inputs

    text = MATRIX.format(index="https://pkgs.example.com/simple", packages="")
    text += 'extra_index_urls = ["https://more.example.com/simple"]\n'
    config = matrix.parse(tomllib.loads(text), "imagekit.toml", inputs.compat_data())
    assert ResolverOptions().settings(config).index_url == "https://pkgs.example.com/simple"
    assert ResolverOptions().settings(config).extra_index_urls == ("https://more.example.com/simple",)
    given = ResolverOptions(index_url="https://mirror.example.com/simple").settings(config)
    assert given.index_url == "https://mirror.example.com/simple"


@pytest.mark.resolver
def test_a_package_from_an_extra_private_index_is_fetched_from_there(app, runner, project, monkeypatch):
    """PyPI (here: a loopback look-alike) as the main index, the private one as an extra: the main index answers 404
    for the private package, so the fetch and the plan look it up on the extra index, with its credentials."""
    monkeypatch.setenv(index_auth.USER_VARIABLE, USER)
    monkeypatch.setenv(index_auth.PASSWORD_VARIABLE, PASSWORD)
    private = project / "private"
    write_simple_index(private, [build_wheel(project / "pw", "acme-utils", "0.3.0")])
    with serve(honest_index(project)) as public, serve_with_auth(private, USER, PASSWORD) as (url, seen):
        _write(project, f"{public}/simple", ("acme-utils==0.3.0",))
        toml = project / "m.toml"
        toml.write_text(toml.read_text() + f'extra_index_urls = ["{url}/simple"]\n')
        res = runner.invoke(app, ["lock", "--matrix", "m.toml", "--lock-dir", "locks"])
        assert res.exit_code == 0, res.output
        plan = runner.invoke(app, ["fetch", "--matrix", "m.toml", "--lock-dir", "locks", "--dry-run"])
        assert plan.exit_code == 0 and "unreadable" not in plan.output, plan.output
        res = runner.invoke(app, ["fetch", "--matrix", "m.toml", "--lock-dir", "locks"])
        assert res.exit_code == 0, res.output
        assert list((project / "cache" / "wheels").rglob("acme_utils-0.3.0-py3-none-any.whl"))
        assert any(h and h.startswith("Basic ") for h in seen)
        _no_secret(res.output, plan.output)


@pytest.mark.resolver
def test_a_lock_never_decides_where_credentials_go(app, runner, project, monkeypatch):
    """A lock whose index line was edited to another host: the fetch refuses it, and that host is never sent the
    environment's credentials (they go to the indexes the matrix file or the options name, never a lock's)."""
    monkeypatch.setenv(index_auth.USER_VARIABLE, USER)
    monkeypatch.setenv(index_auth.PASSWORD_VARIABLE, PASSWORD)
    with (
        serve_with_auth(honest_index(project), USER, PASSWORD) as (url, _),
        serve_with_auth(project / "nothing", "x", "y") as (collector, collected),
    ):
        (project / "nothing").mkdir(exist_ok=True)
        _write(project, f"{url}/simple")
        assert runner.invoke(app, ["lock", "--matrix", "m.toml", "--lock-dir", "locks"]).exit_code == 0
        (path,) = (project / "locks").glob("*.txt")
        path.write_text(
            path.read_text().replace(f"# imagekit-index: {url}/simple", f"# imagekit-index: {collector}/simple")
        )
        for whl in (project / "cache" / "wheels").rglob("*.whl"):
            whl.unlink()
        res = runner.invoke(app, ["fetch", "--matrix", "m.toml", "--lock-dir", "locks"])
        assert res.exit_code != 0 and "edited by hand" in res.output, res.output
        check = runner.invoke(app, ["lock", "--check", "--matrix", "m.toml", "--lock-dir", "locks"])
        assert check.exit_code == 1 and "edited by hand" in check.output, check.output
        res = runner.invoke(app, ["fetch", "--matrix", "m.toml", "--lock-dir", "locks", "--dry-run"])
        assert not [h for h in collected if h], collected  # no credential ever reached the lock's host


@pytest.mark.parametrize("password", ["pa ss", "pass#word", 'qu"ote', "caf\u00e9"])
def test_a_credential_a_netrc_cannot_carry_is_refused_naming_the_variable(monkeypatch, password):
    from imagekit.errors import UsageError

    monkeypatch.setenv(index_auth.USER_VARIABLE, USER)
    monkeypatch.setenv(index_auth.PASSWORD_VARIABLE, password)
    with pytest.raises(UsageError) as exc:
        index_auth.for_indexes(["https://pkgs.example.com/simple"])
    assert index_auth.PASSWORD_VARIABLE in exc.value.message and password not in exc.value.render()
