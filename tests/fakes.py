"""Recording fakes of the container engine and the registry (`imagekit.services.ports`): every call lands in one
shared log, in order, so tests can check the build's steps and failure branches without Docker. Scripted outcomes:
the self-test's report, a failing push, a registry that already holds the immutable tag with other contents. And a
fake pod transport (`imagekit.effects.ssh.ssh_transport.Transport`) for `services/pods/pod.py`'s decisions without an
SSH
server."""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from imagekit.effects.docker import Capabilities
from imagekit.effects.registry import OciManifest, Remote
from imagekit.errors import EnvironmentFailure


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


# A release record's self-test report as publish writes it for a tested image (release merge refuses any other)
PASSED = {"passed": True, "failed": [], "checks": [{"id": "dists-match-lock", "status": "pass", "message": "ok"}]}
DPKG_STATUS = """Package: base-files
Status: install ok installed
Architecture: amd64
Version: 12.4+deb12u15

Package: bsdutils
Status: install ok installed
Architecture: amd64
Source: util-linux (2.38.1-5+deb12u3)
Version: 1:2.38.1-5+deb12u3

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""


@dataclass
class RecordingEngine:
    calls: list[tuple] = field(default_factory=list)
    selftest_passes: bool = True
    selftest_torch: str | None = None  # what the self-test finds torch to be (default: what the image's labels say)
    build_error: str | None = None
    size: int = 5_000_000_000
    images: dict[str, dict] = field(default_factory=dict)  # ref (id or tag) -> inspect
    registry: RecordingRegistry | None = None  # where a push lands
    configs: dict[str, bytes] = field(default_factory=dict)  # image id -> its config's bytes (load_config)
    contents: dict[str, bytes] = field(default_factory=dict)  # diff id -> the layer's bytes (a fake tar)

    def _layer(self, text: str) -> str:
        self.contents[_digest(text)] = text.encode()
        return _digest(text)

    def _record(self, *call: object) -> None:
        self.calls.append(call)

    def _add(self, image_id: str, layers: list[str], parent_layers: int, tags: list[str]) -> None:
        inspect = {"Id": image_id, "Size": self.size, "RootFS": {"Type": "layers", "Layers": layers},
                   "Config": {"Env": [], "Labels": None}, "Architecture": "amd64", "Os": "linux"}  # fmt: skip
        for ref in (image_id, *tags):
            self.images[ref] = inspect

    def capabilities(self) -> Capabilities:
        self._record("capabilities")
        return Capabilities("fake", "1.41", None, "legacy", False)

    def image(self, ref: str) -> dict | None:
        if ref.startswith("imagekit/base:") and ref not in self.images:  # a bootstrapped base the engine holds
            self._add(_digest(ref), [self._layer(ref + "/layer")], 0, [ref])
        return self.images.get(ref)

    def layers(self, ref: str) -> list[str]:
        found = self.image(ref)
        return list(found["RootFS"]["Layers"]) if found else []

    def history(self, ref: str) -> list[dict]:
        found = self.images[ref]
        return list(reversed(found.get("_history", [])))

    def import_tarball(self, tarball: Path, repository: str, tag: str) -> str:
        raise AssertionError("the fake engine holds every base it is asked for")

    def build(self, context, tags, buildargs, *, nocache=False, on_line=None, extra_hosts=None, platform=None) -> str:
        dockerfile = (Path(context) / "Dockerfile").read_text()
        self._record("build", tags[0], nocache)
        if self.build_error:
            raise EnvironmentFailure(f"docker build failed: {self.build_error}", "see the build's output above")
        base = next(line.split()[1] for line in dockerfile.splitlines() if line.startswith("FROM "))
        below = self.image(base)
        assert below is not None, f"the build names a base the engine lacks: {base}"
        steps = [line for line in dockerfile.splitlines() if line.startswith(("COPY ", "RUN "))]
        history = [{"Id": below["Id"], "CreatedBy": "Imported from -", "Size": 1, "Created": 0}]
        layers = list(below["RootFS"]["Layers"])
        for n, step in enumerate(steps):
            layers.append(self._layer(f"{step}/{n}"))
            step_id = _digest(f"{dockerfile}/{n}")
            self.images[step_id] = {"Id": step_id, "RootFS": {"Layers": list(layers)}}
            history.append({"Id": step_id, "CreatedBy": step, "Size": 1, "Created": 0})
        image_id = history[-1]["Id"]
        self._add(image_id, layers, 0, tags)
        self.images[image_id]["_history"] = history
        return image_id

    def load_config(self, config: bytes, tags: list[str]) -> str:
        doc = json.loads(config)
        image_id = "sha256:" + hashlib.sha256(config).hexdigest()
        self._record("load_config", tuple(tags))
        self.configs[image_id] = config
        self._add(image_id, doc["rootfs"]["diff_ids"], 0, tags)
        self.images[image_id]["Config"] = doc["config"]
        return image_id

    def commit_changes(self, image_id: str, changes: list[str], tags: list[str]) -> str:
        raise AssertionError("the fake engine's history always matches its layers")

    def tag(self, image_id: str, repository: str, tag: str) -> None:
        self._record("tag", f"{repository}:{tag}")
        self.images[f"{repository}:{tag}"] = self.images[image_id]

    def remove(self, ref: str) -> None:
        self.images.pop(ref, None)

    def remove_unused(self, ref: str) -> bool:
        self._record("remove_unused", ref)
        self.images.pop(ref, None)
        return True

    def images_named(self, repository: str) -> list[tuple[str, str, int]]:
        return sorted(
            (ref, image["Id"], int(image.get("Size") or 0))
            for ref, image in self.images.items()
            if ref.rsplit(":", 1)[0] == repository and ":" in ref and not ref.startswith("sha256:")
        )

    def run(self, image, argv, *, entrypoint=None, env=None, gpus=False, user=None, timeout=900, volumes=None,
            on_stderr=None, network=False) -> tuple[int, str, str]:  # fmt: skip
        self._record("run", image, argv[0])
        if entrypoint == ["/bin/sh", "-c"] and "/var/lib/dpkg/status" in argv[0]:  # what the SBOM reads
            return 0, f'ID=debian\nVERSION_ID="12"\n\n@@imagekit-dpkg-status@@\n{DPKG_STATUS}', ""
        status = "pass" if self.selftest_passes else "fail"
        checks = [{"id": "dists-match-lock", "status": status, "message": "", "hint": "", "evidence": {}}]
        failed = [] if self.selftest_passes else ["dists-match-lock"]
        # what the self-test reads inside the image: its manifest (the labels were made from it), and its torch
        labels = (self.images.get(image, {}).get("Config") or {}).get("Labels") or {}
        torch = self.selftest_torch or labels.get("imagekit.torch.version")
        cuda = labels.get("imagekit.torch.cuda")
        checks.append(
            {"id": "torch-cuda-version", "status": "pass", "evidence": {"torch": torch, "torch.version.cuda": cuda}}
        )
        report = {"cell": labels.get("imagekit.cell", "x"), "lock_hash": labels.get("imagekit.lock.hash"),
                  "python": labels.get("imagekit.python", "3.11") + ".2", "checks": checks, "failed": failed,
                  "passed": not failed}  # fmt: skip
        return (0 if self.selftest_passes else 1), json.dumps(report), ""

    def layer_export(self, image_id: str) -> FakeStore:
        """The image's config and layers as `imagekit.services.publishing.blob_push` reads them: a push starts here."""
        self._record("push", image_id)
        assert image_id in self.configs, "only an image with its config (load_config) is pushed"
        return FakeStore(self.configs[image_id], self.contents)

    def save(self, image_id: str):
        raise AssertionError("the fake engine's store is always readable")

    def pull(self, reference: str, auth: dict | None = None, platform: str | None = None) -> str:
        raise AssertionError("no registry base in these tests")


