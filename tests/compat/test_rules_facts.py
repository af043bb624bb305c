"""Every fact in docs/compat-facts.md that the rules encode, evaluated as the facts say, with its source; and
every citation of it in the curated data names a section it has."""

from __future__ import annotations

import re

import pytest

from imagekit.compat import rules
from imagekit.errors import UnknownVersionError
from imagekit.model import Query
from tests.conftest import ROOT

FACTS = ROOT / "docs" / "compat-facts.md"
CURATED = ROOT / "imagekit" / "data" / "compat.toml"
# `compat-facts table 1`, `compat-facts 2b: 'same lists as above'` (a quote from that section)
CITATION = re.compile(r"compat-facts (table )?(\d+[a-z]?)\b(?::\s*'([^']+)')?")
SECTION_COMMENT = re.compile(r"^# --- (\d+[a-z]?)\. ", re.M)  # `# --- 2a. CUDA toolkit -> ...`: its section


def facts_sections(text: str) -> dict[str, str]:
    """The numbered sections of the facts document: `## 2b. Title` -> its text, up to the next `## `."""
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    return {m[1]: part for part in parts if (m := re.match(r"(\d+[a-z]?)\. ", part))}


def test_every_citation_of_the_facts_names_a_section_they_have():
    curated = CURATED.read_text()
    sections = facts_sections(FACTS.read_text())
    assert {"1", "2a", "2b", "3"} <= set(sections)
    cited = CITATION.findall(curated)
    assert len(cited) >= 18  # 16 glibc sources (table 1), 2 arch lists carried forward (2b)
    for table, ident, quote in cited:
        assert ident in sections, f"compat.toml cites compat-facts {table}{ident}; {FACTS.name} has no section {ident}"
        if table:
            assert re.search(r"^\|.*\|$", sections[ident], re.M), f"section {ident} of {FACTS.name} has no table"
        if quote:
            assert quote in sections[ident], f"section {ident} of {FACTS.name} does not say {quote!r}"
    headings = SECTION_COMMENT.findall(curated)
    assert headings == ["1", "2a", "2b"]
    assert all(h in sections for h in headings)
    assert "docs/compat-facts.md" in curated  # where the comments say the facts come from


def test_the_citation_check_fails_on_a_missing_section():
    text = FACTS.read_text()
    assert "2b" not in facts_sections(text.replace("## 2b. ", "## 2c. "))
    assert "1" not in facts_sections(text.replace("## 1. ", "## One. "))


