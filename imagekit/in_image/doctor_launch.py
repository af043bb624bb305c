"""The doctor's checks of the launch and the machine around it (standard library only, Python >= 3.8): the
Accelerate config and a launch command's own options (a shell script read for the launch it runs), the paths that must
survive the pod, writable folders, disk, shared memory, the GPU cloud."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile

if __package__:  # imported from the host's package, imagekit.in_image
    from . import facts, nofollow
    from .doctor_expect import MAX_FILE, read_regular, result
    from .doctor_gpu import usable_gpu_count
else:  # a program in the image, or sent to a pod: its sibling modules lie beside it
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import facts
    import nofollow
    from doctor_expect import MAX_FILE, read_regular, result
    from doctor_gpu import usable_gpu_count


EPHEMERAL_FS = {"overlay", "tmpfs", "aufs", "fuse-overlayfs", "ramfs", "squashfs"}


def hf_home():
    return os.path.expanduser(os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))


def find_accelerate_config(explicit=None):
    """As accelerate finds it: --config_file, else $HF_HOME/accelerate/default_config.yaml (or .json)."""
    if explicit:
        return explicit
    base = os.path.join(hf_home(), "accelerate")
    for name in ("default_config.yaml", "default_config.json"):
        if os.path.isfile(os.path.join(base, name)):
            return os.path.join(base, name)
    return None


def parse_flat_config(text):
    """The top-level scalars of an accelerate YAML (or JSON) config, without a YAML library."""
    if text.lstrip().startswith("{"):
        return json.loads(text)
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.*?)\s*$", line)
        if not m:
            continue
        value = m.group(2).strip("'\"")
        if value.lower() in ("true", "false"):
            value = value.lower() == "true"
        elif re.fullmatch(r"-?\d+", value):
            value = int(value)
        elif value in ("", "null", "~"):
            value = None
        out[m.group(1)] = value
    return out


SHELLS = ("bash", "sh", "dash", "zsh")
LAUNCHERS = ("accelerate", "torchrun")
MAX_SCRIPT = 1 << 20  # bytes of a launch script read


def _launcher(argv):
    words = [os.path.basename(a) for a in argv[:4]]
    if "accelerate" in words and "launch" in argv[:4]:
        return "accelerate"
    if any(w in ("torchrun", "torch.distributed.run") for w in argv[:4]):
        return "torchrun"
    return None


def _script_of(argv):
    """The script ``argv`` runs with a shell (``bash train.sh``, ``sh -x run.sh``, ``./train.sh``), or None."""
    if not argv:
        return None
    if os.path.basename(argv[0]) in SHELLS:
        rest = argv[1:]
        while rest and rest[0].startswith("-") and rest[0] not in ("-c", "--"):
            rest = rest[1:]
        if rest and rest[0] == "--":
            rest = rest[1:]
        return rest[0] if rest and rest[0] != "-c" else None
    return argv[0] if argv[0].endswith(".sh") else None


UNKNOWN = "\0"  # in a launch word: a variable neither the script nor the env sets here


def _expand(word, values):
    """``$NAME`` and ``${NAME}`` from the script's own assignments, then the env; one neither sets is ``UNKNOWN``."""

    def one(m):
        name = m.group(1) or m.group(2)
        return values.get(name, os.environ.get(name, UNKNOWN))

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", one, word)


