"""SSH to a pod (paramiko): the exec channel and SFTP where the server offers them, else a terminal session whose
commands are framed by sentinels (podwire). Host keys are checked like OpenSSH does."""

from __future__ import annotations

import base64
import codecs
import hashlib
import logging
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

import paramiko

from imagekit import podwire, untrusted
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.podwire import Target

Sink = Callable[[str], None]
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
                safe = len(self.buf) - 64  # a mark may be arriving
                cut = self.buf.rfind("\n", 0, max(0, safe)) + 1  # whole lines: a CR LF pair stays together
                if not cut and safe > 8192:  # one long line (a progress bar redrawn with CR): pass it on anyway
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

    @property
    def mode(self) -> str:
        return "exec" if self.exec_works else "pty"

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

    def run(self, command: str, timeout: float, sink: Sink, err: Sink | None = None) -> int:
        """Run a shell command on the pod, streaming its output; the exit code is the command's."""
        if self.exec_works:
            code, _, _ = self._exec_run(command, timeout, sink, err or sink)
            return code
        return self.shell().run(command, timeout, sink)

    def capture(self, command: str, timeout: float = 120.0, limit: int = MAX_CAPTURE) -> tuple[int, str]:
        """(exit code, output) of a command whose output is read whole: at most ``limit`` characters."""
        if self.exec_works:
            code, out, _ = self._exec_run(command, timeout, None, None, keep=limit)
            return code, out
        return self.shell().capture(command, timeout, limit)

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
