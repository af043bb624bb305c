"""What an imagekit image does when it starts (standard library only, Python >= 3.8; run by the entrypoint).

No command: **pod mode**, the way RunPod and Vast.ai start an image (detached, no TTY, env injected, a root-owned
volume on /workspace, restarted whenever it exits): save the env for SSH sessions and shells, run /pre_start.sh,
start sshd when PUBLIC_KEY is set and JupyterLab when JUPYTER_PASSWORD is set, run the start check and
/post_start.sh, then stay up. A blocker never exits a pod (that would be a restart loop with no way in): the logs
and a login banner say what is wrong and how to fix it, and `imagekit-doctor` exits 1 until it is fixed.

A command: **job mode**: the start check, then exec the command; a blocker exits 1 with the report.
The lifetime guard (guard.py) starts first in both modes when the env asks for it: a deadline, idle stop, an action
on a blocker (a blocked job then stays up for it) or on the job's exit (the job then runs as a child, and its
declared outputs are checksummed before the pod is ended).
`--onstart`: what a Vast template's onstart runs where its launch mode replaced the entrypoint (see ``onstart``).
The start check is the doctor's `start` tier: the quick checks, plus torch's CUDA probe whenever a GPU is expected
(IMAGEKIT_REQUIRE_GPU=1 or GPUs visible to the driver), so a silent CPU fallback is caught before training starts.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if __package__:  # imported from the host's package, imagekit.in_image
    from . import nofollow
else:  # the program in the image: its siblings lie beside it
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import nofollow
STATE_DIR = "/run/imagekit"
BLOCKED = os.path.join(STATE_DIR, "blocked")
ENV_SH = "/etc/imagekit/env.sh"
SSH_DIR = "/root/.ssh"
# PUBLIC_KEY's keys live here, rewritten at every start: a key removed from PUBLIC_KEY stops working after a restart
# (the container layer, ~/.ssh included, survives restarts). ~/.ssh/authorized_keys stays the user's own.
POD_KEYS = "/etc/imagekit/authorized_keys"
SSHD = "/usr/sbin/sshd"
SSHD_CONFIG = "/opt/imagekit/etc/sshd_config"
SSHD_LOG = "/var/log/imagekit-sshd.log"
JUPYTER = "/opt/venv/bin/jupyter-lab"
JUPYTER_LOG = "/var/log/imagekit-jupyter.log"
HOOKS = ("/pre_start.sh", "/post_start.sh")
# Per-session variables a login sets itself; everything else the container was given reaches SSH sessions.
SESSION_VARS = {"HOME", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "TERM", "_", "SHELL", "USER", "LOGNAME", "MAIL"}
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
KEY = re.compile(
    r"^(ssh-(rsa|ed25519|dss)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)"
    r"@openssh\.com)[ \t]+[A-Za-z0-9+/]+={0,3}([ \t][^\r\n]*)?$"
)


def log(message):
    """One line to the container's log, URL credentials taken out (a job's `git clone https://user:token@...`)."""
    print(f"imagekit: {nofollow.redact(message)}", file=sys.stderr, flush=True)


def write_private(path, text, mode=0o600):
    """Atomically, readable by root only: the env holds secrets (HF_TOKEN, JUPYTER_PASSWORD)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------------
# The container's env, for shells and SSH sessions
# ---------------------------------------------------------------------------------------------------------
def env_files(environ):
    """(shell script for profile.sh, ~/.ssh/environment) from the container's env."""
    sh, ssh = ["# the container's env, saved by the imagekit entrypoint for shells and SSH sessions"], []
    for name in sorted(environ):
        if name in SESSION_VARS or not NAME.match(name):
            continue
        value = environ[name]
        sh.append(f"export {name}={shlex.quote(value)}")
        if "\n" not in value and "\r" not in value:  # ~/.ssh/environment is one NAME=value per line
            ssh.append(f"{name}={value}")
    return "\n".join(sh) + "\n", "\n".join(ssh) + "\n"