def script_launch(argv, cwd=None):
    """(launch argv, the script's path) when ``argv`` runs a shell script whose lines start ``accelerate launch`` or
    ``torchrun``: its first such line, continuation lines joined, leading ``VAR=value``, ``exec``, ``nohup`` and
    ``time`` left out, ``$VAR`` filled in from the script's own assignments (then the env); a relative
    ``--config_file`` taken against the folder of a ``cd DIR`` line before it. (None, None) when it runs none (or
    the script cannot be read as a regular file)."""
    path = _script_of(argv)
    if path is None:
        return None, None
    cwd = cwd or os.getcwd()
    full = path if os.path.isabs(path) else os.path.join(cwd, path)
    try:
        text = read_regular(full, MAX_SCRIPT)
    except (OSError, ValueError):
        return None, None
    values, here = {}, cwd
    for line in re.sub(r"\\\r?\n", " ", text).splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0], re.S):
            name, _, value = words.pop(0).partition("=")
            if not words:  # an assignment on its own line: the script's variable
                values[name] = _expand(value, values)
        while words and words[0] in ("exec", "nohup", "time", "command"):
            words = words[1:]
        if len(words) == 2 and words[0] == "cd":
            target = _expand(words[1], values)
            here = here if UNKNOWN in target else os.path.normpath(os.path.join(here, target))
            continue
        if words and _launcher(words):
            return [_expand(w, values) for w in words], (full, here)
    return None, None


def launch_options(command, cwd=None):
    """What a launch command decides for itself: accelerate's --config_file/--num_processes/--num_machines/--cpu,
    torchrun's --nproc_per_node; a shell script (``bash train.sh``) is read for the launch it runs
    (:func:`script_launch`). {} for other commands."""
    argv = list(command or [])
    script = None
    if _launcher(argv) is None:
        argv, script = script_launch(argv, cwd)
        if argv is None:
            return {}
    tool = _launcher(argv)
    if tool == "accelerate":
        names = {"--config_file": "config_file", "--num_processes": "num_processes",
                 "--num_machines": "num_machines", "--cpu": "use_cpu"}
    else:
        names = {"--nproc_per_node": "num_processes", "--nnodes": "num_machines"}
    opts = {"tool": tool}
    if script:
        opts["script"] = script[0]
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.endswith(".py") or word == "-m" or (i > 1 and word in ("--", "--no_python")):
            break  # the script and its own options start here
        key, _, inline = word.partition("=")
        key = "--" + key[2:].replace("-", "_") if key.startswith("--") else key
        if key in names:
            if names[key] == "use_cpu":
                opts["use_cpu"] = True
            else:
                value = inline if inline else (argv[i + 1] if i + 1 < len(argv) else "")
                i += 0 if inline else 1
                if UNKNOWN in value:  # a variable the script's lines and the env do not say
                    opts.setdefault("unresolved", []).append(key)
                else:
                    opts[names[key]] = int(value) if re.fullmatch(r"\d+", value) else value
        i += 1
    if script and isinstance(opts.get("config_file"), str) and opts["config_file"] \
            and not os.path.isabs(opts["config_file"]):
        opts["config_file"] = os.path.join(script[1], opts["config_file"])
    return opts


def check_accelerate(path, gpu_count, launch=None):
    launch = launch or {}
    if launch.get("unresolved"):
        where = f" in {launch['script']}" if launch.get("script") else ""
        return result("accelerate-config", "warn", f"the launch{where} gives {', '.join(launch['unresolved'])} from a "
                      "variable neither the script nor the env sets here: not checked",
                      "run the check with the variable set, or give the value itself", {"launch": launch})
    if launch.get("config_file"):
        path = launch["config_file"]
    if not path and not launch.get("num_processes"):
        return result("accelerate-config", "skip", "no accelerate config found", "", {"searched": hf_home()})
    cfg = {}
    if path:
        try:
            cfg = parse_flat_config(read_regular(path))
            if not isinstance(cfg, dict):
                raise ValueError("expected a mapping of settings")
        except (OSError, ValueError) as exc:
            return result("accelerate-config", "fail", f"cannot read {path}: {exc}",
                          "rewrite it with `accelerate config`")
    cfg.update({k: v for k, v in launch.items() if k in ("num_processes", "num_machines", "use_cpu")})
    path = path or "the launch command"
    if launch.get("script"):
        path = f"{path} (the launch in {launch['script']})"
    ev = {"path": path, "num_processes": cfg.get("num_processes"), "use_cpu": cfg.get("use_cpu"),
          "distributed_type": cfg.get("distributed_type"), "gpus": gpu_count, "num_machines": cfg.get("num_machines"),
          "launch": launch}
    procs = cfg.get("num_processes")
    machines = cfg.get("num_machines") or 1
    if cfg.get("use_cpu"):
        return result("accelerate-config", "warn", f"{path} sets use_cpu: true: training runs on the CPU",
                      "set use_cpu: false (accelerate config)", ev)
    if gpu_count is None:
        return result("accelerate-config", "pass", f"{path}: num_processes {procs}; the GPU count is unknown here "
                      "(MIG instances in CUDA_VISIBLE_DEVICES), so it is not compared", "", ev)
    if isinstance(procs, int) and machines == 1:
        if procs > max(gpu_count, 1):  # one process never waits for ranks
            return result("accelerate-config", "fail", f"{path} asks for num_processes: {procs} but this machine has "
                          f"{gpu_count} GPU(s): the launch would hang waiting for ranks",
                          f"set num_processes: {max(gpu_count, 1)} or pass --num_processes", ev)
        if procs < gpu_count:
            return result("accelerate-config", "warn", f"num_processes: {procs} uses {procs} of {gpu_count} GPU(s)",
                          f"set num_processes: {gpu_count} to use them all", ev)
    return result("accelerate-config", "pass", f"{path}: num_processes {procs} on {gpu_count} GPU(s)", "", ev)


