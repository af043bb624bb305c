"""`[image] cuda_toolkit = true` on CUDA 11 and 12 cells, built for real: Debian's nvidia-cuda-toolkit from the
archive, each .deb by its sha256, in the image's apt layer (`make test-cuda-toolkit`; opt in: gigabytes of .debs).

- cu124 on trixie: torch 2.6.0 is PyPI's CUDA 12.4 build, so the self-test's cuda-extension builds a torch extension
  with `torch.utils.cpp_extension.load_inline` (nvcc 12.4, Debian's g++-13) and imports it; the image passes its
  whole self-test.
- cu118 on bookworm: torch's CUDA 11.8 wheels are served by download.pytorch.org only, which the test machine cannot
  reach; the cell's torch comes from a loopback PyTorch index of small wheels the test builds, so load_inline cannot
  run there. nvcc 11.8 (with g++-11) compiles and links a plain CUDA program instead: the same compiler, the same
  host compiler, no torch. Without a GPU neither program runs, and the checks say so.
"""

from __future__ import annotations

import json
import shutil

import pytest

from imagekit.effects.docker import Engine
from imagekit.image import cuda_toolkit, naming
from imagekit.image.image_options import ImageOptions
from imagekit.locking import resolution
from imagekit.model import Cell
from imagekit.services import inputs
from imagekit.services.builds.build import BuildOptions, build_cell
from tests import containers
from tests.wheelfactory import build_wheel, fake_pypi_wheels, serve, write_simple_index

pytestmark = [pytest.mark.images, pytest.mark.docker, pytest.mark.network, pytest.mark.slow]
TOOLKIT = ("nvidia-cuda-toolkit",)


def _with_toolkit(cell: Cell, data) -> Cell:
    """The cell as the matrix makes it with `[image] cuda_toolkit = true` (Debian's toolkit, ninja)."""
    made = cuda_toolkit.with_toolkit({"c": cell}, "test", data, {cell.python: data.bases[cell.python].name})["c"]
    assert made.apt == TOOLKIT and made.packages == ("ninja",)
    return made


def _log(cell: str, msg: str) -> None:
    print(f"{cell} {msg}", flush=True)


def _opts(tmp_path, settings=None) -> BuildOptions:
    return BuildOptions(
        repository="imagekit-test/cuda-toolkit",
        lock_dir=tmp_path / "locks",
        state_dir=tmp_path / "state",
        release_index=tmp_path / "releases.json",
        push=False,
        options=ImageOptions(cuda_toolkit=True),
        **({"settings": settings} if settings else {}),
    )


def _apt_layer_size(engine: Engine, image: str) -> int:
    """The bytes of the image's apt layer (the step that ran install-layer --debs), as `docker history` says."""
    sizes = [h["Size"] for h in engine.history(image) if "--debs" in (h.get("CreatedBy") or "")]
    assert len(sizes) == 1, sizes
    return sizes[0]


def _nvcc(engine: Engine, image: str) -> str:
    return containers.output(engine, image, ["nvcc", "--version"])


def _cleanup(engine: Engine, cell: Cell, result) -> None:
    """The image's tags and the build-cache anchors (`imagekit/build:<cell>`, its `-base`): gigabytes each. The
    Debian base and the wheel and .deb caches on disk stay."""
    if result is not None and result.tag:
        engine.remove(result.tag)
        engine.remove(result.tag.rsplit("-", 1)[0])  # the alias: the cell id
    anchor = naming.build_cache_tag(cell)
    for ref in (anchor, f"{anchor}-base"):
        engine.remove(ref)


def test_a_cu124_cell_on_trixie_builds_a_torch_extension_with_debians_nvcc(tmp_path, monkeypatch):
    engine, data = Engine(), inputs.compat_data()
    cell = _with_toolkit(Cell("12.4", "2.6.0", "4.48.2", "3.13"), data)
    opts = _opts(tmp_path)
    res = None
    try:
        res = build_cell(cell, opts, engine, data, _log)
        assert res.report, res.error and res.error.render()
        checks = {c["id"]: c for c in res.report["checks"]}
        ext = checks["cuda-extension"]
        print(json.dumps(ext, indent=2))
        assert ext["status"] == "pass", ext
        assert "compiled and linked a CUDA extension against torch 2.6.0" in ext["message"]
        assert "no GPU: not run" in ext["message"] or "ran on" in ext["message"]
        assert ext["evidence"]["nvcc"].startswith("12.4.131") and ext["evidence"]["CUDA_HOME"] == "/usr"
        assert res.status == "passed", res.error and res.error.render()  # every check: nothing pushed here
        assert "release 12.4, V12.4.131" in _nvcc(engine, res.tag)
        print(f"apt layer (the CUDA compiler and its closure): {_apt_layer_size(engine, res.tag)} bytes")
    finally:
        _cleanup(engine, cell, res)


def test_a_cu118_cell_on_bookworm_compiles_and_links_a_kernel_with_debians_nvcc(tmp_path, monkeypatch):
    engine, data = Engine(), inputs.compat_data()
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    root = tmp_path / "index"
    pypi = fake_pypi_wheels(tmp_path / "w", extra=[("ninja", "1.11.1.4", [])])  # the toolkit adds ninja
    write_simple_index(root, pypi)
    torch = [
        build_wheel(tmp_path / "t", "torch", "2.5.1+cu118", ["filelock", "nvidia-cuda-runtime-cu11==11.8.89"]),
        build_wheel(tmp_path / "t", "nvidia-cuda-runtime-cu11", "11.8.89"),
        build_wheel(tmp_path / "t", "filelock", "3.16.1"),
    ]
    write_simple_index(root / "whl", torch)
    (root / "whl" / "simple").rename(root / "whl" / "cu118")  # the PyTorch index's layout: <base>/cu118/<project>/
    cell = _with_toolkit(Cell("11.8", "2.5.1", "4.48.2", "3.11"), data)
    res = None
    with serve(root) as url:
        settings = resolution.LockSettings(index_url=f"{url}/simple", torch_index_base=f"{url}/whl")
        opts = _opts(tmp_path, settings)
        try:
            res = build_cell(cell, opts, engine, data, _log)
            assert res.step == "self-test", res.error and res.error.render()  # the loopback torch is no torch
            assert "release 11.8, V11.8.89" in _nvcc(engine, res.tag)
            program = containers.output(engine, res.tag, [
                "/opt/venv/bin/python", "-c",
                "import json, sys; sys.path.insert(0, '/opt/imagekit/doctor'); import selftest; "
                "print(json.dumps(selftest.nvcc_kernel('/usr', '7.5', False)))",
            ])  # fmt: skip
            ok, said, ev = json.loads(program.strip().splitlines()[-1])
            print(said, ev)
            assert ok and said == "nvcc compiled and linked a CUDA program for sm_75 (no GPU: not run)"
            gxx = containers.output(engine, res.tag, ["sh", "-c", "/usr/lib/nvidia-cuda-toolkit/bin/g++ --version"])
            assert "g++-11" in gxx or "11." in gxx.splitlines()[0]  # nvcc's host compiler: the toolkit's own
            print(f"apt layer (the CUDA compiler and its closure): {_apt_layer_size(engine, res.tag)} bytes")
        finally:
            _cleanup(engine, cell, res)
    shutil.rmtree(tmp_path / "state", ignore_errors=True)
