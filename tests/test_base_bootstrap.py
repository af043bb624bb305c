"""How a base is bootstrapped where CI runs it: as root, or as a runner's user through passwordless sudo; with the
vendor's own archive keyring, so a Debian base bootstraps on an Ubuntu host (GitHub's runners) and the other way."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagekit.errors import EnvironmentFailure
from imagekit.services.base_images import KEYRINGS, bootstrap_argv

ALL = frozenset(path for path, _, _ in KEYRINGS.values())


def _argv(data, python="3.11", **kw):
    spec = data.bases[python]
    defaults = {"euid": 0, "sudo": False, "keyrings": ALL}
    return spec, bootstrap_argv(spec, 1735689600, Path("/c/base.partial.tar"), True, **{**defaults, **kw})


def test_root_runs_mmdebstrap_itself_with_the_vendors_keyring(data):
    spec, argv = _argv(data)
    assert argv[0] == "mmdebstrap" and "--mode=root" in argv
    assert f"--keyring={KEYRINGS[spec.vendor][0]}" in argv
    assert argv[-3:] == [spec.suite, "/c/base.partial.tar", spec.mirror]


def test_a_runners_user_bootstraps_through_passwordless_sudo_keeping_the_date(data):
    _, argv = _argv(data, euid=1001, sudo=True)
    assert argv[:4] == ["sudo", "-n", "env", "SOURCE_DATE_EPOCH=1735689600"] and argv[4] == "mmdebstrap"


def test_without_root_or_sudo_the_refusal_names_the_ways_out(data):
    with pytest.raises(EnvironmentFailure) as exc:
        _argv(data, euid=1001, sudo=False)
    assert "needs root" in exc.value.message and "passwordless sudo" in exc.value.hint
    assert "bases." in exc.value.hint  # or a registry base


@pytest.mark.parametrize("vendor", ["debian", "ubuntu"])
def test_a_missing_archive_keyring_names_the_package_to_install(data, vendor):
    python = next(py for py, spec in sorted(data.bases.items()) if spec.vendor == vendor)
    path, package, _ = KEYRINGS[vendor]
    with pytest.raises(EnvironmentFailure) as exc:
        _argv(data, python, keyrings=ALL - {path})
    assert path in exc.value.message and f"apt-get install {package}" in exc.value.hint
