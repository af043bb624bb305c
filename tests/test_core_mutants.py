"""Behaviour of the pure core that mutation testing (docs/mutation.md) found unasserted.

Each test states a user-visible fact: what a validator accepts and the exact message it prints, what a build
context contains and with which file modes, how tags and references are formed.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from imagekit.errors import ConfigError, UsageError
from imagekit.image import naming, render
from imagekit.image.buildplan import BuildPlan, bootstrap_base
from imagekit.locking import direct_wheels
from imagekit.locking.lockfile import Lock, LockEntry
from imagekit.matrix.matrix_file import parse
from imagekit.model import Cell
from imagekit.services import inputs
from imagekit.trust import validate
from tests.conftest import ROOT

H1, H2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11")


# ---- validate: what is accepted, and the message a user reads for what is not ------------------------------
@pytest.mark.parametrize(
    ("fn", "value", "message"),
    [
        (validate.glibc, "2.x", "invalid glibc version '2.x': expected major.minor such as '2.36'"),
        (validate.glibc, None, "invalid glibc version None: expected major.minor such as '2.36'"),
        (validate.abs_path, "bin/python", "invalid path 'bin/python': expected an absolute path such as "),
        (validate.abs_path, None, "invalid path None: expected an absolute path such as '/usr/local/bin/python3.12'"),
        (validate.image_ref, "a b", "invalid image reference 'a b': expected an OCI reference such as "),
        (validate.image_ref, None, "invalid image reference None: expected an OCI reference such as 'registry."),
        (validate.tag, ".tag", "invalid image tag '.tag': expected up to 128 characters of [A-Za-z0-9_.-], "),
        (validate.tag, None, "invalid image tag None: expected up to 128 characters"),
        (validate.label_text, "a\nb", "invalid label value 'a\\nb': expected printable ASCII on a single line"),
        (validate.label_text, 7, "invalid label value 7: expected printable ASCII on a single line"),
        (validate.package_name, "-pkg", "invalid package name '-pkg': expected a distribution name such as 'tr"),
        (validate.package_name, None, "invalid package name None: expected a distribution name such as "),
        (validate.python, "3.11\n", "invalid Python version '3.11\\n': expected major.minor such as '3.11'"),
        (validate.driver, "535", "invalid driver version '535': expected an NVIDIA driver version such as "),
        (validate.cuda, "12", "invalid CUDA version '12': expected major.minor such as '12.4' (or 'cu124')"),
        (validate.repository, "A/b", "invalid image repository 'A/b': expected an OCI repository such as "),
        (direct_wheels.requirement, "a\nb", "invalid requirement 'a\\nb': expected a single-line requirement such as "),
    ],
)
def test_refusals_name_the_value_and_what_was_expected(fn, value, message):
    with pytest.raises(UsageError) as exc:
        fn(value)
    assert exc.value.message.startswith(message), exc.value.message


@pytest.mark.parametrize("value", ["2.36", "2.17", "2.5"])
def test_glibc_accepted(value):
    assert validate.glibc(value) == value


@pytest.mark.parametrize("value", ["2", "3.36", "2.36.1", "2.360", " 2.36", "2.\u0663\u0666", "2.36\n"])
def test_glibc_refused(value):
    with pytest.raises(UsageError):
        validate.glibc(value)


@pytest.mark.parametrize("value", ["/usr/local/bin/python3.12", "/opt/Python-3.12/bin/python3", "/a_b/c-d"])
def test_abs_path_accepted(value):
    assert validate.abs_path(value) == value


@pytest.mark.parametrize("value", ["usr/bin/python", "/usr/bin/py thon", "/usr/bin/python\n", "/", "/tmp/$x"])
def test_abs_path_refused(value):
    with pytest.raises(UsageError):
        validate.abs_path(value)


def test_image_refs_are_limited_to_512_characters():
    longest = "r/" + "a" * 510
    assert validate.image_ref(longest) == longest
    with pytest.raises(UsageError):
        validate.image_ref(longest + "a")
    with pytest.raises(UsageError, match="invalid base reference"):
        validate.image_ref(7, "base reference")


@pytest.mark.parametrize("value", ["latest", "cu124-torch2.5.1-py3.11-tf4.48.2", "_x", "A" * 128])
def test_tags_accepted(value):
    assert validate.tag(value) == value


@pytest.mark.parametrize("value", ["", ".x", "-x", "A" * 129, "a:b", "a/b", "a\n"])
def test_tags_refused(value):
    with pytest.raises(UsageError):
        validate.tag(value)


@pytest.mark.parametrize(("value", "canonical"), [("Transformers", "transformers"), ("Foo_Bar.baz", "foo-bar-baz")])
def test_package_names_are_canonicalized(value, canonical):
    assert validate.package_name(value) == canonical


@pytest.mark.parametrize("value", ["", "-a", "a-", "a b", "a==1", "ä"])
def test_package_names_refused(value):
    with pytest.raises(UsageError):
        validate.package_name(value)


@pytest.mark.parametrize("value", ["", "a plain label: v1.2 (x) ~!", "\x7e"])
def test_label_text_accepted(value):
    assert validate.label_text(value) == value


@pytest.mark.parametrize("value", ["a\nb", "a\tb", "\x7f", "é"])
def test_label_text_refused(value):
    with pytest.raises(UsageError):
        validate.label_text(value)


def test_a_registry_base_table_reports_every_bad_field(data):
    doc = {
        "matrix": {"include": [{"cuda": "12.4", "torch": "2.5.1", "transformers": "4.48.2", "python": "3.11"}]},
        "bases": {"3.12": {"reference": "reg/py@sha256:" + "0" * 64, "glibc": "2.x", "python": "bin/python3"}},
    }
    with pytest.raises(ConfigError) as exc:
        parse(doc, "m.toml", data)
    text = exc.value.message
    assert "m.toml: bases.3.12.glibc: invalid glibc version '2.x'" in text
    assert "m.toml: bases.3.12.python: invalid path 'bin/python3'" in text
    doc["bases"]["3.12"].update(glibc="2.36", python="/usr/local/bin/Python3")
    assert parse(doc, "m.toml", data).bases["3.12"].python_exe == "/usr/local/bin/Python3"


# ---- render: the build context's files, modes and refusals -------------------------------------------------
def _files(data, lock: Lock | None = None, **plan) -> dict[str, tuple[bytes, int]]:
    lock = lock or Lock(
        (LockEntry("torch", "2.5.1", (H1,), ("imagekit-cell (pyproject.toml)",)),),
        (LockEntry("transformers", "4.48.2", (H2,), ("imagekit-cell (pyproject.toml)",)),),
    )
    base = bootstrap_base(data.bases["3.11"])
    return render.render_plan(BuildPlan.make(cell=CELL, lock=lock, base=base, repository="r/x", data=data, **plan))


def test_only_the_in_image_scripts_are_executable(data):
    files = _files(data)
    executable = {rel for rel, (_, mode) in files.items() if mode == 0o755}
    scripts = {f"{render.APP_FILES}/bin/{p.name}" for p in (ROOT / "templates" / "context" / "bin").iterdir()}
    scripts.add(f"{render.APP_FILES}/bin/install-layer")  # the in-image package's one program on PATH's side
    base = {f"rootfs/base/opt/imagekit/bin/{name}" for name in ("finalize-layer", "install-layer")}
    pip = {f"rootfs/app/opt/venv/bin/{name}" for name in ("pip", "pip3", "pip3.11")}  # the venv's pip, pins named
    assert executable == scripts | base | pip
    assert {mode for _, mode in files.values()} == {0o644, 0o755}


def test_the_context_ships_the_in_image_package_byte_for_byte_at_the_image_paths(data):
    """Every module of imagekit/in_image is in the image, at the path images have always had it (the doctor under
    /opt/imagekit/doctor/, install-layer under /opt/imagekit/bin/), with the package's bytes."""
    files = _files(data)
    package = ROOT / "imagekit" / "in_image"
    app = render.APP_FILES
    shipped_apart = {render.PIP_WRAPPER, render.CUDA_GUARD}
    assert set(render.IN_IMAGE) | shipped_apart == {p.name for p in package.glob("*.py")}  # none left out
    for name in ("pip", "pip3", "pip3.11"):  # over the venv's own scripts, where PATH finds pip first
        assert files[f"rootfs/app/opt/venv/bin/{name}"] == ((package / render.PIP_WRAPPER).read_bytes(), 0o755)
    site = "rootfs/app/opt/venv/lib/python3.11/site-packages"  # every interpreter of the venv runs the .pth line
    assert files[f"{site}/_imagekit_cuda_guard.py"] == ((package / render.CUDA_GUARD).read_bytes(), 0o644)
    pth = b"import _imagekit_cuda_guard; _imagekit_cuda_guard.install()\n"
    assert files[f"{site}/_imagekit_cuda_guard.pth"] == (pth, 0o644)
    for name, rel in render.IN_IMAGE.items():
        assert files[f"{app}/{rel}"][0] == (package / name).read_bytes(), name
    shipped = {rel for rel in files if rel.startswith(f"{app}/doctor/")}
    assert shipped == {f"{app}/{rel}" for rel in render.IN_IMAGE.values() if rel.startswith("doctor/")}
    assert render.IN_IMAGE["imagekit_doctor.py"] == "doctor/imagekit_doctor.py"
    assert render.IN_IMAGE["podstart.py"] == "doctor/podstart.py"  # templates/context/bin/entrypoint runs it there
    assert render.IN_IMAGE["selftest.py"] == "doctor/selftest.py"
    assert render.IN_IMAGE["install_layer.py"] == "bin/install-layer"  # Dockerfile.j2 runs it there
    assert files[f"{app}/bin/install-layer"][0].startswith(b"#!/opt/venv/bin/python -B\n")  # -B: no .pyc on import
    assert files["rootfs/base/opt/imagekit/bin/install-layer"] == files[f"{app}/bin/install-layer"]
    assert files[f"{app}/etc/sshd_config"][0] == (ROOT / "templates" / "context" / "etc" / "sshd_config").read_bytes()


