"""SSH to a pod (paramiko): the exec channel and SFTP where the server offers them, else a terminal session whose
commands are framed by sentinels (podwire). Host keys are checked like OpenSSH does.

What a use case drives is a :class:`Transport`, chosen once per connection by :func:`open_transport`:
:class:`ExecTransport` (commands on exec channels, files over SFTP) or :class:`TerminalTransport` (everything through
one terminal; files in verified chunks). Both copy protocols (upload and download) live here, on this side."""

from __future__ import annotations

import base64
import codecs
import errno
import hashlib
import logging
import os
import re
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

import paramiko

from imagekit.clouds import podwire
from imagekit.clouds.podwire import CHUNK, Target, q
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.trust import untrusted

Sink = Callable[[str], None]
Progress = Callable[[int, int], None]  # (bytes done, bytes in all)
CHUNK_TRIES = 3  # a chunk that arrives corrupted this many times fails the copy
CONNECT_TIMEOUT = 20.0
MAX_CAPTURE = 1 << 20  # characters of a command's output read whole (a size, a sha256, a path: bytes, really)


class ConnectionLost(EnvironmentFailure):
    """The SSH connection dropped (a copy resumes from here)."""


class CommandTimeout(EnvironmentFailure):
    """A remote command ran past its timeout."""


class TooMuchOutput(EnvironmentFailure):
    """A command whose output is read whole printed more than a command of its kind can (a hostile pod)."""


class WriteFailed(EnvironmentFailure):
    """The pod could not write what was sent (a full disk, a read-only folder): sending it again will not help."""


def seconds(value: float) -> str:
    """A timeout as people say it: ``2 s``, ``1.5 s``, ``20 min``; ``no limit`` for the "0: no limit" sentinel."""
    if value >= 10**8:
        return "no limit"
    if value >= 120 and value % 60 == 0:
        return f"{value / 60:g} min"
    return f"{value:g} s"


