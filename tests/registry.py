"""A real registry (Debian's docker-registry) on 127.0.0.1, with its own config, for tests and the demo."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def htpasswd_line(user: str, password: str) -> str:
    import bcrypt

    return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=6)).decode()}"


@dataclass
class Registry:
    root: Path
    port: int
    auth: tuple[str, str] | None = None
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def config(self) -> str:
        text = (
            f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {self.root / 'data'}\n"
            f"  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{self.port}\n  secret: imagekit-test\n"
        )
        if self.auth:
            (self.root / "htpasswd").write_text(htpasswd_line(*self.auth) + "\n")
            text += f"auth:\n  htpasswd:\n    realm: imagekit\n    path: {self.root / 'htpasswd'}\n"
        return text

    def start(self) -> Registry:
        binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "config.yml").write_text(self.config())
        with open(self.root / "registry.log", "ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [binary, "serve", str(self.root / "config.yml")], stdout=subprocess.DEVNULL, stderr=log
            )
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.address}/v2/", timeout=1):
                    return self
            except urllib.error.HTTPError as exc:
                exc.close()
                return self  # 401 from an auth registry: it is up
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"registry on {self.address} did not start: {(self.root / 'registry.log').read_text()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