def test_installed_requirement_files_carry_no_via_annotations(data):
    files = _files(data)
    torch, app = "rootfs/app/opt/imagekit/requirements-torch.txt", f"{render.APP_FILES}/requirements-app.txt"
    assert files[torch][0] == f"torch==2.5.1 \\\n    --hash={H1}\n".encode()
    assert files[app][0] == f"transformers==4.48.2 \\\n    --hash={H2}\n".encode()


def test_the_manifest_is_canonical_json(data):
    """Sorted keys, two-space indent, final newline: the manifest's bytes feed the immutable tag."""
    text = _files(data)[render.MANIFEST][0].decode()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    assert text.startswith('{\n  "base": ')


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000/", "https://Wheels.Example.COM/house/", "http://[::1]:8080", "/srv/Wheels"]
)
def test_wheelhouse_locations_accepted(data, url):
    assert f"{url}" in _files(data, wheels_url=url)["Dockerfile"][0].decode()


@pytest.mark.parametrize("url", ["ftp://x/", "http://x/a b", "relative/dir", "http://x/$(id)", "http://x/\n"])
def test_wheelhouse_locations_refused(data, url):
    with pytest.raises(UsageError) as exc:
        _files(data, wheels_url=url)
    assert exc.value.message == f"invalid wheelhouse location {url!r}"
    assert exc.value.hint == "use an http(s) URL or an absolute path"


