"""`imagekit compat refresh` against a real PEP 691 index on loopback, serving wheels the tests build.

Some releases carry PEP 658 metadata (`<wheel>.metadata`); the others do not, so refresh reads METADATA out of
the wheel itself with HTTP range requests. One server honours Range (RFC 9110: `bytes=a-b` and suffix `bytes=-n`);
another ignores it, as some mirrors and proxies do, which must be a clean error and never a full download.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import http.server
import json
import os
import random
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import pytest

from imagekit.compat import refresh
from imagekit.compat.pypi_metadata import WATCHED
from imagekit.errors import EnvironmentFailure
from imagekit.services.locks import compat_refresh
from tests import loopback
from tests.conftest import FIXTURES, ROOT

META = FIXTURES / "metadata"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
TORCH_260 = (
    "Metadata-Version: 2.1\nName: torch\nVersion: 2.6.0\nRequires-Python: >=3.9.0\nRequires-Dist: filelock\n"
    'Requires-Dist: nvidia-cuda-runtime-cu12==12.4.127; platform_system == "Linux" and platform_machine == "x86_64"\n'
    "Requires-Dist: opt-einsum>=3.3; extra == 'opt-einsum'\n\n"
)
TF_449 = (  # differs from 4.48.2's real METADATA, so the test tells which file was read
    "Metadata-Version: 2.1\nName: transformers\nVersion: 4.49.0\nRequires-Python: >=3.9.1\n"
    "Requires-Dist: filelock\nRequires-Dist: torch>=2.1; extra == 'torch'\nRequires-Dist: accelerate>=0.26.0; "
    "extra == 'torch'\nRequires-Dist: tensorflow<2.16,>2.9; extra == 'tf'\n\n"
)


def make_wheel(out: Path, filename: str, metadata: str, payload: int = 0) -> Path:
    """A wheel whose METADATA is ``metadata``; ``payload`` random (incompressible) bytes stored after it, so the
    member is far from the end and the central directory is beyond the reader's first 64 KiB tail read."""
    name, version = filename.split("-")[:2]
    dist_info = f"{name}-{version}.dist-info"
    path = out / filename
    rng = random.Random(filename)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(zipfile.ZipInfo(f"{name}/__init__.py", (2025, 1, 1, 0, 0, 0)), "")
        zf.writestr(zipfile.ZipInfo(f"{dist_info}/METADATA", (2025, 1, 1, 0, 0, 0)), metadata, zipfile.ZIP_DEFLATED)
        if payload:
            zf.writestr(f"{name}/_blob.bin", rng.randbytes(payload), zipfile.ZIP_STORED)
        zf.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n")
        zf.writestr(f"{dist_info}/RECORD", "")
    return path


class Index(http.server.BaseHTTPRequestHandler):
    """PEP 691 pages under /simple/<name>/, files under /files/, `<file>.metadata` where PEP 658 applies."""

    pages: ClassVar[dict[str, dict]] = {}
    files: ClassVar[dict[str, bytes]] = {}
    honour_range: ClassVar[bool] = True
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        rng = self.headers.get("Range")
        self.seen.append((self.path, rng))
        m = re.fullmatch(r"/simple/([^/]+)/", self.path)
        if m:
            if m[1] not in self.pages:
                return self._send(404, b"not found")
            if SIMPLE_JSON not in (self.headers.get("Accept") or ""):
                return self._send(406, b"ask for JSON")
            page = self.pages[m[1]]  # bytes: served as they are (a hostile page)
            body = page if isinstance(page, bytes) else json.dumps(page).encode()
            return self._send(200, body, {"Content-Type": SIMPLE_JSON})
        body = self.files.get(self.path.removeprefix("/files/"))
        if body is None:
            return self._send(404, b"not found")
        if not rng or not self.honour_range:
            return self._send(200, body, {"Content-Type": "application/octet-stream"})
        start, _, end = rng.removeprefix("bytes=").partition("-")
        size = len(body)
        first, last = (max(0, size - int(end)), size - 1) if not start else (int(start), min(int(end), size - 1))
        if first > last:
            return self._send(416, b"", {"Content-Range": f"bytes */{size}"})
        self._send(206, body[first : last + 1], {"Content-Range": f"bytes {first}-{last}/{size}"})


