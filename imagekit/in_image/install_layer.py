#!/opt/venv/bin/python -B
"""Install one layer's locked wheels with uv, offline, and leave no trace of uv.

usage: install-layer --wheels URL|DIR --uv FILENAME#sha256=HEX --requirements URL|FILE#sha256=HEX
                     (--venv DIR [--link-from DIR] [--compile] | --target DIR) [--files URL|FILE#sha256=HEX]
       install-layer --files URL|FILE#sha256=HEX     (a layer of files only: the user's code)
       install-layer --wheels URL|DIR --debs URL|FILE#sha256=HEX   (the locked .debs of `[image] apt`)

The uv wheel comes from the same wheelhouse as the locked wheels and is checked against its sha256 before use; it
is unpacked into a temporary folder that is gone when this ends; the requirements are checked against theirs too.
Installs are --no-index --require-hashes --no-deps. --compile byte-compiles what this layer added (hash-checked
.pyc under SOURCE_DATE_EPOCH), not the whole environment again. uv records a wheel file's mtime in
`<dist-info>/uv_cache.json` when it installs from a folder; that file (and its RECORD line) is removed, so the
layer's bytes do not depend on when the wheels were downloaded.

A layer installs no distribution the image below it already holds where the layer installs (the venv, or --target):
uv lists what is there first, and such a layer stops before installing anything. Staged, it would lie beside the
first install (two dist-infos of one name); on the builder, uv would remove the first, a whiteout dated with the
build's time. The base's venv keeps no seed the lock pins (Dockerfile.base), so each name is installed once.

--files unpacks a tarball of files at their image paths into / first, checked by its sha256 (the app layer's
files on the legacy builder, where a COPY after the big layers would cost a container commit of its own).

--debs installs exactly the .debs its list names (``<sha256>.deb name=version arch`` lines), each fetched from the
wheelhouse and checked against its sha256, with apt, offline: apt sees no package lists (an empty lists folder), so
anything not in the list is refused rather than downloaded; no downgrade, no removal, no service started. Files apt
and dpkg stamp with the time (logs, binary caches) are put back as they were, so the layer's bytes do not depend on
when it was built.

Staged (IMAGEKIT_STAGE=DIR, set by `imagekit build` when it writes the layers itself): everything this layer
adds goes under DIR/root at its image path instead of into /, on a bind mount of the host's disk, not the engine's
overlay; uv's cache goes to DIR too (hard links, one filesystem), bytecode is compiled there with the image path as
its file name, and DIR/dirs.json gives the owner and mode of each folder the image already has, so the layer imagekit
writes from DIR/root changes nothing but what was added. DIR/.nonce must hold IMAGEKIT_STAGE_NONCE (exit 75 if not:
the engine sees another folder than imagekit wrote, e.g. a remote engine). --debs cannot be staged (apt writes all
over / and dpkg's database); that layer is built as a container commit.

--link-from DIR links each folder the CUDA layers installed in DIR (nvidia/, cusparselt/, ...) into the venv's
site-packages, so the libraries' RPATHs ($ORIGIN/../../nvidia/cublas/lib) resolve as if installed there.
"""

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile


def fail(message, hint):
    sys.stderr.write(f"error: {message}\nhint: {hint}\n")
    sys.exit(2)


def read_checked(ref, what, hint):
    """The bytes at SOURCE (a URL or a file) of ``SOURCE#sha256=HEX``, refused unless they have that sha256."""
    source, _, digest = ref.partition("#sha256=")
    try:
        if "://" in source:
            with urllib.request.urlopen(source, timeout=60) as resp:
                data = resp.read()
        else:
            with open(source, "rb") as fh:
                data = fh.read()
    except OSError as exc:
        fail(f"cannot read {what} {source}: {exc}", hint)
    got = hashlib.sha256(data).hexdigest()
    if got != digest:
        fail(f"{source} has sha256 {got}, the Dockerfile pins {digest}",
             "other bytes than rendered; fetch/render again")
    return data


def fetch_uv(wheels, ref, into):
    filename = ref.partition("#")[0]
    data = read_checked(f"{wheels.rstrip('/')}/{ref}", "the uv wheel", "run `imagekit fetch` (it puts uv there)")
    wheel = os.path.join(into, filename)
    with open(wheel, "wb") as fh:
        fh.write(data)
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(".data/scripts/uv"))
        exe = os.path.join(into, "uv")
        with zf.open(member) as src, open(exe, "wb") as dst:
            shutil.copyfileobj(src, dst)
    os.chmod(exe, 0o755)
    os.unlink(wheel)
    return exe