def test_the_label_filter_says_what_it_refused():
    with pytest.raises(UsageError) as exc:
        render._dq('a"b')
    assert exc.value.message == "refusing to render 'a\"b' into a Dockerfile"
    assert exc.value.hint == "values must be printable ASCII without quotes, '$' or '\\'"
    assert render._dq("torch 2.5.1+cu124") == '"torch 2.5.1+cu124"'


def test_diff_tree_reports_each_extra_file_once(tmp_path):
    expected = {"cell/Dockerfile": (b"x", 0o644), "cell/imagekit/bin/entrypoint": (b"y", 0o755)}
    for rel, (content, _) in expected.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(content)
    (tmp_path / "cell/imagekit/bin/stray").write_bytes(b"z")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere/f").write_bytes(b"not ours")
    assert render.diff_tree(tmp_path, expected) == ["extra: cell/imagekit/bin/stray"]


@pytest.mark.programs
def test_an_installed_wheel_renders_from_its_packaged_templates(tmp_path):
    """The wheel's layout, built from pyproject's force-include table: templates come from imagekit/_templates."""
    import os
    import shutil
    import subprocess
    import sys
    import tomllib

    import imagekit

    site = tmp_path / "site"
    shutil.copytree(Path(imagekit.__file__).parent, site / "imagekit", ignore=shutil.ignore_patterns("__pycache__"))
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    for src, dest in table["force-include"].items():
        copy = shutil.copytree if (ROOT / src).is_dir() else shutil.copy
        copy(ROOT / src, site / dest)
    code = (
        "from imagekit.image import render; print(render.sources().root); "
        "print(render.environment().get_template('Dockerfile.j2').filename); "
        "print(render.sources().program('imagekit_doctor.py')); print(len(render._context_files()))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    res = subprocess.run(  # -P: the checkout (cwd) is not on sys.path, only the wheel's layout
        [sys.executable, "-P", "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    root, template, doctor, count = res.stdout.splitlines()
    assert root == str(site / "imagekit" / "_templates")
    assert template == str(site / "imagekit" / "_templates" / "templates" / "Dockerfile.j2")
    assert doctor == str(site / "imagekit" / "in_image" / "imagekit_doctor.py")  # the wheel's package, not a checkout
    assert int(count) == len(render._context_files())  # the same context as from the checkout


# ---- naming: tags and references --------------------------------------------------------------------------
def test_the_immutable_tag_is_the_cell_and_twelve_hex_of_the_build_hash():
    digest = "0123456789abcdef" * 4
    assert naming.immutable_tag("127.0.0.1:5000/t/x", CELL, digest) == f"127.0.0.1:5000/t/x:{CELL.id}-0123456789ab"
    assert naming.alias_tag("127.0.0.1:5000/t/x", CELL) == f"127.0.0.1:5000/t/x:{CELL.id}"


@pytest.mark.parametrize(
    ("ref", "parts"),
    [
        ("127.0.0.1:5000/team/img", ("127.0.0.1:5000/team/img", None, None)),
        ("127.0.0.1:5000/team/img:v1", ("127.0.0.1:5000/team/img", "v1", None)),
        ("img@sha256:" + "a" * 64, ("img", None, "sha256:" + "a" * 64)),
        ("reg.io/img:t@sha256:" + "b" * 64, ("reg.io/img", "t", "sha256:" + "b" * 64)),
    ],
)
def test_split_reference_knows_a_port_from_a_tag(ref, parts):
    assert naming.split_reference(ref) == parts


def test_split_reference_refuses_what_is_not_a_reference():
    with pytest.raises(UsageError, match=re.escape("invalid image reference 'img:tag\\nRUN x'")):
        naming.split_reference("img:tag\nRUN x")


# ---- locking: what is asked of the resolver, and what a lock's header records ------------------------------
CU118 = Cell("11.8", "2.5.1", "4.48.2", "3.11")
CU121 = Cell("12.1", "2.1.2", "4.48.2", "3.11")


def test_committed_locks_have_exactly_the_header_this_code_writes(data):
    """A lock's input hash is how `lock` knows it is current: recomputing it must give the committed value."""
    from imagekit.locking import lockfile, resolution

    checked = 0
    for cell in inputs.load_matrix(None, data).cells:
        path = ROOT / "lockfiles" / f"{cell.id}.txt"
        if not path.exists():
            continue
        lock = lockfile.parse(path.read_text())
        uv_version = re.search(r"autogenerated by imagekit \S+ \((.*)\) for ", lock.header[1])[1]
        lines, meta = resolution.header(
            resolution.request(cell, resolution.LockSettings(), data), None, data, uv_version
        )
        assert (lines, meta) == (lock.header, lock.meta), cell.id
        checked += 1
    assert checked >= 10


def test_a_routed_request_pins_the_variant_build_from_its_index(data):
    from imagekit.locking import resolution

    req = resolution.request(CU118, resolution.LockSettings(torch_index_base="https://mirror.example/whl/"), data)
    assert req.routed and req.torch_index == "https://mirror.example/whl/cu118"
    assert req.requirements == ("torch==2.5.1+cu118", "transformers==4.48.2")
    assert req.platform == "x86_64-manylinux_2_28"
    plain = resolution.request(CU121, resolution.LockSettings(), data)
    assert not plain.routed and plain.torch_index is None
    assert plain.requirements == ("torch==2.1.2", "transformers==4.48.2")


@pytest.mark.parametrize(("glibc", "platform"), [("2.28", "x86_64-manylinux_2_28"), ("2.27", "x86_64-manylinux_2_17")])
def test_the_resolver_platform_follows_the_bases_glibc(data, glibc, platform):
    from dataclasses import replace

    from imagekit.locking import resolution

    old = replace(data, bases={**data.bases, "3.11": replace(data.bases["3.11"], glibc=glibc)})
    assert resolution.request(CU121, resolution.LockSettings(), old).platform == platform
    no_base = Cell("12.1", "2.1.2", "4.48.2", "3.99")
    assert resolution.request(no_base, resolution.LockSettings(), data).platform == "x86_64-manylinux_2_28"


def test_the_input_hash_covers_every_setting_but_not_credentials(data):
    from imagekit.locking import resolution

    def h(cell=CU118, **kw) -> str:
        return resolution.request(cell, resolution.LockSettings(**kw), data).input_hash

    base = h()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", base)
    variants = [
        h(index_url="https://mirror.example/simple"),
        h(extra_index_urls=("https://extra.example/simple",)),
        h(torch_index_base="https://mirror.example/whl"),
        h(exclude_newer="2025-01-01T00:00:00Z"),
        h(resolver="pip-compile"),
        h(Cell("11.8", "2.5.1", "4.48.2", "3.11", ("accelerate==1.2.1",))),
    ]
    assert len({base, *variants}) == 1 + len(variants)
    assert h(index_url="https://a:one@pkgs.example/simple") == h(index_url="https://b:two@pkgs.example/simple")


def test_the_resolver_project_routes_the_torch_family_to_one_explicit_index(data):
    import tomllib

    from imagekit.locking import resolution

    req = resolution.request(CU118, resolution.LockSettings(), data).with_routed({"nvidia-cudnn-cu11"})
    assert req.with_routed({"nvidia-cudnn-cu11", "aaa"}).routed_extra == ("aaa", "nvidia-cudnn-cu11")
    doc = tomllib.loads(req.pyproject())
    assert doc["project"]["dependencies"] == ["torch==2.5.1+cu118", "transformers==4.48.2", "nvidia-cudnn-cu11"]
    assert doc["project"]["requires-python"] == "==3.11.*"
    names = ["nvidia-cudnn-cu11", "pytorch-triton", "torch", "torchaudio", "torchvision", "triton"]
    assert req.routed_names() == names
    assert doc["tool"]["uv"]["sources"] == {n: {"index": "pytorch"} for n in names}
    assert doc["tool"]["uv"]["index"] == [
        {"name": "pytorch", "url": "https://download.pytorch.org/whl/cu118", "explicit": True}
    ]
    plain = tomllib.loads(resolution.request(CU121, resolution.LockSettings(), data).pyproject())
    assert "tool" not in plain and plain["project"]["name"] == "imagekit-cell"


def test_the_resolver_command_line(data):
    from imagekit.locking import resolution

    settings = resolution.LockSettings(
        index_url="https://m.example/simple",
        extra_index_urls=("https://e1.example/simple", "https://e2.example/simple"),
        exclude_newer="2025-01-01T00:00:00Z",
    )
    req = resolution.request(CU118, settings, data)
    assert req.uv_args() == [
        "pip", "compile", "pyproject.toml", "--generate-hashes", "--emit-index-annotation", "--no-header",
        "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28",
        "--index-url", "https://m.example/simple", "--no-config", "--only-binary", ":all:",
        "--extra-index-url", "https://e1.example/simple", "--extra-index-url", "https://e2.example/simple",
        "--constraint", "imagekit-companion-table.txt", "--exclude-newer", "2025-01-01T00:00:00Z",
    ]  # fmt: skip
    # the companion table for torch 2.5.1, one requirement a line: what the resolver holds each name it meets to
    assert "torchaudio==2.5.1\n" in resolution.constraints_text(
        req
    ) and "triton==3.1.0\n" in resolution.constraints_text(req)
    assert "--constraint" not in replace(req, constraints=()).uv_args()
    assert "--exclude-newer" not in resolution.request(CU118, resolution.LockSettings(), data).uv_args()
    assert req.regenerate_command("my matrix.toml") == (
        "imagekit lock --cuda 11.8 --torch 2.5.1 --transformers 4.48.2 --python 3.11 --matrix 'my matrix.toml'"
        " --index-url https://m.example/simple --extra-index-url https://e1.example/simple"
        " --extra-index-url https://e2.example/simple --exclude-newer 2025-01-01T00:00:00Z"
    )
    default = resolution.request(CU118, resolution.LockSettings(), data)
    assert default.regenerate_command(None) == (
        "imagekit lock --cuda 11.8 --torch 2.5.1 --transformers 4.48.2 --python 3.11"
    )  # the committed locks' headers stay as they are


def test_which_packages_belong_to_the_torch_family():
    from imagekit.locking.resolution import is_torch_family

    for name in ("torch", "torchvision", "torchaudio", "triton", "pytorch-triton", "nvidia-cudnn-cu12", "cuda-toolkit"):
        assert is_torch_family(name), name
    for name in ("numpy", "nvidia", "cuda", "torchmetrics", "my-nvidia-cudnn"):
        assert not is_torch_family(name), name


def test_a_family_package_missing_from_the_default_index_is_named(data):
    from imagekit.locking import resolution

    req = resolution.request(CU118, resolution.LockSettings(), data)
    err = "  × No solution found\n  ╰─▶ Because nvidia-cudnn-cu11 was not found in the package registry and torch"
    assert resolution.missing_family_package(req, err) == "nvidia-cudnn-cu11"
    assert resolution.missing_family_package(req.with_routed({"nvidia-cudnn-cu11"}), err) is None  # already routed
    assert resolution.missing_family_package(req, err.replace("nvidia-cudnn-cu11", "numpy")) is None
    assert resolution.missing_family_package(resolution.request(CU121, resolution.LockSettings(), data), err) is None


def test_index_annotations_are_read_per_canonical_name():
    from imagekit.locking.resolution import index_of_entries

    text = (
        "--index-url https://x/simple\n"
        "Foo_Bar==1.0 \\\n    --hash=sha256:" + "a" * 64 + "\n    # via torch\n    # from https://a.example/simple\n"
        "baz==2.0\n    # from https://b.example/simple\n"
        "# a comment\n"
        "plain==3.0\n"
    )
    assert index_of_entries(text) == {"foo-bar": "https://a.example/simple", "baz": "https://b.example/simple"}


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://u:p@host:8443/simple", "https://host:8443/simple"),
        ("https://u@host/simple", "https://host/simple"),
        ("https://PyPI.Example:8443/simple", "https://PyPI.Example:8443/simple"),  # nothing secret: unchanged
        ("https://host/simple?a=1&flag&Api_Key=zz#frag", "https://host/simple?a=1&flag&Api_Key=***#frag"),
        ("https://host/abcdefghijklmnopqrstuvwxyz/simple", "https://host/abcdefghijklmnopqrstuvwxyz/simple"),
        ("https://host/a1b2c3d4e5f6g7h8i9j/simple", "https://host/a1b2c3d4e5f6g7h8i9j/simple"),  # 19: not a token
        ("https://host/a1b2c3d4e5f6g7h8i9j0/simple", "https://host/***/simple"),
    ],
)
def test_redaction_keeps_everything_but_secrets(url, shown):
    from imagekit.trust.redact import redact

    assert redact(url) == shown