@contextmanager
def index_server(tmp: Path, honour_range: bool = True) -> Iterator[tuple[str, type[Index]]]:
    wheels = tmp / "wheels"
    wheels.mkdir(exist_ok=True)
    torch_meta = (META / "torch-2.5.1.METADATA").read_text()
    tf_meta = (META / "transformers-4.48.2.METADATA").read_text()
    # (project, filename, METADATA, PEP 658 metadata served, yanked, absolute url, payload bytes)
    spec = [
        ("torch", "torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl", torch_meta, True, False, True, 0),
        ("torch", "torch-2.5.1-cp312-cp312-manylinux1_x86_64.whl", torch_meta, True, False, True, 0),
        ("torch", "torch-2.5.1-cp313-cp313t-manylinux1_x86_64.whl", torch_meta, True, False, True, 0),  # free-threaded
        ("torch", "torch-2.5.1-cp311-none-macosx_11_0_arm64.whl", torch_meta, True, False, True, 0),
        ("torch", "torch-2.6.0-cp312-cp312-manylinux_2_28_x86_64.whl", TORCH_260, False, False, True, 200_000),
        ("torch", "torch-2.6.0-cp313-cp313-manylinux_2_28_x86_64.whl", TORCH_260, False, False, True, 0),
        ("torch", "torch-2.7.0rc1-cp312-cp312-manylinux_2_28_x86_64.whl", TORCH_260, True, False, True, 0),
        ("torch", "torch-1.12.1-cp310-cp310-manylinux1_x86_64.whl", torch_meta, True, False, True, 0),
        ("transformers", "transformers-4.39.0-py3-none-any.whl", tf_meta, True, False, True, 0),
        (
            "transformers",
            "transformers-4.47.0-py3-none-any.whl",
            tf_meta.replace("4.48.2", "4.47.0"),
            True,
            True,
            False,
            0,
        ),
        ("transformers", "transformers-4.48.2-py3-none-any.whl", tf_meta, True, False, False, 0),  # relative url
        # one of its files yanked (a bad build), the release is not
        ("transformers", "transformers-4.48.2-py3-none-manylinux1_x86_64.whl", tf_meta, True, True, True, 0),
        ("transformers", "transformers-4.49.0-py3-none-any.whl", TF_449, False, False, False, 0),
    ]
    handler = type("Handler", (Index,), {"pages": {}, "files": {}, "seen": [], "honour_range": honour_range})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    handler.pages = {name: {"meta": {"api-version": "1.1"}, "name": name, "files": []} for name in ("torch", *WATCHED)}
    for project, filename, meta, pep658, yanked, absolute, payload in spec:
        data = make_wheel(wheels, filename, meta, payload).read_bytes()
        handler.files[filename] = data
        entry: dict = {
            "filename": filename,
            "url": f"{base}/files/{filename}" if absolute else f"../../files/{filename}",
            "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
            "yanked": yanked,
        }
        if pep658:
            handler.files[filename + ".metadata"] = meta.encode()
            entry["core-metadata"] = {"sha256": hashlib.sha256(meta.encode()).hexdigest()}
        handler.pages[project]["files"].append(entry)
    loopback.start(server)
    try:
        yield f"{base}/simple", handler
    finally:
        loopback.stop(server)


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "imagekit", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )


