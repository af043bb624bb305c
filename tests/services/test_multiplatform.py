"""linux/arm64 images from an amd64 host, on the real engine and registry: a base imported as arm64, a legacy-builder
build with --platform whose RUN step runs arm64 code (qemu-user-static through binfmt_misc), a container reporting
aarch64, and one tag naming both platforms' images (an image index) that publishing one platform again keeps whole.

The images are busybox-static roots (Debian's package, extracted without running it): seconds to make, so CI runs
this path on every change. The torch cell built the same way is tests/test_arm64_image.py (emulated: tens of minutes).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from imagekit.effects.registry import RegistryClient, Remote
from imagekit.model import AMD64, ARM64, DEBIAN_ARCH
from imagekit.oci import image_index, media_types
from imagekit.services.builds.base_images import base_config, emulation_hint, emulation_problem
from imagekit.services.builds.selftest_runner import SelfTestReport
from imagekit.services.publishing import publish

pytestmark = pytest.mark.docker
EPOCH = 1735689600


def _busybox_root(platform: str, out: Path) -> None:
    """A root filesystem of busybox-static for ``platform``, byte-identical for the same inputs."""
    arch = DEBIAN_ARCH[platform]
    subprocess.run(
        ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"SOURCE_DATE_EPOCH={EPOCH}", "mmdebstrap", "--quiet",
         "--mode=root", "--format=tar", "--variant=extract", f"--architectures={arch}", "--include=busybox-static",
         "--keyring=/usr/share/keyrings/debian-archive-keyring.gpg",
         '--customize-hook=ln -sf busybox "$1"/bin/sh',
         "bookworm", str(out), "http://deb.debian.org/debian"],
        check=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tiny_bases(engine, tmp_path_factory):
    """An imported busybox base per platform, each under a config naming its own architecture."""
    problem = emulation_problem(ARM64, os.uname().machine)
    assert problem is None, f"{problem}; {emulation_hint(ARM64)}"
    folder = tmp_path_factory.mktemp("tiny")
    refs = {}
    for platform in (AMD64, ARM64):
        arch = DEBIAN_ARCH[platform]
        tarball = folder / f"{arch}.tar"
        _busybox_root(platform, tarball)
        engine.import_tarball(tarball, "imagekit-test/tiny", arch)
        imported = engine.image(f"imagekit-test/tiny:{arch}")
        if arch != "amd64":
            engine.load_config(base_config(imported, arch, EPOCH), [f"imagekit-test/tiny:{arch}"])
        refs[platform] = f"imagekit-test/tiny:{arch}"
    yield refs
    for ref in refs.values():
        engine.remove(ref)


def _build(engine, base: str, platform: str, context: Path, word: str) -> str:
    context.mkdir(parents=True, exist_ok=True)
    (context / "Dockerfile").write_text(
        f'FROM {base}\nRUN ["/bin/busybox", "sh", "-c", "/bin/busybox uname -m > /machine; echo {word} > /word"]\n'
    )
    return engine.build(context, [f"imagekit-test/tiny-built:{DEBIAN_ARCH[platform]}-{word}"], {}, platform=platform)


def test_an_arm64_base_builds_and_runs_arm64_code_on_this_host(engine, tiny_bases, tmp_path):
    base = engine.image(tiny_bases[ARM64])
    assert base["Architecture"] == "arm64" and len(base["RootFS"]["Layers"]) == 1
    image = _build(engine, tiny_bases[ARM64], ARM64, tmp_path / "ctx", "one")
    try:
        assert engine.image(image)["Architecture"] == "arm64"
        code, out, _ = engine.run(image, ["/bin/busybox", "cat", "/machine"])
        assert (code, out.strip()) == (0, "aarch64")  # written by the RUN step, an arm64 program
        code, out, _ = engine.run(image, ["/bin/busybox", "uname", "-m"])
        assert (code, out.strip()) == (0, "aarch64")
    finally:
        engine.remove(image)


def _index(registry_client: RegistryClient, remote: Remote, tag: str) -> list[image_index.Entry]:
    media, body, _ = registry_client.manifest_raw(remote, tag)
    assert media == media_types.DOCKER_MANIFEST_LIST
    return image_index.entries_of(json.loads(body))


def _publish(engine, registry_client, repository: str, image: str, tag: str, platform: str):
    report = SelfTestReport(image, True, {"passed": True, "failed": [], "checks": []})
    return publish.publish(
        engine, registry_client, image_id=image, repository=repository, immutable_tag=tag, alias_tag="cell",
        report=report, platform=platform,
    )  # fmt: skip


def test_one_tag_names_both_platforms_and_a_later_publish_keeps_the_other(engine, registry, tiny_bases, tmp_path):
    repository = f"{registry.address}/imagekit-test/multi"
    remote, client = Remote.parse(repository), RegistryClient()
    amd = _build(engine, tiny_bases[AMD64], AMD64, tmp_path / "a", "one")
    arm = _build(engine, tiny_bases[ARM64], ARM64, tmp_path / "b", "one")
    amd2 = _build(engine, tiny_bases[AMD64], AMD64, tmp_path / "c", "two")
    try:
        first = _publish(engine, client, repository, amd, "cell-aaaa", AMD64)
        assert first.index_digest is None  # amd64 alone: the alias is the image, as before platforms existed
        assert client.manifest_raw(remote, "cell")[2] == first.digest

        second = _publish(engine, client, repository, arm, "cell-arm64-bbbb", ARM64)
        listed = _index(client, remote, "cell")
        assert [(e.platform, e.digest) for e in listed] == [(AMD64, first.digest), (ARM64, second.digest)]
        assert second.index_digest == client.manifest_raw(remote, "cell")[2]

        third = _publish(engine, client, repository, amd2, "cell-cccc", AMD64)  # amd64 rebuilt: arm64 stays
        assert [(e.platform, e.digest) for e in _index(client, remote, "cell")] == [
            (AMD64, third.digest),
            (ARM64, second.digest),
        ]
        # the engine pulls each host's own image through the one tag
        pulled = engine.api.inspect_distribution(f"{repository}:cell")
        assert sorted(f"{p['os']}/{p['architecture']}" for p in pulled["Platforms"]) == [AMD64, ARM64]
        engine.remove(f"{repository}:cell-arm64-bbbb")
        engine.pull(f"{repository}:cell", platform=ARM64)
        assert engine.image(f"{repository}:cell")["Architecture"] == "arm64"
        code, out, _ = engine.run(f"{repository}:cell", ["/bin/busybox", "cat", "/machine"])
        assert (code, out.strip()) == (0, "aarch64")
    finally:
        for image in (amd, arm, amd2):
            engine.remove(image)