def parse_mountinfo(text):
    """(mount point, fstype, source) from /proc/self/mountinfo lines."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rfields = right.split()
        if len(fields) >= 5 and rfields:
            point = fields[4].replace("\\040", " ")
            mounts.append((point, rfields[0], rfields[1] if len(rfields) > 1 else ""))
    return mounts


def mount_of(path, mounts):
    path = os.path.realpath(path)
    best = None
    for point, fstype, source in mounts:
        if path == point or path.startswith(point.rstrip("/") + "/") or point == "/":
            if best is None or len(point) > len(best[0]):
                best = (point, fstype, source)
    return best


def existing_parent(path):
    path = os.path.abspath(path)
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path or "/"


def check_paths(paths, mountinfo_text, provider_hint):
    mounts = parse_mountinfo(mountinfo_text)
    out = []
    for label, path in paths:
        m = mount_of(path, mounts)  # by path prefix: a folder not created yet still lands on its mount
        ev = {"path": path, "mount": m[0] if m else None, "fstype": m[1] if m else None}
        if m is None:
            out.append(result(f"persistent-{label}", "error", f"{path}: mount not found in mountinfo", "", ev))
        elif m[1] in EPHEMERAL_FS or "overlay" in m[1]:  # also fuse.fuse-overlayfs: a container's own layer
            out.append(result(f"persistent-{label}", "warn", f"{path} is on {m[1]} ({m[0]}): lost when the pod stops",
                              provider_hint or "put it on a persistent volume (e.g. /workspace)", ev))
        else:
            out.append(result(f"persistent-{label}", "pass", f"{path} is on {m[1]} mounted at {m[0]}", "", ev))
    return out


def check_writable(paths):
    """The runtime user must be able to write each path (or the folder it will be created in): a root-owned volume
    on /workspace refuses a non-root user, and HF downloads and the first checkpoint save then fail mid-run."""
    out = []
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    for label, path in paths:
        probe = existing_parent(path)
        ev = {"path": path, "probe": probe, "uid": uid}
        try:
            st = os.stat(probe)
            ev.update(owner_uid=st.st_uid, mode=oct(st.st_mode & 0o7777))
            fd, tmp = tempfile.mkstemp(prefix=".imagekit-write-test-", dir=probe)
            os.close(fd)
            os.unlink(tmp)
        except OSError as exc:
            if exc.errno == 30:  # EROFS
                fix = f"mount the volume at {probe} read-write"
            else:
                fix = (f"run as root (pod platforms mount volumes root-owned), or give uid {uid} the folder: "
                       f"chown -R {uid} {probe}")
            out.append(result(f"writable-{label}", "fail", f"{path}: the runtime user (uid {uid}) cannot write "
                              f"{probe}: {exc.strerror}", fix, ev))
            continue
        out.append(result(f"writable-{label}", "pass", f"{path} is writable (uid {uid})", "", ev))
    return out


def check_disk(paths, min_free_gb=10.0):
    out = []
    seen = set()
    for label, path in paths:
        probe = existing_parent(path)
        st = os.statvfs(probe)
        key = st.f_fsid if hasattr(st, "f_fsid") else probe
        if key in seen:
            continue
        seen.add(key)
        free_gb = st.f_bavail * st.f_frsize / 1e9
        inodes = st.f_favail / st.f_files if st.f_files else 1.0
        ev = {"path": probe, "free_gb": round(free_gb, 2), "inodes_free_fraction": round(inodes, 4)}
        if free_gb < 1 or inodes < 0.01:
            out.append(result(f"disk-{label}", "fail", f"{probe}: {free_gb:.1f} GB free, {inodes:.1%} inodes free",
                              "free space or attach a larger volume before training", ev))
        elif free_gb < min_free_gb or inodes < 0.05:
            out.append(result(f"disk-{label}", "warn", f"{probe}: only {free_gb:.1f} GB free ({inodes:.1%} inodes)",
                              "checkpoints and model downloads need tens of GB", ev))
        else:
            out.append(result(f"disk-{label}", "pass", f"{probe}: {free_gb:.0f} GB free", "", ev))
    return out


def check_shm(min_bytes=1 << 30):
    if not os.path.isdir("/dev/shm"):
        return result("shm", "skip", "no /dev/shm")
    st = os.statvfs("/dev/shm")
    size = st.f_blocks * st.f_frsize
    ev = {"bytes": size}
    if size < min_bytes:
        return result("shm", "warn", f"/dev/shm is {size / 2**20:.0f} MiB: DataLoader workers crash with 'bus error'",
                      "start the container with --shm-size=8g (or --ipc=host)", ev)
    return result("shm", "pass", f"/dev/shm is {size / 2**30:.1f} GiB", "", ev)


def detect_provider(environ=None):
    """(name, where data survives there) of the GPU cloud this runs on, or (None, None): the row of facts.PROVIDERS the
    guard ends pods through too."""
    found = facts.detect_provider(os.environ if environ is None else environ)
    return (found.name, found.volume_hint) if found else (None, None)


def provider_checks(ctx):
    provider, hint = detect_provider()
    ctx.provider_hint = hint
    return [result("provider", "pass" if provider else "skip",
                   f"provider: {provider}" if provider else "no known GPU cloud detected", hint or "")]


def launch_checks(ctx):
    """The Accelerate config (the launch command's own options over it, a script read for its launch) against the
    GPUs the process may use."""
    usable = usable_gpu_count(ctx.gpu_state[0], os.environ.get("CUDA_VISIBLE_DEVICES"))
    return [check_accelerate(find_accelerate_config(ctx.args.accelerate_config), usable,
                             launch_options(ctx.args.command))]


def path_checks(ctx):
    """HF_HOME, /workspace and each --path: on storage that survives the pod, writable, with room; /dev/shm."""
    paths = [("hf-home", hf_home())]
    for p in ctx.args.path or (["/workspace"] if os.path.isdir("/workspace") else []):
        paths.append(("output" if p != "/workspace" else "workspace", p))
    out = []
    try:
        mountinfo = nofollow.read_bytes("/proc/self/mountinfo", MAX_FILE)
        if mountinfo is None:
            raise FileNotFoundError(2, "No such file or directory", "/proc/self/mountinfo")
        out += check_paths(paths, mountinfo.decode("utf-8", "replace"), getattr(ctx, "provider_hint", None))
    except OSError:
        out.append(result("persistent-paths", "skip", "no /proc/self/mountinfo (not Linux)"))
    return out + check_writable(paths) + check_disk(paths) + [check_shm()]
