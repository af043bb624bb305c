"""Where a repository's registry ends: Docker's rule, once, and every reader of a name agrees with it."""

from __future__ import annotations

import pytest

from imagekit.effects.registry import Remote
from imagekit.errors import UsageError
from imagekit.services.publishing import release
from imagekit.trust import registry_host, validate

NAMES = [
    # (name, its registry host or None for Docker Hub, the path on it)
    ("ghcr.io/acme/train", "ghcr.io", "acme/train"),
    ("127.0.0.1:5000/imagekit/train", "127.0.0.1:5000", "imagekit/train"),
    ("localhost/train", "localhost", "train"),
    ("registry:5000/train", "registry:5000", "train"),
    ("[::1]:5000/train", "[::1]:5000", "train"),
    ("docker.io/library/ubuntu", "docker.io", "library/ubuntu"),
    ("acme/train", None, "acme/train"),
    ("ubuntu", None, "ubuntu"),
    ("localhost", None, "localhost"),  # one component: a name on Docker Hub
    ("ghcr.io", None, "ghcr.io"),
]


@pytest.mark.parametrize(("name", "host", "path"), NAMES)
def test_a_first_component_with_a_dot_a_colon_or_localhost_is_the_registry(name, host, path):
    assert registry_host.split(name) == (host, path)
    assert registry_host.registry_of(name) == (host or "docker.io")


@pytest.mark.parametrize(("name", "host", "path"), [n for n in NAMES if "[" not in n[0]])
def test_the_client_speaks_to_the_host_the_rule_names(name, host, path):
    remote = Remote.parse(name)
    if host is None:
        assert remote.registry == registry_host.HUB_API
        assert remote.name == (path if "/" in path else f"library/{path}")
    else:
        assert (remote.registry, remote.name) == (host, path)


def test_a_name_whose_first_component_names_no_registry_is_a_lowercase_path():
    assert validate.repository("acme/train") == "acme/train"
    assert validate.repository("Acme.io/train") == "Acme.io/train"  # a host: its case is its own
    with pytest.raises(UsageError):
        validate.repository("Acme/train")  # a path on Docker Hub: lower case only
    with pytest.raises(UsageError, match="expected HOST"):
        Remote("acme", "train")  # a registry must be a host by the rule


def test_docker_hubs_names_are_one_registry_for_release_merge():
    assert registry_host.api_host("docker.io") == registry_host.api_host("index.docker.io") == "registry-1.docker.io"
    assert registry_host.api_host("ghcr.io") == "ghcr.io"
    assert release.named_registry("docker.io/acme") == release.Named("registry-1.docker.io", "acme")
    assert release.named_registry("index.docker.io") == release.Named("registry-1.docker.io")
    with pytest.raises(UsageError, match="names no registry host"):
        release.named_registry("acme/train")