def save_env(environ, env_sh=ENV_SH, ssh_dir=SSH_DIR):
    sh, ssh = env_files(environ)
    write_private(env_sh, sh)
    os.makedirs(ssh_dir, mode=0o700, exist_ok=True)
    os.chmod(ssh_dir, 0o700)
    write_private(os.path.join(ssh_dir, "environment"), ssh)


# ---------------------------------------------------------------------------------------------------------
# SSH
# ---------------------------------------------------------------------------------------------------------
def public_keys(text):
    """(valid keys, count of rejected lines) from PUBLIC_KEY: one key a line (a literal \\n separates too)."""
    lines = [ln.strip() for ln in (text or "").replace("\\n", "\n").splitlines() if ln.strip()]
    good = [ln for ln in lines if KEY.match(ln)]
    return good, len(lines) - len(good)


def write_pod_keys(keys, path=POD_KEYS):
    """Exactly PUBLIC_KEY's keys (sshd reads this file besides ~/.ssh/authorized_keys)."""
    write_private(path, "".join(f"{k}\n" for k in keys))
    return path


def host_key_fingerprints():
    out = []
    for name in sorted(os.listdir("/etc/ssh")):
        if name.startswith("ssh_host_") and name.endswith("_key.pub"):
            res = subprocess.run(["ssh-keygen", "-lf", os.path.join("/etc/ssh", name)], capture_output=True, text=True)
            if res.returncode == 0:
                out.append(res.stdout.strip())
    return out


def start_ssh(environ, own_keys=False):
    """sshd for PUBLIC_KEY's keys; ``own_keys``: also when only ~/.ssh/authorized_keys has some (a platform that
    writes the user's key there itself, as Vast's launch modes do)."""
    keys, rejected = public_keys(environ.get("PUBLIC_KEY", ""))
    write_pod_keys(keys)  # also when empty: a key dropped from PUBLIC_KEY must stop working
    if rejected:
        log(f"SSH: ignored {rejected} line(s) of PUBLIC_KEY that are not OpenSSH public keys")
    if own_keys and not keys:
        try:
            with open(os.path.join(SSH_DIR, "authorized_keys")) as fh:
                keys = public_keys(fh.read())[0]
        except OSError:
            keys = []
    if not keys:
        log("SSH: off (set PUBLIC_KEY to an OpenSSH public key to log in as root on port 22)")
        return False
    if not os.access(SSHD, os.X_OK):
        log(f"SSH: PUBLIC_KEY is set but this image has no {SSHD} (a base without openssh-server)")
        return False
    if not any(n.startswith("ssh_host_") and n.endswith("_key") for n in os.listdir("/etc/ssh")):
        res = subprocess.run(["ssh-keygen", "-A"], capture_output=True, text=True)  # this container's own keys
        if res.returncode != 0:
            log(f"SSH: could not generate host keys: {res.stderr.strip()}")
            return False
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    res = subprocess.run([SSHD, "-f", SSHD_CONFIG, "-E", SSHD_LOG], capture_output=True, text=True)
    if res.returncode != 0:
        log(f"SSH: sshd did not start: {(res.stderr or res.stdout).strip()} (see {SSHD_LOG})")
        return False
    log(f"SSH: sshd listening on port 22 for root ({len(keys)} key(s)); host key fingerprints:")
    for line in host_key_fingerprints():
        log(f"  {line}")
    return True


# ---------------------------------------------------------------------------------------------------------
# JupyterLab
# ---------------------------------------------------------------------------------------------------------
def jupyter_argv():
    return [
        JUPYTER,
        "--allow-root",
        "--no-browser",
        "--ip=0.0.0.0",
        "--port=8888",
        "--ServerApp.root_dir=/workspace",
        "--ServerApp.allow_origin=*",
    ]


def start_jupyter(environ):
    password = environ.get("JUPYTER_PASSWORD")
    if not password:
        return False
    if not os.access(JUPYTER, os.X_OK):
        log("Jupyter: JUPYTER_PASSWORD is set but this image has no JupyterLab (build it with [image] jupyter = true)")
        return False
    env = {k: v for k, v in environ.items() if k != "JUPYTER_PASSWORD"}
    env["JUPYTER_TOKEN"] = password  # read from the env, so the password is not on a command line
    spawn_detached(jupyter_argv(), JUPYTER_LOG, env, cwd="/workspace" if os.path.isdir("/workspace") else "/")
    log(f"Jupyter: JupyterLab starting on port 8888, serving /workspace (log: {JUPYTER_LOG})")
    return True


