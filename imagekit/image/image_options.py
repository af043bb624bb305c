"""ImageOptions: what an image holds beyond its lock, and how it is rendered and published, as one value. Pure.

Its `[image]` keys come from the matrix file (``matrix_file.parse``), a command's flags go over them
(``cli/options.image_options``: ``build --variant``, ``render --builder``); the value goes whole into the plan
(``BuildPlan.options``), and the Dockerfile template sees it as ``options``. A new `[image]` key: its row in
``matrix/schema.KEYS``, a field here with ``metadata=KEY``, its line in README.md's key table, its check in
``matrix_file._image_options`` (a true/false key needs none), and a test (docs/architecture.md shows one as a diff);
then its use, say in ``templates/Dockerfile.j2``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType

from imagekit.image.code_layer import CopySpec

BUILDERS = ("legacy", "buildkit")
KEY = MappingProxyType({"image_key": True})  # a field's metadata: an `[image]` key of the file (else a command's flag)


@dataclass(frozen=True)
class ImageOptions:
    """`[image]` switches that change what an image holds beyond its lock, and a command's flags over them."""

    # JupyterLab locked into the app layer, started when JUPYTER_PASSWORD is set
    jupyter: bool = field(default=False, metadata=KEY)
    # gcc/g++ and the Python headers, so torch.compile works (about 200 MB)
    compiler: bool = field(default=True, metadata=KEY)
    # nvcc, the CUDA headers and ninja from NVIDIA's pinned wheels (CUDA 13 cells), CUDA_HOME set: extensions that
    # compile at run time (DeepSpeed's ops, torch.utils.cpp_extension.load) work (imagekit.image.cuda_toolkit)
    cuda_toolkit: bool = field(default=False, metadata=KEY)
    # imagekit.image.budget: "6.5 GB", or growth over the cell's last release
    size_budget: str = field(default="+10%", metadata=KEY)
    # the user's code, as the image's last layer (imagekit.image.code_layer)
    copy: CopySpec | None = field(default=None, metadata=KEY)
    # the default command: a container started without one runs it (job mode)
    command: tuple[str, ...] = field(default=(), metadata=KEY)
    # Debian packages over the base, pinned per cell in its lock (imagekit.locking.debs)
    apt: tuple[str, ...] = field(default=(), metadata=KEY)
    # the project's own wheel, built from this folder of the copied code (the matrix file's folder or below it,
    # inside `copy`'s) in a container of the cell's base and installed into the venv without its dependencies:
    # the lock must hold them (imagekit.image.project_wheel)
    install: str | None = field(default=None, metadata=KEY)
    # top-level modules of the project's wheel the self-test's `project-imports` does not import (a package that
    # raises on import on purpose): Python identifiers
    skip_imports: tuple[str, ...] = field(default=(), metadata=KEY)
    # environment variables in the image's config, sorted by name (imagekit.image.imageconfig.user_env_problem
    # refuses the names the image relies on and values a Dockerfile could not carry)
    env: tuple[tuple[str, str], ...] = field(default=(), metadata=KEY)
    # shell commands the self-test runs in the image after its own checks: one failing blocks the publish
    smoke: tuple[str, ...] = field(default=(), metadata=KEY)
    # ---- a command's flags, never keys of the file
    builder: str = "legacy"  # legacy (`imagekit build`: wheels over loopback HTTP) | buildkit (bind-mounted wheels)
    # `build --variant NAME` (`--zstd`): the publish formats (oci.publish_formats) the image is also published in,
    # each under <tag>-<name> (never instead of gzip)
    variants: tuple[str, ...] = ()

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The `[image]` keys that are options, in the order the file format lists them."""
        return tuple(f.name for f in fields(cls) if f.metadata.get("image_key"))

    @classmethod
    def switches(cls) -> tuple[str, ...]:
        """The `[image]` keys that take true or false."""
        return tuple(f.name for f in fields(cls) if f.metadata.get("image_key") and isinstance(f.default, bool))
