"""Recording fakes of the container engine and the registry (`imagekit.services.ports`): every call lands in one
shared log, in order, so tests can check the build's steps and failure branches without Docker. Scripted outcomes:
the self-test's report, a failing push, a registry that already holds the immutable tag with other contents."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from imagekit.effects.docker import Capabilities
from imagekit.effects.registry import ManifestInfo, Remote
from imagekit.errors import EnvironmentFailure


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass
class RecordingEngine:
    calls: list[tuple] = field(default_factory=list)
    selftest_passes: bool = True
    push_error: str | None = None
    size: int = 5_000_000_000
    images: dict[str, dict] = field(default_factory=dict)  # ref (id or tag) -> inspect
    registry: RecordingRegistry | None = None  # where a push lands

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
            self._add(_digest(ref), [_digest(ref + "/layer")], 0, [ref])
        return self.images.get(ref)

    def layers(self, ref: str) -> list[str]:
        found = self.image(ref)
        return list(found["RootFS"]["Layers"]) if found else []

    def history(self, ref: str) -> list[dict]:
        found = self.images[ref]
        return list(reversed(found.get("_history", [])))

    def import_tarball(self, tarball: Path, repository: str, tag: str) -> str:
        raise AssertionError("the fake engine holds every base it is asked for")

    def build(self, context, tags, buildargs, *, nocache=False, on_line=None, extra_hosts=None) -> str:
        dockerfile = (Path(context) / "Dockerfile").read_text()
        self._record("build", tags[0], nocache)
        base = next(line.split()[1] for line in dockerfile.splitlines() if line.startswith("FROM "))
        below = self.image(base)
        assert below is not None, f"the build names a base the engine lacks: {base}"
        steps = [line for line in dockerfile.splitlines() if line.startswith(("COPY ", "RUN "))]
        history = [{"Id": below["Id"], "CreatedBy": "Imported from -", "Size": 1, "Created": 0}]
        layers = list(below["RootFS"]["Layers"])
        for n, step in enumerate(steps):
            layers.append(_digest(f"{step}/{n}"))
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

    def run(self, image, argv, *, entrypoint=None, env=None, gpus=False, user=None, timeout=900, volumes=None,
            on_stderr=None) -> tuple[int, str, str]:  # fmt: skip
        self._record("run", image, argv[0])
        status = "pass" if self.selftest_passes else "fail"
        checks = [{"id": "dists-match-lock", "status": status, "summary": "", "hint": "", "evidence": {}}]
        failed = [] if self.selftest_passes else ["dists-match-lock"]
        report = {"cell": "x", "checks": checks, "failed": failed, "passed": not failed}
        return (0 if self.selftest_passes else 1), json.dumps(report), ""

    def push(self, repository, tag, auth=None, on_line=None, on_layer=None) -> str:
        self._record("push", f"{repository}:{tag}")
        if self.push_error:
            raise EnvironmentFailure(f"push of {repository}:{tag} failed: {self.push_error}", "retry the push")
        assert self.registry is not None
        inspect = self.images[f"{repository}:{tag}"]
        return self.registry.receive(Remote.parse(repository), tag, inspect)

    def pull(self, reference: str, auth: dict | None = None) -> str:
        raise AssertionError("no registry base in these tests")


@dataclass
class RecordingRegistry:
    calls: list[tuple]  # the engine's log: one order for both
    manifests: dict[tuple[str, str], dict] = field(default_factory=dict)  # (repo name, tag or digest) -> manifest
    blobs: dict[str, dict] = field(default_factory=dict)

    def receive(self, remote: Remote, tag: str, inspect: dict) -> str:
        config = {"rootfs": {"type": "layers", "diff_ids": inspect["RootFS"]["Layers"]}, "config": inspect["Config"]}
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

    def manifest(self, remote: Remote, reference: str) -> ManifestInfo | None:
        self.calls.append(("registry.manifest", reference))
        found = self.manifests.get((remote.name, reference))
        if found is None:
            return None
        return ManifestInfo(self._digest_of(remote, reference), found["config"]["digest"])

    def manifest_json(self, remote: Remote, reference: str) -> dict:
        return self.manifests[(remote.name, reference)]

    def blob_json(self, remote: Remote, digest: str) -> dict:
        return self.blobs[digest]

    def copy_tag(self, remote: Remote, digest: str, tag: str) -> None:
        self.calls.append(("registry.copy_tag", tag))
        self.manifests[(remote.name, tag)] = self.manifests[(remote.name, digest)]
