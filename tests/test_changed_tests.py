"""tools/changed-tests: which tests cover a change (a test folder per package)."""

from __future__ import annotations

import importlib.machinery
import importlib.util

from tests.conftest import ROOT


def _tool():  # type: ignore[no-untyped-def]
    loader = importlib.machinery.SourceFileLoader("changed_tests", str(ROOT / "tools" / "changed-tests"))
    spec = importlib.util.spec_from_loader("changed_tests", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_a_package_change_runs_its_test_folder_and_the_layering_checks():
    tool = _tool()
    got = tool.tests_for(["imagekit/compat/rules.py", "imagekit/effects/ssh.py", "tests/oci/test_layer_blobs.py"])
    assert got == ["tests/compat", "tests/effects", "tests/oci/test_layer_blobs.py", "tests/test_boundaries.py"]
    assert tool.tests_for(["docs/pods.md"]) == ["tests/test_boundaries.py"]
    assert "tests/image" in tool.tests_for(["templates/Dockerfile.j2"])


def test_what_everything_depends_on_runs_everything():
    tool = _tool()
    assert "tests" in tool.tests_for(["imagekit/errors.py"])
    assert "tests" in tool.tests_for(["tests/conftest.py"])


def test_every_code_package_has_its_test_folder():
    packages = {p.name for p in (ROOT / "imagekit").iterdir() if (p / "__init__.py").exists() and p.name != "data"}
    folders = {p.name for p in (ROOT / "tests").iterdir() if (p / "__init__.py").exists()}
    assert packages <= folders, sorted(packages - folders)
