"""Bases: bootstrap a Debian/Ubuntu root filesystem with mmdebstrap and import it into the engine."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from imagekit.compat.catalog import BaseSpec
from imagekit.effects import process
from imagekit.effects.cache import cache_root
from imagekit.effects.files import write_atomic
from imagekit.errors import EnvironmentFailure
from imagekit.image.buildplan import (
    DEFAULT_SOURCE_DATE_EPOCH,
    BaseRef,
    base_packages,
    bootstrap_base,
    dpkg_path_filters,
)
from imagekit.model import AMD64, DEBIAN_ARCH, MACHINES
from imagekit.services.ports import ContainerEngine

BINFMT = Path("/proc/sys/fs/binfmt_misc")
_NET = ("Could not resolve", "Temporary failure resolving", "Failed to fetch", "Connection failed", "unable to connect")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


KEYRINGS = {
    "debian": ("/usr/share/keyrings/debian-archive-keyring.gpg", "debian-archive-keyring", ()),
    "ubuntu": ("/usr/share/keyrings/ubuntu-archive-keyring.gpg", "ubuntu-keyring", ("--components=main,universe",)),
}


def bootstrap_env(epoch: int) -> dict[str, str]:
    """The bootstrap's whole environment (nothing of the caller's)."""
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "SOURCE_DATE_EPOCH": str(epoch),
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",  # py3compile writes the bytecode, not imports as they happen
        "PYTHONHASHSEED": "0",
    }


def native(platform: str, host_machine: str) -> bool:
    """Whether a host whose CPU ``uname -m`` names ``host_machine`` runs ``platform``'s programs itself."""
    return host_machine == MACHINES[platform] or (host_machine, MACHINES[platform]) == ("arm64", "aarch64")


def emulation_problem(platform: str, host_machine: str, binfmt: Path | None = None) -> str | None:
    """Why this host cannot run ``platform``'s programs (a bootstrap's maintainer scripts, a build's RUN steps, the
    self-test), or None: its own CPU architecture runs them natively; another one through qemu-user-static,
    registered with binfmt_misc (the F flag: the interpreter is opened once, so it works inside containers too)."""
    machine = MACHINES[platform]
    if native(platform, host_machine):
        return None
    entry = (binfmt or BINFMT) / f"qemu-{machine}"
    try:
        text = entry.read_text()
    except OSError:
        return f"this {host_machine} host cannot run {platform} programs: binfmt_misc has no qemu-{machine} entry"
    if not text.startswith("enabled"):
        return f"this {host_machine} host cannot run {platform} programs: binfmt_misc's qemu-{machine} is disabled"
    flags = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("flags:")), "")
    if "F" not in flags:
        return f"binfmt_misc's qemu-{machine} lacks the F flag, so containers cannot use it (flags: {flags or 'none'})"
    return None


def emulation_hint(platform: str) -> str:
    machine = MACHINES[platform]
    return (
        "apt-get install qemu-user-static binfmt-support; mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc "
        f"(if not mounted); update-binfmts --enable qemu-{machine}. Or build on a {platform} host (a native CI runner: "
        "`imagekit ci init --arm64-runner LABEL`)"
    )


def require_emulation(platform: str) -> None:
    problem = emulation_problem(platform, os.uname().machine)
    if problem:
        raise EnvironmentFailure(problem, emulation_hint(platform))


def bootstrap_argv(
    spec: BaseSpec,
    epoch: int,
    tmp: Path,
    compiler: bool,
    *,
    euid: int,
    sudo: bool,
    keyrings: frozenset[str],
    platform: str = AMD64,
    host_machine: str = "x86_64",
) -> list[str]:
    """The bootstrap's command line. Pure: ``euid`` (root runs it directly; anyone else through ``sudo -n``, as on a
    hosted CI runner, where user namespaces for mmdebstrap's unshare mode are restricted), ``sudo`` (a non-interactive
    sudo works), ``keyrings`` (the archive keyring files present). The vendor's archive keyring is always named, so a
    Debian base bootstraps on an Ubuntu host (whose apt trusts Ubuntu's keys only) and the other way round."""
    path, package, extra = KEYRINGS[spec.vendor]
    if path not in keyrings:
        raise EnvironmentFailure(
            f"bootstrapping {spec.name} needs {spec.vendor.capitalize()}'s archive keyring ({path})",
            f"apt-get install {package} (and network access to the {spec.vendor} archive)",
        )
    # One environment for every bootstrap, whoever runs it: the maintainer scripts inherit it, and what they write
    # depends on it (Python writing bytecode as it imports, or not), so root and a runner's sudo give the same bytes
    prefix = ["env", "-i", *(f"{k}={v}" for k, v in bootstrap_env(epoch).items())]
    if euid != 0:
        if not sudo:
            raise EnvironmentFailure(
                "bootstrapping a base needs root (mmdebstrap makes a root filesystem), and `sudo -n` is refused",
                "run as root, allow this user passwordless sudo (as GitHub's hosted runners do), or use a base from "
                'a registry by digest ([bases."3.X"] in the matrix file)',
            )
        prefix = ["sudo", "-n", *prefix]
    return [
        *prefix,
        "mmdebstrap",
        "--quiet",
        "--mode=root",
        "--format=tar",
        "--variant=apt",
        f"--include={','.join(base_packages(compiler))}",
        # openssh-server's postinst makes host keys: two pods of one image must never share them (and random
        # bytes would break the byte-identical tarball). The entrypoint generates them at a container's first start.
        '--customize-hook=rm -f "$1"/etc/ssh/ssh_host_*',
        # documentation, manuals, translations and libpython.a never reach the base (buildplan.SLIM_EXCLUDES)
        *(f"--dpkgopt={line}" for line in dpkg_path_filters()),
        f"--keyring={path}",
        *extra,
        # another CPU architecture's maintainer scripts run under qemu-user-static (require_emulation)
        *(
            [f"--architectures={DEBIAN_ARCH[platform]}"]
            if platform != AMD64 or not native(platform, host_machine)
            else []
        ),
        spec.suite,
        str(tmp),
        spec.mirror_for(platform),
    ]


