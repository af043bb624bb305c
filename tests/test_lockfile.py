"""Lock parsing, rendering and the torch/app split (pure)."""

from __future__ import annotations

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
