"""SSH to a pod (paramiko): the exec channel and SFTP where the server offers them, else a terminal session whose
commands are framed by sentinels (podwire). Host keys are checked like OpenSSH does."""

from __future__ import annotations

import base64
import codecs
import hashlib
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

import paramiko

from imagekit import podwire
from imagekit.errors import EnvironmentFailure, UsageError
from imagekit.podwire import Target

Sink = Callable[[str], None]
CONNECT_TIMEOUT = 20.0


class ConnectionLost(EnvironmentFailure):
    """The SSH connection dropped (a copy resumes from here)."""


class CommandTimeout(EnvironmentFailure):
    """A remote command ran past its timeout."""


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
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        nonce = podwire.new_nonce()
        self._send(podwire.setup_line(nonce))
        self._until(re.compile(re.escape(podwire.mark(nonce, "R")) + r"\r?\n"), time.monotonic() + timeout, "setup")

    def _send(self, text: str) -> None:
        try:
            self.chan.sendall(text.encode())
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectionLost(f"the SSH connection dropped: {exc}", "run the command again") from None

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
            raise ConnectionLost(f"the SSH connection dropped: {exc}", "run the command again") from None
        if not data:
            raise ConnectionLost("the SSH connection dropped (the pod closed the session)", "run the command again")
        return self.decoder.decode(data)

    def _until(
        self, pattern: re.Pattern[str], deadline: float, what: str, sink: Sink | None = None, keep: bool = False
    ) -> tuple[str, re.Match]:
        """Read until ``pattern``; return what came before it (``keep``), or stream it to ``sink`` a line at a time
        (cleaned), or drop it. Text already searched is set aside, so megabytes of output cost linear time."""
        literal, done = _literal(pattern), []
        start = 0
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
        end = re.compile(r"\r?\n" + re.escape(podwire.mark(nonce, "E")) + r" (\d+)\r?\n")
        try:
            _, m = self._until(end, deadline, command, sink)
        except (CommandTimeout, KeyboardInterrupt):
            self._send("\x03")  # interrupt it on the pod too; the session is abandoned anyway
            raise
        return int(m[1])

    def capture(self, command: str, timeout: float) -> tuple[int, str]:
        out: list[str] = []
        code = self.run(command, timeout, out.append)
        return code, "".join(out)

    def capture_raw(self, command: str, timeout: float) -> tuple[int, str]:
        """Like :meth:`capture`, without cleaning: for bulk base64 (verified by checksum instead)."""
        nonce = podwire.new_nonce()
        line, body = podwire.command_line(nonce, command)
        if body is not None:
            raise ValueError("capture_raw takes short commands only")
        deadline = time.monotonic() + timeout
        self._send(line)
        self._until(re.compile(re.escape(podwire.mark(nonce, "S")) + r"\r?\n"), deadline, command)
        end = re.compile(r"\r?\n" + re.escape(podwire.mark(nonce, "E")) + r" (\d+)\r?\n")
        text, m = self._until(end, deadline, command, keep=True)
        return int(m[1]), text

    def upload_chunk(self, part: str, data: bytes, timeout: float) -> bool:
        """Append ``data`` to the remote ``part`` when it arrives intact; False when its checksum differed."""
        nonce = podwire.new_nonce()
        deadline = time.monotonic() + timeout
        text = podwire.chunk_lines(base64.b64encode(data).decode())
        self._send(podwire.chunk_upload_line(nonce, part, hashlib.sha256(data).hexdigest(), len(text)))
        self._until(re.compile(re.escape(podwire.mark(nonce, "G")) + r"\r?\n"), deadline, "upload")
        self._send(text)
        _, m = self._until(re.compile(re.escape(podwire.mark(nonce, "K")) + r" (ok|bad)[^\n]*\n"), deadline, "upload")
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
        self.client = paramiko.SSHClient()
        known = Path.home() / ".ssh" / "known_hosts"
        if host_keys != "insecure" and known.exists():
            try:
                self.client.load_host_keys(str(known))
            except (OSError, paramiko.SSHException) as exc:
                raise UsageError(f"cannot read {known}: {exc}", "fix or move that file") from None
        self.client.set_missing_host_key_policy(_HostKeys(host_keys, known, warn))
        if key is not None and not key.is_file():
            raise UsageError(f"--key {key}: no such file", "give the private key's path (e.g. ~/.ssh/id_ed25519)")
        try:
            self.client.connect(
                target.host.strip("[]"),
                port=target.port,
                username=target.user,
                key_filename=str(key) if key else None,
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
        except paramiko.AuthenticationException:
            raise EnvironmentFailure(
                f"{target} refused the key", "give --key PATH of a key the pod accepts (PUBLIC_KEY on RunPod)"
            ) from None
        except paramiko.PasswordRequiredException:
            raise UsageError("the key is encrypted", "load it into ssh-agent, or give an unencrypted --key") from None
        except EnvironmentFailure:
            raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise EnvironmentFailure(f"cannot connect to {target}: {exc}", "check the address and port") from None
        transport = self.client.get_transport()
        if transport is not None:
            transport.set_keepalive(30)  # a training run prints nothing for minutes; proxies drop idle sessions
        self._exec: bool | None = None
        self._sftp: paramiko.SFTPClient | bool | None = None
        self._shell: Shell | None = None

    @property
    def exec_works(self) -> bool:
        """Whether the exec channel runs commands (RunPod's gateway answers "doesn't support PTY" instead)."""
        if self._exec is None:
            nonce = podwire.new_nonce()
            try:
                code, out, _ = self._exec_run(f"printf 'IMK%s%s\\n' {nonce} P", 15.0, None, None)
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
                raise ConnectionLost(f"{self.target} refused a terminal: {exc}", "check the target") from None
            self._shell = Shell(chan, self.timeout)
        return self._shell

    def _exec_run(self, command: str, timeout: float, sink: Sink | None, err: Sink | None) -> tuple[int, str, str]:
        try:
            chan = self.client.get_transport().open_session(timeout=self.timeout)  # type: ignore[union-attr]
            chan.exec_command(command)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectionLost(f"the SSH connection dropped: {exc}", "run the command again") from None
        out, errs = _Stream(sink), _Stream(err)
        deadline = time.monotonic() + timeout
        chan.settimeout(0.5)
        try:
            while not (chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready()):
                if time.monotonic() > deadline:
                    chan.close()
                    raise CommandTimeout(
                        f"timed out after {timeout:g} s: {command}", "raise --timeout, or check the command"
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
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectionLost(f"the SSH connection dropped: {exc}", "run the command again") from None
        finally:
            chan.close()
        return code, out.close(), errs.close()

    def run(self, command: str, timeout: float, sink: Sink, err: Sink | None = None) -> int:
        """Run a shell command on the pod, streaming its output; the exit code is the command's."""
        if self.exec_works:
            code, _, _ = self._exec_run(command, timeout, sink, err or sink)
            return code
        try:
            return self.shell().run(command, timeout, sink)
        except CommandTimeout as exc:
            raise CommandTimeout(f"timed out after {timeout:g} s: {command}", exc.hint) from None

    def capture(self, command: str, timeout: float = 120.0) -> tuple[int, str]:
        out: list[str] = []
        code = self.run(command, timeout, out.append, lambda _: None)
        return code, "".join(out)

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
    """Decode bytes as they come and pass whole lines on, cleaned."""

    def __init__(self, sink: Sink | None) -> None:
        self.sink, self.pending, self.all = sink, "", []
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> None:
        self.pending += self.decoder.decode(data)
        cut = self.pending.rfind("\n") + 1
        if cut:
            self._emit(self.pending[:cut])
            self.pending = self.pending[cut:]

    def _emit(self, text: str) -> None:
        text = podwire.clean(text)
        self.all.append(text)
        if self.sink:
            self.sink(text)

    def close(self) -> str:
        rest = self.pending + self.decoder.decode(b"", final=True)
        if rest:
            self._emit(rest)
        return "".join(self.all)


def is_dropped(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionLost) or isinstance(exc, socket.error)