# (id, query, expected rule or None for compatible, substring of the cited source)
CASES = [
    # Table 1: which CUDA variants each torch release ships
    ("2.5-has-cu118", dict(torch="2.5.1", cuda="11.8"), None, None),
    ("2.8-no-cu118", dict(torch="2.8.0", cuda="11.8"), "cuda-variant", "TI release/2.8"),
    ("2.12-dropped-cu128", dict(torch="2.12.0", cuda="12.8"), "cuda-variant", "GH #182849"),
    ("2.12-has-cu132", dict(torch="2.12.0", cuda="13.2"), None, None),
    ("2.9-cu129-not-advertised", dict(torch="2.9.1", cuda="12.9"), "cuda-variant", "TI release/2.9"),
    ("2.0-no-cu121", dict(torch="2.0.1", cuda="12.1"), "cuda-variant", "PV"),
    ("2.6-no-cu128", dict(torch="2.6.0", cuda="12.8"), "cuda-variant", "TI release/2.6"),
    ("2.7-has-cu128", dict(torch="2.7.1", cuda="12.8"), None, None),
    # Table 1: Python windows of PyPI wheels
    ("2.1-no-py3.12", dict(torch="2.1.2", python="3.12"), "python-torch", "PYPI"),
    ("2.2-has-py3.12", dict(torch="2.2.2", python="3.12"), None, None),
    ("2.4-no-py3.13", dict(torch="2.4.1", python="3.13"), "python-torch", "PYPI"),
    ("2.5-added-py3.13", dict(torch="2.5.1", python="3.13"), None, None),
    ("2.9-dropped-py3.9", dict(torch="2.9.1", python="3.9"), "python-torch", "PYPI"),
    ("2.9-added-py3.14", dict(torch="2.9.1", python="3.14"), None, None),
    ("1.13-has-py3.11", dict(torch="1.13.1", python="3.11"), None, None),
    # Table 2a: driver floors under minor-version compatibility
    ("cu118-floor-ok", dict(cuda="11.8", driver="450.80.02"), None, None),
    ("cu118-below-floor", dict(cuda="11.8", driver="450.80.01"), "driver-floor", "minor-version-compatibility"),
    ("cu124-floor-ok", dict(cuda="12.4", driver="525.60.13"), None, None),
    ("cu124-below-floor", dict(cuda="12.4", driver="520.61.05"), "driver-floor", "minor-version-compatibility"),
    ("cu130-below-floor", dict(cuda="13.0", driver="575.57.08"), "driver-floor", "minor-version-compatibility"),
    ("cu130-floor-ok", dict(cuda="13.0", driver="580.65.06"), None, None),
    (
        "design-example",
        dict(cuda="12.4", torch="2.5.1", transformers="4.48.2", python="3.11", archs=("sm_90",), driver="535.104.05"),
        None,
        None,
    ),
    # Table 2b: GPU archs compiled into each variant
    ("cu118-has-sm90", dict(torch="2.5.1", cuda="11.8", archs=("sm_90", "sm_37")), None, None),
    ("cu117-no-sm90", dict(torch="2.0.1", cuda="11.7", archs=("sm_90",)), "gpu-arch", "BLD release/2.0"),
    ("cu126-no-blackwell", dict(torch="2.6.0", cuda="12.6", archs=("sm_100",)), "gpu-arch", "(I)"),
    ("2.7-cu128-blackwell", dict(torch="2.7.1", cuda="12.8", archs=("sm_100", "sm_120")), None, None),
    ("2.7-cu128-no-volta", dict(torch="2.7.1", cuda="12.8", archs=("sm_70",)), "gpu-arch", "vs-playground#59"),
    ("2.8-cu128-has-volta", dict(torch="2.8.0", cuda="12.8", archs=("sm_70",)), None, None),
    ("2.11-cu128-no-volta", dict(torch="2.11.0", cuda="12.8", archs=("sm_70",)), "gpu-arch", "#172598"),
    ("cu130-never-volta", dict(torch="2.9.1", cuda="13.0", archs=("sm_70",)), "gpu-arch", "#164471"),
    ("2.8-cu126-keeps-pascal", dict(torch="2.8.0", cuda="12.6", archs=("sm_60",)), None, None),
    ("2.8-cu128-no-pascal", dict(torch="2.8.0", cuda="12.8", archs=("sm_60",)), "gpu-arch", "CI @00c7a380"),
    ("sm89-via-sm86-cubin", dict(torch="2.5.1", cuda="12.4", archs=("sm_89",)), None, None),
    ("sm103-via-sm100-cubin", dict(torch="2.9.1", cuda="13.0", archs=("sm_103",)), None, None),
    (
        "ptx-only-needs-new-driver",
        dict(torch="2.8.0", cuda="12.9", archs=("sm_130",), driver="560.35.03"),
        "ptx-jit-driver",
        "NVIDIA CUDA Toolkit Release Notes",
    ),
    ("no-ptx-no-run", dict(torch="2.8.0", cuda="12.8", archs=("sm_130",)), "gpu-arch", "CI @00c7a380"),
    # Table 3: transformers' Python and torch floors (from METADATA)
    ("tf5.9-needs-torch2.4", dict(transformers="5.9.0", torch="2.3.1"), "transformers-torch", "transformers 5.9.0"),
    ("tf5.9-torch2.4-ok", dict(transformers="5.9.0", torch="2.4.1"), None, None),
    ("tf4.48-needs-py3.9", dict(transformers="4.48.0", python="3.8"), "python-transformers", "PYPI"),
    ("tf5.0-needs-py3.10", dict(transformers="5.0.0", python="3.9"), "python-transformers", "PYPI"),
    ("tf5.24-needs-py3.11", dict(transformers="5.24.0", python="3.10"), "python-transformers", "PYPI"),
    ("tf5.20-needs-torch2.6", dict(transformers="5.20.0", torch="2.5.1"), "transformers-torch", "PYPI"),
    ("tf4.52-caps-torch-below-2.7", dict(transformers="4.52.0", torch="2.7.1"), "transformers-torch", "PYPI"),
    ("tf4.46-yanked", dict(transformers="4.46.0"), "package-yanked", "PYPI"),
    # Table 4/5: extra packages' floors and exact pins
    ("accelerate1.15-needs-py3.10", dict(packages=("accelerate==1.15.0",), python="3.9"), "package-python", "PYPI"),
    (
        "trl0.20-needs-tf4.53.2",
        dict(packages=("trl==0.20.0",), transformers="4.48.2"),
        "package-requires",
        "trl 0.20.0",
    ),
    (
        "torchvision-pins-torch",
        dict(packages=("torchvision==0.20.1",), torch="2.5.0"),
        "package-requires",
        "torchvision",
    ),
    ("torchvision-pair-ok", dict(packages=("torchvision==0.20.1",), torch="2.5.1"), None, None),
    ("trl1.16-needs-py3.11", dict(packages=("trl==1.16.0",), python="3.10"), "package-python", "PYPI"),
    # glibc: 2.7+ wheels are manylinux_2_28
    ("2.7-needs-glibc2.28", dict(torch="2.7.1", base_glibc="2.27"), "glibc", "PYPI"),
    ("2.6-fine-on-glibc2.17", dict(torch="2.6.0", base_glibc="2.17"), None, None),
]


