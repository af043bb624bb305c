"""One SSH connection to a pod (paramiko): the private key, the host key checked as OpenSSH does, and what the server
offers (exec, SFTP, a terminal), found out once."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import socket
from pathlib import Path

import paramiko

from imagekit.clouds import podwire
from imagekit.clouds.podwire import Target
from imagekit.effects.ssh import ssh_exec
from imagekit.effects.ssh.ssh_errors import ConnectionLost, Sink, seconds
from imagekit.effects.ssh.ssh_terminal import Shell
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.trust import untrusted

CONNECT_TIMEOUT = 20.0
MAX_KEY_FILE = 1 << 20  # a private key is a few KB
MAX_KNOWN_HOSTS = 64 << 20


def load_key(path: Path) -> paramiko.PKey:
    """The private key of ``--key``; a clear error for a file that is not one (a public key, an encrypted key, a
    binary or non-UTF-8 file) instead of paramiko's tracebacks."""
    from imagekit.effects import foreign_files

    if not os.path.lexists(path):
        raise UsageError(
            f"--key {path}: no such file", "give the private key's path (e.g. ~/.ssh/id_ed25519)"
        ) from None
    try:  # a regular file (a FIFO or /dev/zero is refused at once, before anything connects), of a key's size
        raw = foreign_files.read_bytes(path, MAX_KEY_FILE, follow=True)
    except foreign_files.Refused as exc:
        raise UsageError(f"--key {path}: it {exc.why}", "give a readable private key (a regular file)") from None
    head = raw[:200].lstrip()
    if head.startswith((b"ssh-", b"ecdsa-", b"sk-")) or b"PUBLIC KEY" in head:
        raise UsageError(
            f"--key {path} is a public key", "give the private key (the same name without .pub, e.g. ~/.ssh/id_ed25519)"
        )
    try:
        return paramiko.PKey.from_path(path)  # the regular file just read (a key of the user's own)
    except (paramiko.PasswordRequiredException, TypeError) as exc:  # cryptography: TypeError "password-protected"
        if isinstance(exc, TypeError) and "password" not in str(exc):
            raise UsageError(
                f"--key {path} is not a private key imagekit can read",
                "give an OpenSSH or PEM private key (ssh-keygen)",
            ) from None
        raise UsageError(
            f"--key {path} is encrypted (it needs its passphrase)",
            f"load it into ssh-agent (ssh-add {path}) and leave out --key, or give an unencrypted key",
        ) from None
    except Exception:  # paramiko raises SSHException, ValueError, UnicodeDecodeError, IndexError...
        raise UsageError(
            f"--key {path} is not a private key imagekit can read", "give an OpenSSH or PEM private key (ssh-keygen)"
        ) from None


def _load_known_hosts(keys: paramiko.HostKeys, path: Path, warn: Sink) -> None:
    """``known_hosts`` read as OpenSSH does: a line it cannot parse is skipped (with a warning), not fatal."""
    from imagekit.effects import foreign_files

    try:  # a FIFO or a device there is refused at once, never waited on
        text = foreign_files.read_bytes(path, MAX_KNOWN_HOSTS, follow=True).decode("utf-8", "replace")
    except foreign_files.Refused as exc:
        raise UsageError(f"cannot read {path}: it {exc.why}", "fix or move that file") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except Exception:  # bad base64, an unknown key type, a malformed key
            entry = None
        if entry is None or entry.key is None:
            if not line.startswith("@"):  # @cert-authority / @revoked lines: not for imagekit, not an error
                warn(f"warning: {path} line {lineno} cannot be read as a host key; skipped")
            continue
        for host in entry.hostnames:
            keys.add(host, entry.key.get_name(), entry.key)


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's form: ``SHA256:<base64, no padding>``."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


class _HostKeys(paramiko.MissingHostKeyPolicy):
    def __init__(self, mode: str, known_hosts: Path, warn: Sink) -> None:
        self.mode, self.known_hosts, self.warn = mode, known_hosts, warn

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        fp = f"{key.get_name()} {fingerprint(key)}"
        if self.mode == "insecure":
            self.warn(f"warning: NOT verifying the host key of {hostname} ({fp}): --insecure-host-key")
            return
        if self.mode == "accept-new":
            self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self.known_hosts.open("a") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            self.warn(f"warning: added {hostname} ({fp}) to {self.known_hosts}")
            return
        port = re.fullmatch(r"\[(.*)\]:(\d+)", hostname)
        scan = f"ssh-keyscan -p {port[2]} {port[1]}" if port else f"ssh-keyscan {hostname}"
        raise EnvironmentFailure(
            f"{hostname} is not a known host (its key: {fp})",
            f"check that fingerprint, then record it: {scan} >> {self.known_hosts} (or --accept-new-host-key); "
            "--insecure-host-key skips the check",
        )


# A pod its lifetime guard (or its user) stopped answers no SSH: what `pod cp` and `pod exec` say when none answers
STOPPED_HINT = (
    "a stopped pod (by its lifetime guard, or by you) answers nothing until `imagekit pod start POD_ID` starts it "
    "again, its volume as it was (then `pod cp` its outputs; its SSH address may change: the console shows it)"
)