def spawn_detached(argv, logfile, env, cwd="/"):
    """Double fork: the service is re-parented to PID 1 (tini), which reaps it."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                fd = os.open(logfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.chdir(cwd)
                os.execve(argv[0], argv, env)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


# ---------------------------------------------------------------------------------------------------------
# The start check
# ---------------------------------------------------------------------------------------------------------
def start_check(environ):
    """(exit code, report text, seconds, checks) of the doctor's start tier, run in this process."""
    if environ.get("IMAGEKIT_SKIP_DOCTOR") == "1":
        log("start check skipped (IMAGEKIT_SKIP_DOCTOR=1)")
        return 0, "", 0.0, []
    sys.path.insert(0, HERE)
    import imagekit_doctor as doctor

    begin = time.time()
    checks = doctor.run_checks(doctor.parser().parse_args(["--tier", "start"]))
    code = doctor.exit_code(checks, False)
    return code, doctor.render_text(checks, verbose=False), time.time() - begin, checks


def summary(checks, seconds):
    probe = next((c for c in checks if c["id"] in ("torch-probe", "cpu-fallback")), None)
    what = f"torch CUDA probe: {probe['status']}" if probe else "no GPU expected, torch CUDA probe not needed"
    return f"start check took {seconds:.2f} s ({what})"


def banner(report):
    return (
        "\n"
        "==== imagekit: this pod has a blocker; training would fail or run on the CPU ====\n"
        f"{report}\n"
        "Fix it, then run `imagekit-doctor`: it exits 1 until the blocker is gone, so\n"
        "`imagekit-doctor && accelerate launch train.py` refuses to launch.\n"
        "==================================================================================\n"
    )


# ---------------------------------------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------------------------------------
def run_hook(path):
    if os.path.isfile(path):
        log(f"running {path}")
        code = subprocess.call(["bash", path] if os.path.exists("/bin/bash") else ["sh", path])
        if code != 0:
            log(f"{path} exited {code}")


def cell_name():
    try:
        import json

        with open(os.environ.get("IMAGEKIT_MANIFEST", "/etc/imagekit/manifest.json")) as fh:
            return json.load(fh)["cell"]["id"]
    except (OSError, ValueError, KeyError):
        return "unknown cell"


def load_guard():
    sys.path.insert(0, HERE)
    import guard

    return guard


def start_guard(environ):
    """The guard's own process, detached (re-parented to tini), its lines in the container's log; first of all, so
    a deadline holds whatever fails after it. Off unless the env arms a trigger."""
    guard = load_guard()
    s, problems = guard.settings(environ)
    if not guard.armed(s):
        for p in problems:
            log(f"guard: ignored: {p}")
        return False
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.execv(sys.executable, [sys.executable, "-I", os.path.join(HERE, "guard.py")])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return True


def run_then_end(argv, environ, guard, s):
    """IMAGEKIT_ON_EXIT: the command as a child (signals passed on), its exit code recorded for the guard
    (``guard_files.JOB_EXIT``), its outputs checksummed, then the pod stays up: the guard ends it once nothing runs and
    the pod stayed quiet for IMAGEKIT_EXIT_GRACE (time to copy the outputs out: `pod cp` counts while it copies). A
    missing output, or no provider, leaves the pod as a plain job leaves it: up, said why."""
    os.makedirs(STATE_DIR, exist_ok=True)
    try:
        proc = subprocess.Popen(argv)
    except OSError as exc:
        log(f"cannot run {argv[0]}: {exc.strerror}")
        return 127
    # the job's process by boot id, pid and start time: after a restart its pid names some other process
    write_private(guard.guard_files.JOB, (guard.guard_signs.identity(proc.pid) or "") + "\n", 0o644)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    code = proc.wait()
    files = guard.guard_files
    safely("recording the job's exit code", write_private, files.JOB_EXIT, f"{code & 255} {time.time():.3f}\n", 0o644)
    os.unlink(guard.guard_files.JOB)
    log(f"`{shlex.join(argv)}` exited {code}")
    ok, lines = guard.guard_files.checksum_outputs(s["outputs"])
    for line in lines:
        log(f"outputs: {line}")
    if not ok:
        log(
            f"not ending the pod (IMAGEKIT_ON_EXIT={s['on_exit']}): the outputs are not all there; it stays up so you "
            "can look (it keeps billing)"
        )
    else:
        log(
            f"the guard will {guard.exit_action(s['on_exit'], code, quiet=True)} this pod once it has stayed quiet for "
            f"{guard.say(s['exit_grace'])} (nothing running or making progress, no input, no `pod cp` connected)"
        )
    stay_up()
    return code


