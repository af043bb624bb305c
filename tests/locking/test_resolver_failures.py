"""What a lock that uv cannot resolve says: uv's reason, and a hint for the cause it names (uv's own words, as a
real `imagekit lock` of huggingface/alignment-handbook's setup.py printed them)."""

from __future__ import annotations

from imagekit.effects import resolver
from imagekit.errors import CheckFailed
from imagekit.locking import resolution
from imagekit.model import Cell

CELL = Cell("12.8", "2.8.0", "5.25.0", "3.11", ("huggingface-hub<1.0,>=0.33.4", "trl>=0.19.1"))

AXIS_CONFLICT = """\
  x No solution found when resolving dependencies:
  `-> Because transformers>=5.25.0 depends on huggingface-hub>=2.4.0,<3.0 and imagekit-cell depends on \
transformers==5.25.0, we can conclude that imagekit-cell depends on huggingface-hub>=2.4.0,<3.0.
      And because imagekit-cell depends on huggingface-hub>=0.33.4,<1.0, we can conclude that your requirements \
are unsatisfiable.
"""

NO_WHEEL = """\
  x No solution found when resolving dependencies:
  `-> Because deepspeed>=0.17.2 has no usable wheels and imagekit-cell depends on deepspeed>=0.17.2, we can \
conclude that your requirements are unsatisfiable.
"""

OTHER = """\
  x No solution found when resolving dependencies:
  `-> Because imagekit-cell depends on numpy<1 and numpy>=2, we can conclude that your requirements are \
unsatisfiable.
"""


def _fail(cell: Cell, stderr: str) -> CheckFailed:
    req = resolution.LockRequest(
        cell, resolution.LockSettings(), False, None, "x86_64-manylinux_2_28", "sha256:" + "0" * 64, ()
    )
    err = resolver._fail(req, stderr)
    assert isinstance(err, CheckFailed)
    return err


def test_a_conflict_through_the_transformers_axis_says_to_choose_another_release() -> None:
    err = _fail(CELL, AXIS_CONFLICT)
    assert "no resolution" in str(err) and "huggingface-hub>=0.33.4,<1.0" in str(err)  # uv's reason, both sides
    assert "transformers 5.25.0 (an axis of the matrix)" in err.hint
    assert "`transformers` axis" in err.hint and "--transformers VERSION" in err.hint


def test_a_conflict_through_the_torch_axis_names_torch() -> None:
    text = AXIS_CONFLICT.replace("transformers>=5.25.0", "torch>=2.8.0").replace("transformers==5.25.0", "torch==2.8.0")
    assert "torch 2.8.0 (an axis of the matrix)" in _fail(CELL, text).hint


def test_a_source_only_package_and_other_conflicts_keep_their_hints() -> None:
    no_wheel = _fail(CELL, NO_WHEEL)
    assert "deepspeed has no wheel for Python 3.11" in str(no_wheel) and "deepspeed @ https://" in no_wheel.hint
    assert 'from_source = ["deepspeed"] in [matrix]' in no_wheel.hint  # the fix that builds it, first
    assert isinstance(no_wheel, resolver.NoWheel) and no_wheel.names == ("deepspeed",)
    hinted = NO_WHEEL.replace("Because deepspeed>=0.17.2", "Because only deepspeed<=0.19 is available and deepspeed")
    hinted += "hint: Wheels are required for `DeepSpeed` because building from source is disabled for all packages\n"
    assert resolver._fail(resolution.LockRequest(CELL, resolution.LockSettings(), False, None, "p", "h", ()), hinted
                          ).names == ("deepspeed",)  # uv's hint names it, however the sentence runs  # fmt: skip
    assert _fail(CELL, OTHER).hint == "the cell's pins conflict; `imagekit explain` may say why"
