"""`project-imports` (in_image/selftest.py): the project's own wheel, installed in the code layer, replaces no file of
the layers below it, puts its modules in no other distribution's package by accident (a package extended on purpose,
as a plugin extends what it plugs into, is fine) and adds no .pth file, so the checks of those layers still hold when
they are reused; and each top-level module it installs imports as a user would import it, less `[image]
skip_imports`, each failure naming the module's file and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagekit.in_image import selftest


def _dist(site: Path, name: str, files: list[str], requires: tuple[str, ...] = (), top_level: str | None = None):
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    (info / "METADATA").write_text(meta)
    extra = [f"{info.name}/METADATA"]
    if top_level is not None:
        (info / "top_level.txt").write_text(top_level)
        extra.append(f"{info.name}/top_level.txt")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in [*files, *extra]))
    for f in files:
        if not f.startswith("..") and not (site / f).exists():
            (site / f).parent.mkdir(parents=True, exist_ok=True)
            (site / f).write_text("VALUE = 1\n" if f.endswith(".py") else "")


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    """A site-packages folder the self-test reads as the image's (its CUDA prefix: one of image_paths)."""
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return tmp_path / "site"


def _manifest(site: Path, **project) -> dict:
    return {"project": {"name": "Acme_Train", **project}, "layers": {"cuda_prefix": str(site)}}  # paths: this site


# ---- what shares a package with what: pure, no import


@pytest.mark.parametrize(
    ("mine", "theirs", "requires", "theirs_require", "verdict"),
    [
        # the same file from both: one replaced the other, whoever meant what
        (["torchish/__init__.py"], ["torchish/__init__.py"], (), (), "torchish/__init__.py is installed by both"),
        (["acme/__init__.py", "acme/x.py"], ["acme/__init__.py", "acme/p.py"], (), ("acme-train",), "installed by"),
        # modules into a regular package of a distribution neither side knows: by accident
        (["utils/helpers.py"], ["utils/__init__.py"], (), (), "the project's utils/helpers.py goes into the package"),
        # a plugin: it requires what it extends (either way round), with files of its own
        (["acme/__init__.py", "acme/x.py"], ["acme/plugins/p.py"], (), ("acme-train>=1",), "extended"),
        (
            ["lm/tasks/mine.py"],
            ["lm/__init__.py", "lm/tasks/__init__.py"],
            ("lm[all]; python_version>'3'",),
            (),
            "extended",
        ),
        # a namespace package (PEP 420): no __init__.py on either side
        (["google/cloud/acme/__init__.py"], ["google/cloud/storage/__init__.py"], (), (), "extended"),
    ],
)
def test_a_shared_package_is_told_an_accident_or_on_purpose(mine, theirs, requires, theirs_require, verdict):
    other = "lm" if mine[0].startswith("lm/") else "acme-plugin-x"
    accidents, extended = selftest._shared_packages(
        "acme-train", set(mine), {selftest.facts.canon(r.split("[")[0].split(";")[0]) for r in requires},
        [(other, set(theirs), {selftest.facts.canon(r.split(">")[0]) for r in theirs_require})],
    )  # fmt: skip
    if verdict == "extended":
        assert not accidents and len(extended) == 1, (accidents, extended)
    else:
        assert not extended and len(accidents) == 1 and verdict in accidents[0][3], (accidents, extended)


def test_a_clash_names_the_file_and_the_fix_and_a_pth_file_fails(site):
    _dist(site, "torchish-core", ["torchish/__init__.py", "utils/__init__.py"])  # a layer below the code layer
    _dist(site, "acme-train", ["acme_train/__init__.py", "torchish/__init__.py", "utils/io.py", "acme.pth"])
    result = selftest.check_project_imports(_manifest(site))  # fails before anything is imported
    assert result["status"] == "fail", result
    assert "torchish/__init__.py is installed by both the project's wheel and torchish-core" in result["message"]
    assert "the project's utils/io.py goes into the package utils that torchish-core installs too" in result["message"]
    assert "adds acme.pth" in result["message"]
    assert (
        "rename the project's package torchish" in result["fix"] and "[tool.setuptools.packages.find]" in result["fix"]
    )
    assert "add torchish-core to the project's dependencies" in result["fix"]  # utils: it may be meant
    assert "drop the .pth file" in result["fix"]


# ---- the imports: a process of their own


@pytest.mark.programs
def test_the_wheels_top_level_modules_import_and_a_plugin_extending_it_is_no_clash(site):
    _dist(
        site, "acme-train", ["acme_train/__init__.py", "acme_train/loop.py", "../../bin/acme-train", "configs/a.yaml"]
    )
    (site / "acme_train" / "loop.py").write_text("raise RuntimeError('a submodule is not imported')\n")
    _dist(site, "acme-plugin-x", ["acme_train/plugins/x.py"], requires=("acme-train",))
    result = selftest.check_project_imports(_manifest(site))
    assert result["status"] == "pass", result
    assert result["evidence"]["imported"] == ["acme_train"]  # configs/ holds no code: no user imports it
    assert (
        "extended on purpose: acme_train (also acme-plugin-x's: acme-plugin-x requires acme-train)" in result["message"]
    )


@pytest.mark.programs
def test_a_module_that_raises_names_its_file_and_the_skip_and_is_skipped_when_told(site):
    files = ["acme_train/__init__.py", "recipes/__init__.py", "exits/__init__.py"]
    _dist(site, "acme-train", files, top_level="acme_train\nrecipes\nexits\n")
    (site / "recipes" / "__init__.py").write_text("\n\nraise ImportError('recipes are run, not imported')\n")
    (site / "exits" / "__init__.py").write_text("import sys\nsys.exit(3)\n")  # would end an in-process self-test
    result = selftest.check_project_imports(_manifest(site))
    assert result["status"] == "fail", result
    assert (
        f"import recipes failed: ImportError: recipes are run, not imported ({site}/recipes/__init__.py, line 3)"
        in (result["message"])
    )
    assert "import exits failed: SystemExit: 3" in result["message"]
    assert '[image] skip_imports = ["exits"]' in result["fix"]
    assert result["evidence"]["imported"] == ["acme_train"]  # the others still imported, all failures at once
    told = selftest.check_project_imports(_manifest(site, skip_imports=["recipes", "exits", "gone"]))
    assert told["status"] == "pass", told
    assert told["evidence"]["imported"] == ["acme_train"] and told["evidence"]["skipped"] == ["exits", "recipes"]
    assert "skip_imports names what the wheel does not install: gone" in told["message"]


@pytest.mark.programs
def test_a_process_that_dies_importing_names_the_module(site):
    _dist(site, "acme-train", ["acme_train/__init__.py", "zz_dies/__init__.py"])
    (site / "zz_dies" / "__init__.py").write_text("import os\nos._exit(9)\n")
    result = selftest.check_project_imports(_manifest(site))
    assert (
        result["status"] == "fail"
        and "import zz_dies failed: the import process ended with exit 9" in (result["message"])
    ), result
    assert result["evidence"]["imported"] == ["acme_train"]
