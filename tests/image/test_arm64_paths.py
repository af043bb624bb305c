"""What a linux/arm64 image is made of, decided before any effect runs: its base bootstrap (Debian's arm64 archive,
Ubuntu's ports), the host's emulation, the wheels and uv it installs, its Dockerfile and tags, the image index its
alias becomes, and how its emulated self-test is reported (never "on a GPU")."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from imagekit.clouds import readme
from imagekit.effects.registry import Remote
from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.image import naming
from imagekit.image.buildplan import bootstrap_base, bootstrap_key
from imagekit.locking import uv_pin as tools
from imagekit.locking import wheel_choice as wheels
from imagekit.model import AMD64, ARM64, Cell
from imagekit.oci import image_index, media_types
from imagekit.services.builds import selftest_runner
from imagekit.services.builds.base_images import KEYRINGS, bootstrap_argv, emulation_problem, native
from imagekit.services.builds.selftest_runner import SelfTestReport
from imagekit.services.locks.lock_cells import read_lock
from imagekit.services.publishing import publish
from imagekit.services.wheels import wheel_index
from imagekit.trust import untrusted
from tests.conftest import ROOT
from tests.fakes import RecordingEngine, RecordingRegistry

FIXTURE = ROOT / "tests" / "fixtures" / "lockfiles-arm64"
CELL = Cell("13.2", "2.15.0", "5.24.0", "3.13", ("accelerate==1.12.0",))
ARM = Cell("13.2", "2.15.0", "5.24.0", "3.13", ("accelerate==1.12.0",), platform=ARM64)
ALL = frozenset(path for path, _, _ in KEYRINGS.values())


# ---- the base --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("python", ["3.11", "3.13", "3.10", "3.12"])
def test_an_arm64_base_is_bootstrapped_from_its_archive_and_named_apart(data, python):
    spec = data.bases[python]
    argv = bootstrap_argv(spec, 1, Path("/t.tar"), True, euid=0, sudo=False, keyrings=ALL, platform=ARM64)
    assert "--architectures=arm64" in argv
    mirror = "http://ports.ubuntu.com/ubuntu-ports" if spec.vendor == "ubuntu" else spec.mirror  # Ubuntu's ports
    assert argv[-1] == mirror
    amd = bootstrap_argv(spec, 1, Path("/t.tar"), True, euid=0, sudo=False, keyrings=ALL)
    assert not any(a.startswith("--architectures") for a in amd) and amd[-1] == spec.mirror
    arm_ref, amd_ref = bootstrap_base(spec, platform=ARM64), bootstrap_base(spec)
    assert arm_ref.reference != amd_ref.reference and arm_ref.name.endswith("-arm64") and arm_ref.platform == ARM64
    assert bootstrap_key(spec, 1) != bootstrap_key(spec, 1, platform=ARM64)


def test_an_amd64_bases_tag_names_its_inputs_and_no_platform(data):
    """Its tag names its inputs (packages, date, dpkg's path filters): the same inputs keep the same tag."""
    import hashlib

    from imagekit.image.buildplan import base_packages, dpkg_path_filters

    spec = data.bases["3.11"]
    text = f"debian|bookworm|{spec.mirror}|{','.join(base_packages(True))}|1735689600|no-host-keys"
    text += "|slim:" + hashlib.sha256("\n".join(dpkg_path_filters()).encode()).hexdigest()[:12]
    assert bootstrap_key(spec, 1735689600) == hashlib.sha256(text.encode()).hexdigest()[:12]


def _binfmt(tmp_path: Path, text: str | None) -> Path:
    if text is not None:
        (tmp_path / "qemu-aarch64").write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (None, "binfmt_misc has no qemu-aarch64 entry"),
        ("disabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\n", "is disabled"),
        ("enabled\ninterpreter /usr/bin/qemu-aarch64\nflags: P\n", "lacks the F flag"),
        ("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\n", None),
    ],
)
def test_an_amd64_host_runs_arm64_programs_only_through_a_usable_qemu_entry(tmp_path, entry, says):
    problem = emulation_problem(ARM64, "x86_64", _binfmt(tmp_path, entry))
    assert (problem is None) if says is None else (says in problem)
    assert emulation_problem(AMD64, "x86_64", tmp_path) is None  # its own architecture needs nothing
    assert native(ARM64, "aarch64") and native(ARM64, "arm64") and not native(ARM64, "x86_64")


