"""How a base is bootstrapped where CI runs it: as root, or as a runner's user through passwordless sudo; with the
vendor's own archive keyring, so a Debian base bootstraps on an Ubuntu host (GitHub's runners) and the other way."""

from __future__ import annotations

import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from imagekit.errors import EnvironmentFailure
from imagekit.image.buildplan import DEFAULT_SOURCE_DATE_EPOCH
from imagekit.services.builds.base_images import KEYRINGS, bootstrap_argv, bootstrap_tarball, ensure_base
from tests.conftest import ROOT

ALL = frozenset(path for path, _, _ in KEYRINGS.values())


def _argv(data, python="3.11", **kw):
    spec = data.bases[python]
    defaults = {"euid": 0, "sudo": False, "keyrings": ALL}
    return spec, bootstrap_argv(spec, 1735689600, Path("/c/base.partial.tar"), True, **{**defaults, **kw})


def test_root_runs_mmdebstrap_itself_with_the_vendors_keyring(data):
    spec, argv = _argv(data)
    mm = argv.index("mmdebstrap")
    assert argv[:2] == ["env", "-i"] and "SOURCE_DATE_EPOCH=1735689600" in argv[:mm] and "--mode=root" in argv
    assert f"--keyring={KEYRINGS[spec.vendor][0]}" in argv
    assert argv[-3:] == [spec.suite, "/c/base.partial.tar", spec.mirror]


def test_dpkg_keeps_documentation_and_libpython_a_out_of_the_base_licenses_in(data):
    """Every exclude before every include (dpkg: the last matching filter wins), and copyright files come back."""
    _, argv = _argv(data)
    opts = [a.removeprefix("--dpkgopt=") for a in argv if a.startswith("--dpkgopt=")]
    kinds = [o.split("=", 1)[0] for o in opts]
    assert kinds == sorted(kinds, key=lambda k: k != "path-exclude") and "path-include" in kinds
    assert "path-exclude=/usr/share/doc/*" in opts and "path-include=/usr/share/doc/*/copyright" in opts
    assert any(o.startswith("path-exclude=") and o.endswith("libpython3*.a") for o in opts)
    assert not any("libgcc" in o or "libstdc++" in o for o in opts)  # gcc links those: torch.compile needs them


def test_a_runners_user_bootstraps_through_passwordless_sudo_keeping_the_date(data):
    _, argv = _argv(data, euid=1001, sudo=True)
    mm = argv.index("mmdebstrap")
    assert argv[:4] == ["sudo", "-n", "env", "-i"] and "SOURCE_DATE_EPOCH=1735689600" in argv[:mm]
    assert "PYTHONDONTWRITEBYTECODE=1" in argv[:mm]  # the same environment as root's: the same bytes


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


RUNNER = "imagekit-runner"  # a hosted runner's user: not root, passwordless sudo


def _as_runner(out: Path, epoch: int) -> subprocess.CompletedProcess:
    """imagekit's bootstrap as the runner's user, with the system's Python (this venv's interpreter may lie under
    root's home) reading imagekit and its packages from this checkout and venv."""
    code = (
        "import sys; from pathlib import Path; from imagekit.services import inputs; "
        "from imagekit.services.builds.base_images import bootstrap_tarball; "
        "print(bootstrap_tarball(inputs.compat_data().bases['3.11'], int(sys.argv[1]), Path(sys.argv[2]), True))"
    )
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    path = f"{ROOT}:{sysconfig.get_paths()['purelib']}"
    return subprocess.run(
        ["runuser", "-u", RUNNER, "--", "env", f"HOME={out}", f"PYTHONPATH={path}", python, "-c", code, str(epoch),
         f"{out}/b.tar"],
        capture_output=True,
        text=True,
        timeout=1800,
    )  # fmt: skip


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.images  # a second bootstrap of the base, as another user: `make test-images`
def test_a_runners_user_with_passwordless_sudo_bootstraps_the_bytes_root_does(engine, data):
    """As on GitHub's hosted runners: a user that is not root, with passwordless sudo, bootstraps the base; the tarball
    is the user's and byte-identical to the one root made (the base the builds use). Without sudo: the refusal."""
    assert shutil.which("sudo") and shutil.which("runuser"), "make setup installs sudo"
    root_base = ensure_base(data.bases["3.11"], engine, DEFAULT_SOURCE_DATE_EPOCH, compiler=True)
    if subprocess.run(["id", RUNNER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--create-home", RUNNER], check=True)
    sudoers = Path("/etc/sudoers.d") / RUNNER
    out = Path(tempfile.mkdtemp(prefix="imagekit-runner-", dir="/var/tmp"))
    shutil.chown(out, RUNNER)
    try:
        sudoers.write_text(f"{RUNNER} ALL=(ALL) NOPASSWD:ALL\n")
        sudoers.chmod(0o440)
        res = _as_runner(out, DEFAULT_SOURCE_DATE_EPOCH)
        assert res.returncode == 0, res.stderr[-3000:]
        digest = res.stdout.split()[-1]
        assert (out / "b.tar").stat().st_uid == pwd.getpwnam(RUNNER).pw_uid  # chowned back from sudo's root
        if f"sha256:{digest}" != root_base.digest:
            # the archive published new packages since root's bootstrap: root bootstraps again, now, to compare
            again = bootstrap_tarball(data.bases["3.11"], DEFAULT_SOURCE_DATE_EPOCH, out / "root.tar", True)
            assert digest == again
        sudoers.unlink()
        refused = _as_runner(out, DEFAULT_SOURCE_DATE_EPOCH)
        assert refused.returncode != 0 and "needs root" in refused.stderr and "`sudo -n` is refused" in refused.stderr
    finally:
        sudoers.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(out)], check=False)