def _sudo_works() -> bool:
    import shutil

    if shutil.which("sudo") is None:
        return False
    return process.run(["sudo", "-n", "true"], timeout=30).ok


def bootstrap_tarball(spec: BaseSpec, epoch: int, out: Path, compiler: bool = True, platform: str = AMD64) -> str:
    """Run mmdebstrap (deterministic with SOURCE_DATE_EPOCH); returns the tarball's sha256."""
    require_emulation(platform)
    # one partial file per process: two builds on one host (CI runners side by side) may bootstrap at once; each
    # renames its own byte-identical tarball into place
    tmp = out.with_name(f"{out.stem}.{os.getpid()}.partial.tar")
    euid = os.geteuid()
    present = frozenset(path for path, _, _ in KEYRINGS.values() if Path(path).is_file())
    argv = bootstrap_argv(
        spec,
        epoch,
        tmp,
        compiler,
        euid=euid,
        sudo=euid != 0 and _sudo_works(),
        keyrings=present,
        platform=platform,
        host_machine=os.uname().machine,
    )
    res = process.run(argv, env={"SOURCE_DATE_EPOCH": str(epoch)}, timeout=1800)
    if euid != 0 and tmp.exists():  # written by root through sudo: the cache stays the user's
        process.run(["sudo", "-n", "chown", f"{euid}:{os.getegid()}", str(tmp)], timeout=60)
    if not res.ok:
        tmp.unlink(missing_ok=True)
        text = (res.stderr or res.stdout)[-2000:]
        if any(sign in text for sign in _NET):
            raise EnvironmentFailure(
                f"mmdebstrap could not reach {spec.mirror_for(platform)}:\n{text}",
                f"the {spec.vendor} archive must be reachable to bootstrap {spec.name}; "
                "or use a base from a registry by digest",
            )
        raise EnvironmentFailure(
            f"mmdebstrap failed for {spec.name}:\n{text}", "apt-get install mmdebstrap (root needed)"
        )
    digest = _sha256(tmp)
    os.replace(tmp, out)
    return digest


def _state(path: Path) -> dict | None:
    """A bootstrapped base's state file in the cache (what its tarball was made of), or None when it is missing or
    not one imagekit wrote (not a small regular file holding an object whose sha256 is one): bootstrapped again."""
    from imagekit.effects import foreign_files
    from imagekit.trust import untrusted

    try:
        doc = untrusted.load_json(foreign_files.read_bytes(path, 1 << 16), str(path), max_depth=4)
    except (OSError, ValueError):  # missing, a link, a FIFO, too large, too deep, not JSON
        return None
    ok = isinstance(doc, dict) and isinstance(doc.get("sha256"), str) and untrusted.is_digest("sha256:" + doc["sha256"])
    return doc if ok else None


