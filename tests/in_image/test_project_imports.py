"""`project-imports` (in_image/selftest.py): the project's own wheel, installed in the code layer, shadows no
module of the layers below it and adds no .pth file, so the checks of those layers still hold when they are reused."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagekit.in_image import selftest


def _dist(site: Path, name: str, files: list[str]) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in [*files, f"{info.name}/METADATA"]))
    for f in files:
        if not f.startswith(".."):
            (site / f).parent.mkdir(parents=True, exist_ok=True)
            (site / f).write_text("VALUE = 1\n" if f.endswith(".py") else "")


@pytest.mark.parametrize(
    ("files", "status", "says"),
    [
        (["acme_train/__init__.py", "acme_train/loop.py", "../../bin/acme-train"], "pass", "acme_train"),
        (["acme_train/__init__.py", "torchish/__init__.py"], "fail", "shadows torchish (also torchish-core's)"),
        (["acme_train/__init__.py", "acme.pth"], "fail", "adds acme.pth"),
    ],
)
def test_the_projects_wheel_shadows_nothing_and_imports(tmp_path, monkeypatch, files, status, says):
    site = tmp_path / "site"
    _dist(site, "torchish-core", ["torchish/__init__.py"])  # a distribution of a layer below the code layer
    _dist(site, "acme-train", files)
    monkeypatch.syspath_prepend(str(site))
    manifest = {"project": {"name": "Acme_Train"}, "layers": {"cuda_prefix": str(site)}}  # its paths: this site
    result = selftest.check_project_imports(manifest)
    assert result["status"] == status and says in result["message"], result
    if status == "pass":
        assert result["evidence"]["modules"] == ["acme_train"]