def load_key(path: Path) -> paramiko.PKey:
    """The private key of ``--key``; a clear error for a file that is not one (a public key, an encrypted key, a
    binary or non-UTF-8 file) instead of paramiko's tracebacks."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(
            f"--key {path}: no such file", "give the private key's path (e.g. ~/.ssh/id_ed25519)"
        ) from None
    except OSError as exc:
        raise UsageError(f"--key {path}: cannot read it ({exc.strerror})", "give a readable private key") from None
    head = raw[:200].lstrip()
    if head.startswith((b"ssh-", b"ecdsa-", b"sk-")) or b"PUBLIC KEY" in head:
        raise UsageError(
            f"--key {path} is a public key", "give the private key (the same name without .pub, e.g. ~/.ssh/id_ed25519)"
        )
    try:
        return paramiko.PKey.from_path(path)
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
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}", "fix or move that file") from None
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


class Shell:
    """A terminal session on the pod: one command at a time, each framed by sentinels."""

    def __init__(self, channel: paramiko.Channel, timeout: float) -> None:
        self.chan = channel
        self.buf = ""
        self.broken = False
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        nonce = podwire.new_nonce()
        self._send(podwire.setup_line(nonce))
        try:
            self._until(re.compile(re.escape(podwire.mark(nonce, "R")) + r"\r?\n"), time.monotonic() + timeout, "setup")
        except CommandTimeout:
            raise EnvironmentFailure(
                f"the pod's terminal did not start a shell within {seconds(timeout)}",
                "check the target: a shell login must work there (ssh -t TARGET)",
            ) from None

    def _send(self, text: str) -> None:
        try:
            self.chan.sendall(text.encode())
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectionLost(
                f"the SSH connection dropped: {untrusted.printable(exc)}", "run the command again"
            ) from None

    def _recv(self, deadline: float, what: str) -> str:
        """The next text the terminal printed ('' when nothing came within a second)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise CommandTimeout(f"timed out: {what}", "raise --timeout, or check that the command finishes")
        self.chan.settimeout(min(left, 1.0))
        try:
            data = self.chan.recv(1 << 16)
        except TimeoutError:
            return ""
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectionLost(
                f"the SSH connection dropped: {untrusted.printable(exc)}", "run the command again"
            ) from None
        if not data:
            raise ConnectionLost("the SSH connection dropped (the pod closed the session)", "run the command again")
        return self.decoder.decode(data)

    def _until(
        self,
        pattern: re.Pattern[str],
        deadline: float,
        what: str,
        sink: Sink | None = None,
        keep: bool = False,
        limit: int = MAX_CAPTURE,
    ) -> tuple[str, re.Match]:
        """Read until ``pattern``; return what came before it (``keep``: at most ``limit`` characters, else
        :class:`TooMuchOutput`), or stream it to ``sink`` a line at a time (cleaned), or drop it. Text already
        searched is set aside, so megabytes of output cost linear time."""
        literal, done = _literal(pattern), []
        start = kept = 0
        while True:
            at = self.buf.find(literal, start)  # a plain find first: the regex only runs where the mark is
            m = pattern.search(self.buf, max(0, at - 2)) if at >= 0 else None
            if m:
                before, self.buf = self.buf[: m.start()], self.buf[m.end() :]
                if sink and before:
                    sink(podwire.clean(before))
                return ("".join(done) + before if keep else before), m
            if sink:
                # every line before the last line break goes on now (a log followed live); that break and what
                # follows it stay, since a mark starts there (the end mark is a line break, then IMK...), and a
                # CR LF pair stays together
                cut = self.buf.rfind("\n")
                while cut > 0 and self.buf[cut - 1] == "\r":  # a terminal's CR CR LF too
                    cut -= 1
                safe = len(self.buf) - 64  # a mark may be arriving
                if cut <= 0 and safe > 8192:  # one long line (a progress bar redrawn with CR): pass it on anyway
                    cut = safe - 1 if self.buf[safe - 1] == "\r" else safe
                if cut > 0:
                    sink(podwire.clean(self.buf[:cut]))
                    self.buf = self.buf[cut:]
            elif len(self.buf) > 1 << 16:  # searched already: set aside (keep) or drop, all but a mark's length
                if keep:
                    done.append(self.buf[:-128])
                    kept += len(self.buf) - 128
                    if kept > limit:
                        self._abandon()
                        raise TooMuchOutput(
                            f"the pod printed more than {limit:,} characters for {untrusted.printable(what, 80)}",
                            "check the pod: a command there prints without end",
                        )
                self.buf = self.buf[-128:]
            start = max(0, len(self.buf) - 128)  # marks are shorter: search only what is new
            self.buf += self._recv(deadline, what)

    def run(self, command: str, timeout: float, sink: Sink) -> int:
        """Run ``command`` with ``sh -c``; its cleaned output goes to ``sink``; its exit code is returned."""
        nonce = podwire.new_nonce()
        line, body = podwire.command_line(nonce, command)
        deadline = time.monotonic() + timeout
        self._send(line)
        if body is not None:
            self._until(re.compile(re.escape(podwire.mark(nonce, "G")) + r"\r?\n"), deadline, command)
            self._send("".join(podwire.data_lines(body)))
        self._until(re.compile(re.escape(podwire.mark(nonce, "S")) + r"\r?\n"), deadline, command)
        end = re.compile(r"\r?\n" + re.escape(podwire.mark(nonce, "E")) + r" (\d{1,3})\r?\n")
        try:
            _, m = self._until(end, deadline, command, sink)
        except CommandTimeout as exc:
            self._abandon()  # interrupt it on the pod too; the session is not used again
            raise CommandTimeout(
                f"timed out after {seconds(timeout)}: {untrusted.printable(command)}", exc.hint
            ) from None
        except KeyboardInterrupt:
            self._abandon()
            raise
        return int(m[1])

    def capture(self, command: str, timeout: float, limit: int = MAX_CAPTURE) -> tuple[int, str]:
        """Run ``command``; (its exit code, its cleaned output: at most ``limit`` characters, else
        :class:`TooMuchOutput`, the session abandoned)."""
        out: list[str] = []
        size = 0

        def sink(text: str) -> None:
            nonlocal size
            size += len(text)
            if size > limit:
                self._abandon()
                raise TooMuchOutput(
                    f"the pod printed more than {limit:,} characters for {untrusted.printable(command, 80)}",
                    "check the pod: a command there prints without end",
                )
            out.append(text)

        code = self.run(command, timeout, sink)
        return code, "".join(out)

    def _abandon(self) -> None:
        """Stop what runs (the session is not used again: its output is not ours to wait for)."""
        self.broken = True
        try:
            self.chan.sendall(b"\x03")
            self.chan.close()
        except Exception:  # closing what already failed
            pass

    def capture_raw(self, command: str, timeout: float, limit: int = MAX_CAPTURE) -> tuple[int, str]:
        """Like :meth:`capture`, without cleaning: for bulk base64 (verified by checksum instead)."""
        nonce = podwire.new_nonce()
        line, body = podwire.command_line(nonce, command)
        if body is not None:
            raise ValueError("capture_raw takes short commands only")
        deadline = time.monotonic() + timeout
        self._send(line)
        self._until(re.compile(re.escape(podwire.mark(nonce, "S")) + r"\r?\n"), deadline, command)
        end = re.compile(r"\r?\n" + re.escape(podwire.mark(nonce, "E")) + r" (\d+)\r?\n")
        text, m = self._until(end, deadline, command, keep=True, limit=limit)
        return int(m[1]), text

    def upload_chunk(self, part: str, data: bytes, timeout: float) -> bool:
        """Append ``data`` to the remote ``part`` when it arrives intact; False when its checksum differed. A pod
        that cannot write it (a full disk, a read-only folder) is :class:`WriteFailed` at once."""
        nonce = podwire.new_nonce()
        deadline = time.monotonic() + timeout
        text = podwire.chunk_lines(base64.b64encode(data).decode())
        self._send(podwire.chunk_upload_line(nonce, part, hashlib.sha256(data).hexdigest(), len(text)))
        self._until(re.compile(re.escape(podwire.mark(nonce, "G")) + r"\r?\n"), deadline, "upload")
        self._send(text)
        end = re.compile(re.escape(podwire.mark(nonce, "K")) + r" (ok|bad|fail)([^\n]{0,400})\r?\n")
        _, m = self._until(end, deadline, "upload")
        reason = untrusted.printable(m[2].strip(), 200)
        if m[1] == "fail" or (m[1] == "bad" and podwire.WRITE_ERRORS.search(reason)):
            words = reason.split(" ", 1) if m[1] == "bad" else ["", reason]
            raise WriteFailed(
                f"the pod cannot write {part}: {words[-1] or 'the append failed'}",
                "free space on the pod (df -h there) or copy into a writable folder",
            )
        return m[1] == "ok"

    def close(self) -> None:
        self.chan.close()


