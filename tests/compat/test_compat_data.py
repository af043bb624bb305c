"""Compatibility data the user can refresh: where `compat refresh` writes, what `inputs.compat_data` reads, the sanity
floor, and unknown-version errors that say which data lacks a release (and so whether refreshing helps).

The refresh runs against a real PEP 691 index on loopback, generated from the shipped metadata plus releases the
shipped data does not know (torch 2.16.0, transformers 9.0.0).
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from packaging.version import Version

from imagekit.compat import catalog as compat
from imagekit.compat import refresh
from imagekit.services import inputs
from tests import loopback
from tests.compat.test_refresh import Index, index_server
from tests.conftest import ROOT

SHIPPED = compat.shipped_metadata()


def cli(*args: str, data_dir: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", "IMAGEKIT_DATA_DIR": str(data_dir)}
    return subprocess.run(
        [sys.executable, "-m", "imagekit", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def _metadata_text(name: str, version: str, rel: dict) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if rel.get("requires_python"):
        lines.append(f"Requires-Python: {rel['requires_python']}")
    lines += [f"Requires-Dist: {dep}{spec}" for dep, spec in sorted(rel.get("requires", {}).items())]
    if rel.get("cuda_runtime"):
        major = rel["cuda_runtime"].split(".")[0]
        lines.append(f"Requires-Dist: nvidia-cuda-runtime-cu{major}=={rel['cuda_runtime']}; sys_platform == 'linux'")
    return "\n".join(lines) + "\n\n"


def _torch_wheel(flags: str | None) -> bytes:
    """A wheel whose libtorch_python.so holds torch's arch flags as the real library does (one C string), padded."""
    import io
    import zipfile

    library = b"\x7fELF" + b"\x00" * 4096 + (b"\x00" + flags.encode() + b"\x00" if flags else b"") + b"\x01" * 4096
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("torch/lib/libtorch_python.so", library)
        z.writestr("torch-0.dist-info/METADATA", "Name: torch\n")
    return out.getvalue()