def test_settings_are_public_without_credentials():
    from imagekit.locking.resolution import LockSettings

    s = LockSettings(
        index_url="https://u:p@a.example/simple",
        extra_index_urls=("https://b.example/simple?token=t",),
        torch_index_base="https://u:p@c.example/whl",
        exclude_newer="2025-01-01T00:00:00Z",
    )
    assert s.public() == {
        "index_url": "https://a.example/simple",
        "extra_index_urls": ["https://b.example/simple?token=***"],
        "torch_index_base": "https://c.example/whl",
        "exclude_newer": "2025-01-01T00:00:00Z",
        "resolver": "uv",
    }
    with pytest.raises(UsageError, match="invalid --torch-index-url"):
        LockSettings(torch_index_base="https://x/whl\n")
    with pytest.raises(UsageError, match="invalid --extra-index-url 'https://x/ s'"):
        LockSettings(extra_index_urls=("https://x/ s",))


# ---- verify: every refusal says what was wrong and what to do -----------------------------------------------
def _e(name: str, version: str, *via: str, hashed: bool = True) -> LockEntry:
    return LockEntry(name, version, (H1,) if hashed else (), via)


@pytest.mark.parametrize(
    ("cell", "entries", "sources", "message", "hint"),
    [
        (CU118, [_e("numpy", "1.26.4")], {}, "cu118-torch2.5.1-py3.11-tf4.48.2: the resolution has no torch",
         "check the index settings"),
        (CU118, [_e("torch", "2.5.1+cu118"), _e("a", "1", hashed=False), _e("b", "1", hashed=False)], {},
         "cu118-torch2.5.1-py3.11-tf4.48.2: no hashes for a, b", "the index must publish sha256 hashes"),
        (CU118, [_e("torch", "2.5.1+cu121")], None,
         "cu118-torch2.5.1-py3.11-tf4.48.2: resolved torch 2.5.1+cu121, expected 2.5.1+cu118",
         "the index https://download.pytorch.org/whl/cu118 does not serve 2.5.1+cu118"),
        (CU121, [_e("torch", "2.1.2+cu118")], {},
         "cu121-torch2.1.2-py3.11-tf4.48.2: resolved torch 2.1.2+cu118, expected 2.1.2 (PyPI default cu121)",
         "an extra index supplied a different torch build; remove it or pin the variant"),
        (CU121, [_e("torch", "2.1.2")], {}, "cu121-torch2.1.2-py3.11-tf4.48.2: torch 2.1.2 pulled no CUDA runtime",
         "is this a CPU-only torch build?"),
        (CU121, [_e("torch", "2.1.2"), _e("nvidia-cuda-runtime-cu11", "11.8.89", "torch")], {},
         "cu121-torch2.1.2-py3.11-tf4.48.2: torch 2.1.2 brings CUDA runtime 11.8.89, not 12.1",
         "the PyPI default variant changed; run `imagekit compat refresh` and pick the right --cuda"),
    ],
    ids=["no-torch", "no-hashes", "other-variant", "other-build-on-pypi", "no-runtime", "wrong-runtime"],
)  # fmt: skip
def test_every_refusal_says_what_and_how_to_fix(data, cell, entries, sources, message, hint):
    from imagekit.errors import CheckFailed
    from imagekit.locking import resolution

    with pytest.raises(CheckFailed) as exc:
        resolution.verify(resolution.request(cell, resolution.LockSettings(), data), entries, sources, data)
    assert (exc.value.message, exc.value.hint) == (message, hint)