def drop_uv_cache_records(root, before):
    for name in sorted(os.listdir(root)):
        info = os.path.join(root, name)
        if not name.endswith(".dist-info") or name in before:
            continue
        stamp = os.path.join(info, "uv_cache.json")
        if os.path.exists(stamp):
            os.unlink(stamp)
            record = os.path.join(info, "RECORD")
            with open(record) as fh:
                lines = [line for line in fh if not line.startswith(f"{name}/uv_cache.json,")]
            with open(record, "w") as fh:
                fh.writelines(lines)


DEB_LINE = re.compile(r"^([0-9a-f]{64})\.deb ([a-z0-9][a-z0-9+.-]+)=([A-Za-z0-9.+~:-]+) ([a-z0-9-]+)$")
# What apt and dpkg write with the time in it (or a per-build cache): restored to the base's bytes, or removed
VOLATILE = (
    "/var/log/dpkg.log", "/var/log/alternatives.log", "/var/log/apt/history.log", "/var/log/apt/term.log",
    "/var/log/apt/eipp.log.xz", "/var/cache/ldconfig/aux-cache", "/var/cache/apt/pkgcache.bin",
    "/var/cache/apt/srcpkgcache.bin", "/var/cache/debconf/config.dat-old", "/var/cache/debconf/templates.dat-old",
    "/var/cache/debconf/passwords.dat-old",
)
POLICY = "/usr/sbin/policy-rc.d"  # 101: no service starts while the layer is built


def read_deb_list(data):
    pins = []
    for line in data.decode("utf-8", "replace").splitlines():
        m = DEB_LINE.match(line)
        if not m:
            fail(f"not a package line in the .deb list: {line[:120]!r}", "render again")
        pins.append(m.groups())
    return pins


def install_debs(wheels, ref):
    pins = read_deb_list(read_checked(ref, "the .deb list", "render again"))
    saved = {}
    for path in VOLATILE:
        try:
            with open(path, "rb") as fh:
                saved[path] = fh.read()
        except FileNotFoundError:
            saved[path] = None
    had_policy = os.path.lexists(POLICY)
    with tempfile.TemporaryDirectory(prefix="imagekit-debs-") as tmp:
        files = []
        for sha, name, version, _arch in pins:
            data = read_checked(f"{wheels.rstrip('/')}/{sha}.deb#sha256={sha}", f"{name} {version}",
                                "run `imagekit fetch` (it puts the locked .debs there)")
            path = os.path.join(tmp, f"{sha}.deb")
            with open(path, "wb") as fh:
                fh.write(data)
            files.append(path)
        lists = os.path.join(tmp, "lists")
        os.makedirs(os.path.join(lists, "partial"))
        if not had_policy:
            with open(POLICY, "w") as fh:
                fh.write("#!/bin/sh\nexit 101\n")
            os.chmod(POLICY, 0o755)
        try:
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            res = subprocess.run(
                ["apt-get", "install", "-y", "-q", "--no-install-recommends", "--no-remove",
                 "-o", f"Dir::State::Lists={lists}", "-o", "APT::Sandbox::User=root", "-o", "Dpkg::Use-Pty=0",
                 *files],
                env=env,
            )
        finally:
            if not had_policy:
                os.unlink(POLICY)
        if res.returncode != 0:
            fail("apt could not install the locked packages from their files alone",
                 "re-lock the cell (`imagekit lock -U`): the base changed since these packages were resolved")
    query = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${Architecture} ${Version} ${db:Status-Status}\\n"],
        capture_output=True, text=True,
    )
    got = {}
    for line in query.stdout.splitlines():
        parts = line.split(" ")
        if len(parts) == 4:
            got[(parts[0], parts[1])] = (parts[2], parts[3])
    for _, name, version, arch in pins:
        if got.get((name, arch)) != (version, "installed"):
            fail(f"{name} {version} ({arch}) is not what dpkg reports after the install: {got.get((name, arch))}",
                 "re-lock the cell (`imagekit lock -U`)")
    for path, data in saved.items():
        if data is None:
            if os.path.lexists(path):
                os.unlink(path)
        else:
            with open(path, "wb") as fh:
                fh.write(data)


STAGE_MISMATCH = 75  # the stage folder is not the one imagekit prepared: it falls back to `docker build`