# ---- wheels, uv, Dockerfile, tags ---------------------------------------------------------------------------------
def test_aarch64_wheel_tags_are_aarch64s_own():
    tags = [str(t) for t in wheels.supported_tags("3.13", "2.28", "aarch64")]
    assert "cp313-cp313-manylinux_2_28_aarch64" in tags and "cp313-cp313-manylinux2014_aarch64" in tags
    assert "py3-none-manylinux_2_17_aarch64" in tags
    assert not any("x86_64" in t or "manylinux1" in t or "manylinux2010" in t or "_2_16_" in t for t in tags)
    x86 = [str(t) for t in wheels.supported_tags("3.13", "2.28")]
    assert "cp313-cp313-manylinux1_x86_64" in x86 and not any("aarch64" in t for t in x86)


def test_a_lock_for_aarch64_fetches_aarch64_wheels_and_uv():
    lock = read_lock(FIXTURE / "linux-arm64" / f"{CELL.id}.txt")
    assert wheel_index.lock_machine(lock) == "aarch64"
    assert wheel_index.lock_machine(read_lock(FIXTURE / f"{CELL.id}.txt")) == "x86_64"
    assert tools.uv_for("aarch64").filename.endswith("aarch64.whl") and tools.uv_for("x86_64") is tools.UV
    assert tools.uv_for("aarch64").version == tools.UV.version  # the same installer release on both


@pytest.mark.seconds
def test_render_makes_both_platforms_each_in_its_folder(app, runner, tmp_path):
    (tmp_path / "m.toml").write_text(
        '[matrix]\nplatforms = ["linux/amd64", "linux/arm64"]\n\n[[matrix.include]]\ncuda = "13.2"\ntorch = "2.15.0"\n'
        'transformers = "5.24.0"\npython = "3.13"\npackages = ["accelerate==1.12.0"]\n'
    )
    lock_dir = tmp_path / "lockfiles"
    shutil.copytree(FIXTURE, lock_dir)
    res = runner.invoke(
        app, ["render", "--matrix", str(tmp_path / "m.toml"), "--lock-dir", str(lock_dir), "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 0, res.output
    arm = (tmp_path / "o" / f"{CELL.id}-arm64" / "Dockerfile").read_text()
    amd = (tmp_path / "o" / CELL.id / "Dockerfile").read_text()
    assert "# Platform: linux/arm64" in arm and tools.UV_AARCH64.ref in arm and tools.UV.ref not in arm
    assert "FROM imagekit/base:debian-trixie-arm64-" in arm
    assert "Platform:" not in amd and tools.UV.ref in amd and "FROM imagekit/base:debian-trixie-" in amd
    assert "arm64" not in amd


def test_each_platform_has_its_own_immutable_tag_and_cache_anchor():
    assert naming.immutable_tag("r/t", CELL, "a" * 64) == f"r/t:{CELL.id}-aaaaaaaaaaaa"
    assert naming.immutable_tag("r/t", ARM, "a" * 64) == f"r/t:{CELL.id}-arm64-aaaaaaaaaaaa"
    assert naming.alias_tag("r/t", ARM) == naming.alias_tag("r/t", CELL) == f"r/t:{CELL.id}"
    assert naming.build_cache_tag(ARM) != naming.build_cache_tag(CELL)
    assert ARM.slug == f"{CELL.id}-arm64" and CELL.slug == CELL.id


# ---- the image index -------------------------------------------------------------------------------------------
D1, D2, D3 = (f"sha256:{c * 64}" for c in "123")
V2 = media_types.DOCKER_MANIFEST


def test_an_index_is_deterministic_and_a_platform_replaced_keeps_the_others():
    amd, arm = image_index.Entry(AMD64, D1, 500, V2), image_index.Entry(ARM64, D2, 600, V2)
    doc = image_index.document([arm, amd])
    assert doc == image_index.document([amd, arm])
    parsed = image_index.entries_of(json.loads(doc))
    assert parsed == [amd, arm]
    newer = image_index.Entry(AMD64, D3, 700, V2)
    assert image_index.merged(parsed, newer) == [newer, arm]
    assert json.loads(doc)["manifests"][1]["platform"] == {"architecture": "arm64", "os": "linux"}


def _entry(arch="arm64", os_="linux", digest=D1, size=500, media=V2):
    return {"mediaType": media, "digest": digest, "size": size, "platform": {"architecture": arch, "os": os_}}


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ([], "does not name an image index"),
        ({"mediaType": "text/html", "manifests": []}, "does not name an image index"),
        ({"manifests": "x"}, "lists 0 to 16 manifests"),
        ({"manifests": [_entry()] * 17}, "lists 0 to 16 manifests"),
        ({"manifests": [{"digest": D1}]}, "has no platform"),
        ({"manifests": [_entry(), _entry(digest=D2)]}, "lists linux/arm64 twice"),
        ({"manifests": [_entry(digest="sha256:../../x")]}, "is not a sha256 digest"),
    ],
)
def test_a_hostile_index_is_refused_with_what_is_wrong(doc, says):
    with pytest.raises(untrusted.UntrustedData, match=says):
        image_index.entries_of(doc)


