"""Containers of the images the tests build, started through testcontainers.

One way to start them: detached, no TTY, ports published on 127.0.0.1 only, ready when the container says so (a log
line, an HTTP answer), never after a fixed sleep; removed with their anonymous volumes afterwards. Local images
only: an image that is not in the engine is an error here, never a pull (this machine can pull nothing, and a test
must not run what a registry happens to serve). Ryuk, testcontainers' reaper, is off
(``TESTCONTAINERS_RYUK_DISABLED``): its image cannot be pulled, and every test removes its own containers.
testcontainers reads its settings from the environment when it is first imported, so it is imported only after
``configure`` ran (in ``tests/conftest.py``'s ``pytest_configure``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import WaitStrategy

READY = "imagekit: ready"  # what the pod start prints once its check ran and sshd (if any) listens
SETTINGS = {
    "TESTCONTAINERS_RYUK_DISABLED": "true",  # the reaper's image cannot be pulled; every test removes its own
    # Ports are published on 127.0.0.1 and reached there, also where a /.dockerenv makes testcontainers believe it
    # runs in a container (it would then try the bridge's gateway address).
    "TESTCONTAINERS_CONNECTION_MODE": "docker_host",
    "TESTCONTAINERS_HOST_OVERRIDE": "127.0.0.1",
}


def configure() -> None:
    """Before testcontainers is first imported: its settings (see the module's docstring)."""
    for name, value in SETTINGS.items():
        os.environ.setdefault(name, value)


def ready_times(message: str, times: int) -> WaitStrategy:
    """Ready once ``message`` was logged ``times`` times (a restart logs it again)."""
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    return LogMessageWaitStrategy(re.compile("(?s)" + ".*".join([re.escape(message)] * times)))


def http_ready(port: int, path: str) -> WaitStrategy:
    from testcontainers.core.wait_strategies import HttpWaitStrategy

    return HttpWaitStrategy(port, path).for_status_code(200)


class Running:
    """A started container: its logs, its published ports, exec, and removal."""

    def __init__(self, tc: DockerContainer) -> None:
        self.tc = tc

    @property
    def container(self):  # type: ignore[no-untyped-def]
        """The docker SDK's container (restart, stop, attrs)."""
        return self.tc.get_wrapped_container()

    def logs(self) -> str:
        return self.container.logs().decode("utf-8", "replace")

    def port(self, port: str) -> int:
        """The host port (on 127.0.0.1) that ``port`` (``22/tcp``) is published on."""
        self.container.reload()
        return int(self.container.attrs["NetworkSettings"]["Ports"][port][0]["HostPort"])

    def exec(self, *argv: str) -> tuple[int, str]:
        code, out = self.container.exec_run(list(argv), tty=False)
        return code, out.decode("utf-8", "replace")

    def wait(self, strategy: WaitStrategy, timeout: float = 120) -> str:
        """Wait for ``strategy`` (a restarted container, a second start) and return the logs."""
        strategy.with_startup_timeout(int(timeout)).with_poll_interval(0.2)
        strategy.wait_until_ready(self.tc)
        return self.logs()

    def remove(self) -> None:
        self.tc.stop(force=True, delete_volume=True)


def start(
    engine,  # type: ignore[no-untyped-def]
    image: str,
    *,
    env: dict[str, str] | None = None,
    volumes: dict[Path | str, tuple[str, str]] | None = None,
    ports: tuple[str, ...] = (),
    command: list[str] | None = None,
    ready: WaitStrategy | None = None,
    timeout: float = 120,
    **docker_kw: object,
) -> Running:
    """Start ``image`` detached; return once ``ready`` holds (the pod start's ready line by default). A container that
    exits before it is ready, or is not ready in ``timeout`` s, raises (with its logs) and is removed."""
    from testcontainers.core.container import DockerContainer

    if engine.image(image) is None:
        raise AssertionError(f"{image} is not in the engine: build it first (tests never pull)")
    tc = DockerContainer(image).with_envs(**(env or {}))
    tc.with_kwargs(tty=False, stdin_open=False, **docker_kw)
    for host, (bind, mode) in (volumes or {}).items():
        tc.with_volume_mapping(str(host), bind, mode)
    for port in ports:
        tc.ports[port] = ("127.0.0.1", None)  # type: ignore[assignment]  # docker-py's (address, any free port)
    if command is not None:
        tc.with_command(command)
    strategy = ready if ready is not None else ready_times(READY, 1)
    tc.waiting_for(strategy.with_startup_timeout(int(timeout)).with_poll_interval(0.2))
    try:
        tc.start()
    except BaseException:
        if tc._container is not None:  # created, started, never ready: its logs are in the error already
            tc.stop(force=True, delete_volume=True)
        raise
    return Running(tc)


@contextmanager
def started(engine, image: str, **kw: object) -> Iterator[Running]:  # type: ignore[no-untyped-def]
    running = start(engine, image, **kw)  # type: ignore[arg-type]
    try:
        yield running
    finally:
        running.remove()


def output(engine, image: str, argv: list[str], **docker_kw: object) -> str:  # type: ignore[no-untyped-def]
    """Run ``argv`` in a container of ``image`` (no entrypoint, no network) to its end; its stdout. A non-zero exit
    raises with the container's stderr."""
    from testcontainers.core.container import DockerContainer

    if engine.image(image) is None:
        raise AssertionError(f"{image} is not in the engine: build it first (tests never pull)")
    tc = DockerContainer(image).with_command(argv).with_kwargs(entrypoint=[], network_mode="none", **docker_kw)
    tc.start()
    try:
        code = tc.wait()
        out, err = tc.get_logs()
    finally:
        tc.stop(force=True, delete_volume=True)
    if code != 0:
        raise AssertionError(f"{argv} exited {code} in {image}:\n{err.decode('utf-8', 'replace')[-3000:]}")
    return out.decode("utf-8", "replace")
