"""What a requirements file's pip forms become in the matrix (services.requirement_forms): its index lines the
lock's indexes, its `.` / `-e ./sub` lines `[image] install`, a VCS line without a name named from its commit."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from imagekit.errors import ConfigError
from imagekit.services import inputs

CELL = '[[matrix.include]]\ncuda = "12.4"\ntorch = "2.5.1"\ntransformers = "4.48.2"\npython = "3.11"\n'
PYPROJECT = (
    '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n[project]\nname = "app"\n'
)


def _project(root: Path, requirements: str, image: str = "", lock: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "requirements.txt").write_text(requirements)
    (root / "pyproject.toml").write_text(PYPROJECT)
    head = '[matrix]\nrequirements = "requirements.txt"\n'
    (root / "m.toml").write_text(
        head + CELL + (f"[image]\n{image}" if image else "") + (f"[lock]\n{lock}" if lock else "")
    )
    return root / "m.toml"


def _refused(path: Path, data) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        inputs.load_matrix(path, data)
    return info.value


def test_index_lines_become_the_locks_indexes(tmp_path, data):
    m = _project(tmp_path, "--index-url https://mirror.example/simple\n--extra-index-url https://a.example/simple\n"
                 "numpy\n", lock='extra_index_urls = ["https://b.example/simple"]\n')  # fmt: skip
    config = inputs.load_matrix(m, data)
    assert config.index_url == "https://mirror.example/simple"
    assert config.extra_index_urls == ("https://b.example/simple", "https://a.example/simple")
    assert config.cells[0].packages == ("numpy",)


def test_a_main_index_that_contradicts_lock_index_url_is_refused_naming_both(tmp_path, data):
    m = _project(tmp_path, "-i https://mirror.example/simple\n", lock='index_url = "https://other.example/simple"\n')
    err = _refused(m, data)
    assert "requirements.txt:1: --index-url https://mirror.example/simple replaces the main index" in str(err)
    assert "https://other.example/simple" in str(err)


@pytest.mark.parametrize("line", [".", "-e .", "./", "-e ./."])
def test_the_project_itself_becomes_image_install_when_the_image_copies_it(tmp_path, data, line):
    m = _project(tmp_path, f"numpy\n{line}\n", image='copy = "."\n')
    config = inputs.load_matrix(m, data)
    assert config.options.install == os.path.normpath(str(tmp_path))
    # and the project's build backend (no [build-system]: setuptools' legacy one) joins the cell's closure
    assert config.cells[0].packages == ("numpy", "setuptools", "wheel")


def test_a_package_of_the_project_becomes_image_install(tmp_path, data):
    m = _project(tmp_path, "-e ./sub\n", image='copy = "."\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "setup.py").write_text("from setuptools import setup\nsetup(name='sub')\n")
    assert inputs.load_matrix(m, data).options.install == str(tmp_path / "sub")


def test_install_named_already_is_kept_and_another_folder_refused(tmp_path, data):
    (tmp_path / "sub").mkdir(parents=True)
    (tmp_path / "sub" / "pyproject.toml").write_text(PYPROJECT)
    m = _project(tmp_path, ".\n", image='copy = "."\ninstall = "."\n')
    assert inputs.load_matrix(m, data).options.install == str(tmp_path)
    m = _project(tmp_path, "./sub\n", image='copy = "."\ninstall = "."\n')
    err = _refused(m, data)
    assert "requirements.txt:1: sub installs another folder than [image] install" in str(err)


def test_the_project_without_copy_is_refused_with_the_keys_to_add(tmp_path, data):
    err = _refused(_project(tmp_path, "-e .\n"), data)
    assert "requirements.txt:1: . installs the project's own code, which the image does not copy" in str(err)
    assert err.hint is not None and '[image] copy = "." and install = "."' in err.hint


def test_a_folder_outside_the_copied_one_is_refused(tmp_path, data):
    (tmp_path / "tools").mkdir(parents=True)
    (tmp_path / "tools" / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "src").mkdir()
    err = _refused(_project(tmp_path, "./tools\n", image='copy = "src"\n'), data)
    assert "requirements.txt:1: tools: [image] install" in str(err) and "not inside the copied folder" in str(err)


def test_hostile_folders_are_refused(tmp_path, data):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "pyproject.toml").write_text(PYPROJECT)
    root = tmp_path / "p"
    m = _project(root, "./escape\n", image='copy = "."\n')
    (root / "escape").symlink_to(outside)
    assert "escape leads out of the project through a link" in str(_refused(m, data))
    m = _project(root, "./missing\n", image='copy = "."\n')
    assert "missing: no such folder in the project" in str(_refused(m, data))
    (root / "empty").mkdir()
    m = _project(root, "./empty\n", image='copy = "."\n')
    assert "holds no pyproject.toml or setup.py" in str(_refused(m, data))
    (root / "file.txt").write_text("x")
    m = _project(root, "./file.txt\n", image='copy = "."\n')
    assert "file.txt is not a folder" in str(_refused(m, data))
    m = _project(root, "../outside\n", image='copy = "."\n')
    assert "../outside is outside the project" in str(_refused(m, data))


# ---- a VCS line without a name: named from its commit, served by a local git server (git's dumb HTTP) ----------
@pytest.mark.loopback
def test_a_nameless_vcs_line_is_named_from_its_commit_and_a_branch_refused_with_todays_commit(
    tmp_path, data, monkeypatch
):
    from tests.services.test_wheel_builds_docker import _git_repo
    from tests.wheelfactory import serve

    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    commit = _git_repo(tmp_path / "git")  # a package named gitkit, version 2.0
    with serve(tmp_path / "git" / "served") as url:
        repo = f"{url}/gitkit.git"
        m = _project(tmp_path / "p", f"numpy\ngit+{repo}@{commit}\n")
        config = inputs.load_matrix(m, data)
        assert config.cells[0].packages == (f"gitkit @ git+{repo}@{commit}", "numpy")
        for line, said in ((f"git+{repo}@main", "'main' is a branch or tag"),
                           (f"git+{repo}", "names no commit: the default branch (HEAD)")):  # fmt: skip
            err = _refused(_project(tmp_path / "p", f"{line}\n"), data)
            assert f"requirements.txt:1: {line}: {said}, which may move" in str(err)  # the line as written
            assert f"today it names commit {commit}" in str(err)
            assert err.hint is not None and f"pin it: `git+{repo}@{commit}`" in err.hint
        # `without` can name what the commit's metadata named
        (tmp_path / "p" / "m.toml").write_text(
            (tmp_path / "p" / "m.toml")
            .read_text()
            .replace(
                'requirements = "requirements.txt"',
                'requirements = { file = "requirements.txt", without = ["gitkit"] }',
            )
        )
        (tmp_path / "p" / "requirements.txt").write_text(f"numpy\ngit+{repo}@{commit}\n")
        assert inputs.load_matrix(tmp_path / "p" / "m.toml", data).cells[0].packages == ("numpy",)
    # the name is kept: read again with the server gone, nothing is fetched
    config = inputs.load_matrix(_project(tmp_path / "p", f"git+{repo}@{commit}\n"), data)
    assert config.cells[0].packages == (f"gitkit @ git+{repo}@{commit}",)


def _served_repo(root: Path, files: dict[str, str]) -> str:
    """A bare repository of ``files`` under ``root/served/tree.git`` (git's dumb HTTP); its commit."""
    import subprocess

    work = root / "work"
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(root), "PATH": "/usr/bin:/bin"}  # fmt: skip
    git = lambda *a, cwd=work: subprocess.run(["git", *a], cwd=cwd, env=env, check=True, capture_output=True, text=True)  # noqa: E731
    git("init", "-q", "-b", "main")
    git("add", ".")
    git("commit", "-q", "-m", "x")
    git("clone", "-q", "--bare", str(work), str(root / "served" / "tree.git"), cwd=root)
    git("update-server-info", cwd=root / "served" / "tree.git")
    return git("rev-parse", "HEAD").stdout.strip()


