"""Image hygiene, checked inside the built image before it is published (a self-test check; standard library only).

What a security review and a pod platform refuse: credentials left in a layer (`.netrc`, `.git-credentials`, a docker
`config.json` with auths, AWS credentials, a Hugging Face token, `.pypirc`, SSH private keys and host keys), `.git`
folders, what a build left in /tmp, /var/tmp or /root, and any file owned by a uid or gid above 65534 (RunPod's hosts
remap user namespaces: such an entry makes the pull fail, dstackai/dstack#2729). One walk of the image's filesystem,
staying on its device (no /proc, /sys, /dev, nor the files the engine mounts in).
"""

import json
import os
import stat

MAX_ID = 65534  # the highest uid/gid a remapped user namespace maps (nobody/nogroup)
# What /root holds in a clean image: the shell's files from base-files, and the empty .ssh the base stage makes for
# PUBLIC_KEY (the entrypoint writes authorized_keys at a container's start, never at build time)
ROOT_EXPECTED = {".bashrc", ".profile", ".ssh"}
SCRATCH = ("/tmp", "/var/tmp")
CREDENTIAL_NAMES = {
    ".netrc": "netrc credentials",
    "_netrc": "netrc credentials",
    ".git-credentials": "git credentials",
    ".pypirc": "a package index password (.pypirc)",
}
SSH_PRIVATE = ("id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk")
LIMIT = 20  # findings named per kind (the count is always whole)


def _credential(path, name, parent, where):
    """Why ``path`` (``where`` in the image) is a credential file, or None."""
    if name in CREDENTIAL_NAMES:
        return CREDENTIAL_NAMES[name]
    if name == "credentials" and parent == ".aws":
        return "AWS credentials"
    if name in ("token", "stored_tokens") and parent in ("huggingface", ".huggingface"):
        return "a Hugging Face token"
    if name in SSH_PRIVATE and parent == ".ssh":
        return "an SSH private key"
    if name.startswith("ssh_host_") and name.endswith("_key") and where.startswith("/etc/ssh/"):
        return "an SSH host key (every pod of the image would share it)"
    if name == "config.json" and parent == ".docker" and _docker_auths(path):
        return "registry credentials (docker config.json auths)"
    return None


def _docker_auths(path):
    try:
        with open(path, "rb") as fh:
            config = json.loads(fh.read(1 << 20))
    except (OSError, ValueError):
        return False
    auths = config.get("auths") if isinstance(config, dict) else None
    if not isinstance(auths, dict):
        return False
    keys = ("auth", "identitytoken", "password", "registrytoken")
    return any(isinstance(entry, dict) and any(entry.get(k) for k in keys) for entry in auths.values())


def walk(top="/"):
    """Every path under ``top`` on its device, with its lstat: (path, stat). Unreadable folders are skipped."""
    device = os.lstat(top).st_dev
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_dev != device:
                continue  # another filesystem: /proc, /sys, /dev, the engine's /etc/hosts
            yield entry.path, st
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)


def leftovers(root="/"):
    """What a build left behind in the scratch folders and /root (read before anything in this container writes)."""
    found = []
    for folder in SCRATCH:
        try:
            found += [os.path.join(folder, n) for n in sorted(os.listdir(os.path.join(root, folder.lstrip("/"))))]
        except OSError:
            pass
    try:
        names = sorted(os.listdir(os.path.join(root, "root")))
    except OSError:
        names = []
    found += ["/root/" + n for n in names if n not in ROOT_EXPECTED]
    try:
        found += ["/root/.ssh/" + n for n in sorted(os.listdir(os.path.join(root, "root", ".ssh")))]
    except OSError:
        pass
    return found


def scan(top="/", skip=(), only=None):
    """Findings by kind over one walk: credentials, .git folders, owners above 65534. ``skip``: folders judged
    elsewhere (the scratch folders, read before this container wrote to them). ``only``: the image paths to judge
    (each with what it holds), not the whole image: the code layer's, when the layers below it were judged before."""
    found = {"credentials": [], "git": [], "owners": []}
    files = 0
    skip = [os.path.join(top, s.lstrip("/")) for s in skip]
    for path, st in _paths(top, only):
        files += 1
        if any(path == s or path.startswith(s + "/") for s in skip):
            continue
        name = os.path.basename(path)
        parent = os.path.basename(os.path.dirname(path))
        if st.st_uid > MAX_ID or st.st_gid > MAX_ID:
            found["owners"].append(f"{path} ({st.st_uid}:{st.st_gid})")
        if stat.S_ISDIR(st.st_mode):
            if name == ".git":
                found["git"].append(path)
        elif stat.S_ISREG(st.st_mode):
            why = _credential(path, name, parent, "/" + os.path.relpath(path, top))
            if why:
                found["credentials"].append(f"{path}: {why}")
    return found, files


def _paths(top, only):
    """(path, lstat) of everything under ``top``, or of each of ``only`` (image paths) and what it holds."""
    if only is None:
        yield from walk(top)
        return
    seen = set()
    for item in sorted(set(only)):
        path = os.path.join(top, item.lstrip("/"))
        if any(path == s or path.startswith(s.rstrip("/") + "/") for s in seen):
            continue  # inside one judged already
        try:
            st = os.lstat(path)
        except OSError:
            continue
        seen.add(path)
        yield path, st
        if stat.S_ISDIR(st.st_mode):
            yield from walk(path)


def check_hygiene(left, check, top="/", only=None):
    """The self-test check: ``left`` is leftovers() as read at the self-test's start; ``only``: see scan()."""
    found, files = scan(top, skip=SCRATCH, only=only)
    found["leftovers"] = left
    parts = []
    labels = {
        "credentials": "credential files",
        "git": ".git folders",
        "leftovers": "left by the build in /tmp, /var/tmp or /root",
        "owners": f"owned by a uid/gid above {MAX_ID} (a remapping host cannot pull the image)",
    }
    for kind in ("credentials", "git", "owners", "leftovers"):
        items = found[kind]
        if items:
            more = f" and {len(items) - LIMIT} more" if len(items) > LIMIT else ""
            parts.append(f"{len(items)} {labels[kind]}: {', '.join(items[:LIMIT])}{more}")
    evidence = {"files": files}
    if only is not None:
        evidence["only"] = sorted(set(only))[:LIMIT]
    for kind, items in found.items():
        evidence[kind], evidence[kind + "_count"] = items[:LIMIT], len(items)
    if parts:
        return check("image-hygiene", "fail", "; ".join(parts),
                     "remove them in the step that made them (a credential belongs in a build secret or the pod's "
                     "env, never in a layer); nothing was published", evidence)
    return check("image-hygiene", "pass",
                 f"{files} paths{' of the code layer' if only is not None else ''}: no credentials, .git folders, "
                 f"build leftovers or owners above {MAX_ID}", "", evidence)