@pytest.mark.parametrize(("query", "rule", "source"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fact(data, query, rule, source):
    verdict = rules.evaluate(Query(**query), data)
    found = {v.rule: v for v in verdict.violations}
    if rule is None:
        assert verdict.compatible, verdict.violations
    else:
        assert rule in found, verdict.violations
        assert source in found[rule].source, found[rule].source
        assert found[rule].message


def test_unknown_torch_is_an_error_not_a_guess():
    """torch 2.15 has no curated [[torch]] table: with metadata that does not name its CUDA runtime, nothing is
    derived, and nothing guessed."""
    import copy

    from imagekit.compat import catalog as compat

    doc = copy.deepcopy(compat.shipped_metadata())
    del doc["torch"]["2.15.0"]["cuda_runtime"]
    with pytest.raises(UnknownVersionError) as exc:
        rules.evaluate(Query(torch="2.15.0", cuda="13.2"), compat.parse(compat.curated_document(), doc))
    assert "compat refresh" in exc.value.hint


def test_a_torch_build_without_an_arch_list_is_unknown_not_compatible(data):
    """torch 2.15 has no curated [[arch]] table: its list is what its wheel says (read by `compat refresh`). Metadata
    from before that was read knows no list: no image of it could say which GPUs it runs on, so the cell is unknown."""
    import copy

    from imagekit.compat import catalog as compat

    doc = copy.deepcopy(compat.shipped_metadata())
    del doc["torch"]["2.15.0"]["archs"]
    with pytest.raises(UnknownVersionError) as exc:
        rules.evaluate(Query(torch="2.15.0", cuda="13.2"), compat.parse(compat.curated_document(), doc))
    assert "no GPU architecture list" in exc.value.message and "[[arch]]" in exc.value.hint
    assert rules.evaluate(Query(torch="2.15.0", cuda="13.2"), data).compatible
    entry = data.arch_entry("2.15.0", "cu132")
    assert entry is not None and entry.source.startswith("WHEEL torch 2.15.0") and entry.ptx is None


def test_unknown_transformers_is_an_error(data):
    with pytest.raises(UnknownVersionError):
        rules.evaluate(Query(transformers="9.9.9"), data)


def test_unknown_cuda_major_is_an_error(data):
    with pytest.raises(UnknownVersionError):
        rules.evaluate(Query(cuda="14.0", driver="600.1.1"), data)


@pytest.mark.parametrize(
    ("minor", "variant"),
    [
        ("1.13", "cu117"),
        ("2.0", "cu117"),
        ("2.1", "cu121"),
        ("2.4", "cu121"),
        ("2.5", "cu124"),
        ("2.6", "cu124"),
        ("2.7", "cu126"),
        ("2.8", "cu128"),
        ("2.10", "cu128"),
        ("2.11", "cu130"),
        ("2.14", "cu130"),
    ],
)
def test_pypi_default_variant(data, minor, variant):
    assert data.torch_minors[minor].pypi_default == variant


def test_pypi_default_agrees_with_torch_metadata(data):
    """The curated PyPI-default variant matches the CUDA runtime torch's own METADATA pins, for every release."""
    checked = 0
    for version, rel in data.torch_releases.items():
        minor = ".".join(version.split(".")[:2])
        if minor not in data.torch_minors or not rel.get("cuda_runtime"):
            continue
        runtime = ".".join(rel["cuda_runtime"].split(".")[:2])
        assert "cu" + runtime.replace(".", "") == data.torch_minors[minor].pypi_default, version
        checked += 1
    assert checked >= 25


def test_every_variant_has_an_arch_list(data):
    for minor, tm in data.torch_minors.items():
        for variant in tm.variants:
            assert data.arch_entry(f"{minor}.0", variant) is not None, (minor, variant)


@pytest.mark.parametrize(
    ("name", "sm"),
    [
        ("H100", "sm_90"),
        ("B200", "sm_100"),
        ("RTX 5090", "sm_120"),
        ("A100", "sm_80"),
        ("L40S", "sm_89"),
        ("V100", "sm_70"),
    ],
)
def test_gpu_names(data, name, sm):
    from imagekit.trust.validate import arch

    assert arch(name, data.gpus) == sm


def test_every_source_key_is_defined(data):
    for tm in data.torch_minors.values():
        for key in (tm.variants_source, tm.pypi_default_source):
            assert data.source(key) != key, key
    for entry in data.archs:
        assert data.source(entry.source) != entry.source or entry.confidence == "I", entry.source


def _rule_ids_in_source() -> set[str]:
    """The rule ids `rules.py` writes into a Violation: its first argument, a literal or a name bound to literals."""
    import ast

    def literals(node: ast.expr) -> set[str]:  # `"a"`, or `"a" if ... else "b"`
        if isinstance(node, ast.IfExp):
            return literals(node.body) | literals(node.orelse)
        return (
            {node.value}
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            else {f"?{ast.unparse(node)}"}
        )

    tree = ast.parse((ROOT / "imagekit" / "compat" / "rules.py").read_text())
    found: set[str] = set()
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        bound: dict[str, set[str]] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                bound.setdefault(node.targets[0].id, set()).update(literals(node.value))
        for call in ast.walk(fn):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Violation" and call.args:
                first = call.args[0]
                found |= bound[first.id] if isinstance(first, ast.Name) else literals(first)
    return found


def test_rule_ids_name_every_rule_the_rules_report_and_no_other():
    """`RULE_IDS` is the list of what a violation's `rule` can be (`explain --json`, `matrix --explain`)."""
    assert len(set(rules.RULE_IDS)) == len(rules.RULE_IDS)
    assert _rule_ids_in_source() == set(rules.RULE_IDS)


def test_every_violation_a_sweep_of_the_data_finds_carries_a_known_rule_id(data):
    seen: set[str] = set()
    for torch in sorted(data.torch_releases)[::3]:
        for cuda in ("11.8", "12.1", "12.4", "12.8", "13.0"):
            for platform in ("linux/amd64", "linux/arm64"):
                query = Query(cuda=cuda, torch=torch, python="3.8", transformers="4.48.2", archs=("sm_70", "sm_120"),
                              driver="450.80.02", base_glibc="2.17", platform=platform)  # fmt: skip
                try:
                    seen |= {v.rule for v in rules.evaluate(query, data).violations}
                except UnknownVersionError:
                    continue
    assert seen and seen <= set(rules.RULE_IDS), seen - set(rules.RULE_IDS)
    assert {"cuda-variant", "driver-floor", "gpu-arch", "glibc"} <= seen
