"""How imagekit talks to a pod through an SSH server that offers only a terminal (RunPod's gateway): targets,
sentinel framing of commands, control-sequence stripping, and the shell snippets of a checksum-verified chunked
copy. Pure: the terminal transport (effects/ssh/ssh_terminal.py) types these lines and feeds back what the terminal
prints.

Everything typed stays under the terminal's canonical line limit (4095 bytes on Linux: longer lines are cut
silently, which is how a 5.6 MB heredoc arrives as 4.7 MB). Sentinels are printed by ``printf`` from pieces, so
an echoed command line never contains the sentinel it waits for, and a prompt is never matched by a regex.
"""

from __future__ import annotations

import base64
import re
import secrets
import shlex
from dataclasses import dataclass

from imagekit.clouds import providers
from imagekit.errors import UsageError
from imagekit.trust import untrusted

LINE_LIMIT = 4095  # N_TTY_BUF_SIZE - 1: the longest line a Linux terminal in canonical mode delivers whole
TYPED_LINE = 3072  # base64 characters per typed line: well under the limit, a multiple of 4
CHUNK = 4 << 20  # payload bytes per verified chunk (a round trip and a few processes each)
GATEWAYS = providers.ssh_gateways()

_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}", re.ASCII)
_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\]",
    re.ASCII,
)
_TARGET = re.compile(rf"(?P<user>{_USER.pattern})@(?P<host>{_HOST.pattern})(?::(?P<port>\d{{1,5}}))?", re.ASCII)
_REMOTE = re.compile(rf"(?P<target>{_USER.pattern}@(?:{_HOST.pattern})(?::\d{{1,5}})?):(?P<path>.*)", re.ASCII | re.S)
# CSI (colors, cursor), OSC (titles, hyperlinks), other ESC sequences, then any C0/C1 control but tab and newline.
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]"  # two-byte and nF sequences
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
)
_CRLF = re.compile(r"\r+\n")


@dataclass(frozen=True)
class Target:
    """An SSH endpoint: ``user@host[:port]``, RunPod's gateway form ``<pod-id>-<hex>@ssh.runpod.io`` included."""

    user: str
    host: str
    port: int = 22

    @property
    def gateway(self) -> bool:
        """A provider's proxied gateway (RunPod's): a terminal only (no exec channel, no SFTP)."""
        return self.host.lower() in GATEWAYS

    @property
    def known_hosts_name(self) -> str:
        """How OpenSSH's known_hosts names this host."""
        return self.host if self.port == 22 else f"[{self.host.strip('[]')}]:{self.port}"

    def __str__(self) -> str:
        return f"{self.user}@{self.host}" + ("" if self.port == 22 else f":{self.port}")


def parse_target(text: str) -> Target:
    m = _TARGET.fullmatch(text or "")
    port = int(m["port"]) if m and m["port"] else 22
    if m is None or not 1 <= port <= 65535:
        raise UsageError(
            f"not an SSH target: {text!r}",
            "give USER@HOST[:PORT] (e.g. root@203.0.113.7:22011) or RunPod's gateway form "
            f"POD-HEX@{providers.named('runpod').ssh_gateway}",
        )
    return Target(m["user"], m["host"], port)


def split_remote(spec: str) -> tuple[Target, str] | None:
    """``TARGET:PATH`` -> (target, path); None for a local path (one that starts with / or . never is remote)."""
    if spec.startswith(("/", ".")):
        return None
    m = _REMOTE.fullmatch(spec)
    if m is None:
        return None
    target_text, path = m["target"], m["path"]
    port = re.match(r"(\d{1,5}):(.*)", path, re.S)
    if port and ":" not in target_text.split("@", 1)[1]:  # USER@HOST:PORT:PATH
        target_text, path = f"{target_text}:{port[1]}", port[2]
    if not path:
        raise UsageError(f"no remote path in {spec!r}", "give TARGET:PATH, e.g. root@host:/workspace/out")
    return parse_target(target_text), remote_path(path)


