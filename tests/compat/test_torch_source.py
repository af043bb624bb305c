""" "Is this cell's torch from PyPI" has one answer (`CompatData.torch_from_pypi`), and every place that shows or acts
on it agrees: the matrix's `torch_source`, `--source pypi|pytorch`, and whether a lock routes torch to the PyTorch
index."""

from __future__ import annotations

from imagekit.cli.options import Selection
from imagekit.locking import resolution
from imagekit.matrix import matrix_file as matrix
from imagekit.matrix import outputs
from imagekit.services import inputs


def test_the_pypi_default_variant_is_from_pypi_and_the_others_from_the_pytorch_index():
    data = inputs.compat_data()
    assert data.torch_from_pypi("2.5.1", "cu124") and not data.torch_from_pypi("2.5.1", "cu118")
    for minor in data.torch_minors.values():
        release = next(v for v in data.torch_releases if v.startswith(minor.minor + "."))
        assert [v for v in minor.variants if data.torch_from_pypi(release, v)] == [minor.pypi_default]


def test_every_place_that_asks_agrees_with_the_accessor():
    data = inputs.compat_data()
    cells = matrix.evaluate(matrix.parse(matrix.default_document(), "default", data), data)
    assert cells
    pypi = {c.cell.id for c in Selection(source="pypi").by_source(cells, data)}
    pytorch = {c.cell.id for c in Selection(source="pytorch").by_source(cells, data)}
    for e in cells:
        c = e.cell
        from_pypi = data.torch_from_pypi(c.torch, c.variant)
        assert (c.id in pypi, c.id in pytorch) == (from_pypi, not from_pypi)
        assert outputs.cell_row(e, data)["torch_source"] == ("pypi" if from_pypi else "pytorch")
        assert resolution.request(c, resolution.LockSettings(), data).routed is not from_pypi
