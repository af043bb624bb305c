"""One credential source for every registry step: the env variables, else what `docker login` saved (its config's
`auths`, a credential helper, the credential store), read with docker-py's own code against real files and a real
helper program."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from imagekit.effects import credentials
from imagekit.errors import EnvironmentFailure

HOST = "127.0.0.1:5999"


def _docker_config(folder: Path, doc: dict, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(doc))
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))
    monkeypatch.delenv("IMAGEKIT_REGISTRY_USER", raising=False)
    monkeypatch.delenv("IMAGEKIT_REGISTRY_PASSWORD", raising=False)
    return folder / "config.json"


def _helper(folder: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real `docker-credential-NAME` on PATH, answering `get` as the protocol says (the server on stdin)."""
    script = folder / f"docker-credential-{name}"
    script.write_text(
        '#!/bin/sh\n[ "$1" = get ] || exit 1\nread host\n'
        'printf \'{"ServerURL": "%s", "Username": "helper-user", "Secret": "helper-secret"}\' "$host"\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{__import__('os').environ['PATH']}")


def test_docker_logins_saved_auth_is_used_and_shown_by_its_source(tmp_path, monkeypatch):
    auth = base64.b64encode(b"bob:s3cret").decode()
    path = _docker_config(tmp_path / "docker", {"auths": {HOST: {"auth": auth}}}, monkeypatch)
    found = credentials.for_registry(HOST)
    assert (found.username, found.password) == ("bob", "s3cret")
    assert found.source == f"docker login ({path})"
    assert "s3cret" not in repr(found)
    assert credentials.for_registry("quay.io") == credentials.NONE


def test_a_credential_helper_answers_for_its_registry(tmp_path, monkeypatch):
    _docker_config(tmp_path / "docker", {"credHelpers": {"ghcr.io": "imagekittest"}}, monkeypatch)
    _helper(tmp_path, "imagekittest", monkeypatch)
    found = credentials.for_registry("ghcr.io")
    assert (found.username, found.password) == ("helper-user", "helper-secret")
    assert found.source == "docker login (docker-credential-imagekittest)"


def test_the_env_variables_come_first(tmp_path, monkeypatch):
    _docker_config(tmp_path / "docker", {"auths": {HOST: {"auth": base64.b64encode(b"bob:x").decode()}}}, monkeypatch)
    monkeypatch.setenv("IMAGEKIT_REGISTRY_USER", "ci")
    monkeypatch.setenv("IMAGEKIT_REGISTRY_PASSWORD", "pw")
    found = credentials.for_registry(HOST)
    assert (found.username, found.source) == ("ci", "IMAGEKIT_REGISTRY_USER/IMAGEKIT_REGISTRY_PASSWORD")


def test_a_store_that_cannot_answer_is_an_environment_failure_naming_the_registry(tmp_path, monkeypatch):
    _docker_config(tmp_path / "docker", {"credsStore": "not-installed-anywhere"}, monkeypatch)
    with pytest.raises(EnvironmentFailure) as exc:
        credentials.for_registry(HOST)
    assert HOST in exc.value.message and "docker login" in exc.value.hint and exc.value.exit_code == 3


def test_a_broken_config_file_means_no_credentials(tmp_path, monkeypatch):
    path = _docker_config(tmp_path / "docker", {}, monkeypatch)
    for text in ("{not json", "[1, 2]", '{"auths": {"127.0.0.1:5999": {"auth": "%%%"}}}'):
        path.write_text(text)
        try:
            found = credentials.for_registry(HOST)
        except EnvironmentFailure as exc:  # said, not a traceback
            assert HOST in exc.message and exc.hint
        else:
            assert found == credentials.NONE


@pytest.mark.seconds
def test_build_dry_run_push_says_where_and_with_which_credentials(app, runner, tmp_path, monkeypatch):
    repo = f"{HOST}/imagekit/train"
    args = ["build", "--cuda", "12.1", "--source", "pypi", "--dry-run", "--push", "--registry", repo]
    _docker_config(tmp_path / "none", {}, monkeypatch)
    res = runner.invoke(app, args)
    assert f"push to {repo}: no credentials found" in res.output and f"docker login {HOST}" in res.output
    assert f"{repo}: cannot tell what is published (registry {HOST} is unreachable" in res.output  # a note
    assert res.exit_code == 0, res.output
    path = _docker_config(tmp_path / "docker", {"auths": {HOST: {"auth": base64.b64encode(b"u:p").decode()}}},
                          monkeypatch)  # fmt: skip
    res = runner.invoke(app, args)
    assert f"push to {repo}: credentials from docker login ({path})" in res.output, res.output
    assert ":p" not in res.output.replace(str(path), "")