def test_attestations_and_foreign_platforms_are_left_out_not_kept_or_fatal():
    doc = {
        "manifests": [
            _entry(arch="unknown", os_="unknown", digest=D2),  # a BuildKit attestation
            _entry(arch="s390x", digest=D3),
            _entry(arch="amd64", size=10**9),  # no manifest is a gigabyte
            _entry(arch="arm64", media="application/vnd.in-toto+json"),
            _entry(),
        ]
    }
    assert image_index.entries_of(doc) == [image_index.Entry(ARM64, D1, 500, V2)]


def _published(engine, registry, image: str, tag: str, platform: str):
    report = SelfTestReport(image, True, {"passed": True, "failed": [], "checks": []})
    return publish.publish(
        engine, registry, image_id=image, repository="127.0.0.1:5000/t", immutable_tag=tag, alias_tag="cell",
        report=report, platform=platform,
    )  # fmt: skip


def _image(engine, arch: str, layer: str) -> str:
    """An image the fake engine holds with its config bytes (what a push uploads), of one layer."""
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [engine._layer(layer)]},
    }
    return engine.load_config(json.dumps(config).encode(), [])


def test_the_alias_is_the_image_for_amd64_alone_and_an_index_once_arm64_joins():
    engine = RecordingEngine()
    registry = RecordingRegistry(engine.calls)
    engine.registry = registry
    remote = Remote.parse("127.0.0.1:5000/t")
    first = _published(engine, registry, _image(engine, "amd64", "one"), "cell-1", AMD64)
    assert first.index_digest is None and ("registry.copy_tag", "cell") in engine.calls
    second = _published(engine, registry, _image(engine, "arm64", "two"), "cell-arm64-1", ARM64)
    doc = registry.manifests[(remote.name, "cell")]
    assert second.index_digest and [m["platform"]["architecture"] for m in doc["manifests"]] == ["amd64", "arm64"]
    assert [m["digest"] for m in doc["manifests"]] == [first.digest, second.digest]


def test_an_alias_the_registry_garbled_is_refused_not_overwritten():
    engine = RecordingEngine()
    registry = RecordingRegistry(engine.calls)
    engine.registry = registry
    remote = Remote.parse("127.0.0.1:5000/t")
    registry.manifests[(remote.name, "cell")] = {"mediaType": media_types.DOCKER_MANIFEST_LIST, "manifests": "garbage"}
    with pytest.raises(EnvironmentFailure, match="not an image or index imagekit can extend") as exc:
        _published(engine, registry, _image(engine, "arm64", "two"), "cell-arm64-1", ARM64)
    assert "delete the tag by hand" in exc.value.hint
    assert registry.manifests[(remote.name, "cell")]["manifests"] == "garbage"


# ---- the emulated self-test -----------------------------------------------------------------------------------------
def test_an_emulated_self_test_cannot_be_asked_to_prove_a_gpu():
    with pytest.raises(CheckFailed, match="runs emulated, with no GPU") as exc:
        selftest_runner.run(RecordingEngine(), "img", gpus=False, require_gpu=True, emulated=True)
    assert "--arm64-runner" in exc.value.hint


