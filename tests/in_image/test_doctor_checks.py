"""Doctor checks the README lists that had no test: tools from another environment, PYTHONPATH shadowing, local-label
drift, low disk and inodes, a small /dev/shm.

Everything is real: virtual environments with console scripts written by uv, PATHs and PYTHONPATHs, and for disk
and /dev/shm small tmpfs mounts made in a private mount namespace (`unshare -rm`), with the doctor run inside it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from imagekit.effects.resolver import uv_binary
from imagekit.in_image import imagekit_doctor as doc
from tests.in_image.test_doctor import DOCTOR, by_id, make_venv, run_doctor


def make_wheel(
    out: Path, name: str, version: str, modules: dict[str, str], scripts: dict[str, str] | None = None
) -> Path:
    """A pure-Python wheel of distribution ``name`` holding ``modules`` (path -> source) and console ``scripts``."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {path: src.encode() for path, src in modules.items()}
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n".encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: imagekit-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if scripts:
        lines = "".join(f"{k} = {v}\n" for k, v in scripts.items())
        files[f"{info}/entry_points.txt"] = f"[console_scripts]\n{lines}".encode()
    record = [
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
        for p, d in files.items()
    ]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, d in files.items():
            zf.writestr(zipfile.ZipInfo(p, (2025, 1, 1, 0, 0, 0)), d)
    return path


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("doctor-wheels")
    main = "def main():\n    print('ran')\n"
    make_wheel(out, "alpha", "1.0", {"alpha/__init__.py": ""})
    make_wheel(out, "pip", "24.3.1", {"pip_stub/__init__.py": main}, {"pip": "pip_stub:main"})
    make_wheel(out, "accelerate", "1.2.1", {"accelerate/__init__.py": main}, {"accelerate": "accelerate:main"})
    make_wheel(out, "pyyaml", "6.0.2", {"yaml/__init__.py": "__version__ = '6.0.2'\n"})  # imported as `yaml`
    for label in ("cu121", "cu124"):
        make_wheel(
            out,
            "torch",
            f"2.5.1+{label}",
            {"torch/__init__.py": f"__version__ = '2.5.1+{label}'\n"},
            {"torchrun": "torch:main"},
        )
    return out


def install(venv: Path, wheels: Path, *pins: str, target: Path | None = None) -> None:
    where = ["--target", str(target)] if target else []
    subprocess.run(
        [
            uv_binary(),
            "pip",
            "install",
            "-q",
            "--python",
            str(venv / "bin" / "python"),
            "--no-index",
            "--find-links",
            str(wheels),
            *where,
            *pins,
        ],
        check=True,
        capture_output=True,
    )


def manifest(tmp: Path, **dists: str) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "manifest.json"
    path.write_text(json.dumps({"distributions": dists}))
    return path


# ---- tools from another environment -------------------------------------------------------------------------
@pytest.mark.programs
def test_pip_from_another_environment_earlier_on_path_is_a_blocker(tmp_path, wheels):
    venv = make_venv(tmp_path / "v", wheels)
    install(venv, wheels, "pip==24.3.1", "alpha==1.0")
    other = make_venv(tmp_path / "other", wheels)
    install(other, wheels, "pip==24.3.1")
    tools = tmp_path / "user-bin"  # e.g. ~/.local/bin first on PATH, holding another installation's pip
    tools.mkdir()
    (tools / "pip").symlink_to(other / "bin" / "pip")
    m = manifest(tmp_path, alpha="1.0", pip="24.3.1")
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(m), path_dirs=[venv / "bin"])
    assert code == 0 and by_id(report)["interpreter-identity"]["status"] == "pass"
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(m), path_dirs=[tools, venv / "bin"])
    ident = by_id(report)["interpreter-identity"]
    assert code == 1 and ident["status"] == "fail"
    assert ident["message"] == f"`pip` -> {tools / 'pip'} belongs to {other}, not {venv}"
    assert ident["evidence"]["pip"]["prefix"] == str(other) and str(venv / "bin") in ident["fix"]


