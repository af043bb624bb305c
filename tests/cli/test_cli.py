"""The CLI through typer's runner: contracts, formats, exit codes."""

from __future__ import annotations

import json

import pytest
from packaging.version import Version

from tests.conftest import ROOT

EXAMPLE = ["--cuda", "12.4", "--torch", "2.5.1", "--transformers", "4.48.2", "--python", "3.11"]


@pytest.mark.seconds
def test_every_command_has_help_with_an_example(app, runner):
    for cmd in (
        ["init"],
        ["matrix"],
        ["explain"],
        ["lock"],
        ["render"],
        ["compat", "refresh"],
        ["build"],
        ["fetch"],
        ["base", "bootstrap"],
        ["runpod-template"],
        ["doctor"],
    ):
        res = runner.invoke(app, [*cmd, "--help"])
        assert res.exit_code == 0, cmd
        assert "Example" in res.output, cmd


def test_explain_json_contract_compatible(app, runner):
    res = runner.invoke(app, ["explain", *EXAMPLE, "--arch", "sm_90", "--driver", "535.104.05", "--json"])
    assert res.exit_code == 0
    assert json.loads(res.stdout) == {"compatible": True, "violations": []}


def test_explain_json_contract_incompatible(app, runner):
    res = runner.invoke(
        app,
        [
            "explain",
            "--cuda",
            "12.6",
            "--torch",
            "2.6.0",
            "--transformers",
            "5.24.0",
            "--python",
            "3.10",
            "--arch",
            "B200",
            "--driver",
            "520.61.05",
            "--json",
        ],
    )
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["compatible"] is False
    assert all(set(v) == {"rule", "message", "source"} for v in doc["violations"])
    assert {v["rule"] for v in doc["violations"]} == {"python-transformers", "gpu-arch", "driver-floor"}


def test_explain_omitted_axes_are_not_checked(app, runner):
    assert runner.invoke(app, ["explain", "--torch", "2.1.2", "--json"]).exit_code == 0
    assert runner.invoke(app, ["explain", "--python", "3.14", "--json"]).exit_code == 0


def test_explain_readable_output(app, runner):
    res = runner.invoke(app, ["explain", "--cuda", "11.8", "--torch", "2.8.0"])
    assert res.exit_code == 1
    assert "cuda-variant" in res.output and "source:" in res.output


@pytest.mark.parametrize("args", [["--torch", "2.5.9"], ["--transformers", "9.0.0"], ["--torch", "2.16"]])
def test_explain_unknown_versions_exit_2_with_refresh_hint(app, runner, args):
    res = runner.invoke(app, ["explain", *args, "--json"])
    assert res.exit_code == 2
    assert "hint:" in res.output and "`imagekit compat refresh`" in res.output and "will not help" not in res.output


def test_explain_a_torch_the_curated_facts_lack_uses_what_the_index_says(app, runner):
    """torch 2.15 has no [[torch]] table: its one variant (PyPI's cu132) comes from its METADATA, cited as such."""
    res = runner.invoke(app, ["explain", "--torch", "2.15.0", "--cuda", "13.0", "--json"])
    assert res.exit_code == 1, res.output
    (violation,) = [v for v in json.loads(res.stdout)["violations"] if v["rule"] == "cuda-variant"]
    assert "its CUDA variants are cu132" in violation["message"] and "PYPI (torch 2.15.0" in violation["source"]


