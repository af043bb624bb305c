"""The build's failure summary (services/builds/selftest_runner.failure_lines): each failed check's message and fix as
the
image wrote them, so the user reads what broke without opening the report; the image's output is another party's
text: bounded, its escape sequences and control characters taken out, no line of its own."""

from __future__ import annotations

from imagekit.errors import CheckFailed
from imagekit.services.builds import selftest_runner
from imagekit.services.builds.selftest_runner import SelfTestReport, failure_lines


def _report(*checks: dict) -> dict:
    return {"checks": list(checks), "failed": [c["id"] for c in checks if c.get("status") == "fail"]}


def test_each_failed_check_is_shown_with_its_message_and_fix():
    report = _report(
        {"id": "pip-check", "status": "pass", "message": "no broken requirements"},
        {"id": "smoke-1", "status": "fail", "message": "`acme --help` exited 1: ModuleNotFoundError: trl", "fix": ""},
        {"id": "project-imports", "status": "fail", "message": "acme shadows torch", "fix": "rename the package"},
    )
    summary = SelfTestReport("reg/acme:x", False, report).summary()
    assert summary.splitlines() == [
        "self-test failed: smoke-1, project-imports",
        "  smoke-1: `acme --help` exited 1: ModuleNotFoundError: trl",
        "  project-imports: acme shadows torch",
        "    fix: rename the package",
    ]
    assert "no broken requirements" not in summary  # a passing check is not a failure


def test_the_images_text_is_bounded_and_escaped():
    hostile = "\x1b[2J\x1b]0;owned\x07line one\nerror: spoofed\r" + "x" * 5000
    report = _report({"id": "smoke-1\x1b[31m", "status": "fail", "message": hostile, "fix": "y" * 900})
    lines = failure_lines(report)
    assert len(lines) == 2 and all("\x1b" not in line and "\r" not in line for line in lines)
    assert lines[0].startswith("  smoke-1: line one error: spoofed xxx")  # one line: no `error:` of its own
    assert len(lines[0]) <= selftest_runner.MAX_MESSAGE + 100 and lines[0].endswith("…")
    assert len(lines[1]) <= selftest_runner.MAX_FIX + 20
    rendered = CheckFailed("\n".join(["self-test failed: smoke-1", *lines]), "h").render()
    assert not any(line.startswith("error: spoofed") for line in rendered.splitlines())


def test_many_failures_are_counted_past_the_shown_ones_and_odd_shapes_do_not_crash():
    many = [{"id": f"smoke-{n}", "status": "fail", "message": f"m{n}"} for n in range(20)]
    lines = failure_lines(_report(*many))
    assert len(lines) == selftest_runner.MAX_SHOWN + 1 and lines[-1] == "  ... and 12 more failed checks"
    assert failure_lines({"checks": "nope"}) == [] and failure_lines({}) == []
    assert failure_lines({"checks": [1, None, {"id": 3, "status": "fail", "message": ["a"]}]}) == ["  3: ['a']"]
