"""Programs that run inside every image (and on any host as imagekit doctor): standard library only, Python >= 3.8,
siblings only; facts.py is the one module the host imports."""