@pytest.mark.parametrize(
    ("given", "axis", "exact"),
    [
        (["--torch", "2.5"], "torch", "2.5.1"),
        (["--torch", "2.5", "--cuda", "cu124"], "torch", "2.5.1"),
        (["--transformers", "4.48", "--torch", "2.5.1"], "transformers", "4.48.3"),
    ],
)
def test_explain_takes_a_prefix_as_matrix_and_lock_do(app, runner, given, axis, exact):
    """`--torch 2.5` selects 2.5.x in `matrix`/`lock`; `explain` evaluates the newest known 2.5.x and says so."""
    res = runner.invoke(app, ["explain", *given, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc.pop("resolved") == {axis: exact}
    pinned = [exact if i > 0 and given[i - 1] == f"--{axis}" else w for i, w in enumerate(given)]
    same = runner.invoke(app, ["explain", *pinned, "--json"])
    assert doc == json.loads(same.stdout) and "resolved" not in json.loads(same.stdout)  # the same verdict
    assert f"{axis} {given[given.index(f'--{axis}') + 1]} -> {exact}" in res.stderr


def test_explain_prefix_picks_the_newest_release_the_curated_facts_cover(app, runner, data):
    """`--torch 2`: 2.15.0 is on PyPI but has no curated facts yet, so 2.14.1, the newest imagekit can check."""
    newest = max((r for r in data.torch_releases if r.rsplit(".", 1)[0] in data.torch_minors), key=Version)
    res = runner.invoke(app, ["explain", "--torch", "2", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["resolved"] == {"torch": newest}


@pytest.mark.parametrize("value", ["2.16", "2.5.9", "3"])
def test_explain_prefix_matching_nothing_does_not_contradict_itself(app, runner, value):
    res = runner.invoke(app, ["explain", "--torch", value])
    assert res.exit_code == 2
    [error] = [line for line in res.output.splitlines() if line.startswith("error:")]
    listed = error.split("(", 1)[1]
    assert value not in listed.replace("…", ",").replace(":", ",").split(", ")  # never "2.5 is not known (2.5...)"
    assert not any(r == value or r.startswith(value + ".") for r in listed.split(": ")[-1].split(", "))


def test_matrix_github_is_valid_json_of_compatible_cells(app, runner, data, in_tmp):
    from imagekit.compat import rules
    from imagekit.model import Query

    res = runner.invoke(app, ["matrix", "--format", "github"])
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert set(doc) == {"include"} and 10 <= len(doc["include"]) <= 256
    for row in doc["include"]:
        q = Query(cuda=row["cuda"], torch=row["torch"], transformers=row["transformers"], python=row["python"])
        assert rules.evaluate(q, data).compatible, row
        assert (
            row["cell"]
            == f"cu{row['cuda'].replace('.', '')}-torch{row['torch']}-py{row['python']}-tf{row['transformers']}"
        )


def test_matrix_github_is_one_line_for_github_output(app, runner, in_tmp):
    """`echo "matrix=$(imagekit matrix --format github)" >> "$GITHUB_OUTPUT"` needs one line."""
    res = runner.invoke(app, ["matrix", "--format", "github"])
    assert res.exit_code == 0 and res.stdout.count("\n") == 1 and res.stdout.endswith("}\n")
    assert json.loads(res.stdout)["include"]


def test_matrix_locked_only_lists_cells_with_a_current_lock(app, runner, in_tmp):
    import shutil
    from pathlib import Path

    repo_locks = Path(__file__).resolve().parents[2] / "lockfiles"
    pypi = json.loads(runner.invoke(app, ["matrix", "--format", "github", "--source", "pypi"]).stdout)["include"]
    kept, stale = pypi[0]["cell"], pypi[1]["cell"]
    (in_tmp / "locks").mkdir()
    shutil.copy(repo_locks / f"{kept}.txt", in_tmp / "locks" / f"{kept}.txt")
    text = (repo_locks / f"{stale}.txt").read_text()  # another cell's lock under this name: never listed
    (in_tmp / "locks" / f"{stale}.txt").write_text(text.replace(stale, kept))
    res = runner.invoke(app, ["matrix", "--format", "github", "--locked-only", "--lock-dir", "locks"])
    assert res.exit_code == 0, res.output
    assert [r["cell"] for r in json.loads(res.stdout)["include"]] == [kept]
    assert f"skipped {stale}:" in res.stderr and f"skipped {pypi[2]['cell']}: no lock in locks" in res.stderr


@pytest.mark.seconds
def test_matrix_github_shards(app, runner, in_tmp):
    whole = json.loads(runner.invoke(app, ["matrix", "--format", "github"]).stdout)["include"]
    parts = [
        json.loads(runner.invoke(app, ["matrix", "--format", "github", "--shard", f"{i}/3"]).stdout)["include"]
        for i in (1, 2, 3)
    ]
    assert sorted(r["cell"] for p in parts for r in p) == sorted(r["cell"] for r in whole)


@pytest.mark.seconds
def test_matrix_over_github_limit_says_how_to_shard(app, runner, data, in_tmp):
    from packaging.specifiers import SpecifierSet

    versions = sorted(
        v
        for v, r in data.packages["transformers"].items()
        if not r.yanked
        and SpecifierSet(r.requires.get("torch", "")).contains("2.5.1")
        and SpecifierSet(r.requires_python).contains("3.10.0")
    )
    (in_tmp / "big.toml").write_text(
        '[matrix]\ncuda = ["11.8", "12.1", "12.4"]\ntorch = ["2.5.1"]\npython = ["3.10", "3.11", "3.12"]\n'
        "transformers = [" + ", ".join(f'"{v}"' for v in versions) + "]\n"
    )
    res = runner.invoke(app, ["matrix", "--matrix", "big.toml", "--format", "github"])
    assert res.exit_code == 2
    assert "256-job" in res.output and "--shard 1/" in res.output
    total = len(versions) * 9
    need = -(-total // 256)
    parts = [
        json.loads(
            runner.invoke(
                app, ["matrix", "--matrix", "big.toml", "--format", "github", "--shard", f"{i}/{need}"]
            ).stdout
        )["include"]
        for i in range(1, need + 1)
    ]
    assert sum(len(p) for p in parts) == total and all(len(p) <= 256 for p in parts)


@pytest.mark.seconds
def test_matrix_explain_lists_excluded_with_rule(app, runner, in_tmp):
    res = runner.invoke(app, ["matrix", "--explain", "--format", "json"])
    rows = json.loads(res.stdout)
    excluded = [r for r in rows if not r["compatible"]]
    assert excluded and all(r["violations"][0]["rule"] and r["violations"][0]["source"] for r in excluded)
    plain = json.loads(runner.invoke(app, ["matrix", "--format", "json"]).stdout)
    assert all(r["compatible"] for r in plain) and len(plain) == len(rows) - len(excluded)


def test_matrix_filters_and_table(app, runner, in_tmp):
    res = runner.invoke(app, ["matrix", "--cuda", "11.8"])
    assert res.exit_code == 0 and "cu118-torch2.5.1-py3.11-tf4.48.2" in res.output and "cu124-" not in res.output


def test_markdown_grid(app, runner, in_tmp):
    res = runner.invoke(app, ["matrix", "--format", "grid"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert lines[0].startswith("| torch \\ CUDA | cu118")
    row = next(line for line in lines if line.startswith("| **2.8.0**"))
    assert "✗ no such wheels" in row and "✓ (PyPI)" in row


@pytest.mark.seconds
def test_bake_targets_are_the_locked_cells(app, runner, in_tmp):
    locks = ["--lock-dir", str(ROOT / "lockfiles")]
    res = runner.invoke(app, ["matrix", "--format", "bake", *locks])
    bake = json.loads(res.stdout)
    github = json.loads(runner.invoke(app, ["matrix", "--format", "github", "--locked-only", *locks]).stdout)["include"]
    everything = json.loads(runner.invoke(app, ["matrix", "--format", "github"]).stdout)["include"]
    assert len(bake["target"]) == len(github) == len(bake["group"]["default"]["targets"]) < len(everything)
    committed = {p.stem for p in (ROOT / "lockfiles").glob("*.txt")}
    assert {t["context"].split("/", 1)[1] for t in bake["target"].values()} <= committed
    assert res.stderr.count("not in the bake file: ") == len(everything) - len(github)
    for target in bake["target"].values():
        cell = target["context"].split("/", 1)[1]
        alias, immutable = target["tags"]
        assert alias.endswith(f":{cell}") and immutable.startswith(f"{alias}-") and len(immutable) == len(alias) + 13
        assert target["platforms"] == ["linux/amd64"] and "network" not in target and "args" not in target


def test_bad_format_is_usage_error(app, runner):
    res = runner.invoke(app, ["matrix", "--format", "yaml"])
    assert res.exit_code == 2 and "error: invalid --format" in res.output


@pytest.mark.seconds
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--extra-index-url", "https://mirror.example/simple\n--index-url x"], "invalid --extra-index-url"),
        (["--resolver", "pip"], "invalid --resolver"),
        (["--index-url", ""], "invalid --index-url"),
    ],
)
def test_build_takes_the_same_resolver_settings_as_lock(app, runner, in_tmp, extra, needle):
    """`build` re-locks stale cells: with every setting `lock` has, validated before anything runs."""
    for command in ("lock", "build"):
        res = runner.invoke(app, [command, "--cell", "cu121-torch2.1.2-py3.11-tf4.48.2", *extra])
        assert res.exit_code == 2 and needle in res.output, (command, res.output)
    assert not (in_tmp / "lockfiles").exists() and not (in_tmp / ".imagekit").exists()
