"""A command on an SSH exec channel: output and errors apart, cleaned as they come, bounded when read whole, and the
signal that killed it heard (paramiko drops it)."""

from __future__ import annotations

import codecs
import time

import paramiko

from imagekit.clouds import podwire
from imagekit.effects.ssh.ssh_errors import CommandTimeout, ConnectionLost, Sink, TooMuchOutput, seconds
from imagekit.trust import untrusted


def run(
    client: paramiko.SSHClient,
    command: str,
    timeout: float,
    sink: Sink | None,
    err: Sink | None,
    keep: int = 0,
    *,
    open_timeout: float,
) -> tuple[int, str, str]:
    """Run ``command`` on an exec channel of ``client`` (opened within ``open_timeout``): (exit code, its output
    and its errors, ``keep`` characters of each at most: more is :class:`TooMuchOutput`; 0 keeps nothing, for
    streaming)."""
    try:
        chan = client.get_transport().open_session(timeout=open_timeout)  # type: ignore[union-attr]
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


def hear_exit_signals(transport: paramiko.Transport) -> None:
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
