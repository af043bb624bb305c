"""Build small but real wheels and serve them from a real PEP 503 index on loopback (for routing tests)."""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from packaging.utils import canonicalize_name

from tests import loopback

FIXED_TIME = (2025, 1, 1, 0, 0, 0)


def build_wheel(
    out: Path,
    name: str,
    version: str,
    requires: list[str] = (),
    tag: str = "py3-none-any",
    requires_python: str | None = None,
    payload: str = "",
    extra_files: dict[str, bytes] | None = None,
) -> Path:
    """Write ``{name}-{version}-{tag}.whl`` (deterministic bytes) and return its path. ``extra_files``: more files
    at the wheel's root (a ``.pth`` that runs at every interpreter start, as a hostile package's would)."""
    dist = name.replace("-", "_")
    dist_info = f"{dist}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if requires_python:
        meta.append(f"Requires-Python: {requires_python}")
    meta += [f"Requires-Dist: {r}" for r in requires]
    files = {
        f"{dist}/__init__.py": f'__version__ = "{version}"\n{payload}'.encode(),
        f"{dist_info}/METADATA": ("\n".join(meta) + "\n\n").encode(),
        f"{dist_info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: imagekit-tests\nRoot-Is-Purelib: true\nTag: {tag}\n"
        ).encode(),
        **(extra_files or {}),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return wheel


def fake_pypi_wheels(
    out: Path,
    *,
    runtime: str = "12.4.127",
    extra: list[tuple[str, str, list[str]]] = (),
    torch_files: dict[str, bytes] | None = None,
) -> list[Path]:
    """A small PyPI look-alike: torch 2.5.1 (cu124 default) with its runtime, transformers, numpy, filelock.
    ``torch_files``: more files in the torch wheel (a hostile one's)."""
    specs = [
        ("torch", "2.5.1", ["filelock", f"nvidia-cuda-runtime-cu12=={runtime}"]),
        ("nvidia-cuda-runtime-cu12", runtime, []),
        ("filelock", "3.16.1", []),
        ("numpy", "1.26.4", []),
        ("transformers", "4.48.2", ["numpy>=1.17", "filelock"]),
        ("transformers", "4.49.0", ["numpy>=1.17", "filelock"]),
        *extra,
    ]
    return [build_wheel(out, n, v, reqs, extra_files=torch_files if n == "torch" else None) for n, v, reqs in specs]


# A PEP 517 build backend, small but real: it reads pyproject.toml's [project] table, writes beside the sources as
# setuptools does (build/), talks on stdout, imports a dependency of its own (which the build environment must hold)
# and writes a wheel whose entries are dated SOURCE_DATE_EPOCH. What `[image] install` builds with in the tests.
BACKEND = "imagekit-test-backend"
BACKEND_CODE = r"""
import base64, hashlib, os, time, tomllib, zipfile

import filelock  # noqa: F401 - the backend's own dependency: the build environment must hold it


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with open("pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    name, version = project["name"], project["version"]
    dist = name.replace("-", "_")
    print(f"imagekit-test-backend: building {name} {version}")
    os.makedirs("build", exist_ok=True)
    date = time.gmtime(max(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")), 315532800))[:6]
    files = {}
    for folder, dirs, names in os.walk(dist):
        dirs.sort()
        for n in sorted(names):
            if n.endswith(".py"):
                with open(os.path.join(folder, n), "rb") as fh:
                    files[os.path.join(folder, n).replace(os.sep, "/")] = fh.read()
    info = f"{dist}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in project.get("dependencies", [])]
    if project.get("requires-python"):
        meta.append(f"Requires-Python: {project['requires-python']}")
    files[f"{info}/METADATA"] = ("\n".join(meta) + "\n\n").encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: imagekit-test-backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    filename = f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(files):
            zf.writestr(zipfile.ZipInfo(path, date), files[path])
    return filename
"""


def backend_wheel(out: Path, version: str = "1.0") -> Path:
    """The test build backend as a wheel (it needs filelock, which every fake cell locks through torch)."""
    return build_wheel(out, BACKEND, version, ["filelock"], payload=BACKEND_CODE)


