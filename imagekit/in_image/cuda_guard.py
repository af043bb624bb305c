"""`import torch` refused on a pod whose start check found that torch cannot use the GPU the pod expects (standard
library only, Python >= 3.8).

The image's venv carries this module as ``_imagekit_cuda_guard.py`` and a ``.pth`` line that calls :func:`install` at
every interpreter start (cheap: one ``stat`` of the marker). When the start check (podstart.py) found GPUs visible, or a
GPU required, while torch sees none, it wrote the cause to ``MARKER``; then every Python process of the image (``ssh
pod python train.py``, a Jupyter kernel, a `pod run`) fails at its first ``import torch`` naming that cause, instead of
training on the CPU at GPU rates. ``IMAGEKIT_ALLOW_CPU=1`` lets a process import torch anyway (the doctor's own probe
sets it). The marker is read as root's regular file only, without following a link, bounded: another user of the pod
cannot forge it to break everyone's imports.
"""

import os
import stat
import sys

MARKER = "/run/imagekit/no-cuda"
OPT_OUT = "IMAGEKIT_ALLOW_CPU"
MAX_MARKER = 4096


class CpuFallbackRefused(RuntimeError):
    """Not an ImportError: code that falls back to the CPU when torch is missing must not take this for one."""


def cause(path=None):
    """What the start check found (its text, printable), or None: no marker, or one that is not root's regular file."""
    try:
        fd = os.open(path or MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0:
            return None
        data = os.read(fd, MAX_MARKER)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace").strip()
    text = "".join(ch if ch.isprintable() or ch == "\n" else "?" for ch in text)
    return text or "the start check found that torch cannot use the GPU"


def message(found):
    return (f"imagekit: this pod's start check found that torch cannot use its GPU: {found}\n"
            "Training here would run on the CPU at GPU rates, so `import torch` is refused. Fix it first "
            "(`imagekit-doctor` says how); to import torch anyway in one process, set IMAGEKIT_ALLOW_CPU=1.")


class Refuse:
    """A finder ahead of every other: ``torch`` is refused while the marker says why (looked at on each import)."""

    def __init__(self, marker=None):
        self.marker = marker

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or os.environ.get(OPT_OUT) == "1":
            return None
        found = cause(self.marker)
        if found is None:
            return None
        raise CpuFallbackRefused(message(found))


def install(environ=None, marker=None):
    """Put the finder first on ``sys.meta_path`` when the start check left its marker (unless opted out)."""
    environ = os.environ if environ is None else environ
    if environ.get(OPT_OUT) == "1" or not os.path.lexists(marker or MARKER):
        return False
    if not any(isinstance(f, Refuse) for f in sys.meta_path):
        sys.meta_path.insert(0, Refuse(marker))
    return True