@dataclass(frozen=True)
class FakeStore:
    config_bytes: bytes
    contents: dict[str, bytes]

    def config(self) -> bytes:
        return self.config_bytes

    def layer(self, diff_ids: list[str], index: int):
        yield self.contents[diff_ids[index]]


@dataclass
class RecordingRegistry:
    calls: list[tuple]  # the engine's log: one order for both
    manifests: dict[tuple[str, str], dict] = field(default_factory=dict)  # (repo name, tag or digest) -> manifest
    blobs: dict[str, dict] = field(default_factory=dict)
    data: dict[str, bytes] = field(default_factory=dict)  # blob digest -> bytes uploaded
    upload_error: str | None = None

    def receive(self, remote: Remote, tag: str, inspect: dict) -> str:
        config = {"rootfs": {"type": "layers", "diff_ids": inspect["RootFS"]["Layers"]}, "config": inspect["Config"],
                  "architecture": inspect.get("Architecture", "amd64"), "os": "linux"}  # fmt: skip
        config_digest = inspect["Id"]
        self.blobs[config_digest] = config
        manifest = {"config": {"digest": config_digest},
                    "layers": [{"digest": d, "size": 10} for d in inspect["RootFS"]["Layers"]]}  # fmt: skip
        digest = _digest(json.dumps(manifest, sort_keys=True))
        self.manifests[(remote.name, tag)] = self.manifests[(remote.name, digest)] = manifest
        return digest

    def holds(self, remote: Remote, tag: str, config_digest: str, config: dict) -> None:
        """Seed: the registry already has ``tag`` (pushed by another build)."""
        self.blobs[config_digest] = config
        manifest = {"config": {"digest": config_digest}, "layers": []}
        self.manifests[(remote.name, tag)] = manifest

    def _digest_of(self, remote: Remote, reference: str) -> str:
        if reference.startswith("sha256:"):
            return reference
        return _digest(json.dumps(self.manifests[(remote.name, reference)], sort_keys=True))

    def oci_manifest(self, remote: Remote, reference: str) -> OciManifest | None:
        self.calls.append(("registry.oci_manifest", reference))
        found = self.manifests.get((remote.name, reference))
        if found is None:
            return None
        return OciManifest(self._digest_of(remote, reference), (found.get("config") or {}).get("digest"))

    def oci_manifest_json(self, remote: Remote, reference: str) -> dict:
        return self.manifests[(remote.name, reference)]

    def blob_json(self, remote: Remote, digest: str) -> dict:
        return self.blobs[digest]

    def copy_tag(self, remote: Remote, digest: str, tag: str) -> None:
        self.calls.append(("registry.copy_tag", tag))
        self.manifests[(remote.name, tag)] = self.manifests[(remote.name, digest)]

    def manifest_raw(self, remote: Remote, reference: str) -> tuple[str, bytes, str] | None:
        found = self.manifests.get((remote.name, reference))
        if found is None:
            return None
        body = json.dumps(found, sort_keys=True).encode()
        media = found.get("mediaType", "application/vnd.docker.distribution.manifest.v2+json")
        return media, body, _digest(body.decode())

    def put_manifest(self, remote: Remote, tag: str, body: bytes, media: str) -> str:
        self.calls.append(("registry.put_manifest", tag))
        doc = json.loads(body)
        digest = _digest(json.dumps(doc, sort_keys=True))
        self.manifests[(remote.name, tag)] = self.manifests[(remote.name, digest)] = doc
        return digest

    def blob_size(self, remote: Remote, digest: str) -> int | None:
        found = self.data.get(digest)
        return None if found is None else len(found)

    def blob(self, remote: Remote, digest: str, max_bytes: int) -> bytes:
        data = self.data[digest]
        assert len(data) <= max_bytes
        return data

    def holds_tags(self, remote: Remote) -> bool | None:
        return None  # not told: each layer goes through a file, as to a registry that does not say

    def start_upload(self, remote: Remote):
        raise AssertionError("no streamed upload to a registry that does not say it is empty")

    stream_upload = finish_upload = cancel_upload = start_upload

    def upload_blob(self, remote: Remote, digest: str, size: int, source: Path | bytes) -> None:
        self.calls.append(("registry.upload_blob", digest))
        if self.upload_error:
            raise EnvironmentFailure(f"registry refused blob {digest}: {self.upload_error}", "retry the publish")
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest.split(":", 1)[1] and len(data) == size
        self.data[digest] = data
        if data.startswith(b"{"):
            self.blobs[digest] = json.loads(data)