# Real wheels from PyPI, each by its URL and sha256, downloaded once into a cache on disk (IMAGEKIT_TEST_WHEELS, else
# ~/.cache/imagekit-tests/wheels): what `python -m venv` seeds, at versions no seed of a base image has.
PYPI_WHEELS = {
    "pip-24.3.1-py3-none-any.whl": (
        "https://files.pythonhosted.org/packages/ef/7d/500c9ad20238fcfcb4cb9243eede163594d7020ce87bd9610c9e02771876/",
        "3790624780082365f47549d032f3770eeb2b1e8bd1f7b2e02dace1afa361b4ed",
    ),
    "setuptools-75.6.0-py3-none-any.whl": (
        "https://files.pythonhosted.org/packages/55/21/47d163f615df1d30c094f6c8bbb353619274edccf0327b185cc2493c2c33/",
        "ce74b49e8f7110f9bf04883b730f4765b774ef3ef28f722cce7c273d253aaf7d",
    ),
}


def pypi_wheel(out: Path, filename: str) -> Path:
    """A real wheel of PYPI_WHEELS in ``out``: from the cache, else downloaded into it; its sha256 checked always."""
    import os
    import shutil
    import urllib.request

    folder, sha256 = PYPI_WHEELS[filename]
    cache = Path(os.environ.get("IMAGEKIT_TEST_WHEELS") or Path.home() / ".cache" / "imagekit-tests" / "wheels")
    cached = cache / filename
    if not cached.is_file() or hashlib.sha256(cached.read_bytes()).hexdigest() != sha256:
        with urllib.request.urlopen(folder + filename, timeout=60) as res:
            data = res.read()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise AssertionError(f"{filename} from PyPI does not have the sha256 this file pins")
        cache.mkdir(parents=True, exist_ok=True)
        (cache / f".{filename}.part").write_bytes(data)
        (cache / f".{filename}.part").replace(cached)
    out.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(cached, out / filename))


def write_simple_index(root: Path, wheels: list[Path]) -> None:
    """Lay out ``root/simple/<project>/index.html`` (PEP 503) with sha256 fragments, wheels under ``root/files``."""
    files_dir = root / "files"
    files_dir.mkdir(parents=True, exist_ok=True)
    by_project: dict[str, list[Path]] = {}
    for w in wheels:
        target = files_dir / w.name
        target.write_bytes(w.read_bytes())
        by_project.setdefault(canonicalize_name(w.name.split("-")[0]), []).append(target)
    simple = root / "simple"
    simple.mkdir(parents=True, exist_ok=True)
    links = []
    for project, paths in sorted(by_project.items()):
        (simple / project).mkdir(exist_ok=True)
        rows = []
        for p in sorted(paths):
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
            rows.append(f'<a href="../../files/{html.escape(p.name)}#sha256={digest}">{html.escape(p.name)}</a><br>')
        (simple / project / "index.html").write_text(
            "<!DOCTYPE html><html><body>\n" + "\n".join(rows) + "\n</body></html>\n"
        )
        links.append(f'<a href="{project}/">{project}</a><br>')
    (simple / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    delay = 0.0

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.delay:
            time.sleep(self.delay)
        super().do_GET()


@contextmanager
def serve(root: Path, delay: float = 0.0) -> Iterator[str]:
    """Serve ``root`` over HTTP on 127.0.0.1 (a free port), each answer ``delay`` s late; yields the base URL."""
    handler_cls = type("Handler", (_Quiet,), {"delay": delay})
    handler = lambda *a, **kw: handler_cls(*a, directory=str(root), **kw)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    loopback.start(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        loopback.stop(server)


@contextmanager
def serve_with_auth(root: Path, user: str, password: str) -> Iterator[tuple[str, list[str | None]]]:
    """Serve ``root`` on 127.0.0.1, answering 401 to any request without these basic-auth credentials; yields
    (base URL, the Authorization headers it was sent)."""
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    seen: list[str | None] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            got = self.headers.get("Authorization")
            seen.append(got)
            if got != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="private"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            super().do_GET()

        do_HEAD = do_GET

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a, **kw: Handler(*a, directory=str(root), **kw))
    loopback.start(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        loopback.stop(server)
