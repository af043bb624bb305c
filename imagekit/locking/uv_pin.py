"""Build tools an image's layers are installed with, pinned by hash like any locked wheel. Pure data.

uv installs each layer (``uv pip install --no-index --require-hashes --no-deps``, about twice as fast as pip on the
torch closure). Its wheel is served from the wheelhouse next to the locked wheels, checked against the sha256 below
inside the build, unpacked to /tmp for the one RUN and removed with it: it leaves no trace in the image.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolWheel:
    name: str
    version: str
    filename: str
    url: str
    sha256: str
    size: int

    @property
    def ref(self) -> str:
        """How a Dockerfile names it: ``<filename>#sha256=<hex>``."""
        return f"{self.filename}#sha256={self.sha256}"


# From https://pypi.org/simple/uv/ (PEP 691 JSON: filename, url, hashes.sha256, size) for uv 0.13.9.
UV = ToolWheel(
    name="uv",
    version="0.13.9",
    filename="uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    url=(
        "https://files.pythonhosted.org/packages/3d/aa/26d64642d808de4a652579ef950d7cd2d37f080a8babf9c67c6b75fc4c3f/"
        "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    ),
    sha256="d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",
    size=17606939,
)

# The same uv release for linux/arm64 images (its static build: one file, no loader needed), from the same page.
UV_AARCH64 = ToolWheel(
    name="uv",
    version="0.13.9",
    filename="uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl",
    url=(
        "https://files.pythonhosted.org/packages/57/15/94b6cd62ac3ff6550288328e8035288875197cbc183f51554b266a69877b/"
        "uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl"
    ),
    sha256="5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",
    size=18026789,
)


def uv_for(machine: str) -> ToolWheel:
    """The uv wheel that runs in an image for CPU architecture ``machine`` (``x86_64``, ``aarch64``)."""
    return UV_AARCH64 if machine == "aarch64" else UV
