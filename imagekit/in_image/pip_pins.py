#!/opt/venv/bin/python
"""pip, as the image's venv runs it, with one addition: when pip cannot install what was asked because the image pins
another version (PIP_CONSTRAINT), it says how to get that version the right way. Everything else is pip's own: its
arguments, output and exit code. stdout is pip's own stream; stderr passes through line by line (read for pip's
"ResolutionImpossible"). Installed over the venv's pip, pip3 and pip3.X scripts by the app layer (standard library
only: it runs inside the image)."""

import os
import shlex
import subprocess
import sys

HINT = """\
imagekit: this image pins its packages ({path}, from its lock): pip names the pin above as "(constraint)".
  Another version is another image: set it in imagekit.toml's [matrix], then `imagekit lock` and `imagekit build`
  (a new cell, tested before it is published). Past the pins anyway (the doctor reports the drift):
  env -u PIP_CONSTRAINT -u UV_CONSTRAINT pip {args}
"""


def main() -> int:
    args = sys.argv[1:]
    pins = os.environ.get("PIP_CONSTRAINT", "")
    if not pins:
        os.execv(sys.executable, [sys.executable, "-m", "pip", *args])
    proc = subprocess.Popen([sys.executable, "-m", "pip", *args], stderr=subprocess.PIPE)
    refused = False
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.buffer.write(line)
        sys.stderr.buffer.flush()
        refused = refused or b"ResolutionImpossible" in line
    code = proc.wait()
    if code != 0 and refused:
        sys.stderr.write(HINT.format(path=pins, args=shlex.join(args)))
    return code


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