def _literal(pattern: re.Pattern[str]) -> str:
    """The sentinel inside a mark pattern (``IMK<nonce><kind>``)."""
    m = re.search(r"IMK[0-9A-F]+[A-Z]", pattern.pattern)
    assert m, pattern.pattern
    return m.group(0)


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
                    "check the address and port: the pod's SSH port, not its HTTP one",
                ) from None
            if isinstance(exc, (socket.timeout, TimeoutError)):
                raise EnvironmentFailure(
                    f"cannot connect to {where}: no answer within {seconds(timeout)}", "check the address and port"
                ) from None
            raise EnvironmentFailure(f"cannot connect to {where}: {text}", "check the address and port") from None
        transport = self.client.get_transport()
        if transport is not None:
            transport.set_keepalive(30)  # a training run prints nothing for minutes; proxies drop idle sessions
            _hear_exit_signals(transport)
        self._exec: bool | None = None
        self._sftp: paramiko.SFTPClient | bool | None = None
        self._shell: Shell | None = None

    @property
    def exec_works(self) -> bool:
        """Whether the exec channel runs commands (RunPod's gateway answers "doesn't support PTY" instead)."""
        if self._exec is None:
            nonce = podwire.new_nonce()
            try:
                code, out, _ = self._exec_run(f"printf 'IMK%s%s\\n' {nonce} P", 15.0, None, None, keep=4096)
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

    def _exec_run(
        self, command: str, timeout: float, sink: Sink | None, err: Sink | None, keep: int = 0
    ) -> tuple[int, str, str]:
        """Run ``command`` on an exec channel: (exit code, its output and its errors, ``keep`` characters of each
        at most: more is :class:`TooMuchOutput`; 0 keeps nothing, for streaming)."""
        try:
            chan = self.client.get_transport().open_session(timeout=self.timeout)  # type: ignore[union-attr]
            chan.exec_command(command)
            chan.shutdown_write()  # no input: a command reading stdin gets end-of-file (`ssh host cmd </dev/null`)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectionLost(
                f"the SSH connection dropped: {untrusted.printable(exc)}", "run the command again"
            ) from None
        out, errs = _Stream(sink, keep, command), _Stream(err, keep, command)
        deadline = time.monotonic() + timeout
        chan.settimeout(0.5)
        try:
            while not (chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready()):
                if time.monotonic() > deadline:
                    chan.close()
                    raise CommandTimeout(
                        f"timed out after {seconds(timeout)}: {untrusted.printable(command)}",
                        "raise --timeout, or check the command",
                    )
                got = False
                if chan.recv_stderr_ready():
                    errs.feed(chan.recv_stderr(1 << 16))
                    got = True
                if chan.recv_ready():
                    data = chan.recv(1 << 16)
                    if not data and chan.exit_status_ready():
                        break
                    out.feed(data)
                    got = True
                if not got:
                    time.sleep(0.01)
            code = chan.recv_exit_status()
            signal_name = getattr(chan, "imagekit_exit_signal", "")
            if code == -1 and signal_name:
                code = 128 + _SIGNALS[signal_name] if signal_name in _SIGNALS else 255
                if err is not None:
                    err(f"imagekit: the remote command was killed by signal {signal_name} (exit {code})\n")
            elif code == -1:
                code = 255
                if err is not None:
                    err("imagekit: the remote command ended without an exit status (exit 255)\n")
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectionLost(
                f"the SSH connection dropped: {untrusted.printable(exc)}", "run the command again"
            ) from None
        finally:
            chan.close()
        return code, out.close(), errs.close()

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


