"""The README's Quick tour works verbatim on a fresh clone.

Each line of the Quick tour block runs, in order, in a copy of the repository (its tracked and unignored files,
nothing built), with an empty user data folder; lines needing Docker, a registry, a RunPod key or gigabytes of
downloads are skipped by the explicit list below, each with its reason. Optional `[--flag]` groups run both ways:
without them, then with every group that has no placeholder in it. `lock` and `compat refresh` may reach PyPI;
nothing needs the PyTorch index.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SKIPPED = {
    "imagekit base bootstrap": "needs Docker and mmdebstrap",
    "imagekit fetch": "downloads gigabytes of wheels (tests/services/test_fetch.py runs it against a loopback index)",
    "imagekit build --cuda 11.8": "needs Docker, a registry for --push, and the PyTorch index for cu118",
    "imagekit runpod-template": "needs a published image in a release index; --create needs RUNPOD_API_KEY",
    "imagekit pod": "needs a live RunPod pod",
}
# The doctor judges the machine it runs on: here, a developer's host with no torch and no GPU, so "the check said
# no" (exit 1, with the report) is the feature working. `compat refresh --check` runs right after `compat refresh`
# wrote the user data: up to date, unless PyPI published a release in between (exit 1 naming it, the check working).
EXIT_CODES = {"imagekit doctor": (0, 1), "imagekit compat refresh --check": (0, 1)}
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{2,}\b|\.\.\.|\|")


def quick_tour() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick tour", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md has no ```bash block under ## Quick tour"
    lines = []
    for raw in block[1].splitlines():
        line = re.sub(r"\s+#\s.*$", "", raw).strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def variants(line: str) -> list[str]:
    """The line without its optional groups, then with every group free of placeholders."""
    groups = re.findall(r"\[([^\]]*)\]", line)
    bare = re.sub(r"\s*\[[^\]]*\]", "", line)
    full = bare + "".join(f" {g}" for g in groups if not PLACEHOLDER.search(g))
    return [bare] if full == bare else [bare, full]


def skipped(line: str) -> str | None:
    return next((why for prefix, why in SKIPPED.items() if line.startswith(prefix + " ") or line == prefix), None)


LINES = quick_tour()
RUNS = [v for line in LINES if not skipped(line) for v in variants(line)]
REACHES_PYPI = ("imagekit compat refresh",)  # asks PyPI for every release of the packages the rules know


def test_the_skip_list_names_real_lines_and_every_other_line_is_runnable():
    for prefix in SKIPPED:
        assert any(line.startswith(prefix) for line in LINES), f"{prefix!r} is skipped but not in the Quick tour"
    for run in RUNS:
        assert run.startswith("imagekit "), run
        assert not PLACEHOLDER.search(run), f"{run!r} has a placeholder: give it a real value or skip it"
    assert len(RUNS) >= 10


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's files as a fresh clone has them (git's tracked and unignored files; nothing built)."""
    dest = tmp_path_factory.mktemp("clone") / "imagekit"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.mark.programs
@pytest.mark.parametrize(
    "line", [pytest.param(r, marks=pytest.mark.network) if r.startswith(REACHES_PYPI) else r for r in RUNS]
)
def test_quick_tour_line_works_verbatim(clone: Path, line: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    data_dir = tmp_path_factory.getbasetemp() / "tour-user-data"  # shared by the lines, as a user's would be
    env = {
        **os.environ,
        "IMAGEKIT_DATA_DIR": str(data_dir),
        "NO_COLOR": "1",
        "COLUMNS": "200",
        "UV_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "tour-uv-cache"),
    }
    argv = [sys.executable, "-m", *shlex.split(line)]  # `imagekit ...` as `python -m imagekit ...`, from the clone
    res = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    allowed = next((codes for prefix, codes in EXIT_CODES.items() if line.startswith(prefix)), (0,))
    assert res.returncode in allowed, f"{line}\nexit {res.returncode}\n{res.stderr[-3000:]}"
    assert "Traceback" not in res.stderr