_PATH_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def remote_path(path: str) -> str:
    """A path on the pod, refused when it holds a control character: typed into a terminal, ^U erases the line
    before it and ^C interrupts, so the rest of the name would run as a command."""
    bad = _PATH_CONTROL.search(path)
    if bad:
        raise UsageError(
            f"the remote path {untrusted.printable(path, 120)!r} has a control character (U+{ord(bad[0]):04X})",
            "name the file plainly (no control characters)",
        )
    return path


def clean(text: str) -> str:
    """What a terminal printed, as plain text: escape sequences and control characters (C0, C1, DEL, the bidi and
    zero-width format characters) removed, CRLF -> LF, and a lone CR (a progress bar redrawing itself) kept as a
    line break."""
    text = _CRLF.sub("\n", _ANSI.sub("", text)).replace("\r", "\n")  # a terminal turns \r\n into \r\r\n
    return untrusted.CONTROL.sub("", text)  # C0, C1 (U+0080-U+009F, from UTF-8 too), DEL, bidi controls


def new_nonce() -> str:
    return secrets.token_hex(8).upper()  # upper case: survives a terminal that maps case on output


def mark(nonce: str, kind: str) -> str:
    """The sentinel the remote prints: ``IMK<nonce><kind>``."""
    return f"IMK{nonce}{kind}"


def print_mark(nonce: str, kind: str, *values: str) -> str:
    """Shell that prints ``IMK<nonce><kind> v1 v2...`` on a line of its own; typed text never equals the output."""
    fmt = "IMK%s%s" + " %s" * len(values)
    return f"printf '\\n{fmt}\\n' {nonce} {kind} " + " ".join(values)


def setup_line(nonce: str) -> str:
    """First line typed into the terminal: no echo, no prompt, no history, a plain shell; then a ready mark."""
    return (
        "stty -echo 2>/dev/null; unset HISTFILE PROMPT_COMMAND; "
        f'PS1= PS2= TERM=dumb exec sh -c "stty -echo 2>/dev/null; {print_mark(nonce, "R")}; exec sh"\n'
    )


def command_line(nonce: str, command: str) -> tuple[str, str | None]:
    """The line that runs ``command`` in ``sh -c`` (stdin from /dev/null) between a start mark ``S`` and an end mark
    ``E <exit code>``. A command too long for one typed line goes as base64 into a file first (after a ``G`` mark,
    through :func:`data_lines`): the second item is that base64 body, or None."""
    encoded = base64.b64encode(command.encode()).decode()
    line = (
        f'{print_mark(nonce, "S")}; sh -c "$(printf %s {encoded} | base64 -d)" </dev/null; '
        f"{print_mark(nonce, 'E', '$?')}\n"
    )
    if len(line) < TYPED_LINE:
        return line, None
    script = f"/tmp/.imk-{nonce}.sh"
    line = (
        f"{print_mark(nonce, 'G')}; base64 -d > {script}; {print_mark(nonce, 'S')}; sh {script} </dev/null; "
        f"{print_mark(nonce, 'E', '$?')}; rm -f {script}\n"
    )
    return line, encoded


def data_lines(encoded: str) -> list[str]:
    """base64 text as typed lines under the limit, ending with the end-of-file character at a line start."""
    lines = [encoded[i : i + TYPED_LINE] + "\n" for i in range(0, len(encoded), TYPED_LINE)]
    return [*lines, "\x04"]


def q(path: str) -> str:
    """A path as one shell word that no command takes for an option (``-n`` goes as ``./-n``)."""
    return shlex.quote("./" + path if path.startswith("-") else path)


def probe_script() -> str:
    """What the remote side is: a file, a directory or nothing; its size; and the tools the copy needs."""
    return (
        'p="$1"; if [ -d "$p" ]; then k=dir; elif [ -f "$p" ]; then k=file; else k=none; fi; '
        's=$( [ "$k" = file ] && wc -c < "$p" || echo 0 ); '
        't=; for x in base64 sha256sum dd tar; do command -v $x >/dev/null 2>&1 || t="$t $x"; done; '
        'echo "$k $s${t:+ missing:$t}"'
    )