def test_a_cuda_toolkit_package_counts_as_the_runtime(data):
    from imagekit.locking import resolution

    req = resolution.request(CU121, resolution.LockSettings(), data)
    resolution.verify(
        req, [_e("torch", "2.1.2"), _e("cuda-toolkit", "12.1.1", "torch"), _e("transformers", "4.48.2")], {}, data
    )


@pytest.mark.parametrize(
    ("src", "flagged"),
    [
        ("https://download.pytorch.org/whl/cu118/", False),
        ("https://download.pytorch.org/whl/cu118", False),
        (None, True),  # no annotation: unknown index
        ("https://pypi.org/simple", True),
        ("https://download.pytorch.org/whl/cu118/X", True),  # a sub-path is another index
    ],
)
def test_first_pass_finds_family_packages_from_another_index(data, src, flagged):
    from imagekit.locking import resolution

    text = "torch==2.5.1+cu118\n    # from https://download.pytorch.org/whl/cu118\n"
    text += "nvidia-cudnn-cu11==9.1.0.70\n    # via torch\n" + (f"    # from {src}\n" if src else "")
    text += "numpy==1.26.4\n    # via torch\n    # from https://pypi.org/simple\n"
    req = resolution.request(CU118, resolution.LockSettings(), data)
    assert resolution.misrouted(req, text) == ({"nvidia-cudnn-cu11"} if flagged else set())
    assert resolution.misrouted(resolution.request(CU121, resolution.LockSettings(), data), text) == set()