@pytest.mark.loopback
def test_a_commit_that_states_no_name_asks_for_egg(tmp_path, data, monkeypatch):
    from tests.wheelfactory import serve

    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    commit = _served_repo(tmp_path, {"pyproject.toml": "[tool.black]\nline-length = 100\n", "pkg/__init__.py": ""})
    with serve(tmp_path / "served") as url:
        err = _refused(_project(tmp_path / "p", f"git+{url}/tree.git@{commit}\n"), data)
    assert "its commit states no name imagekit can read" in str(err)
    assert err.hint is not None and "#egg=NAME" in err.hint


@pytest.mark.docker
@pytest.mark.loopback
def test_a_commit_that_states_its_name_only_in_setup_py_is_named_by_its_hook_in_a_container(
    tmp_path, data, monkeypatch
):
    """huggingface/peft's shape: setup.py and a pyproject.toml of tool settings only. setuptools' metadata hook runs
    in the base, network off, the tree read-only, as for a project's own setup.py."""
    from tests.wheelfactory import serve

    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    setup = "from setuptools import setup\nsetup(name='Hidden_Pkg', version='0.3', packages=['hidden'])\n"
    files = {"setup.py": setup, "pyproject.toml": "[tool.ruff]\nline-length = 119\n", "hidden/__init__.py": ""}
    commit = _served_repo(tmp_path, files)
    with serve(tmp_path / "served") as url:
        config = inputs.load_matrix(_project(tmp_path / "p", f"numpy\ngit+{url}/tree.git@{commit}\n"), data)
    assert config.cells[0].packages == (f"hidden-pkg @ git+{url}/tree.git@{commit}", "numpy")