@contextmanager
def index_of(doc: dict) -> Iterator[tuple[str, type[Index]]]:
    """A PEP 691 index serving, for every release in a metadata document, wheels with PEP 658 metadata; yields its
    URL and its handler class (``seen``: every request's path)."""
    pages: dict[str, dict] = {}
    files: dict[str, bytes] = {}

    def add(name: str, filename: str, meta: str, yanked: bool) -> None:
        files[filename + ".metadata"] = meta.encode()
        entry = {"filename": filename, "url": f"../../files/{filename}", "hashes": {}, "yanked": yanked}
        pages.setdefault(name, {"meta": {"api-version": "1.1"}, "name": name, "files": []})
        pages[name]["files"].append({**entry, "core-metadata": True})

    for version, rel in doc["torch"].items():
        plat = "manylinux_" + rel["glibc"].replace(".", "_") + "_x86_64"
        for py in rel["python"]:
            tag = "cp" + py.replace(".", "")
            name = f"torch-{version}-{tag}-{tag}-{plat}.whl"
            add("torch", name, _metadata_text("torch", version, rel), False)
            files[name] = _torch_wheel(rel.get("archs"))
        if "aarch64_archs" in rel:  # what PyPI's aarch64 build is: CPU-only ('') or a CUDA build for these GPUs
            name = f"torch-{version}-cp311-cp311-manylinux_2_28_aarch64.whl"
            runtime = {"cuda_runtime": rel["aarch64_cuda_runtime"]} if "aarch64_cuda_runtime" in rel else {}
            add("torch", name, _metadata_text("torch", version, {**rel, "cuda_runtime": None, **runtime}), False)
            files[name] = _torch_wheel(rel["aarch64_archs"])
    for name, releases in doc["packages"].items():
        pages.setdefault(name, {"meta": {"api-version": "1.1"}, "name": name, "files": []})
        for version, rel in releases.items():
            add(name, f"{name}-{version}-py3-none-any.whl", _metadata_text(name, version, rel), rel["yanked"])
    handler = type("Handler", (Index,), {"pages": pages, "files": files, "seen": [], "honour_range": True})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    loopback.start(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", handler
    finally:
        loopback.stop(server)


def newer_than_shipped() -> dict:
    doc = copy.deepcopy(SHIPPED)
    doc["torch"]["2.16.0"] = {**doc["torch"]["2.15.0"], "python": ["3.11", "3.12", "3.13"]}
    doc["packages"]["transformers"]["9.0.0"] = {**doc["packages"]["transformers"]["4.48.2"], "yanked": False}
    return doc


# ---- where the user data lives -------------------------------------------------------------------------


def test_user_data_dir_order():
    home = Path("/home/u")
    assert compat.user_data_dir({"IMAGEKIT_DATA_DIR": "/d", "XDG_DATA_HOME": "/x"}, home) == Path("/d")
    assert compat.user_data_dir({"XDG_DATA_HOME": "/x"}, home) == Path("/x/imagekit")
    assert compat.user_data_dir({"XDG_DATA_HOME": "relative"}, home) == home / ".local/share/imagekit"  # XDG: ignored
    assert compat.user_data_dir({"IMAGEKIT_DATA_DIR": ""}, home) == home / ".local/share/imagekit"
    assert compat.user_data_dir({}, None) is None


def test_the_test_session_reads_only_the_shipped_data():
    """conftest points IMAGEKIT_DATA_DIR at an empty folder: a refresh on this machine changes no test."""
    assert compat.user_metadata_path() == Path(os.environ["IMAGEKIT_DATA_DIR"]) / "pypi-metadata.json"
    data = inputs.compat_data()
    assert data.metadata_origin == compat.SHIPPED and data.metadata_path == compat.shipped_path("pypi-metadata.json")


# ---- refresh writes it, load reads it ------------------------------------------------------------------


@pytest.mark.loopback
def test_refresh_writes_the_user_file_and_every_command_reads_it(tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    shipped_file = ROOT / "imagekit" / "data" / "pypi-metadata.json"
    shipped_bytes = shipped_file.read_bytes()
    before = cli("explain", "--transformers", "9.0.0", data_dir=data_dir)
    assert before.returncode == 2 and "compat refresh" in before.stderr  # the shipped data lacks it
    with index_of(newer_than_shipped()) as (index, _):
        res = cli("compat", "refresh", "--index", index, data_dir=data_dir)
        current = cli("compat", "refresh", "--check", "--index-url", index, data_dir=data_dir)
    assert res.returncode == 0, res.stderr
    written = data_dir / "pypi-metadata.json"
    assert f"wrote {written}: torch {len(SHIPPED['torch']) + 1} releases" in res.stderr
    assert shipped_file.read_bytes() == shipped_bytes  # the shipped file is untouched

    monkeypatch.setenv("IMAGEKIT_DATA_DIR", str(data_dir))
    data = inputs.compat_data()
    assert data.metadata_origin == compat.USER and data.metadata_path == str(written)
    assert "2.16.0" in data.torch_releases and "9.0.0" in data.packages["transformers"]
    assert data.torch_releases["2.5.1"] == SHIPPED["torch"]["2.5.1"]  # the same facts, read back from the index
    # what a refresh records is what --check compares: right after one, the data in use (the user file) is current,
    # torch 2.16 included: its PyPI build, glibc, Python window and GPU architectures all came from the index
    assert current.returncode == 0 and f"up to date: {written} (user)" in current.stderr, current.stderr
    assert data.arch_entry("2.16.0", "cu132").source.startswith("WHEEL torch 2.16.0 (linux/amd64, PyPI)")

    after = cli("explain", "--transformers", "9.0.0", "--json", data_dir=data_dir)
    assert after.returncode == 0 and json.loads(after.stdout)["compatible"] is True, after.stderr
    # a torch minor newer than this imagekit: a cell of it is known from what the index says, no new imagekit needed
    newest = cli("explain", "--torch", "2.16", "--cuda", "13.2", data_dir=data_dir)
    assert newest.returncode == 0, newest.stderr
    assert "torch 2.16 -> 2.16.0" in newest.stderr and "compatible: cuda 13.2, torch 2.16.0" in newest.stderr
    show = cli("compat", "show", "--json", data_dir=data_dir)
    doc = json.loads(show.stdout)
    assert doc["metadata"]["origin"] == "user" and doc["metadata"]["path"] == str(written)
    assert doc["metadata"]["newest_torch"] == "2.16.0" and doc["user_file"]["state"] == "in use"
    # refreshed data does not make committed locks stale: their input hash covers the curated data version
    check = cli("lock", "--check", "--source", "pypi", data_dir=data_dir)
    assert check.returncode == 0, check.stderr


@pytest.mark.loopback
def test_refresh_refuses_an_index_knowing_fewer_torch_releases_than_shipped(tmp_path):
    data_dir = tmp_path / "data"
    with index_server(tmp_path) as (index, _):  # two torch releases
        res = cli("compat", "refresh", "--index-url", index, data_dir=data_dir)
    assert res.returncode == 3, res.stderr
    assert f"fewer than the {len(SHIPPED['torch'])} shipped" in res.stderr and "was not written" in res.stderr
    assert res.stderr.count("error:") == 1 and res.stderr.count("hint:") == 1
    assert not (data_dir / "pypi-metadata.json").exists()


@pytest.mark.loopback
def test_refresh_refuses_an_index_that_lost_releases_of_a_package(tmp_path):
    lost = copy.deepcopy(SHIPPED)
    lost["packages"]["peft"] = dict(list(SHIPPED["packages"]["peft"].items())[:3])
    data_dir = tmp_path / "data"
    with index_of(lost) as (index, _):
        res = cli("compat", "refresh", "--index-url", index, data_dir=data_dir)
        export = cli(
            "compat", "refresh", "--index-url", index, "--out", str(tmp_path / "export.json"), data_dir=data_dir
        )
    assert res.returncode == 3, res.stderr
    want = len(SHIPPED["packages"]["peft"])
    assert f"it knows 3 peft releases, fewer than the {want} shipped with imagekit" in res.stderr
    assert "was not written" in res.stderr and res.stderr.count("hint:") == 1
    assert not (data_dir / "pypi-metadata.json").exists()
    assert export.returncode == 0 and "peft 3" in export.stderr  # an export has no floor: it is not read


def test_the_floor_names_each_short_package():
    assert compat.floor_problem(SHIPPED, SHIPPED) is None
    short = copy.deepcopy(SHIPPED)
    short["packages"]["trl"] = {}
    del short["packages"]["xformers"]["0.0.23"]
    have, want = len(short["packages"]["xformers"]), len(SHIPPED["packages"]["xformers"])
    assert compat.floor_problem(short, SHIPPED) == (
        f"it knows 0 trl releases, fewer than the {len(SHIPPED['packages']['trl'])}; "
        f"{have} xformers releases, fewer than the {want} shipped with imagekit"
    )
    newer = newer_than_shipped()
    assert compat.floor_problem(newer, SHIPPED) is None
    del newer["packages"]["torchaudio"]
    assert compat.floor_problem(newer, SHIPPED) == "it has no releases of torchaudio, which the shipped data has"
    fewer_torch = {**SHIPPED, "torch": dict(list(SHIPPED["torch"].items())[1:])}
    assert "torch releases, fewer than the" in (compat.floor_problem(fewer_torch, SHIPPED) or "")


# ---- compat refresh --check: what the index has that the data lacks ------------------------------------


@pytest.mark.loopback
def test_check_names_each_release_the_index_has_and_writes_nothing(tmp_path):
    data_dir = tmp_path / "data"
    shipped_file = ROOT / "imagekit" / "data" / "pypi-metadata.json"
    shipped_bytes = shipped_file.read_bytes()
    with index_of(newer_than_shipped()) as (index, handler):
        res = cli("compat", "refresh", "--check", "--index-url", index, data_dir=data_dir)
        as_json = cli("compat", "refresh", "--check", "--json", "--index-url", index, data_dir=data_dir)
    assert res.returncode == 1, res.stderr
    stale = f"stale: torch 2.16.0, transformers 9.0.0 are on the index and not in the data ({shipped_file}, shipped)"
    assert stale in res.stderr and res.stdout == ""
    assert "hint: run `imagekit compat refresh`" in res.stderr
    assert "`imagekit compat refresh --out imagekit/data/pypi-metadata.json`" in res.stderr
    assert "torch 2.16 is new: refreshing records its releases" in res.stderr
    assert "error:" not in res.stderr and "Traceback" not in res.stderr
    assert not data_dir.exists() and shipped_file.read_bytes() == shipped_bytes  # nothing written
    assert handler.seen and all(path.startswith("/simple/") for path, _ in handler.seen)  # release lists only
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout) == {
        "up_to_date": False,
        "data": {"path": str(shipped_file), "origin": "shipped"},
        "index": index,
        "missing": {"torch": ["2.16.0"], "transformers": ["9.0.0"]},
        "uncurated_torch_minors": ["2.16"],
        "unbuildable_torch_minors": {},
    }


@pytest.mark.loopback
def test_check_fails_while_a_torch_minor_the_data_lists_cannot_be_built(tmp_path):
    """Release lists in step with the index are not enough: a minor whose facts are missing (here the GPU
    architectures of torch 2.16's PyPI build: its wheel did not say) is unbuildable, and the check says so (exit 1)."""
    doc = newer_than_shipped()
    del doc["torch"]["2.16.0"]["archs"]  # its wheel named no GPU architectures when the data was refreshed
    exported = tmp_path / "meta.json"
    exported.write_text(json.dumps(doc))
    with index_of(doc) as (index, _):
        res = cli("compat", "refresh", "--check", "--out", str(exported), "--index-url", index, data_dir=tmp_path)
        as_json = cli(
            "compat", "refresh", "--check", "--json", "--out", str(exported), "--index-url", index, data_dir=tmp_path
        )
    assert res.returncode == 1 and "stale:" not in res.stderr, res.stderr
    assert (
        "unbuildable: torch 2.16.0 (cu132 on PyPI): no GPU architecture list for torch 2.16+cu132 (curated [[arch]]"
        in res.stderr
    )
    assert "hint: a curated fact no index gives is missing" in res.stderr and "compat.toml" in res.stderr
    report = json.loads(as_json.stdout)
    assert (
        report["up_to_date"] is False
        and report["missing"] == {}
        and list(report["unbuildable_torch_minors"]) == ["2.16"]
    )


@pytest.mark.loopback
def test_a_refresh_makes_a_new_torch_minor_buildable_with_no_new_imagekit(tmp_path):
    """torch 2.15 has no [[torch]] table: its PyPI build (cu132), glibc floor and Python window come from the index.
    Data whose metadata does not name its CUDA runtime cannot build it; `compat refresh` fetches what the index
    says, and it can."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "pypi-metadata.json").write_text(json.dumps(_without_cuda_runtime("2.15.0")))  # an older refresh's
    ask = ("explain", "--torch", "2.15.0", "--cuda", "13.2", "--python", "3.12", "--transformers", "5.24.0")
    before = cli(*ask, data_dir=data_dir)
    assert before.returncode == 2 and "entry for torch 2.15" in before.stderr, before.stderr
    with index_of(SHIPPED) as (index, _):
        stale = cli("compat", "refresh", "--check", "--index-url", index, data_dir=data_dir)
        refreshed = cli("compat", "refresh", "--index-url", index, data_dir=data_dir)
        fresh = cli("compat", "refresh", "--check", "--index-url", index, data_dir=data_dir)
    assert stale.returncode == 1 and "unbuildable: torch 2.15.0: the index names no CUDA runtime" in stale.stderr
    assert refreshed.returncode == 0, refreshed.stderr
    assert fresh.returncode == 0 and "every torch minor in it can be built" in fresh.stderr, fresh.stderr
    after = cli(*ask, data_dir=data_dir)
    assert after.returncode == 0 and "compatible: cuda 13.2, torch 2.15.0" in after.stderr, after.stdout + after.stderr


def test_facts_the_index_gives_are_derived_and_agree_with_every_curated_minor():
    """The PyPI default variant the index gives (the CUDA runtime torch's METADATA requires) is the one the curated
    facts name for every minor they cover: the derivation is checked against 13 minors of sources."""
    curated = compat.curated_document()
    derived = compat.derived_minors(SHIPPED["torch"], curated=())
    for t in curated["torch"]:
        if t["minor"] in derived:
            assert derived[t["minor"]].pypi_default == t["pypi_default"], t["minor"]
    assert len([t for t in curated["torch"] if t["minor"] in derived]) >= 13
    data = compat.parse(curated, SHIPPED)
    assert "2.15" not in {t["minor"] for t in curated["torch"]}  # nothing typed for it
    tm = data.torch_minor("2.15.0")
    assert (tm.pypi_default, tm.variants, tm.glibc) == ("cu132", ("cu132",), "2.28")
    assert "CUDA runtime 13.2.2" in tm.pypi_default_source
    assert refresh.unbuildable(data) == {}


def test_what_makes_a_minor_unbuildable_is_named():
    doc = copy.deepcopy(SHIPPED)
    doc["torch"]["2.16.0"] = {"python": ["3.12"], "glibc": "2.28", "requires": {}, "requires_python": ">=3.12"}
    doc["torch"]["2.17.0"] = {**doc["torch"]["2.16.0"], "cuda_runtime": "14.0.1"}
    doc["torch"]["2.18.0rc1"] = {**doc["torch"]["2.16.0"]}  # a pre-release is not a minor to build yet
    why = refresh.unbuildable(compat.parse(compat.curated_document(), doc))
    assert set(why) == {"2.16", "2.17"}
    assert "names no CUDA runtime or glibc" in why["2.16"]
    assert (
        "no driver floor for CUDA 14.x" in why["2.17"]
        and "no GPU architecture list for torch 2.17+cu140" in why["2.17"]
    )


def test_pytorch_index_variants_in_the_metadata_are_checked_and_used():
    doc = copy.deepcopy(SHIPPED)
    doc["torch"]["2.16.0"] = {**doc["torch"]["2.15.0"], "variants": ["cu126", "cu132"]}
    tm = compat.parse(compat.curated_document(), doc).torch_minor("2.16.0")
    assert tm.variants == ("cu126", "cu132") and tm.variants_source.startswith("PTI")
    doc["torch"]["2.16.0"]["variants"] = ["cu132; rm -rf /"]
    assert any("variants is not a list of CUDA variants" in p for p in compat.metadata_problems(doc))


@pytest.mark.loopback
def test_check_of_data_the_index_matches_is_up_to_date(tmp_path):
    with index_of(SHIPPED) as (index, _):
        res = cli("compat", "refresh", "--check", "--index-url", index, data_dir=tmp_path / "data")
        as_json = cli("compat", "refresh", "--check", "--json", "--index-url", index, data_dir=tmp_path / "data")
    assert res.returncode == 0, res.stderr
    assert res.stderr.startswith("up to date: ") and res.stderr.count("\n") == 1 and res.stdout == ""
    doc = json.loads(as_json.stdout)
    assert as_json.returncode == 0 and doc["up_to_date"] is True and doc["missing"] == {}


@pytest.mark.loopback
def test_check_compares_the_file_out_names(tmp_path):
    older = copy.deepcopy(SHIPPED)
    newest = max(older["packages"]["accelerate"], key=Version)
    del older["packages"]["accelerate"][newest]
    exported = tmp_path / "export.json"
    exported.write_text(json.dumps(older))
    with index_of(SHIPPED) as (index, _):
        res = cli("compat", "refresh", "--check", "--out", str(exported), "--index-url", index, data_dir=tmp_path)
        missing = cli(
            "compat",
            "refresh",
            "--check",
            "--out",
            str(tmp_path / "nope.json"),
            "--index-url",
            index,
            data_dir=tmp_path,
        )
    assert res.returncode == 1, res.stderr
    assert f"stale: accelerate {newest} is on the index and not in the data ({exported}, --out)" in res.stderr
    assert f"hint: run `imagekit compat refresh --out {exported}`" in res.stderr
    assert exported.read_text() == json.dumps(older)
    assert missing.returncode == 2 and "nope.json does not exist" in missing.stderr and "hint:" in missing.stderr


@pytest.mark.loopback
def test_check_against_an_unreachable_index_is_exit_3(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on: the connection is refused
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/simple"
    res = cli("compat", "refresh", "--check", "--index", dead, data_dir=tmp_path / "data")
    assert res.returncode == 3, res.stderr
    assert res.stderr.startswith("error: ") and "hint:" in res.stderr and "Traceback" not in res.stderr
    assert "stale" not in res.stderr and "up to date" not in res.stderr
    with index_of(SHIPPED) as (index, _):
        gone = cli("compat", "refresh", "--check", "--index-url", index.replace("/simple", "/none"), data_dir=tmp_path)
    assert gone.returncode == 3 and "HTTP 404" in gone.stderr and "hint:" in gone.stderr
    assert not (tmp_path / "data").exists()


# ---- the sanity floor when reading ---------------------------------------------------------------------


@pytest.mark.programs
def test_an_older_user_file_is_passed_over_with_a_warning(tmp_path):
    older = copy.deepcopy(SHIPPED)
    del older["torch"]["2.15.0"]  # as if refreshed before this imagekit shipped newer data
    (tmp_path / "pypi-metadata.json").write_text(json.dumps(older))
    res = cli("explain", "--torch", "2.5.1", data_dir=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "warning: not using" in res.stderr and "fewer than the" in res.stderr and "hint:" in res.stderr
    show = json.loads(cli("compat", "show", "--json", data_dir=tmp_path).stdout)
    assert show["metadata"]["origin"] == "shipped" and show["user_file"]["state"].startswith("not used")


@pytest.mark.programs
@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "wrong shape"),
        (json.dumps({"torch": {"2.5.1": {"python": "3.11"}}, "packages": {}}), "wrong shape"),
        (json.dumps({**SHIPPED, "packages": {"transformers": {"4.48.2": {"requires": 5}}}}), "wrong shape"),
    ],
)
def test_an_unusable_user_file_is_exit_2_naming_it(tmp_path, text, needle):
    path = tmp_path / "pypi-metadata.json"
    path.write_text(text)
    res = cli("matrix", "--format", "github", data_dir=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    [error] = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert str(path) in error and needle in error
    assert "compat refresh" in res.stderr and f"delete {path}" in res.stderr
    show = cli("compat", "show", data_dir=tmp_path)  # says what is wrong instead of failing
    assert show.returncode == 0 and "unusable" in show.stdout


def test_the_shipped_metadata_passes_its_own_checks():
    assert compat.metadata_problems(SHIPPED) == []
    assert compat.floor_problem(SHIPPED, SHIPPED) is None
    assert compat.metadata_problems({"torch": {"2.x": {"python": ["3.11"]}}, "packages": {}}) == [
        "torch release '2.x' is not a version"
    ]


# ---- unknown versions: which data lacks them, and what fixes that --------------------------------------


def test_a_release_in_neither_file_points_to_refresh(data, app, runner):
    assert "9.9.9" not in data.torch_releases
    res = runner.invoke(app, ["explain", "--torch", "9.9.9"])
    assert res.exit_code == 2
    assert "torch 9.9.9 is not in imagekit's shipped PyPI metadata" in res.output
    assert "needs `imagekit compat refresh`" in res.output and "will not help" not in res.output


def _user_data(tmp_path, monkeypatch, doc: dict) -> None:
    (tmp_path / "pypi-metadata.json").write_text(json.dumps(doc))
    monkeypatch.setenv("IMAGEKIT_DATA_DIR", str(tmp_path))


def _without_cuda_runtime(version: str) -> dict:
    doc = copy.deepcopy(SHIPPED)
    del doc["torch"][version]["cuda_runtime"]
    return doc


def test_a_release_the_index_says_too_little_of_and_no_curated_entry_is_unknown(app, runner, tmp_path, monkeypatch):
    """torch 2.15 has no [[torch]] table: with metadata that does not name its CUDA runtime, nothing is guessed."""
    _user_data(tmp_path, monkeypatch, _without_cuda_runtime("2.15.0"))
    res = runner.invoke(app, ["explain", "--torch", "2.15.0", "--cuda", "13.2"])
    assert res.exit_code == 2
    assert "names its CUDA runtime and glibc floor" in res.output and "entry for torch 2.15" in res.output
    assert "run `imagekit compat refresh`" in res.output and 'add a [[torch]] table with minor = "2.15"' in res.output


def test_a_cuda_major_without_a_driver_floor_names_the_curated_table(app, runner):
    res = runner.invoke(app, ["explain", "--cuda", "14.0", "--torch", "2.14.1"])
    assert res.exit_code == 2
    assert "no driver floor for CUDA 14.x" in res.output and "[[driver_family]]" in res.output
    assert "will not help" in res.output


def test_a_matrix_with_both_kinds_gives_each_fix_once(app, runner, tmp_path, monkeypatch):
    _user_data(tmp_path, monkeypatch, _without_cuda_runtime("2.15.0"))
    matrix = tmp_path / "m.toml"
    matrix.write_text(
        "[matrix]\n"
        'cuda = ["12.8"]\ntorch = ["2.15.0", "9.9.9", "9.9.8"]\ntransformers = ["4.48.2"]\npython = ["3.11"]\n'
    )
    res = runner.invoke(app, ["matrix", "--matrix", str(matrix)])
    assert res.exit_code == 2
    assert res.output.count("hint:") == 2  # one refresh hint for both 9.9.x cells, one curated-facts hint
    assert "torch 9.9.9 is not in" in res.output and "entry for torch 2.15" in res.output


# ---- the PyTorch index: each torch release's CUDA variants ----------------------------------------------------
PYTORCH_FILES = [  # (folder, file name) as the PyTorch index's torch page lists them
    ("cu126", "torch-2.15.0+cu126-cp312-cp312-manylinux_2_28_x86_64.whl"),
    ("cu130", "torch-2.15.0+cu130-cp313-cp313-manylinux_2_28_x86_64.whl"),
    ("cu132", "torch-2.15.0+cu132-cp313-cp313t-manylinux_2_28_x86_64.whl"),
    ("cu130", "torch-2.15.0+cu130-cp312-cp312-manylinux_2_28_aarch64.whl"),
    ("cpu", "torch-2.15.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl"),
    ("rocm7", "torch-2.15.0+rocm7.1-cp312-cp312-manylinux_2_28_x86_64.whl"),
    ("cu999", "torch-2.15.0+cu999-cp312-cp312-win_amd64.whl"),
    ("evil", "torch-2.15.0+cu126-cp312-cp312-manylinux_2_28_x86_64.whl; rm -rf /"),
    ("cu124", "torch-2.5.1+cu124-cp311-cp311-linux_x86_64.whl"),
]
PYTORCH_PAGE = (
    "<!DOCTYPE html>\n<html><body><h1>Links for torch</h1>\n"
    + "".join(
        f'<a href="/whl/{folder}/{name.replace("+", "%2B")}#sha256=00">{name}</a><br/>\n'
        for folder, name in PYTORCH_FILES
    )
    + "</body></html>\n"
)


def test_the_pytorch_index_page_gives_each_releases_variants_per_cpu_architecture():
    found = refresh.pytorch_variants(PYTORCH_PAGE)
    assert found == {
        "2.15.0": {"aarch64_variants": ["cu130"], "variants": ["cu126", "cu130", "cu132"]},
        "2.5.1": {"variants": ["cu124"]},
    }  # cpu, ROCm, Windows and a name with anything after it are passed over
    assert refresh.pytorch_variants("<a>" + "x" * 100_000 + "</a>" + "<a" * 1000) == {}


@pytest.mark.loopback
def test_a_refresh_reads_the_pytorch_index_and_a_new_minor_knows_its_variants(tmp_path):
    from tests import hostile_http

    data_dir = tmp_path / "data"
    page = (200, {"Content-Type": "text/html"}, PYTORCH_PAGE.encode())
    with index_of(SHIPPED) as (index, _), hostile_http.serve({"/whl/torch/": page}) as pti:
        res = cli("compat", "refresh", "--index-url", index, "--pytorch-index", f"{pti.url}/whl", data_dir=data_dir)
        ask = ("explain", "--torch", "2.15.0", "--cuda", "12.6", "--python", "3.12")
        routed = cli(*ask, data_dir=data_dir)
    assert res.returncode == 0, res.stderr
    written = json.loads((data_dir / "pypi-metadata.json").read_text())
    assert written["torch"]["2.15.0"]["variants"] == ["cu126", "cu130", "cu132"]
    assert written["torch"]["2.15.0"]["aarch64_variants"] == ["cu130"]
    # cu126 is a torch 2.15 build now (from the PyTorch index); what no index says, its GPU architectures, is named
    assert routed.returncode == 2 and "has no cu126 wheels" not in routed.stderr, routed.stderr
    assert "torch 2.15.0+cu126" in routed.stderr and "no GPU architecture list" in routed.stderr


@pytest.mark.loopback
def test_an_unreachable_pytorch_index_is_said_and_the_refresh_goes_on(tmp_path):
    data_dir = tmp_path / "data"
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there
    with index_of(SHIPPED) as (index, _):
        res = cli(
            "compat", "refresh", "--index-url", index, "--pytorch-index", f"http://127.0.0.1:{port}/whl",
            data_dir=data_dir,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "note: the PyTorch index was not read" in res.stderr and "PyPI build only" in res.stderr
    assert "variants" not in json.loads((data_dir / "pypi-metadata.json").read_text())["torch"]["2.15.0"]


@pytest.mark.loopback
def test_a_refresh_reads_the_pytorch_indexs_aarch64_kernels_and_routes_an_older_arm64_cell_there(tmp_path):
    """PyPI's aarch64 torch 2.10 is CPU-only; the PyTorch index's aarch64 cu128 wheel is read (by range requests,
    never downloaded whole) for its GPU architectures, and a linux/arm64 cell of it is then routed there."""
    from tests import hostile_http

    data_dir = tmp_path / "data"
    wheels = {  # (file name, its libtorch_python.so arch flags: None for a library without them)
        "torch-2.10.0+cu128-cp312-cp312-manylinux_2_28_aarch64.whl": "sm_80 sm_90 sm_100 sm_120 compute_120",
        "torch-2.10.0+cu128-cp313-cp313-manylinux_2_28_aarch64.whl": "sm_80",  # another Python's: not read again
        "torch-2.10.0+cu126-cp313-cp313-manylinux_2_28_aarch64.whl": None,
        "torch-2.10.0+cu126-cp314-cp314-manylinux_2_28_aarch64.whl": None,
        "torch-2.9.0+cu128-cp313-cp313-manylinux_2_28_aarch64.whl": "sm_90",  # not its minor's newest: not read
        "torch-2.9.1+cu128-cp313-cp313-manylinux_2_28_aarch64.whl": "sm_90 sm_100",
    }
    with index_of(SHIPPED) as (index, handler):
        files = index.rsplit("/simple", 1)[0] + "/files/"
        for name, flags in wheels.items():
            handler.files[name.replace("+", "%2B")] = _torch_wheel(flags)
        page = "<html><body>" + "".join(
            f'<a href="{files}{name.replace("+", "%2B")}#sha256=00">{name}</a><br/>' for name in wheels
        ) + "</body></html>"  # fmt: skip
        answer = (200, {"Content-Type": "text/html"}, page.encode())
        with hostile_http.serve({"/whl/torch/": answer}) as pti:
            res = cli("compat", "refresh", "--index-url", index, "--pytorch-index", f"{pti.url}/whl", data_dir=data_dir)
        assert res.returncode == 0, res.stderr
        read = sorted(p.removeprefix("/files/") for p, r in handler.seen if "aarch64" in p and "%2B" in p)
        first = ("torch-2.10.0+cu128-cp312", "torch-2.10.0+cu126-cp313", "torch-2.9.1+cu128-cp313")
        assert set(read) == {n.replace("+", "%2B") for n in wheels if n.startswith(first)}
        assert all(r and r.startswith("bytes=") for p, r in handler.seen if "%2B" in p)
    assert "torch 2.10.0+cu126 for aarch64" in res.stderr and "names no GPU architectures" in res.stderr
    written = json.loads((data_dir / "pypi-metadata.json").read_text())["torch"]["2.10.0"]
    assert written["aarch64_variants"] == ["cu126", "cu128"] and written["aarch64_archs"] == ""  # PyPI's: CPU-only
    assert written["aarch64_index_archs"] == {"cu128": "sm_80 sm_90 sm_100 sm_120 compute_120"}
    older = json.loads((data_dir / "pypi-metadata.json").read_text())["torch"]["2.9.1"]
    assert older["aarch64_index_archs"] == {"cu128": "sm_90 sm_100"}
    ask = ("explain", "--torch", "2.10.0", "--cuda", "12.8", "--python", "3.13", "--platform", "arm64", "--json")
    verdict = json.loads(cli(*ask, data_dir=data_dir).stdout)
    assert verdict["compatible"], verdict
    unread = cli("explain", "--torch", "2.10.0", "--cuda", "12.6", "--python", "3.13", "--platform", "arm64",
                 data_dir=data_dir)  # fmt: skip
    assert unread.returncode == 2 and "no GPU architecture list" in unread.stderr  # known to exist, kernels unread


# ---- what a torch wheel says of the GPUs it runs on --------------------------------------------------------------
def test_the_arch_flags_are_read_out_of_the_library_without_running_it():
    from imagekit.compat import pypi_metadata as metadata

    lib = b"\x7fELF\x00junk\x00sm_75 sm_80 sm_86 sm_90 sm_100 sm_120\x00other\x00"
    assert metadata.arch_flags(lib) == "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"
    assert metadata.arch_flags(lib + b"\x00sm_75 sm_80 compute_80\x00") is None  # two lists: which? none
    assert metadata.arch_flags(b"\x00sm_80\x00" + b"\x00sm_80\x00") == "sm_80"  # the same list twice is one
    assert metadata.arch_flags(b"\x00nothing here\x00") is None


@pytest.mark.loopback
def test_a_refresh_records_what_each_wheel_says_per_cpu_architecture(tmp_path):
    """From PyPI's wheels (as the shipped data recorded them from pypi.org): aarch64 builds are CPU-only up to 2.10
    and CUDA builds from 2.11; a wheel that names no GPU architectures is said, and its release gets no list."""
    doc = copy.deepcopy(SHIPPED)
    assert doc["torch"]["2.10.0"]["aarch64_archs"] == "" and "aarch64_cuda_runtime" not in doc["torch"]["2.10.0"]
    assert doc["torch"]["2.11.0"]["aarch64_archs"].startswith("sm_80 sm_90")
    assert doc["torch"]["2.11.0"]["aarch64_cuda_runtime"].startswith("13.0")
    doc["torch"]["2.15.0"]["archs"] = ""  # served as a wheel whose library says nothing
    data_dir = tmp_path / "data"
    with index_of(doc) as (index, _):
        res = cli("compat", "refresh", "--index-url", index, "--out", str(tmp_path / "m.json"), data_dir=data_dir)
    assert res.returncode == 0, res.stderr
    assert "note: torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl names no GPU architectures" in res.stderr
    written = json.loads((tmp_path / "m.json").read_text())
    assert "archs" not in written["torch"]["2.15.0"]
    for v in ("2.10.0", "2.11.0", "2.15.0"):
        for field in ("aarch64_archs", "aarch64_cuda_runtime"):
            assert written["torch"][v].get(field) == SHIPPED["torch"][v].get(field), (v, field)
