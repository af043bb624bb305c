"""docs/architecture.md's "A new `[image]` key, as a diff" cannot fall behind the code: its diff still applies to the
tree, and its `--stat` lines say what the diff does."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

HEADING = "### A new `[image]` key, as a diff"


def _diff_block(text: str) -> str:
    """The first ```diff block under the heading."""
    assert HEADING in text, f"docs/architecture.md has no {HEADING!r} section"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    m = re.search(r"^```diff\n(.*?)^```$", section, re.M | re.S)
    assert m, f"no ```diff block under {HEADING!r}"
    return m[1]


def _git(*args: str, patch: str) -> subprocess.CompletedProcess[str]:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    return subprocess.run([git, *args], input=patch, cwd=ROOT, capture_output=True, text=True, timeout=30)


def test_the_new_image_key_diff_still_applies_to_the_tree():
    patch = _diff_block((ROOT / "docs" / "architecture.md").read_text())
    checked = _git("apply", "--check", "-", patch=patch)
    assert checked.returncode == 0, (
        f"docs/architecture.md's new-[image]-key diff no longer applies:\n{checked.stderr}"
        "hint: make the change again on this tree and paste its `git diff --stat` and `git diff -U1` there"
    )
    # its --stat lines are the diff's own, and it stays within the table's count: at most 3 files and a test
    numstat = _git("apply", "--numstat", "-", patch=patch).stdout.split("\n")
    counted = {path: int(added) for added, _, path in (line.split("\t") for line in numstat if line)}
    stated = {m[1]: int(m[2]) for m in re.finditer(r"^ (\S+)\s+\| (\d+) \+*$", patch, re.M)}
    assert stated == counted
    assert len([p for p in counted if not p.startswith("tests/")]) <= 3 and len(counted) <= 4
    assert {"imagekit/matrix/schema.py", "imagekit/image/image_options.py"} <= set(counted)
