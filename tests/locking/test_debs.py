"""`[image] apt`: apt's answer read as hostile data, the pins in a lock, the layer and its Dockerfile step, the
matrix key, and the self-test's and doctor's view of dpkg (pure; the real apt runs in tests/test_user_project.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from imagekit.errors import ConfigError, UsageError
from imagekit.image import layering as layers
from imagekit.image import render
from imagekit.image.buildplan import BaseRef, BuildPlan
from imagekit.image.image_options import ImageOptions
from imagekit.in_image import facts, imagekit_doctor, selftest
from imagekit.locking import debs, lockfile
from imagekit.matrix import matrix_file as matrix
from imagekit.model import Cell
from imagekit.services import inputs
from imagekit.services.locks import lock_cells
from imagekit.services.locks.lock_cells import read_lock
from imagekit.trust.untrusted import UntrustedData
from tests.conftest import ROOT

# What `debs.resolve_script(("jq", "libc6"))` printed in the bookworm base (libc6 is there already: not pinned)
SIMULATION = """\
Inst libonig5 (6.9.8-1 Debian:12.15/oldstable [amd64])
Inst libjq1 (1.6-2.1+deb12u2 Debian:12.15/oldstable [amd64])
Inst jq (1.6-2.1+deb12u2 Debian:12.15/oldstable [amd64])
Conf libonig5 (6.9.8-1 Debian:12.15/oldstable [amd64])
Conf libjq1 (1.6-2.1+deb12u2 Debian:12.15/oldstable [amd64])
Conf jq (1.6-2.1+deb12u2 Debian:12.15/oldstable [amd64])
"""
URIS = """\
'http://deb.debian.org/debian/pool/main/j/jq/jq_1.6-2.1%2bdeb12u2_amd64.deb' jq_1.6-2.1+deb12u2_amd64.deb 63984 \
SHA256:f2303584378ac85f6d3a9ae8e46412196061681e81610d3b020abe4b5d389eb0
'http://deb.debian.org/debian/pool/main/j/jq/libjq1_1.6-2.1%2bdeb12u2_amd64.deb' libjq1_1.6-2.1+deb12u2_amd64.deb \
135656 SHA256:f501b6349a3c2462af59e7a598ebd71e7889de46c9ddf852eb12ebeba7df21a2
'http://deb.debian.org/debian/pool/main/libo/libonig/libonig5_6.9.8-1_amd64.deb' libonig5_6.9.8-1_amd64.deb 187828 \
SHA256:59ecfce6d88c7c4b09496ce182b3b8303e8e8477664e009b16ae83a09cd12be7
"""
CELL = "cu124-torch2.5.1-py3.11-tf4.48.2"


def pins() -> tuple[debs.DebPin, ...]:
    return debs.parse_resolution(SIMULATION, URIS)


def test_apts_answer_becomes_exact_pins_with_their_hashes():
    got = pins()
    assert [(p.name, p.version, p.arch, p.size) for p in got] == [
        ("jq", "1.6-2.1+deb12u2", "amd64", 63984),
        ("libjq1", "1.6-2.1+deb12u2", "amd64", 135656),
        ("libonig5", "6.9.8-1", "amd64", 187828),
    ]
    assert got[0].sha256.startswith("f2303584") and got[0].filename == got[0].sha256 + ".deb"
    assert got[0].url.endswith("/jq_1.6-2.1%2bdeb12u2_amd64.deb")
    # the script's own output splits at its marker into the two texts
    assert debs.split_output(SIMULATION + "#--- uris ---\n" + URIS) == (SIMULATION, "\n" + URIS)


def test_an_upgrade_and_an_epoch_are_pinned_as_dpkg_names_them():
    sim = "Inst libc6 [2.36-9] (1:2.36-9+deb12u9 Debian:12.15/oldstable [arm64])\n"
    uri = (
        "'http://deb.debian.org/debian/pool/main/g/glibc/libc6_2.36-9%2bdeb12u9_arm64.deb' "
        f"libc6_2.36-9+deb12u9_arm64.deb 2757000 SHA256:{'ab' * 32}\n"
    )
    (pin,) = debs.parse_resolution(sim, uri)
    assert (pin.name, pin.version, pin.arch) == ("libc6", "1:2.36-9+deb12u9", "arm64")


@pytest.mark.parametrize(
    ("sim", "uris", "says"),
    [
        ("Inst Evil (1.0 x [amd64])\n", "", "name rules"),
        ("Inst jq (1.0;rm x [amd64])\n", "", "version rules"),
        (SIMULATION, URIS.replace(" jq_1.6", " jq_6.6", 1), "no download"),  # a file of another name
        (SIMULATION, URIS.replace("http://deb.debian.org", "http://user:pw@deb.debian.org", 1), "plain http"),
        (SIMULATION, URIS.replace("http://deb", "file:///etc/passwd?", 1), "plain http"),
        (SIMULATION, URIS.replace("_amd64.deb'", "_amd64.deb?x=1'", 1), "query"),
        (SIMULATION, URIS.replace("/jq_1.6-2.1%2bdeb12u2_amd64.deb'", "/other_1.0_amd64.deb'", 1), "does not name"),
        (SIMULATION, URIS.replace("SHA256:f2303584", "SHA256:F2303584", 1), "no download"),  # not hex as apt writes
        ("".join(f"Inst p{i:04d} (1.0 x [amd64])\n" for i in range(debs.MAX_PACKAGES + 1)), "", "more than"),
    ],
)
def test_a_hostile_or_broken_answer_is_refused(sim, uris, says):
    with pytest.raises(UntrustedData, match=says):
        debs.parse_resolution(sim, uris)


def test_the_pins_round_trip_through_a_lock_and_change_its_hash_only_when_present():
    lock = read_lock(ROOT / "lockfiles" / f"{CELL}.txt")
    text = lock.render()
    assert lockfile.APT_MARK not in text  # a lock without apt packages is what it was before the key existed
    with_apt = replace(lock, apt=pins())
    rendered = with_apt.render()
    assert lockfile.APT_MARK in rendered and rendered.count("\n# apt: ") == 3
    again = lockfile.parse(rendered)
    assert again.apt == pins() and again.content_hash == with_apt.content_hash != lock.content_hash
    assert again.pins() == lock.pins()  # pip reads the pins as comments: the Python side is untouched
    assert lockfile.integrity_problems(again, rendered) == []
    twice = replace(lock, apt=(*pins(), pins()[0]))
    assert any("jq:amd64 is pinned twice" in p for p in lockfile.integrity_problems(twice, twice.render()))


@pytest.mark.parametrize(
    "edit",
    [
        lambda line: line.replace("sha256:", "sha1:"),
        lambda line: line.replace("http://", "ftp://"),
        lambda line: line.replace(" amd64 ", " AMD64 "),
        lambda line: line + " extra",
    ],
)
def test_an_edited_pin_line_is_refused_with_the_fix(edit):
    rendered = replace(read_lock(ROOT / "lockfiles" / f"{CELL}.txt"), apt=pins()).render()
    line = next(x for x in rendered.splitlines() if x.startswith("# apt: jq="))
    with pytest.raises(UsageError) as err:
        lockfile.parse(rendered.replace(line, edit(line)), "locks/x.txt")
    assert "locks/x.txt:" in err.value.message and "imagekit lock" in err.value.hint


def _matrix(apt: object) -> dict:
    return {
        "matrix": {"cuda": ["12.4"], "torch": ["2.5.1"], "transformers": ["4.48.2"], "python": ["3.11"]},
        "image": {"apt": apt},
    }


def test_the_matrix_key_names_packages_every_cell_carries():
    data = inputs.compat_data()
    config = matrix.parse(_matrix(["jq", "git-lfs", "jq"]), "m", data)
    assert config.options.apt == ("git-lfs", "jq") and [c.apt for c in config.cells] == [("git-lfs", "jq")]
    assert config.cells[0].to_json()["apt"] == ["git-lfs", "jq"]
    assert "apt" not in Cell("12.4", "2.5.1", "4.48.2", "3.11").to_json()  # existing locks stay fresh


@pytest.mark.parametrize(
    ("value", "says"),
    [("jq", "git-lfs"), (["jq;rm -rf /"], "not a Debian package name"), (["Jq"], "not a Debian"), (["x"] * 201, "")],
)
def test_a_bad_apt_list_is_a_config_error_with_an_example(value, says):
    with pytest.raises(ConfigError) as err:
        matrix.parse(_matrix(value), "m", inputs.compat_data())
    text = "\n".join(err.value.problems)
    assert "image.apt" in text and says in text and 'apt = ["git-lfs", "ffmpeg"]' in text


def test_a_cell_with_apt_packages_is_not_locked_without_its_base(tmp_path):
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11", apt=("jq",))
    res = lock_cells.lock_one(cell, tmp_path, lock_cells.resolution.LockSettings(), inputs.compat_data())
    assert res.status == "failed" and isinstance(res.error, UsageError) and "Docker" in res.error.hint
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("builder", ["legacy", "buildkit"])
def test_the_packages_are_one_layer_below_the_app_installed_from_their_hashed_list(builder):
    lock = replace(read_lock(ROOT / "lockfiles" / f"{CELL}.txt"), apt=pins())
    split = layers.split(lock)
    assert split.apt is not None and split.apt.requirements.splitlines()[0] == (
        f"{pins()[0].sha256}.deb jq=1.6-2.1+deb12u2 amd64"
    )
    assert split.requirement_files["requirements-apt.txt"] == split.apt.requirements
    assert [x["name"] for x in split.to_json()["layers"]][-1] == "apt"
    digest = "sha256:" + "cd" * 32
    base = BaseRef("python", f"r.example.com/py@{digest}", digest, "3.11", "2.36", "/usr/bin/python3.11", registry=True)
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11", apt=("jq",))
    options = ImageOptions(builder=builder)
    plan = BuildPlan.make(cell, lock, base, "r.example.com/x", inputs.compat_data(), options=options)
    files = render.render_plan(plan)
    text = files["Dockerfile"][0].decode()
    step = f"--debs {'/mnt' if builder == 'buildkit' else 'http'}"
    assert step in text and f"requirements-apt.txt#sha256={split.apt.requirements_sha256}" in text
    assert text.index("--debs") < text.index("requirements-app.txt")  # below the app layer: it changes less often
    manifest = json.loads(files["rootfs/app/opt/imagekit/manifest.json"][0])
    assert manifest["apt"] == {
        "requested": ["jq"],
        "packages": {p.name: {"version": p.version, "arch": p.arch} for p in pins()},
    }


STATUS = """\
Package: jq
Status: install ok installed
Architecture: amd64
Version: 1.6-2.1+deb12u2
Description: lightweight and flexible command-line JSON processor
 jq is like sed for JSON data

