"""Size budgets: parsing, the limit they set, and the matrix key."""

from __future__ import annotations

import pytest

from imagekit.errors import ConfigError, UsageError
from imagekit.image import budget
from imagekit.matrix import matrix_file as matrix


@pytest.mark.parametrize(
    ("text", "absolute", "growth"),
    [("6.5 GB", 6_500_000_000, None), ("6500MB", 6_500_000_000, None), ("7000000000", 7_000_000_000, None),
     ("2 GiB", 2 << 30, None), ("+10%", None, 0.10), ("+12.5 %", None, 0.125)],
)  # fmt: skip
def test_budgets_parse(text, absolute, growth):
    got = budget.parse(text)
    assert (got.absolute, got.growth) == (absolute, growth)


@pytest.mark.parametrize("text", ["", "  ", "-5%", "10%", "0 GB", "6 parsecs", "GB", "1e9", 5, None, "+%"])
def test_bad_budgets_are_usage_errors_with_a_hint(text):
    with pytest.raises(UsageError) as exc:
        budget.parse(text)
    assert "invalid size budget" in exc.value.message and "+10%" in exc.value.hint


def test_a_growth_budget_holds_an_image_to_its_last_release():
    b = budget.parse("+10%")
    assert b.limit(None) is None and budget.over(10**12, b, None) is None  # a first build sets the size
    assert budget.over(5_500_000_000, b, 5_000_000_000) is None
    why = budget.over(5_600_000_000, b, 5_000_000_000)
    assert why == "the image is 5.60 GB, over 5.50 GB (the last release 5.00 GB + 10%)"


def test_an_absolute_budget_ignores_the_last_release():
    b = budget.parse("6 GB")
    assert budget.over(6_000_000_000, b, None) is None
    assert budget.over(6_000_000_001, b, 1) == "the image is 6.00 GB, over 6.00 GB (the budget 6 GB)"


def test_the_matrix_takes_a_size_budget_and_refuses_a_bad_one(data):
    doc = {"matrix": {"cuda": ["12.4"], "torch": ["2.5.1"], "transformers": ["4.48.2"], "python": ["3.11"]}}
    assert matrix.parse(doc, "<t>", data).options.size_budget == "+10%"
    doc["image"] = {"size_budget": "7 GB"}
    assert matrix.parse(doc, "<t>", data).options.size_budget == "7 GB"
    doc["image"] = {"size_budget": "huge"}
    with pytest.raises(ConfigError) as exc:
        matrix.parse(doc, "<t>", data)
    (problem,) = exc.value.problems
    assert problem.startswith("<t>: image.size_budget: invalid size budget 'huge'; use a size such as")