# ---- locked: a requirements file with each form, resolved by uv against loopback indexes -----------------------
@pytest.mark.resolver
@pytest.mark.loopback
def test_a_requirements_file_with_each_form_locks(app, runner, fake_index, tmp_path, monkeypatch):
    from tests.wheelfactory import build_wheel, serve, write_simple_index

    extra = tmp_path / "extra"
    # the project's build backend (`-e .`: its [build-system] requires setuptools) is locked with the rest
    backend = [build_wheel(tmp_path / "xw", n, v) for n, v in (("setuptools", "80.9.0"), ("wheel", "0.45.1"))]
    write_simple_index(extra, [build_wheel(tmp_path / "xw", "extrapkg", "1.0", ["filelock"]), *backend])
    url_wheel = build_wheel(extra / "direct", "urlpkg", "1.0")
    project = tmp_path / "p"
    (project / "wheels").mkdir(parents=True)
    build_wheel(project / "wheels", "localpkg", "1.0")
    (project / "pyproject.toml").write_text(PYPROJECT)
    with serve(extra) as second:
        (project / "requirements.txt").write_text(
            f"--index-url {fake_index}\n--extra-index-url {second}/simple\n"
            f"numpy  # the array \\\nfilelock\n"  # pip takes filelock into the comment
            f"extrapkg\n{second}/direct/{url_wheel.name}\n./wheels/localpkg-1.0-py3-none-any.whl\n-e .\n"
        )
        (project / "m.toml").write_text(
            '[matrix]\nrequirements = "requirements.txt"\n' + CELL + '[image]\ncopy = "."\n'
        )
        monkeypatch.chdir(project)
        res = runner.invoke(app, ["lock", "--matrix", "m.toml", "--dir", "locks"])
        assert res.exit_code == 0, res.output
    (path,) = (project / "locks").iterdir()
    text = path.read_text()
    for name in ("numpy==1.26.4", "extrapkg==1.0", "filelock==3.16.1", "setuptools==80.9.0"):
        assert name in text, text
    assert f"urlpkg @ {second}/direct/{url_wheel.name}#sha256=" in text, text
    assert "localpkg @ file:wheels/localpkg-1.0-py3-none-any.whl#sha256=" in text, text
    assert fake_index in text and f"{second}/simple" in text, text  # the indexes the lock used, recorded


@pytest.mark.resolver
@pytest.mark.loopback
def test_an_index_the_file_names_gets_the_index_credentials_and_no_lock_keeps_them(
    app, runner, fake_index, tmp_path, monkeypatch
):
    from imagekit.effects import index_auth
    from tests.wheelfactory import build_wheel, serve_with_auth, write_simple_index

    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv(index_auth.USER_VARIABLE, "builder")
    monkeypatch.setenv(index_auth.PASSWORD_VARIABLE, "s3cret-token")
    private = tmp_path / "private"
    write_simple_index(private, [build_wheel(tmp_path / "pw", "privpkg", "1.0")])
    project = tmp_path / "p"
    project.mkdir()
    with serve_with_auth(private, "builder", "s3cret-token") as (url, seen):
        (project / "requirements.txt").write_text(
            f"--index-url {fake_index}\n--extra-index-url {url}/simple\nprivpkg\n"
        )
        (project / "m.toml").write_text('[matrix]\nrequirements = "requirements.txt"\n' + CELL)
        monkeypatch.chdir(project)
        res = runner.invoke(app, ["lock", "--matrix", "m.toml", "--dir", "locks"])
        assert res.exit_code == 0, res.output
    expected = "Basic " + base64.b64encode(b"builder:s3cret-token").decode()
    assert expected in seen  # uv sent them to the file's index, when it asked
    (path,) = (project / "locks").iterdir()
    text = path.read_text()
    assert "privpkg==1.0" in text and f"{url}/simple" in text
    assert "s3cret-token" not in text and "s3cret-token" not in res.output