@pytest.mark.programs
def test_pinned_launchers_must_come_from_the_environment(tmp_path, wheels):
    venv = make_venv(tmp_path / "v", wheels)
    install(venv, wheels, "alpha==1.0")
    other = make_venv(tmp_path / "other", wheels)
    install(other, wheels, "accelerate==1.2.1", "torch==2.5.1+cu124")
    m = manifest(tmp_path, alpha="1.0", accelerate="1.2.1")
    # not pinned, not on PATH: nothing to say; pinned but missing: said
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(manifest(tmp_path / "m0", alpha="1.0")))
    assert by_id(report)["interpreter-identity"]["status"] == "pass"
    _, report, _ = run_doctor(venv, tmp_path, "--expect", str(m))
    assert by_id(report)["interpreter-identity"]["message"] == "`accelerate` is not on PATH"
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("accelerate", "torchrun"):
        (tools / name).symlink_to(other / "bin" / name)
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(m), path_dirs=[venv / "bin", tools])
    ident = by_id(report)["interpreter-identity"]
    assert code == 1 and ident["status"] == "fail"
    assert f"`accelerate` -> {tools / 'accelerate'} belongs to {other}" in ident["message"]
    assert f"`torchrun` -> {tools / 'torchrun'} belongs to {other}" in ident["message"]  # torch is not pinned: still


@pytest.mark.programs
@pytest.mark.parametrize("folder", ["my project/.venv", "deep/" + "x" * 150 + "/.venv"])
def test_own_console_scripts_in_a_spaced_or_long_path_are_the_environment(tmp_path, wheels, folder):
    """pip and uv write `#!/bin/sh` + `'''exec' '/path/bin/python' "$0" "$@"` when the interpreter path has a space or
    is longer than a shebang may be: those scripts are the environment's own, not another installation."""
    venv = make_venv(tmp_path / folder, wheels)
    install(venv, wheels, "pip==24.3.1", "accelerate==1.2.1")
    assert (venv / "bin" / "accelerate").read_text().startswith("#!/bin/sh\n'''exec' ")
    assert subprocess.run([str(venv / "bin" / "accelerate")], capture_output=True, text=True).stdout == "ran\n"
    m = manifest(tmp_path, accelerate="1.2.1", pip="24.3.1")
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(m))
    ident = by_id(report)["interpreter-identity"]
    assert ident["status"] == "pass", ident["message"]
    assert ident["evidence"]["accelerate"]["prefix"] == str(venv) and code == 0


@pytest.mark.programs
def test_env_shebang_follows_path(tmp_path, wheels):
    """`#!/usr/bin/env python3` scripts run whichever python3 PATH finds first."""
    venv = make_venv(tmp_path / "v", wheels)
    other = make_venv(tmp_path / "other", wheels)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "accelerate").write_text("#!/usr/bin/env python3\nprint('ran')\n")
    (tools / "accelerate").chmod(0o755)
    m = manifest(tmp_path, accelerate="1.2.1")
    _, report, _ = run_doctor(venv, tmp_path, "--expect", str(m), path_dirs=[venv / "bin", tools, Path("/usr/bin")])
    assert by_id(report)["interpreter-identity"]["evidence"]["accelerate"]["prefix"] == str(venv)
    _, report, _ = run_doctor(venv, tmp_path, "--expect", str(m), path_dirs=[tools, other / "bin", venv / "bin"])
    assert by_id(report)["interpreter-identity"]["evidence"]["accelerate"]["prefix"] == str(other)


# ---- PYTHONPATH shadowing -----------------------------------------------------------------------------------
def _shadow_run(tmp: Path, venv: Path, shadow: Path, m: Path):
    """The doctor as images run it (`python -I`) and as a user runs it, both with PYTHONPATH set."""
    env = {"PATH": str(venv / "bin"), "HOME": str(tmp), "HF_HOME": str(tmp / "hf"), "PYTHONPATH": str(shadow)}
    out = []
    for flags in (["-I"], []):
        res = subprocess.run(
            [str(venv / "bin" / "python"), *flags, str(DOCTOR), "--tier", "quick", "--json", "--expect", str(m)],
            capture_output=True,
            text=True,
            env=env,
        )
        out.append((res.returncode, by_id(json.loads(res.stdout))))
    return out