def open_stage():
    """The staged root (DIR/root) when IMAGEKIT_STAGE is set, else None."""
    stage = os.environ.get("IMAGEKIT_STAGE")
    if not stage:
        return None
    try:
        with open(os.path.join(stage, ".nonce")) as fh:
            ok = fh.read().strip() == os.environ.get("IMAGEKIT_STAGE_NONCE", "")
    except OSError:
        ok = False
    if not ok:
        sys.stderr.write(f"install-layer: {stage} is not the folder imagekit prepared\n")
        sys.exit(STAGE_MISMATCH)
    root = os.path.join(stage, "root")
    os.makedirs(root, exist_ok=True)
    return root


def staged(root, path):
    """Where image path ``path`` is staged (the path itself when not staged)."""
    return os.path.join(root, path.lstrip("/")) if root else path


def record_folders(root):
    """Owner and mode of every staged folder the image already has: the layer keeps them as they are."""
    out = {}
    for here, dirs, _files in os.walk(root):
        dirs.sort()
        rel = os.path.relpath(here, root)
        if rel == ".":
            continue
        try:
            st = os.lstat("/" + rel)
        except OSError:
            continue
        if os.path.isdir("/" + rel) and not os.path.islink("/" + rel):
            out[rel] = [st.st_mode & 0o7777, st.st_uid, st.st_gid]
    with open(os.path.join(os.path.dirname(root), "dirs.json"), "w") as fh:
        json.dump(out, fh, sort_keys=True)


def main():
    # No bytecode written as modules are imported, by this program (-B above) or any Python it starts: the venv's
    # .pth imports the CUDA guard at every start, and a .pyc written then (its mtime in it) would make the layer
    # differ between builds and between build paths; --compile writes checked-hash bytecode itself.
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheels")
    ap.add_argument("--uv")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--venv")
    where.add_argument("--target")
    ap.add_argument("--requirements")
    ap.add_argument("--link-from")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--files")
    ap.add_argument("--debs")
    args = ap.parse_args()
    stage = None if args.debs else open_stage()
    try:
        install(ap, args, stage)
    finally:
        if stage:
            record_folders(stage)


def install(ap, args, stage):
    """One layer, as the options say: the .debs of `[image] apt`, or the files and then the wheels (into a venv or a
    target folder), byte-compiled when asked."""
    if args.debs:
        if not args.wheels:
            ap.error("--debs needs --wheels (where the .debs are)")
        install_debs(args.wheels, args.debs)
        return
    if args.files:
        unpack_files(args.files, stage)
    if not args.requirements:  # --files alone: a layer of files (the user's code), no wheels
        if args.files:
            return
        ap.error("--requirements (with --wheels, --uv and --venv or --target) or --files is required")
    if not (args.wheels and args.uv and (args.venv or args.target)):
        ap.error("--requirements needs --wheels, --uv and --venv or --target")
    python = os.path.join(args.venv or "/opt/venv", "bin", "python")
    site, root = install_folder(args, stage, python)
    if args.link_from and os.path.isdir(args.link_from):
        link_cuda_folders(args.link_from, site, root)
    before = set(os.listdir(root))
    installed = install_wheels(args, stage, python, root)
    drop_uv_cache_records(root, before)
    compiled = compile_added(python, root, before, stage) if args.compile else 0.0
    sys.stderr.write(f"install-layer: installed in {installed:.1f} s (uv)"
                     + (f", bytecode {compiled:.1f} s" if args.compile else "") + "\n")


def unpack_files(ref, stage):
    """The layer's tarball of files (``--files``), checked by its sha256, unpacked at their image paths."""
    data = read_checked(ref, "the layer's files", "render again")
    trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}  # checked above
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(staged(stage, "/"), numeric_owner=True, **trusted)


def install_folder(args, stage, python):
    """(site, root): the folder the wheels go to in the image (the venv's site-packages, or --target) and where it is
    written (the same folder unless staged)."""
    if args.venv:
        site = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
        root = staged(stage, site)
        if stage:
            # uv's --prefix lays out <prefix>/lib/pythonX.Y/site-packages as the venv does: the same RECORD paths and
            # script shebangs (the interpreter named by --python) as an install into the venv itself
            if os.path.relpath(site, args.venv).split(os.sep)[:1] != ["lib"]:
                fail(f"{site} is not under {args.venv}/lib", "stage only a venv laid out as `python -m venv` makes it")
            os.makedirs(root, exist_ok=True)
    else:
        site = args.target
        root = staged(stage, args.target)
        os.makedirs(root, exist_ok=True)
    return site, root


