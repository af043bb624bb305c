"""What the use cases need from a container engine and a registry: the real ones are `effects.docker.Engine` and
`effects.registry.RegistryClient`; tests pass recording fakes (`tests/fakes.py`) to check the steps' order and every
failure branch without Docker. Structural: anything with these methods will do."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from imagekit.effects.docker import Capabilities
from imagekit.effects.registry import OciManifest, Remote

LineFn = Callable[[str], None]
LayerFn = Callable[[str, str, int | None, int | None], None]


class ContainerEngine(Protocol):
    def capabilities(self) -> Capabilities: ...
    def image(self, ref: str) -> dict | None: ...
    def layers(self, ref: str) -> list[str]: ...
    def history(self, ref: str) -> list[dict]: ...
    def import_tarball(self, tarball: Path, repository: str, tag: str) -> str: ...
    def build(
        self,
        context: Path,
        tags: list[str],
        buildargs: dict[str, str],
        *,
        nocache: bool = False,
        on_line: LineFn | None = None,
        extra_hosts: dict[str, str] | None = None,
        platform: str | None = None,
    ) -> str: ...
    def load_config(self, config: bytes, tags: list[str]) -> str: ...
    def commit_changes(self, image_id: str, changes: list[str], tags: list[str]) -> str: ...
    def tag(self, image_id: str, repository: str, tag: str) -> None: ...
    def remove(self, ref: str) -> None: ...
    def run(
        self,
        image: str,
        argv: list[str],
        *,
        entrypoint: list[str] | None = None,
        env: dict[str, str] | None = None,
        gpus: bool = False,
        user: str | None = None,
        timeout: int = 900,
        volumes: dict[str, dict] | None = None,
        on_stderr: LineFn | None = None,
        network: bool = False,
    ) -> tuple[int, str, str]: ...
    def push(
        self,
        repository: str,
        tag: str,
        auth: dict | None = None,
        on_line: LineFn | None = None,
        on_layer: LayerFn | None = None,
    ) -> str: ...
    def pull(self, reference: str, auth: dict | None = None, platform: str | None = None) -> str: ...


class Registry(Protocol):
    def oci_manifest(self, remote: Remote, reference: str) -> OciManifest | None: ...
    def oci_manifest_json(self, remote: Remote, reference: str) -> dict: ...
    def blob_json(self, remote: Remote, digest: str) -> dict: ...
    def copy_tag(self, remote: Remote, digest: str, tag: str) -> None: ...
    def manifest_raw(self, remote: Remote, reference: str) -> tuple[str, bytes, str] | None: ...
    def put_manifest(self, remote: Remote, tag: str, body: bytes, media: str) -> str: ...
