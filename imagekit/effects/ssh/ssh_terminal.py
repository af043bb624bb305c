"""The terminal transport's wire: one shell session whose commands are framed by sentinels (podwire), and the chunked
copy over it. Each chunk is verified by its sha256 and sent again when it arrives altered."""

from __future__ import annotations

import base64
import codecs
import hashlib
import re
import time
from pathlib import Path
from typing import BinaryIO

import paramiko

from imagekit.clouds import podwire
from imagekit.clouds.podwire import CHUNK, q
from imagekit.effects.ssh.ssh_copies import Captures, Progress, checked, remote_sha256, sha256_file
from imagekit.effects.ssh.ssh_errors import (
    MAX_CAPTURE,
    CommandTimeout,
    ConnectionLost,
    Sink,
    TooMuchOutput,
    WriteFailed,
    seconds,
)
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.trust import untrusted

CHUNK_TRIES = 3  # a chunk that arrives corrupted this many times fails the copy


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


# ---- the chunked copy over the terminal, both directions ---------------------------------------------------
def put_chunks(
    t: Captures, shell: Shell, local: Path, part: str, parent: str, total: int, progress: Progress, log: Sink
) -> int:
    """Verified chunks appended to the pod's ``part``, resumed after its last whole chunk when those bytes
    still match ours (sha256 of the prefix on both ends)."""
    out = checked(t, f"mkdir -p {q(parent)} && {{ wc -c < {q(part)} 2>/dev/null || echo 0; }}", f"mkdir {parent}")
    have = int(out.split()[-1]) if out.split() and out.split()[-1].isdigit() else 0
    start = 0 if have > total else have // CHUNK * CHUNK
    if start:
        checked(t, f"truncate -s {start} {q(part)}", "resume")
        if remote_sha256(t, part) != sha256_file(local, start):
            start = 0
        else:
            log(f"resuming {part[: -len('.imkpart')]} at {start:,} of {total:,} bytes")
    if not start:
        checked(t, f": > {q(part)}", f"create {part}")
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
                t.capture(f"rm -f {q(part)}", 30)
                raise CheckFailed(
                    f"chunk {index} of {local} arrived corrupted {CHUNK_TRIES} times: nothing was written",
                    "the terminal alters what is typed into it; check the pod's stty settings",
                )
            done += len(data)
            sent += len(data)
            index += 1
            progress(done, total)
    return sent


def get_chunks(
    t: Captures,
    shell: Shell,
    remote: str,
    part: Path,
    fh: BinaryIO,
    have: int,
    total: int,
    progress: Progress,
    log: Sink,
) -> int:
    """Verified chunks appended to ``fh``, resumed after the last whole chunk of an earlier try when those
    bytes still match the pod's (sha256 of the prefix on both ends)."""
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
        if remote_sha256(t, remote, start) != mine.hexdigest():
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