def job(argv, environ):
    safely("clearing the last start's state", _clear_state)
    code, report, seconds, checks = start_check(environ)
    safely("marking torch without its GPU", mark_no_cuda, checks)
    guard = load_guard()
    s, _ = guard.settings(environ)
    if code == 1 and s["on_blocker"]:
        text = banner(report)
        safely("writing the login banner", write_private, BLOCKED, text, 0o644)
        safely("marking the start check done", mark_checked)
        print(text, file=sys.stderr, flush=True)
        log(
            f"BLOCKED: not starting `{shlex.join(argv)}`; the guard will {s['on_blocker']} this pod after "
            f"IMAGEKIT_BLOCKER_GRACE unless the blocker goes away"
        )
        stay_up()
    if code == 1:
        print(report, file=sys.stderr)
        log(
            f"the start check found a blocker; not starting `{shlex.join(argv)}`. "
            "Set IMAGEKIT_SKIP_DOCTOR=1 to start anyway."
        )
        return 1
    if code == 3:
        print(report, file=sys.stderr)
        log("a start check could not run (above); starting anyway")
    if checks:
        log(summary(checks, seconds))
    safely("marking the start check done", mark_checked)
    if s["on_exit"]:
        return run_then_end(argv, environ, guard, s)
    # the command takes this process over, its pid and start time kept: the marker names it to the guard as the job
    marker = (guard.guard_signs.identity(os.getpid()) or "") + "\n"
    safely("marking the job", write_private, guard.guard_files.JOB, marker, 0o644)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        log(f"cannot run {argv[0]}: {exc.strerror}")
        return 127


def safely(what, fn, *args, default=None):
    """A pod never exits on a failed step (that would be a restart loop with no way in): log it and go on."""
    try:
        return fn(*args)
    except Exception as exc:  # any failure of one step is logged, the pod stays up
        log(f"{what} failed: {type(exc).__name__}: {exc}")
        return default


def port_in_use(port):
    """Does something on this machine accept connections on ``port`` (Vast's own sshd, in its SSH launch mode)?"""
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def pod(environ):
    log(f"pod mode ({cell_name()})")
    code = start(environ, jupyter=True)
    log("ready" + (" (blocked: see above)" if code == 1 else ""))
    stay_up()


def onstart(environ):
    """`entrypoint --onstart`: what a Vast template runs in the launch modes that replace the image's entrypoint
    with Vast's own (SSH, Jupyter): the same start as pod mode, sshd unless something serves port 22 already (Vast
    starts its own in SSH mode), no JupyterLab (Vast's Jupyter mode runs its own); then it returns, since Vast's init
    keeps the container up. Exit 1 when blocked."""
    log(f"onstart ({cell_name()}): the launch mode replaced the entrypoint; the start check runs here")
    code = start(environ, jupyter=False, ssh_unless_served=True)
    log("ready" + (" (blocked: see above)" if code == 1 else ""))
    return 1 if code == 1 else 0


