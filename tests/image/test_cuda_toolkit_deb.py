"""`[image] cuda_toolkit = true` for CUDA 11.8 (bookworm) and 12.4 (trixie) cells: Debian's nvidia-cuda-toolkit
from non-free, a rule over cited facts, resolved by apt with the driver stub, locked .deb by .deb, rendered in the
apt layer with CUDA_HOME=/usr. The apt answer is what the bookworm base's apt printed for the real archive."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import tarfile
import zlib

import pytest

from imagekit.compat.compiler_debs import CompilerDeb
from imagekit.errors import CheckFailed, ConfigError, UsageError
from imagekit.image import cuda_toolkit, imageconfig, render
from imagekit.image.buildplan import BaseRef, BuildPlan, manifest
from imagekit.image.image_options import ImageOptions
from imagekit.locking import debs, driver_stub
from imagekit.locking.lockfile import parse as parse_lock
from imagekit.matrix import matrix_file as matrix
from imagekit.model import Cell
from imagekit.services.locks.lock_cells import read_lock
from imagekit.services.wheels import fetch
from tests.conftest import ROOT

ANSWER = ROOT / "tests" / "fixtures" / "cuda-toolkit-deb" / "bookworm-apt-answer.txt"
AXES118 = {"cuda": ["11.8"], "torch": ["2.5.1"], "transformers": ["4.48.2"], "python": ["3.11"]}
AXES124 = {"cuda": ["12.4"], "torch": ["2.6.0"], "transformers": ["4.48.2"], "python": ["3.13"]}


# ---- the facts and the rule -----------------------------------------------------------------------------------
def test_the_facts_name_debians_package_each_with_its_source_and_the_stub_covers_their_driver(data):
    rows = {(d.cuda, d.base): d for d in data.compiler_debs}
    assert set(rows) == {("11.8", "debian-bookworm"), ("12.4", "debian-trixie")}
    assert rows["11.8", "debian-bookworm"].version == "11.8.89~11.8.0-5~deb12u1"
    assert rows["12.4", "debian-trixie"].version == "12.4.131~12.4.1-2"
    assert rows["11.8", "debian-bookworm"].host_compiler == "g++-11"
    assert rows["12.4", "debian-trixie"].host_compiler == "g++-13"
    for d in rows.values():
        assert d.package == cuda_toolkit.DEB_PACKAGE and d.component == "non-free"
        assert "deb.debian.org" in d.source and d.version in d.source and d.host_compiler in d.source
        assert int(driver_stub.DRIVER) >= int(d.driver)  # apt takes the stub for the driver each closure asks
        assert f"libcuda-{d.cuda}-1" in driver_stub.CONTROL
        assert data.bases[{"debian-bookworm": "3.11", "debian-trixie": "3.13"}[d.base]].name == d.base


@pytest.mark.parametrize("axes", [AXES118, AXES124])
def test_a_cell_with_debians_toolkit_gets_it_among_its_apt_packages_and_no_compiler_wheels(data, axes):
    config = matrix.parse({"matrix": axes, "image": {"cuda_toolkit": True, "apt": ["git-lfs"]}}, "m.toml", data)
    (cell,) = config.cells
    assert cell.apt == ("git-lfs", "nvidia-cuda-toolkit") and cell.packages == ("ninja",)  # torch's builder runs it


@pytest.mark.parametrize(
    ("axes", "says"),
    [
        ({**AXES118, "python": ["3.13"]}, "CUDA 11.8 on debian-trixie"),  # bookworm's toolkit, trixie's base
        ({**AXES124, "python": ["3.11"]}, "CUDA 12.4 on debian-bookworm"),
        ({**AXES124, "cuda": ["12.6"]}, "CUDA 12.6 on debian-trixie"),
    ],
)
def test_other_cuda_11_and_12_cells_are_refused_at_plan_time(data, axes, says):
    with pytest.raises(ConfigError) as exc:
        matrix.parse({"matrix": axes, "image": {"cuda_toolkit": True}}, "m.toml", data)
    (problem,) = exc.value.problems
    assert says in problem and "no CUDA compiler" in problem
    assert "CUDA 11.8 cells on debian-bookworm" in (exc.value.hint or "")


def test_a_base_of_the_users_own_has_no_known_archive_and_is_refused(data):
    bases = {"3.11": {"reference": f"r.example.com/py@sha256:{'a' * 64}", "glibc": "2.36"}}
    with pytest.raises(ConfigError, match=r"CUDA 11\.8 on its base"):
        matrix.parse({"matrix": AXES118, "image": {"cuda_toolkit": True}, "bases": bases}, "m.toml", data)


def test_the_rule_reads_the_facts_it_is_given(data):
    """The rule is the table: a row for another (CUDA, base) admits that cell, and no row refuses it."""
    cell = Cell("12.6", "2.6.0", "4.48.2", "3.13")
    assert cuda_toolkit.problem(cell, data, "debian-trixie")
    row = CompilerDeb("12.6", "debian-trixie", "nvidia-cuda-toolkit", "12.6.0-1", "non-free", "g++-13", "560", "S")
    more = dataclasses.replace(data, compiler_debs=(*data.compiler_debs, row))
    assert cuda_toolkit.problem(cell, more, "debian-trixie") is None
    assert cuda_toolkit.problem(Cell("11.8", "2.5.1", "4.48.2", "3.11", platform="linux/arm64"), data,
                                "debian-bookworm")  # fmt: skip
    assert cuda_toolkit.home("/opt/cuda-libs", "11.8") == "/usr" and cuda_toolkit.home("/x", "13.0").endswith("cu13")


# ---- the driver stub ------------------------------------------------------------------------------------------
def _ar(data: bytes) -> dict[str, bytes]:
    assert data.startswith(b"!<arch>\n")
    out, at = {}, 8
    while at < len(data):
        header = data[at : at + 60]
        name, size = header[:16].decode().strip(), int(header[48:58])
        assert header[58:60] == b"`\n"
        out[name] = data[at + 60 : at + 60 + size]
        at += 60 + size + size % 2
    return out


def test_the_stub_is_a_deb_that_provides_the_drivers_names_and_holds_no_file():
    data = driver_stub.deb_bytes()
    members = _ar(data)
    assert list(members) == ["debian-binary", "control.tar.gz", "data.tar.gz"] and members["debian-binary"] == b"2.0\n"
    with tarfile.open(fileobj=io.BytesIO(members["control.tar.gz"])) as tar:
        control = tar.extractfile("./control").read().decode()
    assert "Provides: libcuda.so.1 (= 550)" in control and "libnvidia-ml.so.1 (= 550)" in control
    with tarfile.open(fileobj=io.BytesIO(members["data.tar.gz"])) as tar:
        assert [m.name for m in tar.getmembers()] == ["."]  # no library of the driver's
    assert zlib.decompressobj(31).decompress(members["data.tar.gz"])  # a real gzip stream
    pin = driver_stub.pin()
    assert pin.sha256 == hashlib.sha256(data).hexdigest() and pin.size == len(data)
    assert debs.parse_line(pin.line(), "lock") == pin  # a lock line like any other .deb's


def test_the_resolve_script_adds_non_free_and_installs_the_stub_only_for_the_toolkit():
    plain = debs.resolve_script(("git-lfs",))
    assert "non-free" not in plain and "dpkg -i" not in plain
    script = debs.resolve_script(("nvidia-cuda-toolkit",), non_free=True, preinstalled=driver_stub.deb_bytes())
    assert "main\\)$/\\1 non-free/' /etc/apt/sources.list" in script  # one-line sources
    assert "Components: .*main\\)$/\\1 non-free/" in script  # deb822 sources
    assert script.index("dpkg -i /tmp/pre.deb") < script.index("apt-get update")


# ---- the lock, the plan, the render --------------------------------------------------------------------------
def _answer_pins():
    simulation, uris = debs.split_output(ANSWER.read_text())
    return tuple(sorted((*debs.parse_resolution(simulation, uris), driver_stub.pin())))


def test_apts_real_answer_pins_the_toolkit_its_host_compiler_and_nothing_of_the_driver():
    pins = {p.name: p for p in _answer_pins()}
    assert pins["nvidia-cuda-toolkit"].version == "11.8.89~11.8.0-5~deb12u1"
    assert "g++-11" in pins and "nvidia-cuda-dev" in pins and "libcudart11.0" in pins
    assert not {"libcuda1", "libnvidia-ml1", "nvidia-alternative"} & set(pins)  # the stub stood in for them
    assert all(p.url.startswith("http://deb.debian.org/debian/pool/non-free/") or p.name in pins
               for p in pins.values())  # fmt: skip
    assert pins[driver_stub.NAME] == driver_stub.pin()
    assert all(len(p.sha256) == 64 for p in pins.values())


def _plan(data, lock_name: str, cell: Cell, python: str, base: str):
    lock = read_lock(ROOT / "lockfiles" / lock_name)
    lock = dataclasses.replace(lock, apt=_answer_pins())
    ref = BaseRef(base, "imagekit/base:x", None, python, "2.36", compiler=True)
    return BuildPlan.make(cell, lock, ref, "r/x", data, options=ImageOptions(cuda_toolkit=True, builder="buildkit"))


def test_the_plan_renders_the_toolkit_in_the_apt_layer_with_cuda_home_usr(data):
    """The bookworm answer over a cu118 cell (its torch lock stands in: the PyTorch index is not reachable here)."""
    cell = Cell("11.8", "2.5.1", "4.48.2", "3.11", ("ninja",), apt=("nvidia-cuda-toolkit",))
    with pytest.raises(UsageError, match=r"CUDA 11\.8 on debian-trixie"):  # the plan's own check of the rule
        _plan(data, "cu124-torch2.5.1-py3.11-tf4.48.2.txt", cell, "3.11", "debian-trixie")
    plan = _plan(data, "cu124-torch2.5.1-py3.11-tf4.48.2.txt", cell, "3.11", "debian-bookworm")
    files = render.render_plan(plan)
    dockerfile = files["Dockerfile"][0].decode()
    assert "Layer: Debian packages ([image] apt: 51 .debs for nvidia-cuda-toolkit)" in dockerfile
    assert "--debs /mnt/requirements-apt.txt#sha256=" in dockerfile
    assert 'CUDA_HOME="/usr"' in dockerfile
    assert 'PATH="/opt/venv/bin:/usr/local/sbin:' in dockerfile  # /usr/bin is on PATH already: not twice
    assert not any(path.endswith("libcudart.so") for path in files)  # Debian's own libcudart.so links
    listed = plan.layering.requirement_files["requirements-apt.txt"]
    assert f"{driver_stub.pin().sha256}.deb {driver_stub.NAME}=1 all\n" in listed
    assert "nvidia-cuda-toolkit=11.8.89~11.8.0-5~deb12u1 amd64" in listed
    assert "CUDA compiler (nvidia-cuda-toolkit)" in plan.layering.apt.title
    facts = manifest(plan)
    assert facts["cuda_toolkit"] == {
        "home": "/usr",
        "nvcc": "11.8.89~11.8.0-5~deb12u1",
        "package": "nvidia-cuda-toolkit",
    }
    assert "nvidia-cuda-toolkit" in facts["apt"]["packages"]
    assert imageconfig.cuda_home(facts) == "/usr"


def test_a_plan_refuses_a_lock_without_the_toolkits_deb(data):
    lock = read_lock(ROOT / "lockfiles" / "cu124-torch2.5.1-py3.11-tf4.48.2.txt")
    ref = BaseRef("debian-trixie", "imagekit/base:x", None, "3.11", "2.41", compiler=True)
    with pytest.raises(UsageError, match="lock has no nvidia-cuda-toolkit"):
        BuildPlan.make(Cell("12.4", "2.5.1", "4.48.2", "3.11"), lock, ref, "r/x", data,
                       options=ImageOptions(cuda_toolkit=True))  # fmt: skip


def test_the_lock_round_trips_the_pins_and_fetch_writes_the_stub_by_its_hash(tmp_path, monkeypatch):
    lock = read_lock(ROOT / "lockfiles" / "cu124-torch2.5.1-py3.11-tf4.48.2.txt")
    text = dataclasses.replace(lock, apt=(driver_stub.pin(),)).render()
    again = parse_lock(text, "lock")
    assert again.apt == (driver_stub.pin(),)
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path))
    (got,) = fetch.fetch_debs(again)
    assert got.path.read_bytes() == driver_stub.deb_bytes() and got.path.name == f"{driver_stub.pin().sha256}.deb"
    forged = dataclasses.replace(driver_stub.pin(), sha256="0" * 64)
    with pytest.raises(CheckFailed, match="not the driver stub"):
        fetch.fetch_debs(dataclasses.replace(again, apt=(forged,)))


def test_the_dry_run_names_debians_compiler_and_what_it_downloads():
    from imagekit.services.builds import forecast as fc

    row = fc.CellForecast(
        "cu118-x", "up-to-date", "l.txt", None, fc.BaseForecast("b", "reuse", 1, 0), None, None,
        compiler_debs=(51, 1_610_478_996),
    )  # fmt: skip
    (line,) = fc.render_text(fc.Forecast((row,), ()))
    assert "CUDA compiler: Debian's nvidia-cuda-toolkit, 51 .debs in the apt layer (1.61 GB to download)" in line
    assert row.to_json()["cuda_compiler_debs"] == {"count": 51, "download_bytes": 1_610_478_996}


def test_explain_says_which_compiler_a_cell_would_get_with_its_source(data):
    bookworm = cuda_toolkit.describe("11.8", "3.11", data)
    assert "Debian's nvidia-cuda-toolkit 11.8.89~11.8.0-5~deb12u1 (non-free) on debian-bookworm" in bookworm
    assert "g++-11" in bookworm and "CUDA_HOME=/usr" in bookworm and "dists/bookworm/non-free" in bookworm
    assert "12.4.131" in cuda_toolkit.describe("12.4", "3.13", data)
    refused = cuda_toolkit.describe("12.4", "3.11", data)
    assert refused.startswith("none for CUDA 12.4 on debian-bookworm: the option is refused")
    assert "NVIDIA's wheels" in cuda_toolkit.describe("13.0", "3.13", data)
