"""imagekit: pinned, tested GPU training container images."""

__version__ = "0.1.0"