@dataclass
class FakeTransport:
    """A pod as `effects.ssh.ssh_transport.Transport` is to `services/pods/pod.py`, over an in-memory file tree: every
    command
    and copy lands in ``calls`` in order. Scripted: ``answers`` (the first key a command starts with gives its (exit
    code, output)), which doctor the pod has, its Python, a connection that drops on the first ``drops`` copies.
    ``dial`` is what the service's ``dial`` parameter takes; each call is a new connection (``connections``)."""

    mode: str = "exec"  # exec | pty
    copy_mode: str = "sftp"  # sftp | pty
    files: dict[str, bytes] = field(default_factory=dict)  # path on the pod -> contents
    dirs: set[str] = field(default_factory=lambda: {"/", "/tmp"})
    answers: dict[str, tuple[int, str]] = field(default_factory=dict)
    own_doctor: bool = False
    python: str = "/usr/bin/python3"
    run_exit: int = 0
    drops: int = 0  # copies that fail with ConnectionLost before this many reconnections
    calls: list[tuple] = field(default_factory=list)
    connections: int = 0
    uploaded: dict[str, bytes] = field(default_factory=dict)  # every upload, kept after the pod removes it

    @contextmanager
    def dial(self, target, opts, warn) -> Iterator[FakeTransport]:
        self.connections += 1
        self.calls.append(("connect", str(target)))
        yield self

    def commands(self) -> list[str]:
        return [c[1] for c in self.calls if c[0] in ("run", "capture")]

    def run(self, command: str, timeout: float, out, err) -> int:
        self.calls.append(("run", command))
        for start, (code, said) in self.answers.items():  # a scripted answer streams as it would be captured
            if command.startswith(start):
                out(said)
                return code
        out(f"ran {command}\n")
        return self.run_exit

    def capture(self, command: str, timeout: float = 300.0) -> tuple[int, str]:
        self.calls.append(("capture", command))
        for start, answer in self.answers.items():
            if command.startswith(start):
                return answer
        if command.startswith("command -v imagekit-doctor"):
            return (0, "/usr/local/bin/imagekit-doctor\n") if self.own_doctor else (1, "")
        if command.startswith("mktemp -d /tmp/imagekit-doctor."):
            self.dirs.add("/tmp/imagekit-doctor.FAKE")
            return 0, "/tmp/imagekit-doctor.FAKE\n"
        if command.startswith("for p in python3"):
            return (0, self.python + "\n") if self.python else (1, "")
        if command.startswith("if [ -d "):
            path = shlex.split(command)[3]
            kind = "dir" if path in self.dirs else "file" if path in self.files else "none"
            return 0, kind + "\n"
        if command.startswith("mkdir -p "):
            self.dirs.add(shlex.split(command)[2])
            return 0, ""
        if command.startswith("rm -"):
            for path in shlex.split(command.split(";")[0])[2:]:
                self.dirs.discard(path)
                self.files = {k: v for k, v in self.files.items() if k != path and not k.startswith(path + "/")}
            return 0, ""
        if command.startswith(("tar -c", "[ -f ")):  # pack a folder: tar -c[h]f STAGED -C DIR .
            words = shlex.split(command.split("|| ")[-1])
            staged, root = words[2], words[4]
            self.files[staged] = _tar_of(
                {k[len(root) + 1 :]: v for k, v in self.files.items() if k.startswith(root + "/")}
            )
            return 0, ""
        return 0, ""

    def _drop(self, what: str) -> None:
        if self.connections <= self.drops:
            from imagekit.effects.ssh.ssh_errors import ConnectionLost

            raise ConnectionLost(f"the SSH connection dropped during {what}", "run the copy again")

    def put(self, local: Path, remote: str, progress, log) -> int:
        self.calls.append(("put", remote))
        self._drop(f"the upload of {remote}")
        data = Path(local).read_bytes()
        self.files[remote] = self.uploaded[remote] = data
        progress(len(data), len(data))
        return len(data)

    def get(self, remote: str, local: Path, progress, log) -> int:
        self.calls.append(("get", remote))
        self._drop(f"the download of {remote}")
        data = self.files[remote]
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)
        progress(len(data), len(data))
        return len(data)


def _tar_of(tree: dict[str, bytes]) -> bytes:
    """A tar of ``tree`` (relative path -> contents), folders implied, as the pod's tar makes it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        folders = sorted({str(PurePosixPath(p).parent) for p in tree} - {"."})
        for name in folders:
            info = tarfile.TarInfo(f"./{name}")
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in sorted(tree.items()):
            info = tarfile.TarInfo(f"./{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@dataclass
class ScriptedResolver:
    """A resolver (`imagekit.effects.resolver.Resolver`) that answers from ``script`` in order: an exception is
    raised, text is returned as the resolution; each request it got lands in ``requests``."""

    script: list[object]
    name: str = "scripted"
    requests: list = field(default_factory=list)

    def version(self) -> str:
        return "scripted 1.0"

    def compile(self, req, preferences=None, upgrade=(), upgrade_all=False, abort=None) -> str:
        self.requests.append(req)
        answer = self.script.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return str(answer)