@pytest.mark.parametrize(
    ("ran", "says", "never"),
    [
        ({"emulated": True, "gpu": False}, "Tested: emulated only", "on a GPU,"),
        ({"emulated": False, "gpu": True}, "passed on a GPU", "emulated"),
        ({"emulated": False, "gpu": False}, "CPU checks passed (the build host had no GPU)", "passed on a GPU"),
    ],
)
def test_the_templates_readme_says_how_the_self_test_ran(ran, says, never):
    entry = {"manifest": {"runtime": {"platform": ARM64}}, "selftest": {"ran": ran}}
    line = " ".join(readme.tested_line(entry))
    assert says in line and never not in line
    assert readme.tested_line({"manifest": {}, "selftest": {"passed": True}}) == []  # an older record says nothing


def test_vasts_template_says_emulated_where_it_says_self_tested():
    from imagekit.clouds import vast

    entry = {"selftest": {"ran": {"emulated": True, "gpu": False}}}
    assert vast._emulated(entry) == " (emulated only)" and vast._emulated({"selftest": {"passed": True}}) == ""
    entry |= {"manifest": {"cell": {"id": CELL.id, "cuda": "13.2"}, "runtime": {"platform": ARM64}},
              "tag": f"r/t:{CELL.id}-arm64-aaaaaaaaaaaa", "digest": D1}  # fmt: skip
    text = vast.readme(entry, "ssh")
    assert "Tested: emulated only" in text and "nothing has run on a linux/arm64 GPU yet" in text


# ---- renting: the platform's image on the platform's hosts -------------------------------------------------------
def _two_platform_index(tmp_path: Path) -> Path:
    images = {}
    for platform, slug, digest in ((AMD64, CELL.id, D1), (ARM64, f"{CELL.id}-arm64", D2)):
        cell = {**CELL.to_json(), **({"platform": platform} if platform != AMD64 else {})}
        runtime = {"driver_min": "580.65.06", "cuda": "13.2", "cuda_major": 13, "platform": platform,
                   "sass": ["sm_80", "sm_90", "sm_100", "sm_120"], "ptx": None, "glibc_min": "2.28"}  # fmt: skip
        tag = f"127.0.0.1:5000/t:{slug}-aaaaaaaaaaaa"
        images[tag] = {
            "tag": tag, "alias": f"127.0.0.1:5000/t:{CELL.id}", "digest": digest, "size_bytes": 6_500_000_000,
            "lock_hash": "b" * 64, "published_at": "2026-12-03T06:00:00Z",
            "selftest": {"passed": True, "ran": {"emulated": platform == ARM64, "gpu": False}},
            "manifest": {"cell": cell, "runtime": runtime, "image": {"ports": ["22/tcp"], "jupyter": False}},
        }  # fmt: skip
    path = tmp_path / "index.json"
    path.write_text(json.dumps({"schema": 1, "images": images}))
    return path


@pytest.mark.seconds
def test_a_grace_gpu_rents_the_arm64_image_and_an_x86_gpu_the_amd64_one(app, runner, tmp_path):
    index = _two_platform_index(tmp_path)
    pod = ["pod", "create", CELL.id, "--release-index", str(index), "--dry-run", "--gpu"]
    grace = runner.invoke(app, [*pod, "NVIDIA GH200 480GB"])
    assert grace.exit_code == 0, grace.output
    assert json.loads(grace.stdout)["image"].endswith(f"{CELL.id}-arm64-aaaaaaaaaaaa")
    x86 = runner.invoke(app, [*pod, "NVIDIA H100 80GB HBM3"])
    assert x86.exit_code == 0, x86.output
    assert json.loads(x86.stdout)["image"].endswith(f"{CELL.id}-aaaaaaaaaaaa")
    # the arm64 image, named by its own tag, never goes to an x86_64 host
    arm_tag = f"127.0.0.1:5000/t:{CELL.id}-arm64-aaaaaaaaaaaa"
    wrong = runner.invoke(app, ["pod", "create", arm_tag, "--release-index", str(index), "--dry-run", "--gpu",
                                "NVIDIA GeForce RTX 4090"])  # fmt: skip
    assert wrong.exit_code == 2 and "hosts are x86_64, and this image is linux/arm64" in wrong.output
    assert "GH200" in wrong.output


