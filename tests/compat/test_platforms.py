"""Image platforms: linux/amd64 and linux/arm64 (Grace hosts) as a matrix axis, in the rules (PyPI's aarch64 torch
is CPU-only up to 2.10, as its wheels say), in locks resolved for aarch64 whatever the host, and in the forecast of
the commands that make images."""

from __future__ import annotations

import json

import pytest

from imagekit.compat import rules
from imagekit.errors import ConfigError, UnknownVersionError
from imagekit.locking import resolution
from imagekit.matrix import matrix_file as matrix
from imagekit.model import ARM64, Cell, Query
from imagekit.services.locks import lock_cells

CELL_215 = {"cuda": "13.2", "torch": "2.15.0", "transformers": "5.24.0", "python": "3.13"}
MATRIX = """
[matrix]
platforms = ["linux/amd64", "arm64"]

[[matrix.include]]
cuda = "13.2"
torch = "2.15.0"
transformers = "5.24.0"
python = "3.13"

[[matrix.include]]
cuda = "12.8"
torch = "2.10.0"
transformers = "5.24.0"
python = "3.13"

[[matrix.include]]
cuda = "13.0"
torch = "2.14.1"
transformers = "5.24.0"
python = "3.13"
platform = "linux/arm64"
"""


def _config(data, text: str = MATRIX) -> matrix.MatrixConfig:
    return matrix.parse(matrix.parse_text(text, "m.toml"), "m.toml", data)


def test_a_cell_keeps_its_id_on_every_platform_and_amd64_is_described_as_before(data):
    config = _config(data)
    keys = [c.key for c in config.cells]
    assert keys == [
        "cu128-torch2.10.0-py3.13-tf5.24.0",
        "cu128-torch2.10.0-py3.13-tf5.24.0@linux/arm64",
        "cu130-torch2.14.1-py3.13-tf5.24.0@linux/arm64",  # an include with a platform: that platform alone
        "cu132-torch2.15.0-py3.13-tf5.24.0",
        "cu132-torch2.15.0-py3.13-tf5.24.0@linux/arm64",
    ]
    arm = next(c for c in config.cells if c.key.endswith("@linux/arm64"))
    assert arm.id == "cu128-torch2.10.0-py3.13-tf5.24.0" and arm.to_json()["platform"] == ARM64
    assert "platform" not in Cell(**CELL_215).to_json()  # the input hash of every amd64 lock is what it was


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[matrix]\nplatforms = ["linux/s390x"]\n', "matrix.platforms[0]: invalid platform"),
        ("[matrix]\nplatforms = []\n", "matrix.platforms: an empty list"),
        ('[matrix]\nplatforms = "arm64"\n', "matrix.platforms: expected a list"),
        ('[[matrix.include]]\ncuda = "13.2"\ntorch = "2.15.0"\ntransformers = "5.24.0"\npython = "3.13"\n'
         'platform = "windows/amd64"\n', "matrix.include[0].platform: invalid platform"),
    ],
)  # fmt: skip
def test_a_platform_that_is_none_is_named(data, text, says):
    with pytest.raises(ConfigError) as exc:
        _config(data, text)
    assert any(says in p for p in exc.value.problems), exc.value.problems


def test_pypis_cpu_only_aarch64_torch_is_excluded_with_the_route_that_works(data):
    verdicts = {e.cell.key: e.verdict for e in matrix.evaluate(_config(data), data)}
    old = verdicts["cu128-torch2.10.0-py3.13-tf5.24.0@linux/arm64"]
    (why,) = old.violations
    assert why.rule == "platform-wheels" and "CPU-only build" in why.message
    assert "cu130 (torch 2.11.0 to 2.14.1), cu132 (torch 2.15.0)" in why.message
    assert "torch 2.10.0: its Linux aarch64 wheel" in why.source
    # the route to its CUDA build: the PyTorch index, once a refresh has read it (this data's was not)
    assert "`imagekit compat refresh` where download.pytorch.org is reachable" in why.message
    assert verdicts["cu128-torch2.10.0-py3.13-tf5.24.0"].compatible  # the same cell on amd64
    assert verdicts["cu132-torch2.15.0-py3.13-tf5.24.0@linux/arm64"].compatible
    assert verdicts["cu130-torch2.14.1-py3.13-tf5.24.0@linux/arm64"].compatible