@pytest.mark.loopback
def test_refresh_writes_what_the_index_says(tmp_path):
    out = tmp_path / "data" / "pypi-metadata.json"
    with index_server(tmp_path) as (index, handler):
        res = cli("compat", "refresh", "--out", str(out), "--index", index)
    assert res.returncode == 0, res.stderr
    assert "torch 2 releases" in res.stderr and "transformers 3" in res.stderr
    doc = json.loads(out.read_text())
    assert doc["torch"] == {
        "2.5.1": {  # cp313t (free-threaded), macOS, 1.12.1 (below the floor) and 2.7.0rc1 are left out
            "python": ["3.11", "3.12"],
            "glibc": "2.5",
            "requires_python": ">=3.8.0",
            "requires": {"triton": "==3.1.0"},  # torch's own pin: which triton goes with it (compat/companions.py)
            "cuda_runtime": "12.4.127",
        },
        "2.6.0": {
            "python": ["3.12", "3.13"],
            "glibc": "2.28",
            "requires_python": ">=3.9.0",
            "requires": {},
            "cuda_runtime": "12.4.127",
        },
    }
    assert doc["packages"]["transformers"] == {
        "4.47.0": {
            "requires_python": ">=3.9.0",
            "requires": {"accelerate": ">=0.26.0", "torch": ">=2.0"},
            "yanked": True,
        },
        "4.48.2": {
            "requires_python": ">=3.9.0",
            "requires": {"accelerate": ">=0.26.0", "torch": ">=2.0"},
            "yanked": False,
        },
        "4.49.0": {
            "requires_python": ">=3.9.1",
            "requires": {"accelerate": ">=0.26.0", "torch": ">=2.1"},
            "yanked": False,
        },
    }
    assert all(doc["packages"][name] == {} for name in WATCHED if name != "transformers")
    assert out.read_text() == refresh.dump(doc)  # the file is the canonical dump, nothing else
    # PEP 658 where served; the wheels without it were read by ranges, never downloaded whole
    wheel_gets = [(p, r) for p, r in handler.seen if p.endswith(".whl")]
    assert wheel_gets and all(r and r.startswith("bytes=") for _, r in wheel_gets)
    read = {p.rsplit("/", 1)[-1] for p, _ in wheel_gets}
    # and each minor's newest x86_64 wheel for its arch flags (what the curated [[arch]] tables are held to)
    assert read == {
        "torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl",
        "torch-2.6.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "transformers-4.49.0-py3-none-any.whl",
    }
    assert ("/files/transformers-4.48.2-py3-none-any.whl.metadata", None) in handler.seen  # its relative url


@pytest.mark.loopback
def test_range_reader_finds_a_member_far_from_the_end(tmp_path):
    """The 200 kB wheel: METADATA's local header lies outside the 64 KiB tail; the reader follows the directory."""
    with index_server(tmp_path) as (index, handler):
        base = index.removesuffix("/simple")
        name = "torch-2.6.0-cp312-cp312-manylinux_2_28_x86_64.whl"
        from imagekit.effects import remote_zip

        text = remote_zip.read_member(f"{base}/files/{name}", ".dist-info/METADATA").decode()
        with pytest.raises(EnvironmentFailure, match="no member ending in"):
            remote_zip.read_member(f"{base}/files/{name}", ".dist-info/entry_points.txt")
    assert text == TORCH_260
    ranges = [r for p, r in handler.seen if p.endswith(name)]
    assert ranges[0] == "bytes=-65536" and len(ranges) >= 3  # tail, directory, local header (+ data)


@pytest.mark.loopback
def test_an_index_that_ignores_range_requests_is_a_clean_error(tmp_path):
    out = tmp_path / "pypi-metadata.json"
    out.write_text("previous contents\n")
    with index_server(tmp_path, honour_range=False) as (index, handler):
        res = cli("compat", "refresh", "--out", str(out), "--index", index)
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert "error:" in res.stderr and "range request" in res.stderr and "hint:" in res.stderr
    assert "Traceback" not in res.stderr
    assert any(p.endswith(".whl") and r == "bytes=-65536" for p, r in handler.seen)  # the range reader asked
    assert out.read_text() == "previous contents\n"  # nothing half-written


@pytest.mark.loopback
def test_an_unreachable_or_missing_index_is_a_clean_error(tmp_path):
    out = tmp_path / "pypi-metadata.json"
    with index_server(tmp_path) as (index, _):
        res = cli("compat", "refresh", "--out", str(out), "--index", index.replace("/simple", "/nothing-here"))
    assert res.returncode == 3 and "HTTP 404" in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()


@pytest.mark.loopback
def test_check_reads_release_lists_only_and_agrees_with_what_refresh_records(tmp_path):
    with index_server(tmp_path) as (index, handler):
        doc = compat_refresh.build_metadata(index)
        handler.seen.clear()
        assert compat_refresh.check(doc, index) == {}
        older = copy.deepcopy(doc)
        del older["torch"]["2.6.0"], older["packages"]["transformers"]["4.49.0"], older["packages"]["peft"]
        assert compat_refresh.check(older, index) == {"torch": ["2.6.0"], "transformers": ["4.49.0"]}
        seen = list(handler.seen)
    assert {path for path, _ in seen} == {f"/simple/{name}/" for name in refresh.PROJECTS}  # no metadata, no wheel


def _page(*filenames: str, yanked: tuple[str, ...] = ()) -> dict:
    return {"files": [{"filename": f, "url": f"https://files.example/{f}", "yanked": f in yanked} for f in filenames]}


