"""Lock parsing, rendering and the torch/app split (pure)."""

from __future__ import annotations

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
