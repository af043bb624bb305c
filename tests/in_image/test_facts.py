"""imagekit/in_image/facts.py: what the build host and the image both judge by, defined once.

One sm_XY parser and one rule for which compiled code runs on a GPU (the core's rules, the doctor and the
self-test's GPU checks all ask it), one lock-drift comparison (the self-test's `dists-match-lock` and the doctor's
`lock-drift`), one torch family, one name canonicalisation.
"""

from __future__ import annotations

import ast
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagekit.compat import rules
from imagekit.in_image import facts, gpu_checks, selftest
from imagekit.in_image import imagekit_doctor as doctor
from imagekit.locking import lockfile, resolution
from imagekit.trust import validate
from tests.conftest import ROOT
from tests.props import examples

IN_IMAGE = ROOT / "imagekit" / "in_image"


# ---- one definition -------------------------------------------------------------------------------------------
@pytest.mark.seconds
def test_the_shared_names_are_defined_in_facts_only():
    """No other in-image module defines its own copy (there were two `canon`s, two `VENV_SEEDS`, three parsers)."""
    shared = {"canon", "VENV_SEEDS", "TORCH_FAMILY", "is_torch_family", "arch_key", "parse_arch", "best_kernel", "SM"}
    shared |= {"lock_drift", "runs_on"}
    for path in sorted(IN_IMAGE.glob("*.py")):
        if path.name == "facts.py":
            continue
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        assert not defined & shared, (path.name, defined & shared)
    assert lockfile.TORCH_FAMILY is facts.TORCH_FAMILY and resolution.is_torch_family is facts.is_torch_family
    from imagekit.in_image import doctor_gpu, doctor_python

    assert doctor_gpu.facts is facts and doctor_python.facts is facts and selftest.facts is facts
    assert gpu_checks.facts is facts and doctor.check_drift is doctor_python.check_drift


