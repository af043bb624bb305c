"""Registry credentials from one place, in one order, for every registry step (the push, the alias tag, the checks,
`release merge`, `base bootstrap --push`): ``IMAGEKIT_REGISTRY_USER``/``IMAGEKIT_REGISTRY_PASSWORD`` when set, else
what `docker login` saved for that registry (its config file's ``auths``, a ``credHelpers`` entry or the
``credsStore``; ``DOCKER_CONFIG`` moves the file), read the way the Docker client reads it (docker-py's own code)."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

from imagekit.effects.registry import PASSWORD_VARIABLE, USER_VARIABLE
from imagekit.errors import EnvironmentFailure
from imagekit.trust.untrusted import printable


@dataclass(frozen=True)
class Credential:
    username: str | None
    password: str | None = field(repr=False)
    source: str  # where they came from, as it may be shown (never the values)

    @property
    def found(self) -> bool:
        return self.username is not None


NONE = Credential(None, None, "none")


def from_env() -> Credential:
    user = os.environ.get(USER_VARIABLE)
    if user:
        return Credential(user, os.environ.get(PASSWORD_VARIABLE, ""), f"{USER_VARIABLE}/{PASSWORD_VARIABLE}")
    return NONE


def for_registry(registry: str) -> Credential:
    """The credentials for ``registry`` (``host[:port]``), or :data:`NONE`."""
    if from_env().found:
        return from_env()
    from docker import auth, errors
    from docker.utils.config import find_config_file

    try:
        with warnings.catch_warnings():  # docker-py warns of a helper not on PATH, then fails: the failure is said
            warnings.simplefilter("ignore")
            config = auth.load_config()
            found = auth.resolve_authconfig(config, registry)
            store = config.get_credential_store(registry)
    except (errors.DockerException, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise EnvironmentFailure(
            f"the credentials `docker login` saved for {registry} cannot be read: {printable(exc)[:300]}",
            f"run `docker login {registry}` again, or set {USER_VARIABLE} and {PASSWORD_VARIABLE}",
        ) from None
    if not isinstance(found, dict) or not isinstance(found.get("Username") or found.get("username"), str):
        return NONE
    username = found.get("Username") or found.get("username")
    password = found.get("Password") or found.get("password") or ""
    if not isinstance(password, str):
        return NONE
    where = f"docker-credential-{store}" if store else printable(find_config_file() or "~/.docker/config.json")
    return Credential(username, password, f"docker login ({where})")
