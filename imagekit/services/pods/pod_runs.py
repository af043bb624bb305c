"""Runs that outlive the connection (`imagekit pod run/logs/wait`): a command started on the pod in a session of its
own (setsid), its output to a log on the volume and its exit code recorded there, so a dropped connection changes
nothing on the pod and any later connection can follow it or wait for it.

On the pod, each run is a folder ``$IMAGEKIT_RUNS/<id>/`` (default ``/workspace/.imagekit/runs``): ``command``,
``pid``, ``log``, and ``exit`` once it ended (written atomically, before the lifetime guard's on-exit action runs,
which the pod's env arms: ``IMAGEKIT_ON_EXIT``). ``latest`` links the newest. Everything read back from the pod (the
id, the log, the exit code) is checked or shown as untrusted text.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from imagekit.clouds.podwire import Target
from imagekit.errors import CheckFailed, EnvironmentFailure, UsageError
from imagekit.services.pods import launch_check
from imagekit.services.pods.pod import LEASE, Dial, Log, PodOptions, connect, refuse_if_blocked
from imagekit.trust import untrusted

RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9]{1,10}", re.ASCII)
RUNS = '"${IMAGEKIT_RUNS:-/workspace/.imagekit/runs}"'
# A run's process is its boot id, pid and start time (field 22 of /proc/PID/stat, counted after the command name's
# closing parenthesis), not its pid: after a container restart the pid names another process (the guard reads the
# same file: in_image/guard.py). `alive` (needs r and p set) is true while the recorded process runs; a run with no
# identity file (started by an older imagekit) falls back to its pid.
_START = "\"$(sed 's/^.*[)] //' \"/proc/$p/stat\" 2>/dev/null | cut -d' ' -f20)\""
_BOOT = '"$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"'
RECORD_IDENTITY = (
    f"t={_START}; b={_BOOT} || b=; "
    'if [ -n "$t" ] && [ -n "$b" ]; then printf \'%s %s %s\\n\' "$b" "$p" "$t" >"$r/identity"; fi; '
)
ALIVE = (
    'alive() { [ -f "$r/identity" ] || { kill -0 "$p" 2>/dev/null; return; }; '
    'read -r b q t <"$r/identity" || return 1; '
    f'[ "$q" = "$p" ] && [ "$b" = {_BOOT} ] && [ "$t" = {_START} ]; }}; '
)
NO_LIMIT = 10.0**9  # seconds: `pod wait` waits as long as the run takes unless --timeout says otherwise
# The runs folder and every folder above it must be the user's or root's and writable by no one else (or sticky): a
# folder another user of the pod can change lets them swap a run's folder, its exit code or `latest` (the guard's state
# refuses the same). `private "$d"` prints the first folder that is not, and fails.
PRIVATE = (
    'private() { x=$(cd "$1" 2>/dev/null && pwd -P) || return 1; me=$(id -u); while :; do '
    'i=$(stat -c "%u %a" "$x" 2>/dev/null) || return 1; o=${i%% *}; m=${i#* }; '
    'if { [ "$o" != 0 ] && [ "$o" != "$me" ]; } || { [ $(( 0$m & 022 )) -ne 0 ] && [ $(( 0$m & 01000 )) -eq 0 ]; }; '
    'then echo "IMAGEKIT-UNSAFE $o $m $x"; return 1; fi; '
    '[ "$x" = / ] && return 0; x=$(dirname "$x"); done; }; '
)
UNSAFE = 5  # the exit code of a script that found the runs folder unsafe
# What the lifetime guard warns of (a job on the CPU while the GPUs idle, a hung GPU holder), printed once each time it
# changes as IMAGEKIT-WARNING lines: `pod run`, `pod logs -f` and `pod wait` show them where the renter looks.
WARNINGS = (
    'W="${IMAGEKIT_WARNING_FILE:-/run/imagekit/guard-warning}"; shown=; '
    'warned() { [ -f "$W" ] && [ ! -L "$W" ] || return 0; s=$(head -c 2000 "$W" 2>/dev/null); '
    '[ -n "$s" ] && [ "$s" != "$shown" ] || return 0; shown=$s; '
    "printf '%s\\n' \"$s\" | while IFS= read -r l; do printf 'IMAGEKIT-WARNING %s\\n' \"$l\"; done; }; "
)


@dataclass(frozen=True)
class Started:
    run_id: str
    transport: str


def start_script(command: str) -> str:
    """Start ``command`` (run by the pod's login shell, as `pod exec` runs it) in its own session; print its id."""
    # The run's folder and files are the user's alone (umask 077: the command line may hold a token); the command
    # itself runs with the login shell's own umask ($2), so what it writes on the volume is as it would be by hand.
    wrapper = (
        'r="$1"; ( umask "$2"; exec "${SHELL:-/bin/sh}" -c "$(cat "$r/command")" ) >"$r/log" 2>&1 </dev/null; c=$?; '
        'echo "$c" >"$r/exit.tmp" && mv "$r/exit.tmp" "$r/exit"; '
        'if [ -n "$IMAGEKIT_ON_EXIT" ] && [ -r /opt/imagekit/doctor/guard.py ]; then '
        '/opt/venv/bin/python -I /opt/imagekit/doctor/guard.py --after-run "$c" >>"$r/log" 2>&1; fi'
    )
    return (
        f'set -e; u="$(umask)"; umask 077; d={RUNS}; mkdir -p "$d"; '
        + PRIVATE
        + WARNINGS
        + f'private "$d" || exit {UNSAFE}; '
        'id="$(date -u +%Y%m%dT%H%M%SZ)-$$"; r="$d/$id"; mkdir "$r"; '
        f"printf '%s\\n' {shlex.quote(command)} >\"$r/command\"; "
        f'setsid sh -c {shlex.quote(wrapper)} imagekit-run "$r" "$u" </dev/null >/dev/null 2>&1 & '
        'p=$!; echo "$p" >"$r/pid"; ' + RECORD_IDENTITY + 'ln -sfn "$id" "$d/latest"; warned; echo "$id"'
    )


def _run_dir(run_id: str | None) -> str:
    """The shell that sets ``r`` to the run's folder (the newest without an id) or says there is none (exit 4)."""
    chosen = shlex.quote(run_id) if run_id else f'"$(readlink {RUNS[:-1]}/latest" 2>/dev/null)"'
    return (
        f"d={RUNS}; " + PRIVATE + f'if [ -d "$d" ]; then private "$d" || exit {UNSAFE}; fi; id={chosen}; r="$d/$id"; '
        'if [ -z "$id" ] || [ ! -f "$r/pid" ]; then echo "imagekit: no such run on this pod" >&2; exit 4; fi; '
    )


def checked_id(run_id: str | None) -> str | None:
    if run_id is not None and not RUN_ID.fullmatch(run_id):
        raise UsageError(
            f"--run {untrusted.printable(run_id, 40)!r} is not a run id", "ids look like 20261202T130501Z-4242"
        )
    return run_id


class PodLines:
    """A sink for what the pod prints: its IMAGEKIT-WARNING lines (the lifetime guard's warnings) said through
    ``warn``, made printable; an IMAGEKIT-UNSAFE line (the runs folder another user can change) kept for the error;
    everything else passed on to ``rest`` whole lines at a time (None: kept in ``kept``)."""

    def __init__(self, warn: Log, rest: Log | None = None) -> None:
        self.warn, self.rest, self.buffer, self.kept, self.unsafe = warn, rest, "", [], None

    def __call__(self, text: str) -> None:
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            self._line(line + "\n")
        if len(self.buffer) > 1 << 16:  # no line end for that long: not a line of ours
            self._pass(self.buffer)
            self.buffer = ""

    def close(self) -> None:
        if self.buffer:
            self._line(self.buffer)
            self.buffer = ""

    def _line(self, line: str) -> None:
        if line.startswith("IMAGEKIT-WARNING "):
            said = untrusted.printable(line[len("IMAGEKIT-WARNING ") :].strip(), 600)
            if said:
                self.warn(f"warning from the pod's lifetime guard: {said}")
        elif line.startswith("IMAGEKIT-UNSAFE "):
            self.unsafe = line.strip()
        else:
            self._pass(line)

    def _pass(self, text: str) -> None:
        if self.rest is not None:
            self.rest(text)
        else:
            self.kept.append(text)

    def text(self) -> str:
        return "".join(self.kept)


def refuse_unsafe(line: str | None) -> None:
    """The runs folder on the pod (or a folder above it) can be changed by another user of the pod: refused."""
    m = re.fullmatch(r"IMAGEKIT-UNSAFE ([0-9]{1,10}) ([0-7]{3,4}) (/.*)", line or "")
    where = f"{untrusted.printable(m[3], 200)} (owner uid {m[1]}, mode {m[2]})" if m else "a folder above it"
    raise CheckFailed(
        f"the pod's runs folder is not private: {where} can be changed by another user of the pod, who could swap a "
        "run's command, log or exit code",
        "as root on the pod: chown root:root and chmod 700 that folder (or remove /workspace/.imagekit/runs), or set "
        "IMAGEKIT_RUNS in the pod's env to a folder only you can change",
    )


def start(
    target: Target,
    command: str,
    opts: PodOptions,
    warn: Log,
    dial: Dial = connect,
    ignore_blockers: bool = False,
    check_launch: bool = True,
) -> Started:
    """Start ``command`` on the pod; its run id. Refused on a blocked pod, as `pod exec` is, and, unless not
    ``check_launch``, where the image's doctor finds a blocker in the launch (:mod:`launch_check`), over the same
    connection and before anything is started; refused where the runs folder is not private. What the lifetime guard
    warns of is said."""
    with dial(target, opts, warn) as t:
        if not ignore_blockers:
            refuse_if_blocked(t, "starting the run")
        if check_launch:
            launch_check.enforce(t, command, warn, ignore_blockers)
        code, out = t.capture(start_script(command), 60.0)
    lines = PodLines(warn)
    lines(out)
    lines.close()
    if code == UNSAFE and lines.unsafe:
        refuse_unsafe(lines.unsafe)
    out = lines.text()
    said = out.strip().splitlines()[-1].strip() if out.strip() else ""
    if code != 0 or not RUN_ID.fullmatch(said):
        raise EnvironmentFailure(
            f"the run did not start on the pod (exit {code}): {untrusted.printable(out.strip()[-300:], 300)}",
            "check that the pod's volume is writable (imagekit pod doctor TARGET)",
        )
    return Started(said, t.mode)


def logs(
    target: Target, run_id: str | None, follow: bool, opts: PodOptions, out: Log, err: Log, warn: Log,
    dial: Dial = connect,
) -> int:  # fmt: skip
    """The run's log (``follow``: until the run ends, with the lifetime guard's warnings said as they come); 0, or 4
    when there is no such run. A connection following a log is an imagekit client (``LEASE``)."""
    show = (
        LEASE + WARNINGS + 'p="$(cat "$r/pid")"; ' + ALIVE + "if alive; then "
        '( while :; do warned >&2; sleep 2; done ) & w=$!; tail -n +1 -f --pid="$p" "$r/log"; c=$?; '
        'kill "$w" 2>/dev/null; warned >&2; exit "$c"; else cat "$r/log"; warned >&2; fi'
        if follow
        else 'cat "$r/log"'
    )
    script = _run_dir(checked_id(run_id)) + show  # a bad id is refused before any connection
    lines = PodLines(warn, err)
    with dial(target, opts, warn) as t:
        code = t.run(script, NO_LIMIT if follow else opts.timeout, out, lines)
    lines.close()
    if code == UNSAFE and lines.unsafe:
        refuse_unsafe(lines.unsafe)
    return code


def wait(target: Target, run_id: str | None, opts: PodOptions, warn: Log, dial: Dial = connect) -> int:
    """The run's exit code, once it ended; a run that ended without one (killed with the pod's processes) is
    :class:`EnvironmentFailure`. The lifetime guard's warnings are said as they come; a connection waiting is an
    imagekit client (``LEASE``): the exit stop waits for it, and for the `pod cp` after it."""
    script = (
        _run_dir(checked_id(run_id))
        + LEASE
        + WARNINGS
        + (
            'p="$(cat "$r/pid")"; ' + ALIVE + 'while [ ! -e "$r/exit" ]; do warned; alive || break; sleep 1; done; '
            'warned; if [ -e "$r/exit" ]; then echo "IMAGEKIT-EXIT $(cat "$r/exit")"; else echo IMAGEKIT-LOST; fi'
        )
    )
    lines = PodLines(warn)
    with dial(target, opts, warn) as t:
        code = t.run(script, opts.timeout or NO_LIMIT, lines, _drop)
    lines.close()
    out = lines.text()
    if code == UNSAFE and lines.unsafe:
        refuse_unsafe(lines.unsafe)
    if code == 4:
        raise UsageError("no such run on this pod", "imagekit pod run TARGET -- COMMAND starts one")
    m = re.search(r"^IMAGEKIT-EXIT (\d{1,3})\s*$", out, re.M)
    if m and int(m[1]) <= 255:  # an exit status is a byte: anything else is not the run's
        return int(m[1])
    if "IMAGEKIT-LOST" in out:
        raise EnvironmentFailure(
            "the run ended without an exit code (its process was killed: the pod restarted?)",
            "imagekit pod logs TARGET shows how far it got",
        )
    raise EnvironmentFailure(f"unexpected answer from the pod: {untrusted.printable(out.strip()[-200:], 200)}", "")


def _drop(_text: str) -> None:
    """What `pod wait`'s script writes to stderr: nothing of use (its own shell's noise)."""