def chunk_upload_line(nonce: str, part: str, expect_sha: str, length: int) -> str:
    """Receive one chunk (``length`` characters of base64 lines) into ``part.c``; append it to ``part`` only when
    its sha256 matches, and say which: ``K ok``, ``K bad <sha> <error>`` (sent again), or ``K fail <error>`` when
    the pod cannot write (a full disk, a read-only folder: no use sending it again). Whatever fails, the typed
    lines are read to the end (never run as commands). The terminal is raw while the lines arrive (no line editing:
    three times the throughput of canonical mode); its settings are restored right after."""
    remote_path(part)
    # the names go as base64 too (never typed as they are): the line holds nothing the terminal could act on
    encoded = base64.b64encode(("./" + part if part.startswith("-") else part).encode()).decode()
    names = f'p=$(printf %s {encoded} | base64 -d); c="$p.c"; '
    c, p = '"$c"', '"$p"'
    one_line = "\"$(printf %s \"$e\" | tr -s '\\r\\n' '  ' | head -c 200)\""
    return (
        f"{names}s=$(stty -g); stty raw -echo; {print_mark(nonce, 'G')}; "
        f'e=$(head -c {length} | {{ base64 -d > {c} || {{ cat > /dev/null; exit 1; }}; }} 2>&1); stty "$s"; '
        f"h=$(sha256sum < {c} | cut -c1-64); "
        f'if [ "$h" = {expect_sha} ]; then if e=$(cat {c} 2>&1 >> {p}); '
        f"then rm -f {c}; {print_mark(nonce, 'K', 'ok')}; "
        f"else rm -f {c}; {print_mark(nonce, 'K', 'fail', one_line)}; fi; "
        f"else rm -f {c}; {print_mark(nonce, 'K', 'bad', '$h', one_line)}; fi\n"
    )


WRITE_ERRORS = re.compile(r"No space left|Read-only file system|Disk quota|Permission denied|Input/output error", re.I)


def chunk_lines(encoded: str) -> str:
    """base64 text as lines under the canonical limit (what :func:`chunk_upload_line` counts)."""
    return "".join(encoded[i : i + TYPED_LINE] + "\n" for i in range(0, len(encoded), TYPED_LINE))


NOT_REGULAR = 66  # the exit code of a chunk command whose file is not a regular file (any more)


def chunk_download_command(path: str, index: int, chunk: int = CHUNK) -> str:
    """Print one chunk as base64 lines, then ``#<sha256 of the chunk>``; a FIFO or a device (swapped in since the
    last look) is never opened: exit ``NOT_REGULAR`` instead of hanging."""
    dd = f"dd if={q(path)} bs={chunk} skip={index} count=1 2>/dev/null"
    guard = f"[ -f {q(path)} ] || exit {NOT_REGULAR}"
    return f'{guard}; {dd} | base64 -w {TYPED_LINE}; echo "#$({dd} | sha256sum | cut -c1-64)"'


def chunk_text_limit(chunk: int = CHUNK) -> int:
    """The most characters a terminal shows for one chunk printed by :func:`chunk_download_command`: its base64,
    a line break (CR LF at worst) per typed line, the ``#`` and digest line. More than that is a hostile pod."""
    encoded = (chunk + 2) // 3 * 4
    return encoded + 2 * (encoded // TYPED_LINE + 1) + 256


def parse_chunk(text: str) -> tuple[bytes, str]:
    """The bytes and the remote's sha256 of one chunk printed by :func:`chunk_download_command` (raw terminal
    text: anything but base64 and line breaks makes it unreadable, and the caller reads the chunk again)."""
    body, _, digest = text.rpartition("#")
    data = base64.b64decode("".join(body.split()), validate=True)
    return data, digest.strip().lower()