# ---- the transport: what a use case drives, chosen once per connection ---------------------------------------
class Transport(Protocol):
    """A pod as a use case sees it (fabric's ``Remote``/``RemoteShell`` split): run or capture a command, put or get
    one file, verified by sha256 on both ends and resumable. ``mode`` is how commands run (``exec`` | ``pty``),
    ``copy_mode`` how files travel (``sftp`` | ``pty``). Real ones: :class:`ExecTransport`,
    :class:`TerminalTransport`; ``tests/fakes.py`` has a recording fake."""

    mode: str

    @property
    def copy_mode(self) -> str: ...
    def run(self, command: str, timeout: float, out: Sink, err: Sink) -> int: ...
    def capture(self, command: str, timeout: float = 300.0) -> tuple[int, str]: ...
    def put(self, local: Path, remote: str, progress: Progress, log: Sink) -> int: ...
    def get(self, remote: str, local: Path, progress: Progress, log: Sink) -> int: ...


def open_transport(conn: Connection, force_pty: bool = False) -> ExecTransport | TerminalTransport:
    """The one place exec-vs-terminal is decided: exec where the server runs commands on exec channels (unless
    ``force_pty``: tests, benchmarks), else the terminal (RunPod's gateway)."""
    return ExecTransport(conn) if not force_pty and conn.exec_works else TerminalTransport(conn)