def test_missing_releases_are_those_a_refresh_would_record():
    pages = {name: _page() for name in refresh.PROJECTS}
    pages["torch"] = _page(
        "torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl",
        "torch-2.6.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "torch-2.7.0rc1-cp312-cp312-manylinux_2_28_x86_64.whl",  # a pre-release
        "torch-2.7.1-cp312-cp312-manylinux_2_28_x86_64.whl",  # yanked
        "torch-2.8.0-cp312-none-macosx_11_0_arm64.whl",  # no Linux x86_64 wheel
        "torch-1.12.1-cp310-cp310-manylinux1_x86_64.whl",  # below the floor
        yanked=("torch-2.7.1-cp312-cp312-manylinux_2_28_x86_64.whl",),
    )
    pages["trl"] = _page(
        "trl-0.8.0-py3-none-any.whl",  # below the floor
        "trl-0.9.0-py3-none-any.whl",
        "trl-0.9.1-py3-none-any.whl",  # yanked: recorded, with yanked = true
        "trl-0.10.0-py3-none-macosx_11_0_arm64.whl",  # no wheel whose metadata applies
        "trl-1.0.0.dev1-py3-none-any.whl",
        yanked=("trl-0.9.1-py3-none-any.whl",),
    )
    doc = {"torch": {"2.5.1": {}}, "packages": {"trl": {"0.9.0": {}}}}
    missing = refresh.missing_releases(doc, pages)
    assert missing == {"torch": ["2.6.0"], "trl": ["0.9.1"]}
    assert refresh.describe_missing(missing) == "torch 2.6.0, trl 0.9.1"
    assert refresh.missing_releases(
        {"torch": {"2.5.1": {}, "2.6.0": {}}, "packages": {"trl": {"0.9.1": {}}}}, pages
    ) == {"trl": ["0.9.0"]}
    assert refresh.uncurated_minors(["2.6.0", "2.16.0", "2.16.1", "3.0.0"], {"2.6"}) == ["2.16", "3.0"]


# The pure core imports no effects: what talks to the network or the disk lives in services/ and effects/.
PURE = ("imagekit/compat/refresh.py", "imagekit/compat/pypi_metadata.py")
EFFECTS = ("subprocess", "socket", "urllib", "httpx", "docker", "paramiko", "imagekit.effects", "imagekit.services")