def test_the_verify_guard_treats_a_sub_path_as_another_index(data):
    from imagekit.errors import CheckFailed
    from imagekit.locking import resolution

    req = resolution.request(CU118, resolution.LockSettings(), data)
    entries = [_e("torch", "2.5.1+cu118")]
    with pytest.raises(CheckFailed, match="torch came from"):
        resolution.verify(req, entries, {"torch": "https://download.pytorch.org/whl/cu118/X"}, data)


def test_a_comment_between_pins_is_not_a_package():
    from imagekit.locking.resolution import index_of_entries

    text = "baz==2.0\n# a comment\n    # from https://b.example/simple\n"
    assert index_of_entries(text) == {"baz": "https://b.example/simple"}


def test_build_lock_writes_the_header_for_the_matrix_and_resolver_used(data):
    from imagekit.locking import resolution

    req = resolution.request(CU121, resolution.LockSettings(), data)
    out = (
        f"nvidia-cuda-runtime-cu12==12.1.105 \\\n    --hash={H1}\n    # via torch\n"
        f"torch==2.1.2 \\\n    --hash={H2}\n"
        f"transformers==4.48.2 \\\n    --hash={H1}\n"
    )
    lock = resolution.build_lock(req, out, "team.toml", data, "uv 9.9")
    assert lock.header == resolution.header(req, "team.toml", data, "uv 9.9")[0]
    assert "(uv 9.9) for cu121-torch2.1.2-py3.11-tf4.48.2." in lock.header[1]
    assert lock.header[4] == "#    " + req.regenerate_command("team.toml") and "--matrix team.toml" in lock.header[4]
    assert [e.name for e in lock.torch] == ["nvidia-cuda-runtime-cu12", "torch"]
    with pytest.raises(UsageError, match=re.escape("uv output for cu121-torch2.1.2-py3.11-tf4.48.2:4: not an exact")):
        resolution.build_lock(req, out.replace("torch==2.1.2", "torch>=2.1"), None, data, "uv 9.9")


