"""The image's pip/uv constraints: every locked distribution at its locked version. Pure.

NGC's images pin their packages the same way (`/etc/pip/constraint.txt` through `PIP_CONSTRAINT`): a `pip install
-U transformers` on the pod keeps the locked transformers ("Requirement already satisfied"), and a request for another
version fails, pip naming the pin ("The user requested (constraint) transformers==4.48.2"); the image's pip adds how
to get that version the right way (`imagekit/in_image/pip_pins.py`). uv reads the same file through `UV_CONSTRAINT`.
"""

from __future__ import annotations

from imagekit.locking.lockfile import Lock

PATH = "/opt/imagekit/constraints.txt"  # what PIP_CONSTRAINT and UV_CONSTRAINT name (imageconfig.ENV)


def constraints(lock: Lock, cell_id: str) -> str:
    """The constraints file: a header saying what it is and how to change a version, then one pin per line, sorted."""
    header = (
        f"# The versions image {cell_id} was built and tested with (lock {lock.short_hash}):\n"
        "# pip (PIP_CONSTRAINT) and uv (UV_CONSTRAINT) keep to them. Another version is another image:\n"
        "# set it in imagekit.toml's [matrix], then `imagekit lock` and `imagekit build`.\n"
        "# Past them anyway (the doctor reports the drift):\n"
        "#   env -u PIP_CONSTRAINT -u UV_CONSTRAINT pip install ...\n"
    )
    return header + "".join(f"{name}=={version}\n" for name, version in sorted(lock.pins().items()))