def checked(t: Transport, command: str, what: str, timeout: float = 300.0) -> str:
    """The output of ``command``; a non-zero exit is :class:`EnvironmentFailure` with the pod's last words."""
    code, out = t.capture(command, timeout)
    if code != 0:
        said = untrusted.printable(out.strip()[-2000:], 300)
        raise EnvironmentFailure(
            f"{what} failed on the pod (exit {code})" + (f": {said}" if said else ""), "check the path"
        )
    return out


def sha256_file(path: Path, limit: int | None = None) -> str:
    """sha256 of a local file (of its first ``limit`` bytes)."""
    h, left = hashlib.sha256(), limit
    with path.open("rb") as fh:
        while left is None or left > 0:
            block = fh.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


def remote_sha256(t: Transport, path: str, limit: int | None = None) -> str:
    """sha256 of a file on the pod (of its first ``limit`` bytes); '' when the pod's answer is not one."""
    source = f"head -c {limit} {q(path)}" if limit is not None else f"cat {q(path)}"
    # a FIFO or a device (one swapped in since the last look) is never opened: reading it would never end
    out = checked(t, f"[ -f {q(path)} ] || exit 0; {source} | sha256sum | cut -c1-64", f"sha256 of {path}", 3600)
    last = out.strip().splitlines()[-1].lower() if out.strip() else ""
    return last if len(last) == 64 and all(c in "0123456789abcdef" for c in last) else ""