# ---- lockfile: the format pip reads, and the torch layer's closure -----------------------------------------
def test_pins_render_as_pip_reads_them():
    assert LockEntry("a", "1", ()).render() == "a==1"
    assert LockEntry("a", "1", (H1, H2), ("x", "y")).render() == (
        f"a==1 \\\n    --hash={H1} \\\n    --hash={H2}\n    # via\n    #   x\n    #   y"
    )
    assert LockEntry("a", "1", (H1,), ("x",)).render(via=False) == f"a==1 \\\n    --hash={H1}"


def test_a_shared_dependency_does_not_stop_the_closure():
    """torch needs a and b, both need c, and only b needs d: d is in torch's closure whatever the visiting order."""
    from imagekit.locking.lockfile import torch_closure

    entries = [
        LockEntry("torch", "2.5.1", (H1,)),
        LockEntry("a", "1", (H1,), ("torch",)),
        LockEntry("b", "1", (H1,), ("torch",)),
        LockEntry("c", "1", (H1,), ("a", "b")),
        LockEntry("d", "1", (H1,), ("b",)),
        LockEntry("e", "1", (H1,), ("c",)),
        LockEntry("app", "1", (H1,), ("-r requirements.in",)),
    ]
    for order in (entries, entries[::-1]):
        assert torch_closure(order) == {"torch", "a", "b", "c", "d", "e"}


def test_requirements_as_pip_compile_writes_them(tmp_path):
    """pip-compile's header comments and options, tab-indented continuations: all read, nothing lost."""
    from imagekit.locking.lockfile import parse_requirements

    text = (
        "#\n# This file is autogenerated by pip-compile\n#\n"
        "--index-url https://pypi.org/simple\n\n"
        f"Foo_Bar==1.0 \\\n\t--hash={H2} \\\n\t--hash={H1}\n\t# via torch\n"
        f"baz==2.0 \\\n    --hash={H1}\n    # via\n    #   a\n    #   b\n# top-level comment\n"
    )
    assert parse_requirements(text) == [
        LockEntry("foo-bar", "1.0", (H1, H2), ("torch",)),
        LockEntry("baz", "2.0", (H1,), ("a", "b")),
    ]
    with pytest.raises(UsageError) as exc:
        parse_requirements("a==1\n\nb>=2\n")
    assert exc.value.message == "<lock>:3: not an exact pin: 'b>=2'"
    assert exc.value.hint == "locks contain only name==version lines and wheel URLs (name @ https://...whl#sha256=...)"
    with pytest.raises(UsageError) as exc:
        parse_requirements("a==1 \\\n    --hash=md5:00\n")
    assert (exc.value.message, exc.value.hint) == (
        "<lock>:2: bad hash '--hash=md5:00'",
        "only sha256 hashes are accepted",
    )


def test_a_via_list_ends_at_the_next_pin_or_top_level_comment():
    from imagekit.locking.lockfile import parse_requirements

    text = "a==1\n    # via\n    #   x\n# section\n    #   stray\nb==2\n    #   stray\n"
    assert [e.via for e in parse_requirements(text)] == [("x",), ()]


def test_a_file_without_both_layer_marks_is_not_a_lock():
    from imagekit.locking.lockfile import APP_MARK, TORCH_MARK, parse

    for text in ("a==1\n", f"{TORCH_MARK}\na==1\n", f"{APP_MARK}\na==1\n"):
        with pytest.raises(UsageError) as exc:
            parse(text)
        assert exc.value.message == "<lock>: not an imagekit lock (no layer marks)"
        assert exc.value.hint == "regenerate it with `imagekit lock`"
    for text in (f"#\n{TORCH_MARK}\n{APP_MARK}\nb>=2\n", f"#\n{TORCH_MARK}\nb>=2\n{APP_MARK}\n"):
        line = text.splitlines().index("b>=2") + 1  # the line of the whole file, not of its section
        with pytest.raises(UsageError, match=re.escape(f"lockfiles/x.txt:{line}: not an exact pin: 'b>=2'")):
            parse(text, "lockfiles/x.txt")
    bare = parse(f"{TORCH_MARK}\n{APP_MARK}\n")
    assert bare.entries == () and bare.header == () and bare.meta == {}


def test_integrity_problems_name_the_line_of_a_non_canonical_name():
    from imagekit.locking.lockfile import integrity_problems, parse

    text = Lock((LockEntry("torch", "2.5.1", (H1,)),), ()).render()
    text += f"Foo_Bar==1.0 \\\n    --hash={H1}\nFOO-bar==1.0 \\\n    --hash={H1}\n"
    line = text.splitlines().index("Foo_Bar==1.0 \\") + 1
    problems = integrity_problems(parse(text), text)
    assert f"line {line}: foo-bar is pinned twice" in problems  # the first spelling, not only a canonical one
    assert integrity_problems(Lock((), ()), "") == [
        "no pins",
        "no '# imagekit-body-sha256' line: not written by this imagekit",
    ]