@pytest.mark.programs
def test_pythonpath_single_module_shadowing_a_pin_is_a_blocker(tmp_path, wheels):
    """A checkout's `alpha.py` on PYTHONPATH is what `import alpha` loads, whatever the lock installed."""
    venv = make_venv(tmp_path / "v", wheels)
    install(venv, wheels, "alpha==1.0")
    shadow = tmp_path / "src"
    shadow.mkdir()
    (shadow / "alpha.py").write_text("VERSION = 'from a checkout'\n")
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import alpha; print(alpha.__file__)"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(shadow)},
    )
    assert probe.stdout.strip() == str(shadow / "alpha.py")  # it does shadow
    for code, checks in _shadow_run(tmp_path, venv, shadow, manifest(tmp_path, alpha="1.0")):
        assert code == 1 and checks["shadowing"]["status"] == "fail", checks["shadowing"]
        assert str(shadow) in checks["shadowing"]["message"]


@pytest.mark.programs
def test_pythonpath_distribution_with_another_import_name_is_a_blocker(tmp_path, wheels):
    """PyYAML imports as `yaml`: a copy installed on PYTHONPATH shadows the pin though no `pyyaml` folder exists."""
    venv = make_venv(tmp_path / "v", wheels)
    install(venv, wheels, "pyyaml==6.0.2")
    shadow = tmp_path / "vendored"
    install(venv, wheels, "pyyaml==6.0.2", target=shadow)
    assert (shadow / "yaml").is_dir() and not (shadow / "pyyaml").exists()
    for code, checks in _shadow_run(tmp_path, venv, shadow, manifest(tmp_path, pyyaml="6.0.2")):
        assert code == 1 and checks["shadowing"]["status"] == "fail", checks["shadowing"]
        assert "pyyaml" in checks["shadowing"]["message"].lower() and str(shadow) in checks["shadowing"]["message"]


@pytest.mark.programs
def test_pythonpath_without_pinned_packages_is_a_warning(tmp_path, wheels):
    venv = make_venv(tmp_path / "v", wheels)
    install(venv, wheels, "alpha==1.0")
    shadow = tmp_path / "mine"
    shadow.mkdir()
    (shadow / "train_utils.py").write_text("")
    for code, checks in _shadow_run(tmp_path, venv, shadow, manifest(tmp_path, alpha="1.0")):
        assert code == 0 and checks["shadowing"]["status"] == "warn"
        assert checks["shadowing"]["evidence"]["PYTHONPATH"] == str(shadow)


# ---- local-label drift ---------------------------------------------------------------------------------------
@pytest.mark.programs
def test_local_label_drift_is_torch_family_drift(tmp_path, wheels):
    """torch 2.5.1+cu121 where the image pins 2.5.1+cu124: same public version, another CUDA build."""
    venv = make_venv(tmp_path / "v", wheels)
    install(venv, wheels, "torch==2.5.1+cu121", "alpha==1.0")
    lock = tmp_path / "lock.txt"
    lock.write_text(
        "# --- layer: torch ---\ntorch==2.5.1+cu124 \\\n    --hash=sha256:" + "0" * 64 + "\n# --- layer: app ---\n"
        "alpha==1.0 \\\n    --hash=sha256:" + "1" * 64 + "\n"
    )
    for expect in (manifest(tmp_path, torch="2.5.1+cu124", alpha="1.0"), lock):
        code, report, _ = run_doctor(venv, tmp_path, "--expect", str(expect))
        drift = by_id(report)["lock-drift"]
        assert code == 1 and drift["status"] == "fail"
        assert drift["message"] == (
            "torch-family drift (the GPU stack is not the tested one): torch 2.5.1+cu121 (pinned 2.5.1+cu124)"
        )
        assert drift["evidence"]["different"] == {"torch": {"installed": "2.5.1+cu121", "pinned": "2.5.1+cu124"}}
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(manifest(tmp_path, torch="2.5.1+cu121", alpha="1.0")))
    assert code == 0 and by_id(report)["lock-drift"]["status"] == "pass"
    code, report, _ = run_doctor(venv, tmp_path, "--expect", str(manifest(tmp_path, torch="2.5.1", alpha="1.0")))
    assert code == 1 and "torch 2.5.1+cu121 (pinned 2.5.1)" in by_id(report)["lock-drift"]["message"]