Package: libjq1
Status: deinstall ok config-files
Architecture: amd64
Version: 1.6-2.1+deb12u2

Package: libonig5
Status: install ok installed
Architecture: amd64
Version: 6.9.7-1
"""


def test_dpkg_status_against_the_pins_names_what_is_missing_or_different():
    have = facts.dpkg_installed(STATUS)
    assert have == {"jq:amd64": "1.6-2.1+deb12u2", "libonig5:amd64": "6.9.7-1"}
    want = {p.name: {"version": p.version, "arch": p.arch} for p in pins()}
    assert facts.apt_drift(want, have) == {"missing": ["libjq1"], "different": ["libonig5 6.9.7-1 (pinned 6.9.8-1)"]}
    assert facts.apt_drift({"jq": want["jq"]}, have) == {"missing": [], "different": []}


def test_the_self_test_and_the_doctor_fail_on_drift_and_pass_on_the_pins(tmp_path, monkeypatch):
    status = tmp_path / "status"
    status.write_text(STATUS)
    monkeypatch.setattr(facts, "DPKG_STATUS", str(status))
    want = {p.name: {"version": p.version, "arch": p.arch} for p in pins()}
    manifest = {"apt": {"requested": ["jq"], "packages": want}}
    st, dr = selftest.check_apt(manifest), imagekit_doctor.check_apt(manifest)
    assert st["status"] == dr["status"] == "fail"
    assert "missing: libjq1" in st["message"] and "libonig5 6.9.7-1 (pinned 6.9.8-1)" in dr["message"]
    ok = {"apt": {"requested": ["jq"], "packages": {"jq": want["jq"]}}}
    assert selftest.check_apt(ok)["status"] == imagekit_doctor.check_apt(ok)["status"] == "pass"
    assert selftest.check_apt({})["status"] == "skip"
    monkeypatch.setattr(facts, "DPKG_STATUS", str(tmp_path / "absent"))
    assert imagekit_doctor.check_apt(manifest)["status"] == "fail"


@pytest.mark.programs
@pytest.mark.parametrize(
    "line",
    [
        "../../etc/passwd jq=1.0 amd64",
        f"{'ab' * 32}.deb jq=1.0 amd64 extra",
        f"{'ab' * 32}.deb jq=1.0;id amd64",
        f"{'AB' * 32}.deb jq=1.0 amd64",
    ],
)
def test_the_images_installer_refuses_a_list_line_it_did_not_render(line):
    code = "import sys; from imagekit.in_image import install_layer as i; i.read_deb_list(sys.argv[1].encode())"
    res = subprocess.run([sys.executable, "-c", code, line], capture_output=True, text=True)
    assert res.returncode == 2 and "not a package line" in res.stderr and "hint: render again" in res.stderr
