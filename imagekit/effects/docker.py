"""The one module that talks to the Docker engine (docker-py, plus the CLI only to detect buildx)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from imagekit.effects import process
from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.trust import untrusted

LineFn = Callable[[str], None]


@dataclass(frozen=True)
class Capabilities:
    server_version: str
    api_version: str
    buildx: str | None  # buildx version, when the CLI plugin exists
    builder: str  # "buildx" or "legacy"
    gpu_runtime: bool
    notes: tuple[str, ...] = field(default=())


def _unix_socket_problem() -> str | None:
    """Why the engine's Unix socket cannot be connected to, or None. Checked first with a socket closed here:
    docker-py leaves the socket of a failed connect open (a ResourceWarning at some later garbage collection)."""
    import os
    import socket

    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://"):
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        try:
            sock.connect(host.removeprefix("unix://"))
        except (OSError, ValueError) as exc:
            return f"{host}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}"
    return None


def _client():
    import docker
    from docker.errors import DockerException

    problem = _unix_socket_problem()
    if problem is not None:
        raise EnvironmentFailure(
            f"the Docker engine is not reachable: {problem}",
            "start Docker (systemctl start docker) or set DOCKER_HOST",
        )
    try:
        client = docker.from_env(timeout=600)
        client.ping()
        return client
    except DockerException as exc:
        raise EnvironmentFailure(
            f"the Docker engine is not reachable: {exc}", "start Docker (systemctl start docker) or set DOCKER_HOST"
        ) from None


SANDBOX = {
    "read_only": True,
    "tmpfs": {"/tmp": "rw,nosuid,nodev,size=256m,mode=1777"},
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges"],
    "pids_limit": 256,
    "mem_limit": "4g",
    # what it prints is kept on the host's disk by the engine: 16 MB at most (the last of it), whatever it prints
    "log_config": {"type": "json-file", "config": {"max-size": "16m", "max-file": "1"}},
}


def _command(entrypoint: list[str] | None, argv: list[str]) -> str:
    """A container's command as a message names it: a program's source handed on the command line (``python -c
    '...'``) is not quoted, nor is any word longer than a path."""
    words = [*(entrypoint or []), *argv]
    shown = [w if len(w) <= 80 and "\n" not in w else "…" for w in words]
    return untrusted.printable(" ".join(shown), 200)


class Engine:
    def __init__(self) -> None:
        self.client = _client()
        self.api = self.client.api

    # -- capabilities ---------------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        info = self.client.info()
        version = self.client.version()
        res = process.run(["docker", "buildx", "version"], timeout=30) if _has_cli() else None
        buildx = res.stdout.strip() if res is not None and res.ok else None
        notes = []
        lost = (
            "Lost: BuildKit's rewrite-timestamp (BuildKit >= 0.13). Kept: identical layers from identical inputs "
            "(SOURCE_DATE_EPOCH, mtimes clamped inside each RUN, no caches) and identical image configs (imagekit sets "
            "the config itself, dated SOURCE_DATE_EPOCH)"
        )
        if buildx:
            notes.append(
                f"buildx found ({buildx}): `imagekit build` still builds through the API with the legacy builder; "
                "`imagekit render` contexts build with `docker buildx build/bake`. " + lost
            )
        else:
            notes.append(
                "no buildx: building with the engine's legacy builder through the API "
                "(`tools/install-buildx` adds it for `docker buildx bake`). " + lost
            )
        builder = "legacy"
        runtimes = info.get("Runtimes") or {}
        return Capabilities(
            version.get("Version", "?"),
            version.get("ApiVersion", "?"),
            buildx,
            builder,
            "nvidia" in runtimes,
            tuple(notes),
        )

    def root_dir(self) -> Path | None:
        """The engine's storage folder when the engine runs on this machine (its free space is ours to measure)."""
        import os

        host = os.environ.get("DOCKER_HOST", "")
        if host and not host.startswith("unix://"):
            return None
        root = self.client.info().get("DockerRootDir")
        return Path(root) if root and Path(root).exists() else None

    # -- images -----------------------------------------------------------------------------------------
    def image(self, ref: str) -> dict | None:
        from docker.errors import ImageNotFound

        try:
            return self.api.inspect_image(ref)
        except ImageNotFound:
            return None

    def import_tarball(self, tarball: Path, repository: str, tag: str) -> str:
        res = self.api.import_image_from_file(str(tarball), repository=repository, tag=tag)
        text = res if isinstance(res, str) else json.dumps(res)
        if "error" in text.lower():
            raise EnvironmentFailure(f"docker import failed: {text}")
        found = self.image(f"{repository}:{tag}")
        if not found:
            raise EnvironmentFailure(f"docker import of {tarball} produced no image")
        return found["Id"]

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
        target: str | None = None,
    ) -> str:
        """Build with the legacy builder (docker-py); returns the image id. Errors in the stream raise.
        ``target``: only the stages up to that one (`imagekit build` runs the cell stage's steps itself).
        ``platform``: another CPU architecture's image (its RUN steps under qemu-user-static on this host).

        ``extra_hosts`` (--add-host) is in neither the cache key nor the image. (Labels are in the Dockerfile: the
        legacy builder turns each --label into a LABEL step of its own, a container commit each.)"""
        image_id = None
        log: list[str] = []
        stream = self.api.build(
            path=str(context),
            tag=tags[0],
            buildargs=buildargs,
            network_mode="host",
            extra_hosts=extra_hosts,
            nocache=nocache,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
            **({"platform": platform} if platform else {}),
            **({"target": target} if target else {}),
        )
        for chunk in stream:
            if "error" in chunk or "errorDetail" in chunk:
                detail = chunk.get("errorDetail", {}).get("message") or chunk.get("error")
                tail = "".join(log[-25:])
                raise CheckFailed(f"docker build failed: {detail}\n{tail}".rstrip(), _build_hint(detail + tail))
            line = chunk.get("stream")
            if line:
                log.append(line)
                # a chunk may carry several lines of a step; a RUN's stderr comes wrapped in color codes
                for part in _COLOR.sub("", line).splitlines() if on_line else ():
                    if part.strip():
                        on_line(part.rstrip())  # type: ignore[misc]
            aux = chunk.get("aux")
            if isinstance(aux, dict) and "ID" in aux:
                image_id = aux["ID"]
        if image_id is None:
            found = self.image(tags[0])
            image_id = found["Id"] if found else None
        if image_id is None:
            raise CheckFailed("docker build produced no image", "see the build log above")
        for extra in tags[1:]:
            repo, tag = extra.rsplit(":", 1)
            self.api.tag(image_id, repo, tag)
        return image_id

    def load_config(self, config: bytes, tags: list[str]) -> str:
        """A new image from ``config`` over layers the engine already holds, tagged ``tags``; returns its id.

        `docker load` of an archive with the config and no layer files: the engine finds each layer by its chain and
        reads nothing else (no container, no diff). Raises ``EnvironmentFailure`` when the engine refuses it (an image
        store that wants the layer blobs, e.g. containerd's)."""
        return self.load_layer(config, None, len(json.loads(config)["rootfs"]["diff_ids"]), tags)

    def load_layer(
        self,
        config: bytes | Callable[[], bytes],
        layer: tuple[int, Iterable[bytes]] | None,
        layer_count: int,
        tags: list[str] | None = None,
    ) -> str:
        """A new image from ``config``, its last layer the tar ``layer`` (its size and chunks; None: the engine holds
        every layer), the rest found by their chains; returns its id. ``config`` may be a function, called once the
        layer's chunks were sent (a config naming the diff id they hashed to; the engine checks the layer against
        it). Raises ``EnvironmentFailure`` when the engine refuses it (a layer it does not hold, a store that wants
        every blob)."""
        import hashlib

        from docker.errors import APIError

        from imagekit.effects.layer_tar import load_archive

        sent: list[bytes] = []

        def final() -> bytes:
            sent.append(config() if callable(config) else config)
            return sent[0]

        try:
            # the stream, decoded; docker-py raises nothing for an error in it
            events = list(self.api.load_image(load_archive(final, layer, layer_count, tags or [])) or ())
        except APIError as exc:
            raise EnvironmentFailure(f"docker load of an image failed: {exc}") from None
        errors = [e for e in events if isinstance(e, dict) and ("error" in e or "errorDetail" in e)]
        found = self.image(f"sha256:{hashlib.sha256(sent[0]).hexdigest()}") if sent else None
        if errors or not found:
            raise EnvironmentFailure(f"docker load of an image failed: {json.dumps(errors or events)[:300]}")
        return found["Id"]

    def staged_steps(self) -> bool:
        """Whether `imagekit build` may run the cell stage's steps itself: an engine on this machine (a bind mount
        names this machine's folder) and IMAGEKIT_BUILD_STEPS not `dockerfile`."""
        import os

        if os.environ.get("IMAGEKIT_BUILD_STEPS", "staged") == "dockerfile":
            return False
        host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        return host.startswith("unix://")

    def run_step(
        self,
        image: str,
        command: str,
        *,
        env: dict[str, str],
        binds: dict[str, str],
        extra_hosts: dict[str, str],
        on_line: LineFn | None = None,
        commit: bool = False,
    ) -> tuple[int, str, str | None]:
        """One build step: ``/bin/sh -c command`` in a container of ``image`` on the host's network (the wheel
        server), ``binds`` (host folder -> container path) mounted; returns (exit code, the last of its output, the
        committed image's id when ``commit`` and it succeeded). The container is removed."""
        container = self.api.create_container(
            image,
            ["/bin/sh", "-c", command],
            entrypoint=[],
            environment=env,
            host_config=self.api.create_host_config(
                network_mode="host",
                extra_hosts=extra_hosts,
                binds={src: {"bind": dst, "mode": "rw"} for src, dst in binds.items()},
            ),
        )
        cid = container["Id"]
        try:
            self.api.start(cid)
            tail: list[str] = []
            pending = b""
            for chunk in self.api.logs(cid, stream=True, follow=True, stdout=True, stderr=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    line = _COLOR.sub("", raw.decode("utf-8", "replace")).rstrip()
                    tail = [*tail, line][-25:]
                    if on_line is not None and line.strip():
                        on_line(line)
            if pending:
                tail.append(pending.decode("utf-8", "replace"))
            code = int(self.api.wait(cid).get("StatusCode", 1))
            committed = None
            if commit and code == 0:
                committed = self.api.commit(cid, pause=False)["Id"]
            return code, "\n".join(tail), committed
        finally:
            self.api.remove_container(cid, force=True)

    def commit_changes(self, image_id: str, changes: list[str], tags: list[str]) -> str:
        """The slow way to the same image: a container commit with Dockerfile ``changes`` (ENV, LABEL, ...)."""
        container = self.api.create_container(image_id, command=["true"])
        try:
            repo, tag = tags[0].rsplit(":", 1)
            new = self.api.commit(container["Id"], repository=repo, tag=tag, changes=changes, pause=False)["Id"]
        finally:
            self.api.remove_container(container["Id"], force=True)
        for extra in tags[1:]:
            repo, tag = extra.rsplit(":", 1)
            self.api.tag(new, repo, tag, force=True)
        return new

    def read_file(self, reference: str, path: str) -> bytes | None:
        """``path`` out of the image as a tar stream (a container created, never started, then removed); None when the
        image lacks it or the engine cannot read it."""
        from docker.errors import DockerException

        try:
            container = self.client.containers.create(reference, ["true"], entrypoint=[])
        except DockerException:
            return None
        try:
            stream, _ = container.get_archive(path)
            return b"".join(stream)
        except DockerException:
            return None
        finally:
            try:
                container.remove(force=True)
            except DockerException:
                pass

    def tag(self, image_id: str, repository: str, tag: str) -> None:
        self.api.tag(image_id, repository, tag, force=True)

    def layers(self, ref: str) -> list[str]:
        found = self.image(ref)
        return list(found["RootFS"]["Layers"]) if found else []

    def history(self, ref: str) -> list[dict]:
        return self.api.history(ref)

    def remove(self, ref: str) -> None:
        from docker.errors import ImageNotFound

        try:
            self.api.remove_image(ref, force=True)
        except ImageNotFound:
            pass

    def remove_unused(self, ref: str) -> bool:
        """Remove the image ``ref`` unless the engine refuses (a container uses it, or it has children): not forced,
        so another build's image in use stays; True when it is gone."""
        from docker.errors import APIError, ImageNotFound

        try:
            self.api.remove_image(ref, force=False)
        except ImageNotFound:
            return True
        except APIError:
            return False
        return True

    def images_named(self, repository: str) -> list[tuple[str, str, int]]:
        """(repository:tag, image id, size) of each tag the engine holds in ``repository``."""
        out = []
        for found in self.api.images(name=repository) or []:
            for tag in found.get("RepoTags") or []:
                if tag.rsplit(":", 1)[0] == repository:
                    out.append((tag, str(found.get("Id")), int(found.get("Size") or 0)))
        return sorted(out)

    # -- containers -----------------------------------------------------------------------------------
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
        sandbox: bool = False,
    ) -> tuple[int, str, str]:
        """Run a container to completion; returns (exit code, stdout, stderr). The container is removed.
        ``on_stderr`` receives the container's stderr lines while it runs. ``sandbox``: another party's program
        (a project's setup.py): its root filesystem read-only but for a 256 MB /tmp, no capabilities, no new
        privileges, at most 256 processes and 4 GB of memory."""
        import requests
        from docker.types import DeviceRequest

        device_requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None
        container = self.client.containers.create(
            image,
            argv,
            entrypoint=entrypoint,
            environment=env or {},
            device_requests=device_requests,
            user=user,
            network_mode="bridge" if network else "none",
            volumes=volumes or {},
            **(SANDBOX if sandbox else {}),
        )
        try:
            container.start()
            follower = None
            if on_stderr is not None:
                follower = threading.Thread(target=_follow, args=(container, on_stderr), daemon=True)
                follower.start()
            try:
                result = container.wait(timeout=timeout)
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                raise CheckFailed(
                    f"{image}: {_command(entrypoint, argv)} did not finish within {timeout} s; the container was "
                    "stopped",
                    "see what it waits on with `docker run` of the same command; on an emulated platform "
                    "(qemu) everything is 5 to 20 times slower",
                ) from None
            if follower is not None:
                follower.join(timeout=10)
            out = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            err = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
            return int(result.get("StatusCode", 1)), out, err
        finally:
            container.remove(force=True)

    # -- registry -------------------------------------------------------------------------------------
    def layer_export(self, image_id: str):
        """A reader of the image's layers straight from this engine's store, or None where that cannot be read
        (another machine's engine, another storage driver, no permission; or IMAGEKIT_PUSH_FROM=save)."""
        import os

        from imagekit.effects.layer_export import store_export

        if os.environ.get("IMAGEKIT_PUSH_FROM") == "save":
            return None
        return store_export(self.client.info(), image_id)

    def save(self, image_id: str):
        """`docker save` of the image, as a stream of chunks."""
        return self.api.get_image(image_id, chunk_size=4 << 20)

    def pull(self, reference: str, auth: dict | None = None, platform: str | None = None) -> str:
        from docker.errors import APIError

        repo, _, digest = reference.partition("@")
        extra = {"platform": platform} if platform and platform != "linux/amd64" else {}
        try:
            for chunk in self.api.pull(repo, tag=digest or None, stream=True, decode=True, auth_config=auth, **extra):
                if "error" in chunk:
                    raise EnvironmentFailure(f"pull of {reference} failed: {chunk['error']}")
        except APIError as exc:
            raise EnvironmentFailure(f"pull of {reference} failed: {exc}") from None
        found = self.image(reference)
        if not found:
            raise EnvironmentFailure(f"pull of {reference} left no image")
        return found["Id"]


_COLOR = re.compile(r"\x1b\[[0-9;]*m")


def _follow(container, on_line: LineFn) -> None:
    """Stream a running container's stderr to ``on_line``, a line at a time (ends when the container does)."""
    pending = b""
    try:
        for chunk in container.logs(stream=True, follow=True, stdout=False, stderr=True):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                on_line(line.decode("utf-8", "replace"))
    except Exception:  # progress only: the full logs are read again after the container ends
        return
    if pending:
        on_line(pending.decode("utf-8", "replace"))


def _build_hint(text: str) -> str:
    lowered = text.lower()
    if (
        "THESE PACKAGES DO NOT MATCH THE HASHES" in text
        or "do not match the hashes" in lowered
        or "hash mismatch" in lowered
    ):
        return "a wheel's bytes differ from the lock (tampered cache or index); `imagekit fetch` re-verifies"
    if "Could not find a version" in text or "No matching distribution" in text or "not found in the provided" in text:
        return "the wheelhouse lacks a locked wheel; run `imagekit fetch` for this cell"
    return "see the build log above"


def _has_cli() -> bool:
    import shutil

    return shutil.which("docker") is not None