def test_facts_imports_only_the_standard_library():
    tree = ast.parse((IN_IMAGE / "facts.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "os", "re", "stat"}, imported


def test_torch_family_and_canonical_names():
    assert [facts.is_torch_family(n) for n in ("torch", "nvidia-cudnn-cu12", "cuda-toolkit", "transformers")] == [
        True,
        True,
        True,
        False,
    ]
    assert facts.canon("Foo_Bar..baz-_Qux") == "foo-bar-baz-qux"


@settings(derandomize=True, max_examples=examples(300))
@given(st.from_regex(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,20}[A-Za-z0-9])?", fullmatch=True))
def test_canon_is_packagings_canonical_name(name):
    from packaging.utils import canonicalize_name

    assert facts.canon(name) == canonicalize_name(name)


# ---- the arch parser --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("sm_90", (9, 0, "")),
        ("sm_90a", (9, 0, "a")),
        ("sm_100f", (10, 0, "f")),
        ("sm_120", (12, 0, "")),
        ("compute_90", (9, 0, "")),
        ("90", (9, 0, "")),
        ("8.6", (8, 6, "")),
        ("10.0f", (10, 0, "f")),
        (" sm_86 ", (8, 6, "")),
        ("sm_9", None),
        ("sm_1234", None),
        ("sm_٩٠", None),  # Arabic-Indic digits are not a compute capability
        ("sm_90\n1", None),
        ("x", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_arch(text, parsed):
    assert facts.parse_arch(text) == parsed
    assert facts.arch_key(text) == (parsed[:2] if parsed else None)


def test_validate_reads_archs_with_the_same_parser():
    for text in ("sm_90", "sm_90a", "sm_100f", "sm_120", "sm_86"):
        assert validate.arch_key(text) == facts.arch_key(text)
        assert validate.arch(text) == text
    assert validate.arch("90a") == "sm_90a" and validate.arch("12.0") == "sm_120"
    for bad in ("compute_90", "sm_90 ", "٩٠"):
        with pytest.raises(validate.UsageError):
            validate.arch(bad)


# ---- the one rule -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("target", "cubins", "ptx", "how"),
    [
        ((8, 9), ["sm_86", "sm_80", "sm_89"], None, ("cubin", (8, 9))),
        ((8, 9), ["sm_89", "sm_86", "sm_80"], None, ("cubin", (8, 9))),  # the highest, not the first listed
        ((8, 6), ["sm_80", "sm_90"], None, ("cubin", (8, 0))),
        ((9, 0), ["sm_80"], "sm_100", None),  # PTX runs only at or above its own capability
        ((10, 0), ["sm_90"], "sm_100", ("ptx", (10, 0))),
        ((12, 0), ["sm_90"], ["compute_80", "compute_90"], ("ptx", (9, 0))),  # the highest PTX
        ((12, 0), ["sm_120", "sm_90"], "compute_90", ("cubin", (12, 0))),  # a cubin before the JIT
        ((9, 0), ["sm_90a"], None, ("cubin", (9, 0))),
        ((10, 0), ["sm_90a"], "compute_90a", None),  # arch-specific: its own GPU only, cubin and PTX alike
        ((10, 3), ["sm_100f"], None, ("cubin", (10, 0))),  # a family cubin runs on the family
        ((10, 3), ["sm_100a"], None, None),
        ((7, 0), ["sm_75", "sm_80"], None, None),
        ((9, 0), ["garbage", "sm_90"], None, ("cubin", (9, 0))),
    ],
)
def test_best_kernel(target, cubins, ptx, how):
    assert facts.best_kernel(target, cubins, ptx) == how
    assert facts.best_kernel(f"{target[0]}.{target[1]}", cubins, ptx) == how  # a capability as nvidia-smi writes it


ARCHS = st.builds(lambda major, minor, suffix: f"sm_{major}{minor}{suffix}", st.integers(3, 12), st.integers(0, 9),
                  st.sampled_from(["", "", "", "a", "f"]))  # fmt: skip


@pytest.mark.seconds
@settings(derandomize=True, max_examples=examples(400))
@given(st.tuples(st.integers(3, 12), st.integers(0, 9)), st.lists(ARCHS, max_size=8), st.randoms())
def test_the_chosen_cubin_runs_no_higher_one_does_and_the_order_does_not_matter(target, cubins, rnd):
    how = facts.best_kernel(target, cubins)
    running = [facts.arch_key(a) for a in cubins if facts.runs_on(a, target)]
    assert how == (("cubin", max(running)) if running else None)
    for key in running:
        assert key[0] == target[0] and key <= target  # same major, not newer than the GPU
    shuffled = list(cubins)
    rnd.shuffle(shuffled)
    assert facts.best_kernel(target, shuffled) == how


def test_the_core_the_doctor_and_the_gpu_checks_judge_every_arch_entry_alike(data):
    """The three callers that each had their own parser: the build host's rules, the doctor (nvidia-smi's compute
    capability against the manifest) and the self-test's GPU checks (torch.cuda.get_arch_list())."""
    gpus = sorted({*data.gpus.values(), "7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "10.3", "12.0", "12.1"})
    judged = 0
    for entry in data.archs:
        archs = [f"sm_{a.replace('.', '')}" for a in entry.archs]
        ptx = f"sm_{entry.ptx.replace('.', '')}" if entry.ptx else None
        arch_list = archs + ([f"compute_{entry.ptx.replace('.', '')}"] if entry.ptx else [])
        for cc in gpus:
            cap = tuple(int(p) for p in cc.split("."))
            core = rules.how_arch_runs(entry, f"sm_{cc.replace('.', '')}")
            ok, how = doctor.arch_runs(cc, archs, ptx)
            gpu_ok, gpu_how = gpu_checks.arch_supported(cap, list(reversed(arch_list)))  # order is no signal
            assert ok == gpu_ok == (core is not None), (entry, cc, core, how, gpu_how)
            if core and core.startswith("cubin"):
                assert how == core == f"cubin {gpu_how}", (entry, cc)
            judged += 1
    assert judged > 50


def test_the_gpu_checks_name_the_highest_cubin_not_the_first():
    """The self-test's GPU checks took the first same-major cubin of torch's list (sm_80 for an 8.9 GPU)."""
    assert gpu_checks.arch_supported((8, 9), ["sm_80", "sm_86", "sm_89", "compute_89"]) == (True, "sm_89")
    assert gpu_checks.arch_supported((12, 1), ["sm_90", "compute_90"]) == (True, "compute_90 (PTX JIT)")
    assert gpu_checks.arch_supported((9, 0), ["sm_80", "sm_100", "compute_100"]) == (False, None)


# ---- one lock-drift comparison ------------------------------------------------------------------------------------
def test_lock_drift():
    want = {"Torch": "2.5.1+cu124", "alpha_beta": "1.0", "gamma": "2.0"}
    have = {"torch": "2.5.1+cu121", "Alpha.Beta": "1.0", "pip": "24.0", "setuptools": "75", "extra-one": "3"}
    found = {"missing": ["gamma"], "extra": ["extra-one"], "different": ["torch"], "duplicates": []}
    assert facts.lock_drift(want, have) == found
    assert facts.lock_drift(want, want) == {"missing": [], "extra": [], "different": [], "duplicates": []}
    # the seeds an image's manifest declares are the only ones not extra there
    assert facts.lock_drift(want, have, facts.declared_seeds({"python": {"seeds": ["pip"]}}))["extra"] == [
        "extra-one",
        "setuptools",
    ]


def test_the_self_test_and_the_doctor_find_the_same_drift():
    """Both checks over this interpreter's real environment, each through its own reading of it, with a lock that
    differs from it in each way: the same names missing, different and extra in both (the self-test fails an extra;
    the doctor warns)."""
    have = {n: found[0][0] for n, found in selftest.installed().items()}
    assert len(have) > 10, sys.prefix
    names = sorted(set(have) - facts.VENV_SEEDS)
    want = {n: v for n, v in have.items() if n != names[0]}  # names[0] is extra
    want[names[1]] = "0.0.0+other"  # different
    want["not-installed-anywhere"] = "1.0"  # missing
    manifest = {"distributions": want}
    tested = selftest.check_distributions(manifest)
    live = doctor.check_drift(doctor.describe_interpreter(None), manifest)
    assert tested["id"] == "dists-match-lock" and live["id"] == "lock-drift"
    assert tested["status"] == live["status"] == "fail"
    assert tested["evidence"]["missing"] == live["evidence"]["missing"] == ["not-installed-anywhere"]
    assert tested["evidence"]["extra"] == list(live["evidence"]["extra"]) == [names[0]]
    assert [d.split(" ")[0] for d in tested["evidence"]["different"]] == list(live["evidence"]["different"])
    assert list(live["evidence"]["different"]) == [names[1]]


# torch._C._cuda_getArchFlags() as PyPI's wheels answer it (read 2026-12-02, docs/compat-facts.md [WHEEL])
TORCH_2_15_CU132 = "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"
SASS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def test_the_self_tests_arch_check_holds_the_image_to_its_promise():
    assert facts.compiled_archs(TORCH_2_15_CU132 + " compute_120") == (SASS, ["sm_120"])
    assert facts.arch_contract_problems(TORCH_2_15_CU132, SASS, None) == []
    # a contract promising PTX the wheel lacks (what the curated 2.14 cu130 row said): a newer GPU would be sent to it
    assert facts.arch_contract_problems(TORCH_2_15_CU132, SASS, "sm_120") == ["no PTX for sm_120"]
    assert facts.arch_contract_problems(TORCH_2_15_CU132, ["sm_70", *SASS], None) == ["no sm_70 cubin"]
    # more kernels than promised is no problem: the contract is only conservative
    assert facts.arch_contract_problems(TORCH_2_15_CU132 + " sm_90a compute_120", ["sm_80"], "sm_120") == []
    assert facts.compiled_archs("garbage compute_ sm_ sm_x9") == ([], [])
