"""The code's shape, enforced: every module imports on its own (no hidden order, no side effect it relies on); the
pure core touches no process, socket, network or effect; effects know no use case; use cases know no CLI; the
in-image code (`in_image/`) imports nothing from the host side, because it runs in the image with the standard
library and its siblings; the host imports of it only the shared facts module (`in_image/facts.py`)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "imagekit"
# Modules no pure-core module may import: processes, sockets, the network, Docker, SSH, and imagekit's effects and
# layers above them. (`urllib.parse` is string handling; `urllib.request` is the network.)
NOT_IN_CORE = ("subprocess", "socket", "urllib", "http", "docker", "httpx", "paramiko", "requests", "asyncio")
ALLOWED_IN_CORE = {"urllib.parse"}
ABOVE_CORE = ("imagekit.effects", "imagekit.services", "imagekit.cli")


def _modules() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out.append(".".join(parts))
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    if module == "imagekit.__main__":
        return "entry"
    if len(parts) > 1 and parts[1] in ("cli", "services", "effects", "in_image", "data"):
        return parts[1]
    return "core"


def _imports(module: str) -> set[str]:
    """Every module ``module`` imports, at the top or inside a function (a lazy import is still an import)."""
    rel = Path(*module.split("."))
    path = ROOT / rel.with_suffix(".py") if (ROOT / rel.with_suffix(".py")).exists() else ROOT / rel / "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if node.module == "imagekit"}
    return found


MODULES = _modules()


def test_the_layers_are_where_the_map_says():
    layers = {m: _layer(m) for m in MODULES}
    assert {"core", "cli", "services", "effects", "in_image"} <= set(layers.values())
    assert len(MODULES) > 60  # the walk found the package


@pytest.mark.parametrize("module", [m for m in MODULES if _layer(m) == "core"])
def test_the_pure_core_touches_no_process_network_or_effect(module):
    bad = sorted(
        name
        for name in _imports(module)
        if name not in ALLOWED_IN_CORE and (name.split(".")[0] in NOT_IN_CORE or name.startswith(ABOVE_CORE))
    )
    assert not bad, f"{module} imports {bad}: move the effect to imagekit/effects and pass its result in"


@pytest.mark.seconds
@pytest.mark.parametrize("module", [m for m in MODULES if _layer(m) in ("effects", "services")])
def test_effects_know_no_use_case_and_use_cases_no_cli(module):
    above = ("imagekit.services", "imagekit.cli") if _layer(module) == "effects" else ("imagekit.cli",)
    bad = sorted(name for name in _imports(module) if name.startswith(above))
    assert not bad, f"{module} imports {bad}"


IN_IMAGE = PACKAGE / "in_image"
SIBLINGS = {p.stem for p in IN_IMAGE.glob("*.py")} - {"__init__"}
# What the in-image checks exist to probe: the image's own environment, imported inside the checks that need it.
UNDER_TEST = {"torch", "numpy", "transformers", "importlib_metadata"}
AFTER_PY38 = {"graphlib", "zoneinfo", "tomllib"}  # in this interpreter's standard library, not in 3.8's
SHARED_FACTS = "imagekit.in_image.facts"
# The one host module that runs an in-image program in-process: `imagekit doctor` is the image's doctor on any host.
RUNS_THE_DOCTOR = {"imagekit.cli.doctor_cmd": {"imagekit.in_image.imagekit_doctor"}}


def _in_image_imports(path: Path) -> set[str]:
    """Every import of an in-image module: top-level names, and ``.name`` for a relative one."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:
            found |= {f".{node.module}"} if node.module else {f".{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.seconds
@pytest.mark.parametrize("module", [m for m in MODULES if _layer(m) == "in_image"])
def test_in_image_code_imports_the_standard_library_and_its_siblings_only(module):
    """It runs in the image under any Python >= 3.8, where imagekit is not installed: no `imagekit.*` import, only
    the 3.8 standard library, its sibling modules (beside it in /opt/imagekit/doctor/) and what its checks probe."""
    path = ROOT / Path(*module.split(".")).with_suffix(".py")
    if path.name == "__init__.py" or not path.exists():
        path = ROOT / Path(*module.split(".")) / "__init__.py"
    bad = []
    for name in sorted(_in_image_imports(path)):
        top = name.lstrip(".").split(".")[0]
        sibling = name.startswith(".") or top in SIBLINGS
        stdlib = top in sys.stdlib_module_names and top not in AFTER_PY38
        if not (sibling or stdlib or top in UNDER_TEST) or top == "imagekit":
            bad.append(name)
    assert not bad, f"{module} runs in the image with the standard library and its siblings only; it imports {bad}"


def test_the_facts_module_imports_nothing_but_the_standard_library():
    """The one in-image module the core imports: no sibling, so the core never pulls in a program."""
    names = _in_image_imports(IN_IMAGE / "facts.py")
    assert names and all(n.split(".")[0] in sys.stdlib_module_names for n in names), names


def _from_in_image(module: str) -> set[str]:
    """The in-image modules ``module`` imports, by full name (``from imagekit.in_image import facts`` included)."""
    rel = Path(*module.split("."))
    path = ROOT / rel.with_suffix(".py") if (ROOT / rel.with_suffix(".py")).exists() else ROOT / rel / "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("imagekit.in_image")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "imagekit.in_image":
                found |= {f"imagekit.in_image.{a.name}" for a in node.names}
            elif node.module.startswith("imagekit.in_image"):
                found.add(node.module)
            elif node.module == "imagekit" and any(a.name == "in_image" for a in node.names):
                found.add("imagekit.in_image")
    return found


@pytest.mark.parametrize("module", [m for m in MODULES if _layer(m) not in ("in_image", "entry")])
def test_the_host_imports_the_shared_facts_not_the_in_image_programs(module):
    """The core depends on facts, not on a program: of the in-image package the host imports `facts` only (the
    `imagekit doctor` command, which runs the doctor in-process, excepted)."""
    allowed = {SHARED_FACTS} | RUNS_THE_DOCTOR.get(module, set())
    bad = sorted(_from_in_image(module) - allowed)
    assert not bad, f"{module} imports {bad}: put what the host and the image share in {SHARED_FACTS}"


def test_the_core_imports_the_facts_module():
    """The rules, the lock format and the resolution check judge by the same facts as the doctor in the image."""
    for module in (
        "imagekit.compat.rules",
        "imagekit.locking.lockfile",
        "imagekit.locking.resolution",
        "imagekit.trust.validate",
    ):
        assert _from_in_image(module) == {SHARED_FACTS}, module


# One interpreter loads the third-party libraries, then forks a child per module: each child starts with no imagekit
# module loaded, so an import that works only after another imagekit module ran still fails, in milliseconds.
_FORK_EACH = """
import importlib, os, sys
for lib in ("typer", "rich.console", "jinja2", "httpx", "paramiko", "packaging.version", "packaging.requirements",
            "packaging.tags", "packaging.utils", "hypothesis", "tarfile", "tomllib", "concurrent.futures", "netrc",
            "html.parser", "http.server", "grp", "pwd"):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
assert not [m for m in sys.modules if m == "imagekit" or m.startswith("imagekit.")]
for module in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(module)
        except BaseException as exc:
            sys.stderr.write(f"{module}: {type(exc).__name__}: {exc}\\n")
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status:
        print(module)
"""


@pytest.mark.programs
def test_every_module_imports_on_its_own():
    """Each module in a fresh interpreter, alone: an import that works only after another module ran is a defect."""
    alone = [m for m in MODULES if m != "imagekit.__main__"]  # `python -m imagekit`: importing it runs the CLI
    res = subprocess.run([sys.executable, "-c", _FORK_EACH, *alone], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == [], res.stderr[-3000:]


def test_module_names_do_not_repeat_across_folders():
    """One name, one thing: `selftest` in the image and on the host, `progress` in the CLI and the services ..."""
    by_name: dict[str, list[str]] = {}
    for module in MODULES:
        name = module.rsplit(".", 1)[-1]
        if name not in ("__init__", "__main__") and module.count(".") >= 1 and name != "imagekit":
            by_name.setdefault(name, []).append(module)
    repeated = {name: where for name, where in by_name.items() if len(where) > 1}
    assert not repeated, repeated


# ---- the core by domain: which package may use which ---------------------------------------------------------------
# Each core package may import its own modules, `imagekit.model`/`imagekit.errors`, the shared facts, and the packages
# named here; the table has no cycle, so each domain can be read (and tested) from the bottom up.
CORE_PACKAGES = {
    "trust": set(),  # another party's data: untrusted input, validation, redaction, the registry-host rule
    "compat": {"trust"},  # facts, rules, PyPI metadata, refresh, the runtime contract
    "locking": {"compat", "trust"},  # what to ask the resolver, the lock format, what may be locked
    "oci": {"compat", "trust"},  # media types, layer blobs, image indexes, the release record, publish formats
    "image": {"compat", "locking", "trust"},  # the plan, the render, layers, steps, runtime config, names
    "matrix": {"compat", "image", "locking", "trust"},  # the matrix file and what it becomes for CI and engines
    "supplychain": {"image", "locking", "oci", "trust"},  # SBOM, signatures, the vulnerability gate
    "clouds": {"compat", "image", "oci", "trust"},  # providers, templates, pod creation, the pod wire protocol
    "pages": {"clouds", "compat", "image", "matrix", "oci", "trust"},  # the release page: records on the grid
}
LAYER_PACKAGES = {"cli", "services", "effects", "in_image", "data"}


def test_every_package_is_a_layer_or_a_declared_core_domain():
    found = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert found == set(CORE_PACKAGES) | LAYER_PACKAGES, "declare a new package in CORE_PACKAGES with what it may use"


def test_the_core_domains_use_each_other_without_a_cycle():
    order: list[str] = []
    remaining = dict(CORE_PACKAGES)
    while remaining:
        ready = sorted(p for p, deps in remaining.items() if deps <= set(order))
        assert ready, f"a cycle among {sorted(remaining)}"
        order += ready
        for p in ready:
            del remaining[p]


@pytest.mark.parametrize("module", [m for m in MODULES if m.split(".")[1:2] and m.split(".")[1] in CORE_PACKAGES])
def test_a_core_domain_imports_only_the_domains_it_is_allowed(module):
    own = module.split(".")[1]
    allowed = CORE_PACKAGES[own] | {own}
    bad = sorted(
        name
        for name in _imports(module)
        if name.startswith("imagekit.") and name.split(".")[1] in CORE_PACKAGES and name.split(".")[1] not in allowed
    )
    assert not bad, f"{module} imports {bad}: {own}/ may use {sorted(CORE_PACKAGES[own]) or 'no other domain'}"