def start(environ, jupyter, ssh_unless_served=False):
    """Save the env, run the hooks, start the services the env asks for, run the start check; its exit code."""
    if os.geteuid() != 0:
        log(f"running as uid {os.geteuid()}, not root: the env cannot be saved for SSH and sshd cannot start")
    safely("clearing the last start's state", _clear_state)
    safely("saving the env for shells and SSH sessions", save_env, environ)
    safely(HOOKS[0], run_hook, HOOKS[0])
    # services first: a wedged GPU can make the check take minutes, and the pod must be reachable meanwhile
    if ssh_unless_served and safely("probing port 22", port_in_use, 22, default=False):
        log("port 22 is served already (the platform's sshd): not starting the image's")
    else:
        safely("SSH", start_ssh, environ, ssh_unless_served)
    if jupyter:
        safely("Jupyter", start_jupyter, environ)
    code, report, seconds, checks = safely("the start check", start_check, environ, default=(3, "", 0.0, []))
    safely("marking torch without its GPU", mark_no_cuda, checks)
    if code == 1:
        text = banner(report)
        safely("writing the login banner", write_private, BLOCKED, text, 0o644)
        print(text, file=sys.stderr, flush=True)
        log("BLOCKED: the pod stays up so you can log in and fix it; `imagekit-doctor` exits 1 until then")
    elif code == 3:
        print(report, file=sys.stderr)
        log("a start check could not run (above)")
    safely("marking the start check done", mark_checked)
    if checks:
        log(summary(checks, seconds))
    safely(HOOKS[1], run_hook, HOOKS[1])
    return code


NO_CUDA = os.path.join(STATE_DIR, "no-cuda")  # cuda_guard.py: every `import torch` in the image refused, saying why


def mark_no_cuda(checks):
    """Where the start check found GPUs expected (visible, or required) while torch sees none, the cause for
    cuda_guard.py: every Python process of the image then fails at `import torch`, naming it, instead of training
    on the CPU (IMAGEKIT_ALLOW_CPU=1 lets one through)."""
    found = [c for c in checks if c.get("id") in ("cpu-fallback", "torch-probe") and c.get("status") == "fail"]
    if not found:
        return False
    c = found[0]
    text = f"{c['id']}: {c.get('message', '')}" + (f" (fix: {c['fix']})" if c.get("fix") else "")
    write_private(NO_CUDA, nofollow.redact(text)[:2000] + "\n", 0o644)
    log(f"every `import torch` in this image now fails, naming this (IMAGEKIT_ALLOW_CPU=1 lets one through): {text}")
    return True


def mark_checked():
    """The start check has said (its blocker, if any, is in BLOCKED): the guard may take a missing banner for no
    blocker (before this, after a restart, it keeps the blocker's first sighting)."""
    write_private(os.path.join(STATE_DIR, "checked"), "", 0o644)


def _clear_state():
    """The last start's markers (the container layer, /run included, survives a restart): gone before this start's
    check writes its own."""
    os.makedirs(STATE_DIR, exist_ok=True)
    names = ("checked", "job", "job-exit", "guard-warning", "no-cuda")
    for path in [BLOCKED] + [os.path.join(STATE_DIR, name) for name in names]:
        if os.path.lexists(path):
            os.unlink(path)
    # where `pod wait`, `pod logs` and `pod cp` say they are connected (the guard's exit stop waits for them): root's
    # alone, so no other user of the pod can hold it up
    clients = os.path.join(STATE_DIR, "clients")
    os.makedirs(clients, mode=0o700, exist_ok=True)
    os.chmod(clients, 0o700)


def stay_up():
    """Under tini (PID 1) a `sleep infinity` is enough; as PID 1 ourselves, reap children and stop on SIGTERM."""
    if os.getpid() != 1:
        os.execvp("sleep", ["sleep", "infinity"])

    def stop(signum, _frame):
        log(f"signal {signum}: stopping")
        try:
            os.kill(-1, signal.SIGTERM)
        except OSError:
            pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            signal.pause()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    environ = dict(os.environ)
    safely("the lifetime guard", start_guard, environ)
    if argv == ["--onstart"]:
        return onstart(environ)
    if argv:
        return job(argv, environ)
    pod(environ)
    return 0


if __name__ == "__main__":
    sys.exit(main())
