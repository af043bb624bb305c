"""Lock parsing, rendering and the torch/app split (pure)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from imagekit.locking import lockfile
from imagekit.services import inputs
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
    from imagekit.trust.redact import redact, redact_text

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
    from imagekit.locking.resolution import LockSettings

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
        "another cell's lock, renamed": (
            other.replace(f"# imagekit-cell: {OTHER_ID}", f"# imagekit-cell: {CELL_ID}"),
            "resolved torch 2.5.1, expected 2.1.2",
        ),
        "no digest": (re.sub(r"^# imagekit-body-sha256: .*\n", "", text, flags=re.M), "not written by this"),
    }


@pytest.mark.seconds
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
    from imagekit.locking.lockfile import integrity_problems, parse

    text, _ = _tampered_cases()["duplicated pin"]
    problems = integrity_problems(parse(text), text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith("accelerate=="))
    assert f"line {line}: accelerate is pinned twice" in problems


def test_committed_locks_verify(data):
    from imagekit.locking import resolution
    from imagekit.services.locks.lock_cells import lock_path, verified_lock

    config = inputs.load_matrix(None, data)
    checked = 0
    for cell in config.cells:
        path = lock_path(ROOT / "lockfiles", cell)
        if path.exists():
            assert verified_lock(path, cell, data, current=True) is not None  # intact, and made for these inputs
            checked += 1
    assert checked == len(list((ROOT / "lockfiles").glob("*.txt")))
    assert resolution.LockSettings()  # defaults validate


# ---- a lock made for other inputs is refused by render and fetch, re-resolved by lock -------------------------
def _matrix_with(in_tmp, packages: str) -> Path:
    text = (ROOT / "imagekit" / "data" / "default-matrix.toml").read_text()
    path = in_tmp / "matrix.toml"
    block = 'transformers = "4.48.2"\npython = "3.11"\npackages = ["accelerate==1.2.1", "numpy<2"]'  # CELL_ID's entry
    assert text.count(block) == 1
    path.write_text(text.replace(block, block.replace('["accelerate==1.2.1", "numpy<2"]', packages)))
    assert path.read_text() != text
    return path


@pytest.mark.seconds
@pytest.mark.parametrize(
    ("packages", "needle"),
    [
        ('["accelerate==1.2.1", "numpy<2", "peft==0.14.0"]', "peft is not pinned"),
        ('["accelerate==1.3.0", "numpy<2"]', "accelerate 1.2.1 does not satisfy ==1.3.0"),
    ],
)
def test_a_lock_for_other_inputs_is_refused_by_render_and_fetch(app, runner, in_tmp, packages, needle):
    matrix_file = _matrix_with(in_tmp, packages)
    (in_tmp / "lockfiles").mkdir()
    text = (ROOT / "lockfiles" / f"{CELL_ID}.txt").read_text()
    (in_tmp / "lockfiles" / f"{CELL_ID}.txt").write_text(text)
    for argv in (["render", "--out", "out"], ["render", "--out", "out", "--check"], ["fetch"]):
        res = runner.invoke(app, [*argv, "--matrix", str(matrix_file), "--cell", CELL_ID])
        assert res.exit_code == 1, (argv, res.output)
        assert needle in res.output and "hint:" in res.output, (argv, res.output)
    assert not (in_tmp / "out").exists()
    res = runner.invoke(app, ["lock", "--check", "--matrix", str(matrix_file), "--cell", CELL_ID])
    assert res.exit_code == 1 and "stale" in res.output, res.output  # `lock` re-resolves it


def test_stale_is_judged_with_the_settings_the_lock_was_made_with(data):
    from imagekit.errors import CheckFailed
    from imagekit.locking import resolution
    from imagekit.locking.lockfile import Lock, LockEntry, parse

    cell = next(c for c in inputs.load_matrix(None, data).cells if c.id == CELL_ID)

    def made_with(settings, for_cell=cell):
        lines, meta = resolution.header(resolution.request(for_cell, settings, data), None, data, "uv 0")
        return parse(Lock((LockEntry("torch", cell.torch, ("sha256:" + "a" * 64,)),), (), meta, lines).render())

    pinned = resolution.LockSettings(
        exclude_newer="2025-01-01T00:00:00Z", index_url="https://u:secret@example.org/simple"
    )
    lock = made_with(pinned)
    assert "secret" not in lock.meta["settings"]
    assert resolution.stale_reason(lock, cell, data) is None  # current under its own settings, without repeating them
    assert resolution.stale_reason(made_with(resolution.LockSettings()), cell, data) is None
    legacy = parse(made_with(resolution.LockSettings()).render().replace("# imagekit-settings:", "# x:"))
    assert (
        "settings" not in legacy.meta and resolution.stale_reason(legacy, cell, data) is None
    )  # older locks: defaults
    grown = replace(cell, packages=(*cell.packages, "peft==0.14.0"))
    assert "input hash" in (resolution.stale_reason(lock, grown, data) or "")
    moved = replace(data, data_version="2099-01-01")
    assert "compatibility data" in (resolution.stale_reason(lock, cell, moved) or "")
    broken = parse(lock.render().replace('"resolver":"uv"', '"resolver":1,"x":2'))
    with pytest.raises(CheckFailed, match="imagekit-settings"):
        resolution.stale_reason(broken, cell, data)