def test_the_aarch64_build_has_its_own_gpus_as_its_wheel_says(data):
    """PyPI's aarch64 torch 2.15 has sm_110 (Thor) and no sm_75/sm_86 (read from the wheel, pypi-metadata.json)."""
    assert rules.supported_archs(data, "2.15.0", "13.2", ARM64) == (["sm_80", "sm_90", "sm_100", "sm_110", "sm_120"],
                                                                   None)  # fmt: skip
    assert rules.supported_archs(data, "2.15.0", "13.2")[0][0] == "sm_75"
    gh200 = rules.evaluate(Query(torch="2.15.0", cuda="13.2", archs=("sm_90",), platform=ARM64), data)
    t4 = rules.evaluate(Query(torch="2.15.0", cuda="13.2", archs=("sm_75",), platform=ARM64), data)
    assert gh200.compatible and [v.rule for v in t4.violations] == ["gpu-arch"]
    wrong = rules.evaluate(Query(torch="2.15.0", cuda="13.0", platform=ARM64), data)
    assert [v.rule for v in wrong.violations] == ["cuda-variant"]  # 2.15 has no cu130 build at all


def _routed_data(data, **release):
    """The shipped data, but the PyTorch index's aarch64 builds of torch 2.10.0 recorded as a refresh records them."""
    import copy

    from imagekit.compat import catalog as compat

    metadata = copy.deepcopy(compat.shipped_metadata())
    metadata["torch"]["2.10.0"].update(release)
    assert compat.metadata_problems(metadata) == []
    return compat.parse(compat.curated_document(), metadata)


def test_an_older_torch_on_arm64_is_routed_to_the_pytorch_indexs_aarch64_build(data):
    """PyPI's aarch64 torch 2.10 is CPU-only: the cell takes the PyTorch index's aarch64 cu128 build, whose GPU
    architectures a refresh read from its wheel; a variant the index lacks is excluded naming what it has."""
    routed = _routed_data(data, aarch64_variants=["cu126", "cu128"],
                          aarch64_index_archs={"cu128": "sm_80 sm_90 sm_100 sm_120 compute_120"})  # fmt: skip
    ok = rules.evaluate(Query(torch="2.10.0", cuda="12.8", archs=("sm_90",), platform=ARM64), routed)
    assert ok.compatible and not routed.torch_from_pypi("2.10.0", "cu128", ARM64)
    assert routed.torch_from_pypi("2.10.0", "cu128")  # on amd64 the same variant is PyPI's
    assert rules.supported_archs(routed, "2.10.0", "12.8", ARM64) == (["sm_80", "sm_90", "sm_100", "sm_120"], "sm_120")
    req = resolution.request(Cell("12.8", "2.10.0", "5.24.0", "3.13", platform=ARM64), resolution.LockSettings(),
                                  routed)  # fmt: skip
    assert req.routed and req.torch_index == "https://download.pytorch.org/whl/cu128"
    assert req.platform == "aarch64-manylinux_2_28" and "torch==2.10.0+cu128" in req.requirements
    missing = rules.evaluate(Query(torch="2.10.0", cuda="13.0", platform=ARM64), _routed_data(
        data, variants=["cu126", "cu128", "cu130"], aarch64_variants=["cu126", "cu128"]))  # fmt: skip
    (why,) = missing.violations
    assert "no aarch64 cu130 build of it (its aarch64 builds: cu126, cu128)" in why.message


def test_a_routed_aarch64_build_without_facts_is_unknown_not_guessed(data):
    routed = _routed_data(data, aarch64_variants=["cu126"])  # the index has it; nobody read its kernels
    with pytest.raises(UnknownVersionError) as exc:
        rules.evaluate(Query(torch="2.10.0", cuda="12.6", platform=ARM64), routed)
    assert "on linux/arm64" in exc.value.message and 'platform = "linux/arm64"' in exc.value.hint


