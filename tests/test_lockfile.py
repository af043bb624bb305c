"""Lock parsing, rendering and the torch/app split (pure)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from imagekit import lockfile
from tests.conftest import ROOT

UV_OUTPUT = """\
filelock==3.16.1 \\
    --hash=sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
    # via
    #   torch
    #   transformers
    # from https://pypi.org/simple
numpy==1.26.4 \\
    --hash=sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
    # via transformers
nvidia-cuda-runtime-cu12==12.4.127 \\
    --hash=sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc
    # via torch
torch==2.5.1 \\
    --hash=sha256:dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd
    # via imagekit-cell (pyproject.toml)
transformers==4.48.2 \\
    --hash=sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee
    # via imagekit-cell (pyproject.toml)
"""


def test_split_follows_the_via_graph():
    entries = lockfile.parse_requirements(UV_OUTPUT)
    assert [e.name for e in entries] == ["filelock", "numpy", "nvidia-cuda-runtime-cu12", "torch", "transformers"]
    assert entries[0].via == ("torch", "transformers")
    torch_part, app_part = lockfile.split(entries)
    assert [e.name for e in torch_part] == ["filelock", "nvidia-cuda-runtime-cu12", "torch"]
    assert [e.name for e in app_part] == ["numpy", "transformers"]


def test_render_parse_round_trip():
    torch_part, app_part = lockfile.split(lockfile.parse_requirements(UV_OUTPUT))
    lock = lockfile.Lock(torch_part, app_part, {"cell": "x", "input-hash": "sha256:1"}, ("#", "# header"))
    again = lockfile.parse(lock.render())
    assert again == lock and again.content_hash == lock.content_hash and len(lock.short_hash) == 12


def test_content_hash_ignores_comments_but_not_pins():
    text = (ROOT / "lockfiles" / "cu124-torch2.5.1-py3.11-tf4.48.2.txt").read_text()
    lock = lockfile.parse(text)
    assert lockfile.parse(text.replace("# To update, run:", "# changed comment")).content_hash == lock.content_hash
    assert (
        lockfile.parse(text.replace("transformers==4.48.2", "transformers==4.48.3")).content_hash != lock.content_hash
    )


def test_credentials_are_redacted_everywhere():
    from imagekit.locking import redact, redact_text

    assert redact("https://ci:s3cret@pkgs.example.com/simple") == "https://pkgs.example.com/simple"
    assert redact("https://gitlab.example.com/api/v4/projects/7/packages/pypi/simple?private_token=glpat-abc") == (
        "https://gitlab.example.com/api/v4/projects/7/packages/pypi/simple?private_token=***"
    )
    assert redact("https://dl.cloudsmith.io/AbCdEf1234567890XyZ9/acme/repo/python/simple/") == (
        "https://dl.cloudsmith.io/***/acme/repo/python/simple/"
    )
    assert redact("https://download.pytorch.org/whl/cu118") == "https://download.pytorch.org/whl/cu118"
    text = "error: GET https://u:p@host/simple/torch/?token=zz failed; see https://pypi.org/simple"
    assert redact_text(text) == "error: GET https://host/simple/torch/?token=*** failed; see https://pypi.org/simple"


@pytest.mark.parametrize(
    "bad", ["", "https://pypi.org/simple\ntorch==9.9", "ftp://x/simple", "https://a b/simple", "pypi.org/simple"]
)
def test_index_urls_are_validated_before_anything_runs(bad):
    from imagekit.errors import UsageError
    from imagekit.locking import LockSettings

    with pytest.raises(UsageError):
        LockSettings(index_url=bad)
    with pytest.raises(UsageError):
        LockSettings(extra_index_urls=(bad,))


def test_a_newline_in_index_url_is_exit_2(app, runner, in_tmp):
    res = runner.invoke(
        app, ["lock", "--cell", "cu124-torch2.5.1-py3.11-tf4.48.2", "--index-url", "https://x/s\ntorch==1"]
    )
    assert res.exit_code == 2 and "invalid --index-url" in res.output and not (in_tmp / "lockfiles").exists()


# ---- a lock is verified before any use -------------------------------------------------------------------
CELL_ID = "cu121-torch2.1.2-py3.11-tf4.48.2"
OTHER_ID = "cu124-torch2.5.1-py3.11-tf4.48.2"


def _edit(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


def _tampered_cases() -> dict[str, tuple]:
    text = (ROOT / "lockfiles" / f"{CELL_ID}.txt").read_text()
    other = (ROOT / "lockfiles" / f"{OTHER_ID}.txt").read_text()
    accel = re.search(r"^accelerate==\S+ \\\n(    --hash=\S+( \\)?\n)+", text, re.M).group(0)
    return {
        "hand-edited pin": (_edit(text, "\ntransformers==4.48.2 ", "\ntransformers==4.49.0 "), "edited by hand"),
        "pin without hashes": (text.replace(accel, "accelerate==1.2.1\n"), "accelerate==1.2.1 has no --hash"),
        "duplicated pin": (_edit(text, accel, accel + accel), "accelerate is pinned twice"),
        "no pins": ("\n".join(ln for ln in text.splitlines() if ln.startswith("#")) + "\n", "no pins"),
        "another cell's lock": (other, f"is the lock of {OTHER_ID}, not of {CELL_ID}"),
        "no digest": (re.sub(r"^# imagekit-body-sha256: .*\n", "", text, flags=re.M), "not written by this"),
    }


@pytest.mark.parametrize("case", sorted(_tampered_cases()))
def test_tampered_locks_are_refused_by_check_lock_render_and_fetch(app, runner, in_tmp, case):
    text, needle = _tampered_cases()[case]
    (in_tmp / "lockfiles").mkdir()
    path = in_tmp / "lockfiles" / f"{CELL_ID}.txt"
    path.write_text(text)
    for argv in (
        ["lock", "--check", "--cell", CELL_ID],
        ["render", "--cell", CELL_ID, "--out", "out"],
        ["fetch", "--cell", CELL_ID],
    ):
        res = runner.invoke(app, argv)
        assert res.exit_code == 1, (argv, res.output)
        assert needle in res.output and str(Path("lockfiles") / f"{CELL_ID}.txt") in res.output, (argv, res.output)
    assert not (in_tmp / "out").exists() and path.read_text() == text  # nothing rendered, nothing overwritten


def test_a_hand_edit_is_named_by_line(in_tmp):
    from imagekit.lockfile import integrity_problems, parse

    text, _ = _tampered_cases()["duplicated pin"]
    problems = integrity_problems(parse(text), text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith("accelerate=="))
    assert f"line {line}: accelerate is pinned twice" in problems


def test_committed_locks_verify(data):
    from imagekit import locking, matrix
    from imagekit.services.lock import lock_path, verified_lock

    config = matrix.load_file(None, data)
    checked = 0
    for cell in config.cells:
        path = lock_path(ROOT / "lockfiles", cell)
        if path.exists():
            assert verified_lock(path, cell, data) is not None
            checked += 1
    assert checked == len(list((ROOT / "lockfiles").glob("*.txt")))
    assert locking.LockSettings()  # defaults validate