def link_cuda_folders(link_from, site, root):
    """``--link-from``: each package folder the CUDA layers installed there, linked into this site-packages."""
    for name in sorted(os.listdir(link_from)):
        source = os.path.join(link_from, name)
        if os.path.isdir(source) and not name.endswith((".dist-info", ".data")) and name != "__pycache__":
            if not os.path.lexists(os.path.join(site, name)) and not os.path.lexists(os.path.join(root, name)):
                os.symlink(source, os.path.join(root, name))


def install_wheels(args, stage, python, root):
    """The locked wheels installed with the checked uv, offline and hash-pinned; the seconds uv took (its exit code
    ends this program when it fails)."""
    with tempfile.TemporaryDirectory(prefix="imagekit-uv-") as tmp:
        uv = fetch_uv(args.wheels, args.uv, tmp)
        requirements = os.path.join(tmp, "requirements.txt")
        with open(requirements, "wb") as fh:
            fh.write(read_checked(args.requirements, "the layer's requirements", "render again"))
        # staged: uv's cache beside the staged root (one filesystem: hard links), removed below
        cache = ["--cache-dir", os.path.join(os.path.dirname(stage), "uv-cache")] if stage else ["--no-cache"]
        cmd = [uv, "pip", "install", "--no-config", "--no-index", "--find-links", args.wheels,
               "--require-hashes", "--no-deps", *cache, "--link-mode", "hardlink", "--python", python,
               "-r", requirements]
        if args.target:
            cmd += ["--target", root]
        elif stage:
            cmd += ["--prefix", staged(stage, args.venv)]
        # hardlink: uv unpacks each wheel into its throwaway cache in /tmp, on the layer's filesystem, and links the
        # files into place instead of copying gigabytes a second time; the cache is gone when uv ends, so the layer
        # holds each file once, unlinked
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1", "NO_COLOR": "1"}
        env.pop("VIRTUAL_ENV", None) if args.target else None
        refuse_a_second_install(uv, python, args.target, requirements, env)
        began = time.monotonic()
        res = subprocess.run(cmd, env=env)
        if res.returncode != 0:
            sys.exit(res.returncode)
        installed = time.monotonic() - began
        if stage:
            shutil.rmtree(os.path.join(os.path.dirname(stage), "uv-cache"), ignore_errors=True)
    return installed


PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ \\;]+)")


def refuse_a_second_install(uv, python, target, requirements, env):
    """Stop before anything is installed when the image below this layer already holds a distribution the layer
    installs, where it installs it (uv's own listing of the venv, or of --target): staged, the layer would hold a
    second install beside the first (two dist-infos of one name, the self-test reading one and the start check the
    other); on the builder, uv would remove the first, a whiteout the legacy builder dates with the build's time."""
    where = ["--target", target] if target else []
    res = subprocess.run([uv, "pip", "list", "--no-config", "--format", "json", "--python", python, *where],
                         env=env, capture_output=True, text=True)
    try:
        held = {d["name"]: d["version"] for d in json.loads(res.stdout)} if res.returncode == 0 else None
    except (ValueError, TypeError, KeyError):
        held = None
    if held is None:
        fail(f"cannot list what the image holds in {target or python}: uv exited {res.returncode}: "
             f"{res.stderr.strip()[-300:]}", "build again; if it persists, report it with this output")
    with open(requirements) as fh:
        pins = [m.groups() for m in map(PIN.match, fh) if m]
    twice = [f"{name} {held[name]} (this layer: {version})" for name, version in pins if name in held]
    if twice:
        fail(f"the image below this layer already holds {', '.join(twice)} in {target or 'the venv'}: installing the "
             "layer would leave a second install of each",
             "render and build again with this imagekit (its base venv keeps no seed the lock pins); a base of your "
             "own must not install what the lock pins there")


def compile_added(python, root, before, stage):
    """``--compile``: byte-compile what this layer added to ``root`` (not what ``before`` held); the seconds it took."""
    added = sorted(os.path.join(root, n) for n in set(os.listdir(root)) - before
                   if not os.path.islink(os.path.join(root, n)) and not n.endswith(".dist-info"))
    if not added:
        return 0.0
    # checked-hash .pyc (SOURCE_DATE_EPOCH is set): the same bytes on every build; errors as pip treats them
    began = time.monotonic()
    # staged: each .pyc names its source by the image path (-s/-p), as if compiled in place
    where = ["-s", stage, "-p", "/"] if stage else []
    subprocess.run([python, "-m", "compileall", "-q", "-j", "0", *where, *added],
                   check=False, stdout=subprocess.DEVNULL)
    return time.monotonic() - began


if __name__ == "__main__":
    main()