# ---- disk, inodes, /dev/shm ----------------------------------------------------------------------------------
def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = 'd=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs "$d" && umount "$d"; rc=$?; rmdir "$d"; exit $rc'
    res = subprocess.run(["unshare", "-rm", "sh", "-c", probe], capture_output=True)
    return res.returncode == 0


needs_mounts = pytest.mark.skipif(not _can_unshare(), reason="no user+mount namespaces here (unshare -rm)")


def doctor_in_namespace(tmp: Path, setup: str, *args: str) -> dict:
    """Run the doctor in a private mount namespace after the shell commands ``setup`` (mounts, files)."""
    cmd = [sys.executable, str(DOCTOR), "--tier", "quick", "--json", *args]
    script = f"set -e\n{setup}\nexec {shlex.join(cmd)}\n"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp), "HF_HOME": str(tmp / "hf")}
    res = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert res.stdout, res.stderr
    return by_id(json.loads(res.stdout))


@needs_mounts
@pytest.mark.parametrize(
    ("size", "files", "status", "needle"),
    [
        ("512m", 0, "fail", "GB free"),  # under 1 GB
        ("3g", 0, "warn", "only 3.2 GB free"),  # under 10 GB
        ("64g", 193, "warn", "(3.0% inodes)"),  # 6 of 200 inodes left
        ("64g", 198, "fail", "0.5% inodes free"),  # 1 of 200 left
        ("64g", 0, "pass", "69 GB free"),  # tmpfs size is a limit, not memory
    ],
)
def test_low_disk_and_inodes_on_an_output_volume(tmp_path, size, files, status, needle):
    vol = tmp_path / "vol"
    vol.mkdir()
    setup = f"mount -t tmpfs -o size={size},nr_inodes=200 tmpfs {shlex.quote(str(vol))}\n"
    if files:
        setup += f"cd {shlex.quote(str(vol))} && i=0 && while [ $i -lt {files - 1} ]; do : > f$i; i=$((i+1)); done\n"
        setup += "mkdir out\n"  # the output folder itself takes an inode too
    checks = doctor_in_namespace(tmp_path, setup, "--path", str(vol / "out"))
    disk = checks["disk-output"]
    assert disk["status"] == status and needle in disk["message"], disk
    assert disk["evidence"]["path"] == str(vol / "out" if files else vol)  # a folder not made yet: its parent


@pytest.mark.seconds
@needs_mounts
@pytest.mark.parametrize(("size", "status"), [("64m", "warn"), ("1g", "pass"), ("8g", "pass")])
def test_small_dev_shm_warns(tmp_path, size, status):
    checks = doctor_in_namespace(tmp_path, f"mount -t tmpfs -o size={size} tmpfs /dev/shm")
    shm = checks["shm"]
    assert shm["status"] == status and shm["evidence"]["bytes"] == {"64m": 64, "1g": 1024, "8g": 8192}[size] << 20
    if status == "warn":
        assert shm["message"].startswith("/dev/shm is 64 MiB") and "--shm-size" in shm["fix"]


def test_disk_and_shm_thresholds_on_this_machine(tmp_path):
    """The same checks on this machine's real filesystems, with thresholds on either side of what they have."""
    st = os.statvfs(tmp_path)
    free_gb = st.f_bavail * st.f_frsize / 1e9
    assert doc.check_disk([("output", str(tmp_path / "not-yet"))], min_free_gb=free_gb * 2)[0]["status"] == "warn"
    if free_gb > 2 and st.f_favail / max(st.f_files, 1) > 0.05:
        assert doc.check_disk([("output", str(tmp_path))], min_free_gb=1.0)[0]["status"] == "pass"
    shm = os.statvfs("/dev/shm")
    size = shm.f_blocks * shm.f_frsize
    assert doc.check_shm(min_bytes=size + 1)["status"] == "warn"
    assert doc.check_shm(min_bytes=size)["status"] == "pass"
