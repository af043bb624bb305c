"""A real headless Chromium for tests (Debian's `chromium`; `make setup` installs it), driven over the DevTools
protocol on a pipe (``--remote-debugging-pipe``: JSON messages ending in NUL on file descriptors 3 and 4), so no port
is opened and no websocket client is needed. It runs offline: every host name resolves to nothing and every proxy is
a dead loopback port; a test reads the requests a page made (``Tab.requests``) to show it asked for nothing else.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

NAMES = ("chromium", "chromium-browser")
TIMEOUT_S = 30.0


def find() -> str | None:
    """The Chromium on PATH, or None."""
    return next((found for name in NAMES if (found := shutil.which(name))), None)


class ProtocolError(RuntimeError):
    pass


class Browser:
    """One Chromium process; ``with Browser(profile) as b: tab = b.tab(url)``."""

    def __init__(self, profile: Path, exe: str | None = None) -> None:
        self.exe = exe or find()
        if self.exe is None:
            raise FileNotFoundError("chromium is not installed (apt-get install chromium; make setup installs it)")
        self.profile = profile
        self.events: list[dict] = []
        self._buffer = b""
        self._next = 0

    def __enter__(self) -> Browser:
        commands_r, self._commands = os.pipe()
        self._answers, answers_w = os.pipe()

        def onto_3_and_4() -> None:  # in the child: the protocol's descriptors, whatever numbers the pipes got
            a, b = os.dup(commands_r), os.dup(answers_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        argv = [
            self.exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
            f"--user-data-dir={self.profile}", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            "--disable-background-networking", "--disable-sync", "--disable-component-update",
            "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
            "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND", "about:blank",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            argv,
            preexec_fn=onto_3_and_4,  # two dup2 calls in the child, nothing that takes a lock
            close_fds=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(commands_r)
        os.close(answers_w)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (ProtocolError, OSError, TimeoutError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._commands)
        os.close(self._answers)

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._answers], [], [], max(0.0, left))
            if not ready:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._answers, 1 << 20)
            if not chunk:
                raise ProtocolError(f"Chromium exited (code {self.process.poll()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(line)

    def post(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        return self._next

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = TIMEOUT_S):
        """Send one command and wait for its answer; events that come meanwhile are kept (``self.events``)."""
        sent = self.post(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            message = self._message(deadline)
            if message.get("id") == sent:
                if "error" in message:
                    raise ProtocolError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self._event(message)

    def _event(self, message: dict) -> None:
        self.events.append(message)
        if message["method"] == "Page.javascriptDialogOpening":  # dismissed at once: a dialog would block the page
            self.post("Page.handleJavaScriptDialog", {"accept": False}, message.get("sessionId"))

    def wait_for(self, method: str, session: str, since: int, timeout: float = TIMEOUT_S) -> dict:
        """The first event ``method`` of ``session`` after the ``since``-th event."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events[since:]:
                if event["method"] == method and event.get("sessionId") == session:
                    return event
            since = len(self.events)
            message = self._message(deadline)
            if "method" in message:
                self._event(message)

    def tab(self, url: str, width: int = 1280, height: int = 900, scripts: bool = True) -> Tab:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable", session=session)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        if not scripts:
            self.send("Emulation.setScriptExecutionDisabled", {"value": True}, session)
        tab = Tab(self, session)
        tab.open(url)
        return tab


class Tab:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session

    def open(self, url: str) -> None:
        since = len(self.browser.events)
        self.browser.send("Page.navigate", {"url": url}, self.session)
        self.browser.wait_for("Page.loadEventFired", self.session, since)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (a promise awaited); its exception raises."""
        found = self.browser.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            self.session,
        )
        if "exceptionDetails" in found:
            raise ProtocolError(f"{expression[:80]}: {found['exceptionDetails']}")
        return found["result"].get("value")

    def events(self, method: str) -> list[dict]:
        return [
            e["params"] for e in self.browser.events if e["method"] == method and e.get("sessionId") == self.session
        ]

    @property
    def requests(self) -> list[str]:
        """Every URL the page asked for."""
        return [e["request"]["url"] for e in self.events("Network.requestWillBeSent")]

    @property
    def dialogs(self) -> list[dict]:
        return self.events("Page.javascriptDialogOpening")

    def grant_clipboard(self) -> None:
        self.browser.send(
            "Browser.grantPermissions", {"permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]}
        )

    def screenshot(self, path: Path, full_page: bool = False) -> bytes:
        params: dict = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = base64.b64decode(self.browser.send("Page.captureScreenshot", params, self.session)["data"])
        path.write_bytes(data)
        return data