# ---- validate: GPU architectures, requirements, repositories, index URLs -----------------------------------
@pytest.mark.parametrize(
    ("value", "sm"),
    [("sm_90", "sm_90"), ("9.0", "sm_90"), ("90", "sm_90"), ("120", "sm_120"), ("sm_90a", "sm_90a"),
     ("8.6", "sm_86"), ("H100", "sm_90"), ("h100", "sm_90"), ("10.0f", "sm_100f")],
)  # fmt: skip
def test_gpu_architectures_accepted(data, value, sm):
    assert validate.arch(value, data.gpus) == sm


def test_gpu_architecture_refusals():
    gpus = {"H100": "sm_90", "A100": "sm_80"}
    cases = [
        ("x", gpus, "invalid GPU architecture 'x': expected a compute capability such as 'sm_90' or '9.0'; "
         "known GPU names: A100, H100"),
        ("1234", None, "invalid GPU architecture '1234': expected a compute capability such as 'sm_90' or '9.0'"),
        (5, None, "invalid GPU architecture 5: expected a compute capability such as 'sm_90'"),
    ]  # fmt: skip
    for value, names, message in cases:
        with pytest.raises(UsageError) as exc:
            validate.arch(value, names)
        assert exc.value.message == message
    assert validate.arch_key("sm_120") == (12, 0) and validate.arch_key("sm_90a") == (9, 0)
    with pytest.raises(UsageError) as exc:
        validate.arch_key("9.0")
    assert exc.value.message == "invalid GPU architecture '9.0': expected 'sm_XY'"


def test_validators_give_a_hint_where_one_helps():
    with pytest.raises(UsageError) as exc:
        validate.version("v2.5.1", "torch version")
    assert exc.value.message == "invalid torch version 'v2.5.1': expected the canonical form '2.5.1'"
    assert exc.value.hint == "write versions without spaces or prefixes"
    with pytest.raises(UsageError) as exc:
        direct_wheels.requirement("pkg @ https://x.example/pkg-1.0.tar.gz")
    assert exc.value.message == (
        "invalid requirement: pkg @ https://x.example/pkg-1.0.tar.gz: not a wheel (pkg-1.0.tar.gz); a source archive "
        "is built"
    )
    assert exc.value.hint.startswith("name a prebuilt wheel by URL with its hash")
    with pytest.raises(UsageError) as exc:
        direct_wheels.requirement("==1")
    assert exc.value.message.startswith("invalid requirement '==1': expected a PEP 508 requirement (Expected package")


@pytest.mark.parametrize("fn", [direct_wheels.requirement, validate.repository, validate.index_url])
@pytest.mark.parametrize("value", [None, 5, ["x"]])
def test_non_strings_are_usage_errors(fn, value):
    with pytest.raises(UsageError):
        fn(value)


def test_repositories_up_to_255_characters_and_any_registry_host_case():
    longest = "r/" + "a" * 253
    assert validate.repository(longest) == longest
    with pytest.raises(UsageError):
        validate.repository(longest + "a")
    for ok in ("Registry.Example.com/team/img", "localhost/img", "LocalHost:5000/img", "[::1]:5000/img"):
        assert validate.repository(ok) == ok
    for bad in ("Team/img", "team/Img", "team//img"):
        with pytest.raises(UsageError):
            validate.repository(bad)


def test_index_url_refusals():
    with pytest.raises(UsageError) as exc:
        validate.index_url("")
    assert exc.value.message == "invalid index URL '': expected an http(s) index URL such as https://pypi.org/simple"
    with pytest.raises(UsageError) as exc:
        validate.index_url("ftp://x/simple")
    assert exc.value.message == (
        "invalid index URL 'ftp://x/simple': expected an http(s) URL without spaces or control characters"
    )
    assert exc.value.hint == "pass one URL per option, e.g. https://example.com/simple"
    with pytest.raises(UsageError) as exc:
        validate.index_url("ftp://x/simple", "--pytorch-index")
    assert exc.value.hint == "pass one URL per option, e.g. --pytorch-index https://download.pytorch.org/whl"


def test_a_lock_that_is_not_this_cells_says_so_with_every_problem(data):
    from imagekit.errors import CheckFailed
    from imagekit.locking import resolution
    from imagekit.locking.lockfile import parse

    lock = Lock((LockEntry("torch", "2.1.2", ()),), ())
    text = lock.render()
    with pytest.raises(CheckFailed) as exc:
        resolution.verify_lock(parse(text), text, CU121, data, "lockfiles/x.txt")
    assert exc.value.message.split("\n") == [
        f"lockfiles/x.txt: line {text.splitlines().index('torch==2.1.2') + 1}: torch==2.1.2 has no --hash",
        f"lockfiles/x.txt: is the lock of an unnamed cell, not of {CU121.id}",
    ]
    assert exc.value.hint == (
        f"never build from it: delete lockfiles/x.txt and run `imagekit lock --cell {CU121.id}` to resolve it again"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (2.5, "invalid version 2.5: expected a version string such as '2.5.1'"),
        ("2.x", "invalid version '2.x': expected a PEP 440 version such as '2.5.1'"),
    ],
)
def test_version_refusals(value, message):
    with pytest.raises(UsageError) as exc:
        validate.version(value)
    assert exc.value.message == message