def ensure_base(
    spec: BaseSpec,
    engine: ContainerEngine,
    epoch: int = DEFAULT_SOURCE_DATE_EPOCH,
    log: Callable[[str], None] = lambda _: None,
    compiler: bool = True,
    platform: str = AMD64,
) -> BaseRef:
    """The bootstrapped base for ``spec``: reused from the engine, else imported from the cached tarball, else built."""
    ref = bootstrap_base(spec, epoch, compiler=compiler, platform=platform)
    repo, tag = ref.reference.rsplit(":", 1)
    state = cache_root() / "bases" / f"{tag}.json"
    tarball = cache_root() / "bases" / f"{tag}.tar"
    meta = _state(state)
    image = engine.image(ref.reference)
    arch = DEBIAN_ARCH[platform]
    if image is not None and len(image["RootFS"]["Layers"]) == 1 and image.get("Architecture", "amd64") == arch:
        # the tag is named by the bootstrap's inputs and its one layer's diff id is the tarball's sha256
        return bootstrap_base(spec, epoch, digest=image["RootFS"]["Layers"][0], compiler=compiler, platform=platform)
    if not (meta and tarball.is_file()):
        log(f"bootstrapping {ref.name} ({spec.suite}, {platform}) with mmdebstrap")
        tarball.parent.mkdir(parents=True, exist_ok=True)
        digest = bootstrap_tarball(spec, epoch, tarball, compiler, platform)
        meta = {
            "sha256": digest,
            "suite": spec.suite,
            "mirror": spec.mirror_for(platform),
            "packages": list(base_packages(compiler)),
            "dpkg_path_filters": list(dpkg_path_filters()),
            "source_date_epoch": epoch,
        }
        write_atomic(state, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    log(f"importing {tarball.name} as {ref.reference}")
    # `docker import` dates its config now (and records the engine's own architecture: its --platform is
    # experimental on Docker 20.10), so each import is a new image id. The layer is imported under a name of this
    # process's own, and the tag names the same layer under a config made of the inputs alone: two runners that
    # import at once tag the same id, and a build FROM the tag never sees it move.
    scratch = f"import-{os.getpid()}-{tag}"[:128]
    engine.import_tarball(tarball, repo, scratch)
    try:
        imported = engine.image(f"{repo}:{scratch}") or {}
        engine.load_config(base_config(imported, arch, epoch), [ref.reference])
    finally:
        engine.remove(f"{repo}:{scratch}")
    layers = engine.layers(ref.reference)
    if layers != [f"sha256:{meta['sha256']}"]:
        raise EnvironmentFailure(
            f"imported base {ref.reference} has layers {layers}, expected sha256:{meta['sha256']}",
            f"delete {tarball} and bootstrap again",
        )
    return bootstrap_base(spec, epoch, digest=f"sha256:{meta['sha256']}", compiler=compiler, platform=platform)


def base_config(imported: dict, arch: str, epoch: int) -> bytes:
    """An imported base's image config naming CPU architecture ``arch``, over its one layer. Pure."""
    import datetime

    created = datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = {
        "architecture": arch,
        "os": "linux",
        "created": created,
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": list(imported.get("RootFS", {}).get("Layers", []))},
        "history": [{"created": created, "created_by": "mmdebstrap (imagekit base bootstrap)"}],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def present(
    ref: BaseRef,
    engine: ContainerEngine,
    data_bases: Mapping[str, BaseSpec],
    epoch: int = DEFAULT_SOURCE_DATE_EPOCH,
    log: Callable[[str], None] = lambda _: None,
) -> BaseRef:
    """``ref`` (``buildplan.base_for``'s choice) present in the engine: a registry base pulled for its platform,
    imagekit's own reused, imported from the cached tarball, or bootstrapped once."""
    if ref.registry:
        engine.pull(ref.reference, platform=ref.platform)
        return ref
    spec = data_bases[ref.python]
    return ensure_base(spec, engine, epoch, log, compiler=ref.compiler is not False, platform=ref.platform)


def push_base(
    engine: ContainerEngine, ref: BaseRef, repository: str, username: str | None, password: str | None
) -> str:
    """Push a bootstrapped base to ``repository`` under its input-named tag; returns ``repository@digest``, checked
    against the registry. The tag names the bootstrap's inputs, so it never moves to other contents."""
    from imagekit.effects.registry import RegistryClient, Remote
    from imagekit.errors import CheckFailed
    from imagekit.services.publishing import blob_push

    tag = ref.reference.rsplit(":", 1)[1]
    image = engine.image(ref.reference)
    if image is None:
        raise EnvironmentFailure(f"{ref.reference} is not in the engine", "run `imagekit base bootstrap` first")
    remote = Remote.parse(repository)
    registry = RegistryClient(username, password, registries=[remote.registry])
    existing = registry.oci_manifest(remote, tag)
    if existing is not None and existing.config_digest != image["Id"]:
        raise CheckFailed(
            f"{repository}:{tag} already exists with other contents (config {existing.config_digest})",
            "a base tag names its inputs and never moves; delete it in the registry by hand if it is wrong",
        )
    engine.tag(image["Id"], repository, tag)
    digest = (
        existing.digest if existing is not None else blob_push.push_image(engine, registry, remote, image["Id"], tag)
    )
    check = registry.oci_manifest(remote, digest)
    if check is None or check.config_digest != image["Id"]:
        raise EnvironmentFailure(f"the registry does not serve {repository}@{digest} as pushed", "retry the push")
    return f"{repository}@{digest}"