class Connection:
    """One SSH connection to a target, with what the server offers found out once."""

    def __init__(
        self,
        target: Target,
        *,
        key: Path | None = None,
        host_keys: str = "strict",
        timeout: float = CONNECT_TIMEOUT,
        warn: Sink = print,
    ) -> None:
        self.target, self.timeout = target, timeout
        logging.getLogger("paramiko").addHandler(logging.NullHandler())  # its "Exception (client)" lines: ours say it
        self.client = paramiko.SSHClient()
        known = Path.home() / ".ssh" / "known_hosts"
        if host_keys != "insecure" and known.exists():
            _load_known_hosts(self.client.get_host_keys(), known, warn)
        self.client.set_missing_host_key_policy(_HostKeys(host_keys, known, warn))
        pkey = load_key(key) if key is not None else None
        where = f"{target.host.strip('[]')} port {target.port}"
        try:
            self.client.connect(
                target.host.strip("[]"),
                port=target.port,
                username=target.user,
                pkey=pkey,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                look_for_keys=key is None,
                allow_agent=key is None,
            )
        except paramiko.BadHostKeyException as exc:
            raise EnvironmentFailure(
                f"the host key of {target.known_hosts_name} CHANGED (now {exc.key.get_name()} "
                f"{fingerprint(exc.key)}): someone may be intercepting the connection, or the pod was replaced",
                f"if the pod was replaced, remove its old line from {known}",
            ) from None
        except paramiko.PasswordRequiredException:  # a key found in ~/.ssh (a --key is loaded above)
            raise UsageError(
                "the SSH key in ~/.ssh is encrypted (it needs its passphrase)",
                "load it into ssh-agent (ssh-add), or give an unencrypted --key",
            ) from None
        except paramiko.AuthenticationException:
            raise EnvironmentFailure(
                f"{target} refused the key", "give --key PATH of a key the pod accepts (PUBLIC_KEY on RunPod)"
            ) from None
        except EnvironmentFailure:
            raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            text = untrusted.printable(exc, 200)
            if "No authentication methods available" in text:
                raise UsageError(
                    f"no SSH key to log in to {target} with (no --key, no ssh-agent, no ~/.ssh/id_*)",
                    "give --key PATH of the private key whose public half the pod has (PUBLIC_KEY on RunPod)",
                ) from None
            if "protocol banner" in text or "No existing session" in text or "Error reading SSH" in text:
                raise EnvironmentFailure(
                    f"{where} did not answer as an SSH server (no SSH banner within {seconds(timeout)})",
                    f"check the address and port: the pod's SSH port, not its HTTP one; {STOPPED_HINT}",
                ) from None
            if isinstance(exc, (socket.timeout, TimeoutError)):
                raise EnvironmentFailure(
                    f"cannot connect to {where}: no answer within {seconds(timeout)}",
                    f"check the address and port; {STOPPED_HINT}",
                ) from None
            raise EnvironmentFailure(
                f"cannot connect to {where}: {text}", f"check the address and port; {STOPPED_HINT}"
            ) from None
        transport = self.client.get_transport()
        if transport is not None:
            transport.set_keepalive(30)  # a training run prints nothing for minutes; proxies drop idle sessions
            ssh_exec.hear_exit_signals(transport)
        self._exec: bool | None = None
        self._sftp: paramiko.SFTPClient | bool | None = None
        self._shell: Shell | None = None

    @property
    def exec_works(self) -> bool:
        """Whether the exec channel runs commands (RunPod's gateway answers "doesn't support PTY" instead)."""
        if self._exec is None:
            nonce = podwire.new_nonce()
            try:
                code, out, _ = self.exec_run(f"printf 'IMK%s%s\\n' {nonce} P", 15.0, None, None, keep=4096)
                self._exec = code == 0 and podwire.mark(nonce, "P") in out
            except (EnvironmentFailure, paramiko.SSHException):
                self._exec = False
        return self._exec

    def sftp(self) -> paramiko.SFTPClient | None:
        if self._sftp is None:
            try:
                chan = self.client.get_transport().open_session(timeout=self.timeout)  # type: ignore[union-attr]
                chan.settimeout(self.timeout)
                chan.invoke_subsystem("sftp")
                self._sftp = paramiko.SFTPClient(chan)
            except (OSError, EOFError, paramiko.SSHException, paramiko.SFTPError):
                self._sftp = False
        return self._sftp or None

    def shell(self) -> Shell:
        if self._shell is None:
            try:
                chan = self.client.invoke_shell(term="dumb", width=400, height=40)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise ConnectionLost(
                    f"{self.target} refused a terminal: {untrusted.printable(exc)}", "check the target"
                ) from None
            self._shell = Shell(chan, self.timeout)
        return self._shell

    def exec_run(
        self, command: str, timeout: float, sink: Sink | None, err: Sink | None, keep: int = 0
    ) -> tuple[int, str, str]:
        """Run ``command`` on an exec channel: (exit code, its output and its errors, ``keep`` characters of each
        at most: more is ``TooMuchOutput``; 0 keeps nothing, for streaming)."""
        return ssh_exec.run(self.client, command, timeout, sink, err, keep, open_timeout=self.timeout)

    def close(self) -> None:
        for closing in (self._shell, self._sftp or None):
            try:
                if closing is not None:
                    closing.close()
            except Exception:
                pass
        self.client.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