def _imports(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names, at any depth (``from a import b`` names a and a.b)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


@pytest.mark.parametrize("module", PURE)
def test_the_pure_part_imports_no_effects(module):
    effects = {n for n in _imports(ROOT / module) if n in EFFECTS or n.startswith(tuple(f"{e}." for e in EFFECTS))}
    assert not effects, f"{module} imports {sorted(effects)}: move that to imagekit/services/locks/compat_refresh.py"


def test_the_import_walk_sees_the_service_s_effects():
    found = _imports(ROOT / "imagekit/services/locks/compat_refresh.py")
    assert {"imagekit.effects.http", "imagekit.effects.files"} <= found
    assert "httpx" not in found  # URLs are joined by effects.http: the service holds no HTTP library of its own


# ---- a hostile index: nothing it sends reaches pypi-metadata.json unchecked, or ends in a traceback ------------
TF_PEP658 = "transformers-4.48.2-py3-none-any.whl.metadata"
HUGE = "9" * 5000


def _refresh(app, runner, index: str, out: Path):
    return runner.invoke(app, ["compat", "refresh", "--out", str(out), "--index-url", index])


def _refused(res, out: Path, *words: str) -> None:
    text = res.output
    assert res.exit_code == 3, text
    assert "Traceback" not in text and "error:" in text and "hint:" in text and "was not written" in text
    assert not out.exists()
    assert len(text) < 3000 and HUGE[:100] not in text
    for word in words:
        assert word in text, (word, text)


@pytest.mark.loopback
@pytest.mark.parametrize(
    ("header", "value", "words"),
    [
        ("Requires-Python", ">=3.9,<<4", ("transformers 4.48.2", "requires_python")),
        ("Requires-Python", ">=3." + HUGE, ("transformers 4.48.2", "requires_python")),
        ("Version", "not a version!", ("transformers 4.48.2", "Version")),
        ("Version", "4." + HUGE, ("transformers 4.48.2", "Version")),
        ("Requires-Dist", "torch>=2." + HUGE, ("transformers 4.48.2", "requires")),
    ],
)
def test_hostile_metadata_refuses_the_whole_refresh(app, runner, tmp_path, header, value, words):
    out = tmp_path / "pypi-metadata.json"
    with index_server(tmp_path) as (index, handler):
        meta = handler.files[TF_PEP658].decode()
        lines = [line for line in meta.splitlines() if not line.startswith(f"{header}:")]
        handler.files[TF_PEP658] = "\n".join([lines[0], f"{header}: {value}", *lines[1:]]).encode() + b"\n"
        res = _refresh(app, runner, index, out)
    _refused(res, out, *words)


@pytest.mark.loopback
@pytest.mark.parametrize(
    "body", [b'{"files": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b'{"n": ' + HUGE.encode() + b"}"]
)
def test_a_hostile_page_refuses_the_refresh(app, runner, tmp_path, body):
    out = tmp_path / "pypi-metadata.json"
    with index_server(tmp_path) as (index, handler):
        handler.pages["peft"] = body  # served as it is
        res = _refresh(app, runner, index, out)
    assert res.exit_code == 3 and "Traceback" not in res.output and "/simple/peft/" in res.output, res.output
    assert not out.exists()


@pytest.mark.loopback
def test_wheel_names_with_absurd_numbers_are_left_out(app, runner, tmp_path):
    out = tmp_path / "pypi-metadata.json"
    with index_server(tmp_path) as (index, handler):
        files = handler.pages["torch"]["files"]
        good = next(f for f in files if f["filename"] == "torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl")
        for name in (
            f"torch-2.5.1-cp3{HUGE}-cp3{HUGE}-manylinux1_x86_64.whl",  # a 5000-digit Python tag
            f"torch-2.5.1-cp312-cp312-manylinux_2_{HUGE}_x86_64.whl",  # a 5000-digit glibc
            f"torch-2.{HUGE}-cp312-cp312-manylinux1_x86_64.whl",  # a 5000-digit release
        ):
            files.append({**good, "filename": name})
        res = _refresh(app, runner, index, out)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert sorted(doc["torch"]) == ["2.5.1", "2.6.0"] and doc["torch"]["2.5.1"]["python"] == ["3.11", "3.12"]
    assert doc["torch"]["2.5.1"]["glibc"] == "2.5"


def _user_file(tmp_path, monkeypatch, text: str) -> Path:
    monkeypatch.setenv("IMAGEKIT_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "pypi-metadata.json"
    path.write_text(text)
    return path


def _edited(edit) -> str:
    from imagekit.compat import catalog as compat

    doc = compat.shipped_metadata()
    edit(doc)
    return refresh.dump(doc)


HOSTILE_FILES = {
    "requires-python": _edited(lambda d: d["packages"]["transformers"]["4.48.2"].update(requires_python=">=3.9,<<4")),
    "requirement": _edited(lambda d: d["packages"]["transformers"]["4.48.2"]["requires"].update(torch=">=2." + HUGE)),
    "version-key": _edited(lambda d: d["packages"]["trl"].update({"not-a-version": d["packages"]["trl"]["0.9.6"]})),
    "python-tag": _edited(lambda d: d["torch"]["2.5.1"].update(python=["3." + HUGE])),
    "cuda-runtime": _edited(lambda d: d["torch"]["2.5.1"].update(cuda_runtime="12.4.<script>")),
    "glibc": _edited(lambda d: d["torch"]["2.5.1"].update(glibc="2." + HUGE)),
    "nested": '{"torch": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "huge-number": '{"torch": {}, "packages": {}, "n": ' + HUGE + "}",
}


@pytest.mark.seconds
@pytest.mark.parametrize("kind", sorted(HOSTILE_FILES))
def test_a_hostile_user_metadata_file_is_an_error_naming_it_for_every_command(app, runner, in_tmp, monkeypatch, kind):
    path = _user_file(in_tmp, monkeypatch, HOSTILE_FILES[kind])
    for args in (["matrix"], ["explain", "--torch", "2.5.1", "--python", "3.11"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert f"error: the compatibility data {path}" in res.output and "hint:" in res.output, res.output
        assert "compat refresh" in res.output and "Traceback" not in res.output and HUGE[:100] not in res.output
    shown = runner.invoke(app, ["compat", "show"])
    assert shown.exit_code == 0 and "unusable" in shown.output, shown.output
