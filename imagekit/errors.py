"""Errors carry what went wrong, how to fix it, and the process exit code.

Exit codes: 0 ok; 1 the check/test/build said no; 2 bad usage or config; 3 the environment failed.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_NO = 1
EXIT_USAGE = 2
EXIT_ENV = 3


class ImagekitError(Exception):
    """Base error: ``message`` (what), ``hint`` (how to fix), ``exit_code``."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        """``error:`` and ``hint:`` as the terminal shows them: what a message quotes of a file, a label or an
        argument never moves the cursor or recolours it (escape sequences and control characters are taken out),
        and no line is longer than MAX_LINE (a 900,000-character name is named by its length)."""
        text = f"error: {_shown(self.message)}"
        if self.hint:
            text += f"\nhint: {_shown(self.hint)}"
        return text


MAX_LINE = 2000


def _shown(text: str) -> str:
    from imagekit.trust.untrusted import printable

    out = []
    for line in str(text).split("\n"):
        clean = printable(line, 1 << 62, lines=True)
        if len(clean) > MAX_LINE:
            clean = f"{clean[: MAX_LINE - 200]}… ({len(clean) - MAX_LINE + 200} more characters not shown)"
        out.append(clean)
    return "\n".join(out)


class UsageError(ImagekitError):
    """Bad input: a flag, a value, a config file."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """A matrix file with one or more problems, all reported at once."""

    def __init__(self, problems: list[str], hint: str | None = None) -> None:
        self.problems = problems
        message = "invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems)
        super().__init__(message, hint)


class UnknownVersionError(UsageError):
    """A version the compatibility data does not know: never guess."""


class CheckFailed(ImagekitError):
    """The check, test or build said no."""

    exit_code = EXIT_NO


class EnvironmentFailure(ImagekitError):
    """Something outside imagekit failed: Docker down, an index unreachable."""

    exit_code = EXIT_ENV


class NotSent(EnvironmentFailure):
    """A request to a provider's API never left (the connection failed): nothing was done there."""


class PodMayExist(EnvironmentFailure):
    """A provider got the request to create a pod, but what it answered cannot be read: a pod may exist and bill."""