def test_the_arm64_templates_readme_names_grace_gpus_as_the_ones_it_runs_on(app, runner, tmp_path, data):
    from imagekit.compat import contract

    entry = json.loads(_two_platform_index(tmp_path).read_text())["images"][
        f"127.0.0.1:5000/t:{CELL.id}-arm64-aaaaaaaaaaaa"
    ]
    line = contract.gpu_line(contract.from_record(entry, data), data)
    runs = line.split(";")[0]
    assert "GH200" in runs and "H100" not in runs and "(x86_64 CPUs; this image is linux/arm64)" in line


@pytest.mark.seconds
@pytest.mark.parametrize("command", ["runpod-template", "vast-template"])
def test_a_template_of_a_cell_is_its_amd64_image_unless_the_platform_is_given(app, runner, tmp_path, command):
    index = _two_platform_index(tmp_path)
    amd = runner.invoke(app, [command, CELL.id, "--release-index", str(index)])
    arm = runner.invoke(app, [command, CELL.id, "--release-index", str(index), "--platform", "arm64"])
    assert amd.exit_code == 0 and arm.exit_code == 0, amd.output + arm.output
    assert "-arm64-" not in amd.stdout and f"{CELL.id}-arm64-aaaaaaaaaaaa" in arm.stdout
    assert "emulated only" in arm.stdout and "emulated only" not in amd.stdout
    bad = runner.invoke(app, [command, CELL.id, "--release-index", str(index), "--platform", "s390x"])
    assert bad.exit_code == 2 and "hint:" in bad.output


def test_an_amd64_cell_on_an_arm64_host_is_bootstrapped_for_amd64(data):
    spec = data.bases["3.13"]
    argv = bootstrap_argv(spec, 1, Path("/t.tar"), True, euid=0, sudo=False, keyrings=ALL, host_machine="aarch64")
    assert "--architectures=amd64" in argv and emulation_problem(AMD64, "aarch64", Path("/nonexistent"))


def test_a_dry_run_on_a_host_that_cannot_run_arm64_says_the_build_is_blocked(app, runner, tmp_path, monkeypatch):
    from imagekit.services.builds import base_images

    monkeypatch.setattr(base_images, "BINFMT", tmp_path / "binfmt")  # no qemu-aarch64 registered
    (tmp_path / "m.toml").write_text(
        '[matrix]\nplatforms = ["linux/arm64"]\n\n[[matrix.include]]\ncuda = "13.2"\ntorch = "2.15.0"\n'
        'transformers = "5.24.0"\npython = "3.13"\npackages = ["accelerate==1.12.0"]\n'
    )
    (tmp_path / "locks").mkdir()
    res = runner.invoke(app, ["build", "--matrix", str(tmp_path / "m.toml"), "--lock-dir", str(tmp_path / "locks"),
                              "--dry-run"])  # fmt: skip
    if os.uname().machine == "aarch64":
        assert res.exit_code == 0, res.output  # its own architecture: nothing to emulate
        return
    assert res.exit_code == 1 and "BLOCKED (this x86_64 host cannot run linux/arm64 programs" in res.output
    assert "update-binfmts --enable qemu-aarch64" in res.output


def test_an_emulated_arm64_run_sees_grace_cores_where_torch_reads_its_cpu():
    from imagekit.image import emulation

    files = emulation.arm64_cpu_folder(3)
    assert files["online"] == files["possible"] == "0-2\n" and files["kernel_max"] == "2\n"
    assert files["cpu2/regs/identification/midr_el1"] == "0x00000000410fd4f0\n"  # Arm (0x41), Neoverse V2 (0xd4f)
    assert "cpu3/regs/identification/midr_el1" not in files
    assert emulation.arm64_cpu_folder(1)["online"] == "0\n"


def test_a_platform_the_matrix_does_not_make_is_named_with_the_key_that_adds_it(app, runner, tmp_path):
    (tmp_path / "m.toml").write_text(
        '[matrix]\ncuda = ["13.2"]\ntorch = ["2.15.0"]\ntransformers = ["5.24.0"]\npython = ["3.13"]\n'
    )
    res = runner.invoke(app, ["render", "--matrix", str(tmp_path / "m.toml"), "--platform", "arm64", "--out",
                              str(tmp_path / "o")])  # fmt: skip
    assert res.exit_code == 2 and "the matrix makes no linux/arm64 cells" in res.output
    assert 'platforms = ["linux/amd64", "linux/arm64"]' in res.output and not (tmp_path / "o").exists()