def open_part(part: Path, keep: bool) -> tuple[int, int]:
    """Open the partial download ``part`` (created if missing): (fd, bytes already there, 0 unless ``keep``).
    Never through a link: a symlink, a hardlink or anything but a plain file planted there is refused."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(part, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(
                f"{part} is a symlink, not a partial download: nothing was written", "remove it, then copy again"
            ) from None
        raise EnvironmentFailure(f"cannot write {part}: {exc.strerror}", "check the destination folder") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = "a hardlink to another file" if stat.S_ISREG(st.st_mode) else "not a plain file"
        raise UsageError(f"{part} is {what}, not a partial download: nothing was written", "remove it, then copy again")
    if not keep:
        os.ftruncate(fd, 0)
    return fd, st.st_size if keep else 0


class _Copies:
    """What both transports do around the bytes: a file goes to ``NAME.imkpart`` (on the pod for an upload, here
    for a download), is renamed only once its sha256 matches the other end's, and is removed when it does not.
    A subclass moves the bytes: ``_send`` (to the pod's part) and ``_receive`` (into the local part, ``fh``)."""

    conn: Connection
    mode: str

    def capture(self, command: str, timeout: float = 300.0) -> tuple[int, str]:
        raise NotImplementedError

    def _send(self, local: Path, part: str, parent: str, total: int, progress: Progress, log: Sink) -> int:
        raise NotImplementedError

    def _receive(
        self, remote: str, part: Path, fh: BinaryIO, have: int, total: int, progress: Progress, log: Sink
    ) -> int:
        raise NotImplementedError

    def _resumes(self) -> bool:
        """Whether a local partial download is kept to resume from (the chunked protocol), or started anew."""
        raise NotImplementedError

    def put(self, local: Path, remote: str, progress: Progress, log: Sink) -> int:
        """Upload one file to ``remote`` (through ``remote.imkpart``, renamed only once its sha256 matches); the
        payload bytes sent. The chunked protocol resumes from an earlier partial upload."""
        total, sha = local.stat().st_size, sha256_file(local)
        part = remote + ".imkpart"
        sent = self._send(local, part, str(PurePosixPath(remote).parent), total, progress, log)
        got = remote_sha256(self, part)
        if got != sha:
            self.capture(f"rm -f {q(part)}", 30)
            raise CheckFailed(
                f"{remote}: sha256 on the pod is {got or 'unreadable'}, here {sha}: the copy is corrupt and was "
                "removed",
                "run the copy again",
            )
        checked(self, f"mv -f {q(part)} {q(remote)}", f"rename {part}")
        return sent

    def get(self, remote: str, local: Path, progress: Progress, log: Sink) -> int:
        """Download one file to ``local`` (through ``local.imkpart``); the payload bytes received."""
        p = q(remote)
        out = checked(self, f"if [ -f {p} ]; then wc -c < {p}; else echo special; fi", f"size of {remote}").split()
        if out and out[-1] == "special":  # never opened: a FIFO or a device would never end
            raise UsageError(
                f"{remote} on the pod is not a regular file (a FIFO, a device or a socket): nothing was copied",
                "copy regular files and folders only",
            )
        if not out or not out[-1].isdigit() or len(out[-1]) > 18:
            raise EnvironmentFailure(f"cannot read the size of {remote} on the pod", "check the path")
        total = int(out[-1])
        sha = remote_sha256(self, remote)
        if not sha:
            raise EnvironmentFailure(
                f"the pod gave no sha256 of {remote} (it is not a regular file any more, or sha256sum failed there): "
                "nothing was copied",
                "check the file on the pod; only regular files are copied",
            )
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(local.name + ".imkpart")
        fd, have = open_part(part, keep=self._resumes())
        try:
            with os.fdopen(fd, "r+b") as fh:
                received = self._receive(remote, part, fh, have, total, progress, log)
        except UsageError:  # it is no regular file any more: nothing to resume from
            part.unlink(missing_ok=True)
            raise
        got = sha256_file(part)
        if got != sha:
            part.unlink(missing_ok=True)
            raise CheckFailed(
                f"{remote}: sha256 here is {got}, on the pod {sha or 'unreadable'}: the copy is "
                "corrupt and was removed (did the file change during the copy?)",
                "run the copy again",
            )
        os.replace(part, local)
        return received

    # ---- the terminal's chunked protocol, both directions ----------------------------------------------------
    def _put_chunks(self, local: Path, part: str, parent: str, total: int, progress: Progress, log: Sink) -> int:
        """Verified chunks appended to the pod's ``part``, resumed after its last whole chunk when those bytes
        still match ours (sha256 of the prefix on both ends)."""
        shell = self.conn.shell()
        out = checked(
            self, f"mkdir -p {q(parent)} && {{ wc -c < {q(part)} 2>/dev/null || echo 0; }}", f"mkdir {parent}"
        )
        have = int(out.split()[-1]) if out.split() and out.split()[-1].isdigit() else 0
        start = 0 if have > total else have // CHUNK * CHUNK
        if start:
            checked(self, f"truncate -s {start} {q(part)}", "resume")
            if remote_sha256(self, part) != sha256_file(local, start):
                start = 0
            else:
                log(f"resuming {part[: -len('.imkpart')]} at {start:,} of {total:,} bytes")
        if not start:
            checked(self, f": > {q(part)}", f"create {part}")
        progress(start, total)
        sent = 0
        with local.open("rb") as fh:
            fh.seek(start)
            index, done = start // CHUNK, start
            while done < total:
                data = fh.read(CHUNK)
                for _ in range(CHUNK_TRIES):
                    if shell.upload_chunk(part, data, 600):
                        break
                    log(f"chunk {index} of {local} arrived corrupted; sending it again")
                else:
                    self.capture(f"rm -f {q(part)}", 30)
                    raise CheckFailed(
                        f"chunk {index} of {local} arrived corrupted {CHUNK_TRIES} times: nothing was written",
                        "the terminal alters what is typed into it; check the pod's stty settings",
                    )
                done += len(data)
                sent += len(data)
                index += 1
                progress(done, total)
        return sent

    def _get_chunks(
        self, remote: str, part: Path, fh: BinaryIO, have: int, total: int, progress: Progress, log: Sink
    ) -> int:
        """Verified chunks appended to ``fh``, resumed after the last whole chunk of an earlier try when those
        bytes still match the pod's (sha256 of the prefix on both ends)."""
        shell = self.conn.shell()
        start = 0 if have > total else have // CHUNK * CHUNK
        fh.truncate(start)
        if start:  # what is here already against the same bytes on the pod: a file changed since is read anew
            fh.seek(0)
            mine, left = hashlib.sha256(), start
            while left:
                block = fh.read(min(1 << 20, left))
                if not block:
                    break
                mine.update(block)
                left -= len(block)
            if remote_sha256(self, remote, start) != mine.hexdigest():
                start = 0
                fh.truncate(0)
            else:
                log(f"resuming {part.with_name(part.name[: -len('.imkpart')])} at {start:,} of {total:,} bytes")
        progress(start, total)
        received = 0
        fh.seek(start)
        done, index = start, start // CHUNK
        while done < total:
            for _ in range(CHUNK_TRIES):
                command = podwire.chunk_download_command(remote, index)
                code, text = shell.capture_raw(command, 600, limit=podwire.chunk_text_limit())
                if code == podwire.NOT_REGULAR:
                    raise UsageError(
                        f"{remote} on the pod is not a regular file (a FIFO, a device or a socket): nothing was copied",
                        "copy regular files and folders only",
                    )
                try:
                    data, digest = podwire.parse_chunk(text)
                except ValueError:
                    data, digest = b"", "unreadable"
                if code == 0 and data and len(data) <= CHUNK and hashlib.sha256(data).hexdigest() == digest:
                    break
                log(f"chunk {index} of {remote} arrived corrupted; reading it again")
            else:
                part.unlink(missing_ok=True)
                raise CheckFailed(
                    f"chunk {index} of {remote} arrived corrupted {CHUNK_TRIES} times: nothing was written",
                    "the terminal alters what the pod prints; check the pod's stty settings",
                )
            fh.write(data)
            done += len(data)
            received += len(data)
            index += 1
            progress(done, total)
        return received


class ExecTransport(_Copies):
    """A full SSH server: each command on its own exec channel (stdout and stderr apart); files over SFTP, opened
    on the first copy. A server without the SFTP subsystem gets the terminal's chunked protocol for files."""

    mode = "exec"

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    @property
    def copy_mode(self) -> str:
        return "sftp" if self.conn.sftp() is not None else "pty"

    def run(self, command: str, timeout: float, out: Sink, err: Sink) -> int:
        code, _, _ = self.conn._exec_run(command, timeout, out, err)
        return code

    def capture(self, command: str, timeout: float = 300.0) -> tuple[int, str]:
        code, out, _ = self.conn._exec_run(command, timeout, None, None, keep=MAX_CAPTURE)
        return code, out

    def _resumes(self) -> bool:
        return self.conn.sftp() is None

    def _send(self, local: Path, part: str, parent: str, total: int, progress: Progress, log: Sink) -> int:
        sftp = self.conn.sftp()
        if sftp is None:
            return self._put_chunks(local, part, parent, total, progress, log)
        checked(self, f"mkdir -p {q(parent)}", f"mkdir {parent}")
        try:
            sftp.put(str(local), part, callback=progress, confirm=True)
        except (OSError, EOFError) as exc:
            raise ConnectionLost(f"SFTP upload of {local} failed: {exc}", "run the copy again") from None
        return total

    def _receive(
        self, remote: str, part: Path, fh: BinaryIO, have: int, total: int, progress: Progress, log: Sink
    ) -> int:
        sftp = self.conn.sftp()
        if sftp is None:
            return self._get_chunks(remote, part, fh, have, total, progress, log)
        try:
            if not stat.S_ISREG(sftp.stat(remote).st_mode or 0):  # swapped since the size was read
                raise UsageError(
                    f"{remote} on the pod is not a regular file (a FIFO, a device or a socket): nothing was copied",
                    "copy regular files and folders only",
                )
            with sftp.open(remote, "rb") as fr:
                fr.prefetch(total)
                done = 0
                while done < total:  # never more than the size the pod gave: a file that grows stops here
                    data = fr.read(min(1 << 15, total - done))
                    if not data:
                        break
                    fh.write(data)
                    done += len(data)
                    progress(done, total)
        except (OSError, EOFError) as exc:
            raise ConnectionLost(
                f"SFTP download of {remote} failed: {untrusted.printable(exc)}", "run the copy again"
            ) from None
        return total


class TerminalTransport(_Copies):
    """A terminal-only gateway (RunPod's proxy): one shell session, commands framed by sentinels, files in verified
    chunks. The command's errors arrive mixed into its output (a terminal has one stream)."""

    mode = "pty"
    copy_mode = "pty"

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def run(self, command: str, timeout: float, out: Sink, err: Sink) -> int:
        return self.conn.shell().run(command, timeout, out)

    def capture(self, command: str, timeout: float = 300.0) -> tuple[int, str]:
        return self.conn.shell().capture(command, timeout)

    def _resumes(self) -> bool:
        return True

    def _send(self, local: Path, part: str, parent: str, total: int, progress: Progress, log: Sink) -> int:
        return self._put_chunks(local, part, parent, total, progress, log)

    def _receive(
        self, remote: str, part: Path, fh: BinaryIO, have: int, total: int, progress: Progress, log: Sink
    ) -> int:
        return self._get_chunks(remote, part, fh, have, total, progress, log)


class _Stream:
    """Decode bytes as they come and pass whole lines on, cleaned (a line without end goes on in pieces); keep at
    most ``keep`` characters of it (0: nothing), more is :class:`TooMuchOutput`."""

    def __init__(self, sink: Sink | None, keep: int = 0, what: str = "") -> None:
        self.sink, self.pending, self.all, self.keep, self.kept, self.what = sink, "", [], keep, 0, what
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> None:
        self.pending += self.decoder.decode(data)
        cut = self.pending.rfind("\n") + 1
        if not cut and len(self.pending) > 1 << 16:
            cut = len(self.pending)
        if cut:
            self._emit(self.pending[:cut])
            self.pending = self.pending[cut:]

    def _emit(self, text: str) -> None:
        text = podwire.clean(text)
        if self.keep:
            self.kept += len(text)
            if self.kept > self.keep:
                raise TooMuchOutput(
                    f"the pod printed more than {self.keep:,} characters for {untrusted.printable(self.what, 80)}",
                    "check the pod: a command there prints without end",
                )
            self.all.append(text)
        if self.sink:
            self.sink(text)

    def close(self) -> str:
        rest = self.pending + self.decoder.decode(b"", final=True)
        if rest:
            self._emit(rest)
        return "".join(self.all)


_SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "ABRT": 6, "FPE": 8, "KILL": 9, "SEGV": 11, "PIPE": 13}
_SIGNALS |= {"ALRM": 14, "TERM": 15, "USR1": 10, "USR2": 12, "BUS": 7, "XCPU": 24, "XFSZ": 25}


def _hear_exit_signals(transport: paramiko.Transport) -> None:
    """paramiko drops the "exit-signal" request (a command killed by a signal then has exit status -1 and no
    word why): read the signal's name first, then let paramiko handle the request as before."""
    table = dict(transport._channel_handler_table)
    handle = table[paramiko.common.MSG_CHANNEL_REQUEST]

    def request(chan: paramiko.Channel, m: paramiko.Message) -> None:
        at = m.packet.tell()
        try:
            if m.get_text() == "exit-signal":
                m.get_boolean()
                chan.imagekit_exit_signal = untrusted.printable(m.get_text(), 16).upper()  # type: ignore[attr-defined]
        except Exception:  # a malformed request: paramiko's own handler deals with it
            pass
        m.packet.seek(at)
        handle(chan, m)

    table[paramiko.common.MSG_CHANNEL_REQUEST] = request
    transport._channel_handler_table = table


def is_dropped(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionLost) or isinstance(exc, socket.error)