def test_an_arm64_lock_resolves_for_aarch64_and_lives_in_its_own_folder(data, tmp_path):
    arm = Cell(**CELL_215, platform=ARM64)
    assert lock_cells.lock_path(tmp_path, arm) == tmp_path / "linux-arm64" / f"{arm.id}.txt"
    assert lock_cells.lock_path(tmp_path, Cell(**CELL_215)) == tmp_path / f"{arm.id}.txt"
    assert resolution._platform(arm, data) == "aarch64-manylinux_2_28"
    assert resolution._platform(Cell(**CELL_215), data) == "x86_64-manylinux_2_28"


@pytest.mark.parametrize("command", ["build", "fetch"])
def test_a_dry_run_forecasts_each_platforms_cell_under_its_own_name(app, runner, tmp_path, command):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX)
    (tmp_path / "locks").mkdir()
    res = runner.invoke(
        app, [command, "--matrix", str(path), "--torch", "2.15.0", "--lock-dir", str(tmp_path / "locks"), "--dry-run"]
    )
    assert res.exit_code == 0, res.output
    assert "cu132-torch2.15.0-py3.13-tf5.24.0@linux/arm64: no lock" in res.output
    assert "cu132-torch2.15.0-py3.13-tf5.24.0: no lock" in res.output


@pytest.mark.seconds
def test_explain_and_the_matrix_know_the_platform(app, runner, tmp_path):
    res = runner.invoke(app, ["explain", "--torch", "2.10.0", "--cuda", "12.8", "--platform", "arm64", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["violations"][0]["rule"] == "platform-wheels"
    path = tmp_path / "m.toml"
    path.write_text(MATRIX)
    rows = json.loads(runner.invoke(app, ["matrix", "--matrix", str(path), "--format", "json"]).stdout)
    assert {(r["id"], r["platform"]) for r in rows} >= {("cu132-torch2.15.0-py3.13-tf5.24.0", "linux/arm64")}
    grid = runner.invoke(app, ["matrix", "--matrix", str(path), "--format", "grid"]).stdout
    assert "**linux/arm64**" in grid and "CPU-only on aarch64" in grid
    github = json.loads(runner.invoke(app, ["matrix", "--matrix", str(path), "--format", "github"]).stdout)
    jobs = {(r["cell"], r["platform"], r["slug"]) for r in github["include"]}
    assert ("cu132-torch2.15.0-py3.13-tf5.24.0", "linux/arm64", "cu132-torch2.15.0-py3.13-tf5.24.0-arm64") in jobs
    assert ("cu132-torch2.15.0-py3.13-tf5.24.0", "linux/amd64", "cu132-torch2.15.0-py3.13-tf5.24.0") in jobs
    assert not any(r[0].startswith("cu128-torch2.10.0") and r[1] == "linux/arm64" for r in jobs)  # CPU-only: out
    only = runner.invoke(app, ["matrix", "--matrix", str(path), "--platform", "linux/arm64", "--format", "json"])
    assert {r["platform"] for r in json.loads(only.stdout)} == {"linux/arm64"}


@pytest.mark.network
@pytest.mark.resolver
def test_a_real_aarch64_lock_of_torch_2_15_from_pypi(data, tmp_path):
    """Resolved on this x86_64 host for aarch64: PyPI's aarch64 torch 2.15 and its CUDA 13.2 runtime wheels."""
    arm = Cell(**CELL_215, packages=("accelerate==1.12.0",), platform=ARM64)
    res = lock_cells.lock_one(arm, tmp_path, resolution.LockSettings(), data)
    assert res.status == "locked", res.error and res.error.render()
    assert res.path == tmp_path / "linux-arm64" / f"{arm.id}.txt"
    pins = res.lock.pins()
    assert pins["torch"] == "2.15.0" and pins["cuda-toolkit"] == "13.2.2"
    assert res.lock.meta["platform"] == "aarch64-manylinux_2_28"
    assert "--platform linux/arm64" in res.path.read_text()  # its regenerate command says the platform
