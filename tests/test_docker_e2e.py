"""Real engine, real registry, real wheels: build -> self-test -> publish -> pull by digest -> doctor, and faults.

The real torch cell (torch 2.1.2 from PyPI with its nvidia-* wheels, ~2.7 GB of wheels, a 5.3 GB image) is built
once per session; its layers and the wheel cache stay on disk between runs, so reruns do not re-download.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import threading
import time

import pytest

from imagekit.effects import wheelserver
from imagekit.effects.files import clamp_mtimes
from imagekit.effects.registry import RegistryClient, Remote
from imagekit.errors import CheckFailed, EnvironmentFailure
from imagekit.image import naming, render
from imagekit.image.buildplan import BuildPlan
from imagekit.locking import resolution
from imagekit.model import Cell
from imagekit.oci import image_index
from imagekit.services import inputs
from imagekit.services.builds import selftest_runner
from imagekit.services.builds.base_images import ensure_base
from imagekit.services.builds.build import BuildOptions, build_cell
from imagekit.services.locks import lock_cells as lock_service
from imagekit.services.publishing import blob_push, publish, release_index
from imagekit.services.wheels import fetch, wheel_folders
from tests import containers
from tests.conftest import REAL_BUILD_PROGRESS, REAL_CELL, REPO, _log
from tests.registry import Registry, free_port
from tests.wheelfactory import build_wheel, fake_pypi_wheels, serve, write_simple_index

pytestmark = [pytest.mark.docker]


@pytest.mark.slow
def test_real_torch_cell_build_selftest_publish_pull_doctor(real_build, engine, registry):
    result, opts = real_build
    checks = {c["id"]: c["status"] for c in result.report["checks"]}
    assert checks["dists-match-lock"] == "pass" and checks["pip-check"] == "pass"
    assert checks["torch-cuda-version"] == "pass" and checks["tiny-model"] == "pass"
    assert checks["python-identity"] == "pass" and checks["numpy-interop"] == "pass"
    assert checks["image-hygiene"] == "pass"  # no credentials, .git, build leftovers or owners above 65534
    assert checks["gpu-cuda-available"] == "skip"  # no GPU on this machine: reported, not silently passed
    # the GPU architectures the image promises (its runtime contract) are those compiled into its torch, read off it
    archs = next(c for c in result.report["checks"] if c["id"] == "torch-archs")
    assert archs["status"] == "pass" and archs["evidence"]["arch_flags"].split()[:2] == ["sm_50", "sm_60"], archs
    # torch loaded its CUDA libraries from the Python-independent prefix, through the venv's link, none from elsewhere
    cuda = next(c for c in result.report["checks"] if c["id"] == "cuda-libraries")
    assert cuda["status"] == "pass" and not cuda["evidence"]["elsewhere"], cuda
    assert any(name.startswith("libcublas") for name in cuda["evidence"]["from_prefix"]), cuda
    index = json.loads(opts.release_index.read_text())["images"]
    entry = index[result.tag]
    # the release records the size and every layer's compressed size, bottom first, each with the step that made it
    assert entry["size_bytes"] > 4e9 and len(entry["layers"]) == len(engine.layers(result.tag))
    assert entry["compressed_bytes"] == sum(x["compressed_bytes"] for x in entry["layers"]) > 2e9
    assert any("--target /opt/cuda-libs" in x["created_by"] for x in entry["layers"])
    assert entry["digest"] == result.digest and entry["selftest"]["passed"]
    assert entry["manifest"]["distributions"]["torch"] == "2.1.2"
    # the registry serves exactly this image under the immutable tag, and the alias points at it too
    remote = Remote.parse(f"{registry.address}/{REPO}")
    tag = result.tag.rsplit(":", 1)[1]
    # the tag names the index of the image and its SBOM attestation; the index's image is exactly this one
    tagged = RegistryClient().manifest_raw(remote, tag)
    assert tagged[2] == entry["tag_digest"] == result.tag_digest != result.digest
    assert [e.digest for e in image_index.entries_of(json.loads(tagged[1]))] == [result.digest]
    assert RegistryClient().manifest_raw(remote, REAL_CELL.id)[2] == result.tag_digest  # the alias: the same index
    # labels tell the truth
    labels = engine.image(result.tag)["Config"]["Labels"]
    assert labels["imagekit.torch"] == "2.1.2" and labels["imagekit.cuda"] == "12.1"
    assert labels["imagekit.lock.hash"] == entry["lock_hash"]
    # pull by digest and run the doctor through the image's own entrypoint
    ref = f"{registry.address}/{REPO}@{result.digest}"
    assert engine.pull(ref) == result.image_id
    code, out, err = engine.run(
        ref, ["/opt/venv/bin/python", "/opt/imagekit/doctor/imagekit_doctor.py", "--json", "--tier", "standard"]
    )
    report = json.loads(out)
    assert code == 0, (out, err)
    status = {c["id"]: c["status"] for c in report["checks"]}
    assert status["lock-drift"] == "pass" and status["interpreter-identity"] == "pass"
    assert status["torch-probe"] == "skip"  # torch imports; no GPU here to probe
    assert status["host-contract"] == "pass"  # an amd64 host with the glibc the contract asks for


@pytest.mark.slow
def test_the_published_sbom_reads_back_with_buildx_imagetools_and_is_valid_spdx(real_build, registry, tmp_path):
    """The SBOM as a stock tool finds it in a plain registry: `docker buildx imagetools inspect --format
    '{{ json .SBOM }}'` reads the attestation the immutable tag's index names; spdx-tools finds the document valid."""
    from spdx_tools.spdx.parser.parse_anything import parse_file
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    from imagekit.supplychain import sbom

    result, opts = real_build
    out = subprocess.run(
        ["docker", "buildx", "imagetools", "inspect", "--format", "{{ json .SBOM }}", result.tag],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)["SPDX"]
    entry = json.loads(opts.release_index.read_text())["images"][result.tag]
    counts = sbom.counts(doc)
    assert (
        counts
        == {"python": entry["sbom"]["python"], "dpkg": entry["sbom"]["dpkg"]}
        == {
            "python": len(entry["manifest"]["distributions"]),
            "dpkg": counts["dpkg"],
        }
    )
    assert counts["dpkg"] > 150 and sbom.digest(sbom.canonical(doc)) == entry["sbom"]["document"]
    names = {p["name"]: p.get("versionInfo") for p in doc["packages"]}
    assert names["torch"] == "2.1.2" and names["transformers"] == "4.48.2" and "openssh-server" in names
    path = tmp_path / "sbom.spdx.json"
    path.write_text(json.dumps(doc))
    problems = validate_full_spdx_document(parse_file(str(path)))
    assert problems == [], [p.validation_message for p in problems][:5]
    assert entry["tag_digest"] != entry["digest"]  # the tag names the index; pods pull the image by its digest


@pytest.mark.slow
def test_audit_reads_the_real_images_pins_and_dpkg_database_against_an_osv_export(real_build, app, tmp_path):
    """`imagekit audit IMAGE`: the known PyPI advisory finds its torch; the known Debian one (fixed long before this
    base) finds nothing; a record written against its own openssh source version finds openssh-server by source."""
    from typer.testing import CliRunner

    from imagekit.supplychain import audit
    from tests.supplychain.test_audit import GLIBC, TORCH_LOAD

    result, _ = real_build
    code, out, _ = containers_run(real_build, "dpkg-query -W -f '${source:Version}' openssh-server")
    assert code == 0 and out, out
    ours = {
        "id": "TEST-OPENSSH-1",
        "summary": "a record written against this base's own openssh",
        "severity": [{"type": "CVSS_V3", "score": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:L/I:N/A:N"}],
        "affected": [{"package": {"ecosystem": "Debian:12", "name": "openssh"}, "versions": [out.strip()]}],
    }
    osv = tmp_path / "osv"
    osv.mkdir()
    for record in (TORCH_LOAD, GLIBC, ours):
        (osv / f"{record['id']}.json").write_text(json.dumps(record))
    res = CliRunner().invoke(app, ["audit", result.tag, "--osv-db", str(osv), "--fail-on", "critical", "--json"])
    doc = json.loads(res.stdout)
    found = {(f["id"], f["package"], f["severity"]) for f in doc["findings"]}
    assert ("GHSA-53q9-r3pm-6pq6", "torch", "critical") in found
    by_source = {
        (f["package"], f["source_package"], f["severity"]) for f in doc["findings"] if f["id"] == "TEST-OPENSSH-1"
    }
    assert {"openssh-server", "openssh-client"} <= {name for name, _, _ in by_source}
    assert {(source, level) for _, source, level in by_source} == {("openssh", "medium")}
    assert not any(f["id"] == "DSA-5514-1" for f in doc["findings"])  # this base's glibc is newer than the fix
    assert res.exit_code == 1 and not doc["passed"] and doc["packages"] > 150
    assert audit.rank("critical") > audit.rank("medium")


def containers_run(real_build, script: str) -> tuple[int, str, str]:
    from imagekit.effects.docker import Engine

    result, _ = real_build
    return Engine().run(result.tag, [script], entrypoint=["/bin/sh", "-c"])


@pytest.mark.slow
def test_the_image_carries_no_documentation_translations_or_libpython_a_but_keeps_licenses(real_build, engine):
    """dpkg's path filters (buildplan.SLIM_EXCLUDES) kept out what a run never reads, and stay for later apt installs;
    what torch.compile links (libgcc.a, libstdc++.a) and every copyright file are still there."""
    result, _ = real_build
    script = (
        "find /usr/share/doc /usr/share/man /usr/share/info /usr/share/locale -type f ! -path /usr/share/info/dir"
        " ! -name copyright ! -name locale.alias | wc -l; "
        "find /usr/share/doc -name copyright | wc -l; "
        "find /usr/lib -name 'libpython3*.a' | wc -l; "
        "find /usr/lib/gcc -name libgcc.a -o -name libstdc++.a | wc -l; "
        "cat /etc/dpkg/dpkg.cfg.d/99mmdebstrap"
    )
    code, out, err = engine.run(result.tag, [script], entrypoint=["sh", "-c"])
    assert code == 0, err
    stray, licenses, libpython_a, compiler_a, *config = out.splitlines()
    assert int(stray) == 0 and int(libpython_a) == 0, out
    assert int(licenses) > 100 and int(compiler_a) >= 2, out
    assert "path-exclude=/usr/share/doc/*" in config and "path-include=/usr/share/doc/*/copyright" in config, out


@pytest.mark.slow
def test_the_real_build_reported_progress_on_every_long_step(real_build):
    """What a user watching the build saw: one line per self-test check and a summary, each docker build step,
    and (when the layers were not cached) the torch closure's step timed; a push by layer with bytes."""
    result, _ = real_build
    text = REAL_BUILD_PROGRESS.text()
    for check in result.report["checks"]:
        assert f"self-test {check['status']:<4} {check['id']}" in text, check["id"]
    n = len(result.report["checks"])
    skipped = sorted(c["id"] for c in result.report["checks"] if c["status"] == "skip")
    assert skipped == ["cuda-extension", "gpu-cuda-available"], skipped  # no toolkit in this image; no GPU here
    assert f"self-test passed: {n} checks (2 skipped) in " in text
    steps = [a for a in REAL_BUILD_PROGRESS.activities if a.label.startswith("step ")]
    assert steps and all(a.finished for a in steps)
    messages = [m for _, m in REAL_BUILD_PROGRESS.lines]
    installs = [m for m in messages if m.startswith("Step ") and "bin/install-layer" in m]
    assert len(installs) == 5  # cu121: CUDA toolkit, cuDNN, NCCL, torch, app
    # inside each install RUN that ran: where its time went. The engine may hold the first ones cached from an earlier
    # build (a cache hit is always a prefix of the steps: after the first miss every step runs), so the last N ran
    timed = [m for m in messages if m.startswith("install-layer: installed in ")]
    # each layer that ran was written by imagekit from its staged files (staged_build): hashed and loaded, timed
    staged = re.compile(r"staged-layer: \d+ MB tar measured in [\d.]+ s, hashed and loaded in")
    written = [m for m in messages if staged.match(m)]
    assert len(timed) <= 5 and len(written) == len(timed), (timed, written)
    compiled = min(len(timed), 2)  # the torch and app layers compile; the CUDA ones do not
    assert sum(" bytecode " in m for m in timed) == compiled, timed
    compressing = [a for a in REAL_BUILD_PROGRESS.activities if a.label.startswith("compress layer ")]
    layer_lines = [m for _, m in REAL_BUILD_PROGRESS.lines if m.startswith("layer ")]
    assert all(a.finished for a in compressing)
    assert layer_lines and all(re.search(r": (pushed .* gzip|.*already in the registry)", m) for m in layer_lines)


@pytest.mark.slow
def test_pip_in_the_image_keeps_to_the_lock_and_the_doctor_names_what_got_past_it(real_build, engine, tmp_path):
    """The image's pins (PIP_CONSTRAINT) hold against `pip install -U` and a newer version; what is installed past
    them on purpose, the doctor reports as drift."""
    result, _ = real_build
    wheel = build_wheel(tmp_path / "w", "tqdm", "9.9.9")
    links = "--no-index --find-links /wheels"
    script = (
        f"pip install {links} -U tqdm; echo upgrade=$?; "
        f"pip install {links} tqdm==9.9.9; echo newer=$?; "
        f"env -u PIP_CONSTRAINT -u UV_CONSTRAINT pip install -q --no-deps {links} tqdm==9.9.9 && "
        "python /opt/imagekit/doctor/imagekit_doctor.py --tier quick"
    )
    code, out, err = engine.run(
        result.tag,
        [script],
        entrypoint=["/bin/sh", "-c"],
        user="0",
        volumes={str(wheel.parent): {"bind": "/wheels", "mode": "ro"}},
    )
    assert "Requirement already satisfied: tqdm" in out and "upgrade=0" in out  # -U keeps the locked tqdm
    assert "(constraint) tqdm==4.70.1" in out and "newer=1" in out, (out, err)  # pip names the pin
    assert "imagekit: this image pins its packages (/opt/imagekit/constraints.txt" in err
    assert code == 1, (out, err)
    assert "lock-drift" in out and "tqdm 9.9.9 (pinned 4.70.1)" in out


@pytest.mark.slow
def test_the_self_test_refuses_an_image_with_credentials_git_leftovers_and_foreign_owners(real_build, engine):
    """What a build could leave in a layer, planted in a container of the real image before its self-test runs."""
    result, _ = real_build
    plant = (
        "mkdir -p /root/.aws /opt/app/.git && echo key > /root/.aws/credentials && touch /tmp/build.log"
        " && touch /opt/odd && chown 70000:70000 /opt/odd"
        " && exec /opt/venv/bin/python /opt/imagekit/doctor/selftest.py"
    )
    code, out, err = engine.run(result.tag, [plant], entrypoint=["/bin/sh", "-c"])
    report = json.loads(out)
    hygiene = next(c for c in report["checks"] if c["id"] == "image-hygiene")
    assert code == 1 and report["failed"] == ["image-hygiene"], (report["failed"], err[-2000:])
    assert "/root/.aws/credentials: AWS credentials" in hygiene["message"]
    assert "/opt/app/.git" in hygiene["message"] and "/opt/odd (70000:70000)" in hygiene["message"]
    assert hygiene["evidence"]["leftovers"] == ["/tmp/build.log", "/root/.aws"]


@pytest.mark.slow
def test_entrypoint_refuses_to_start_on_a_blocker(real_build, engine):
    result, _ = real_build
    code, out, err = engine.run(result.tag, ["echo", "training"], env={"IMAGEKIT_REQUIRE_GPU": "1"})
    assert code == 1 and "training" not in out
    assert "no GPU" in err and "not starting" in err
    code, out, _ = engine.run(
        result.tag, ["echo", "training"], env={"IMAGEKIT_REQUIRE_GPU": "1", "IMAGEKIT_SKIP_DOCTOR": "1"}
    )
    assert code == 0 and out.strip() == "training"
    code, out, _ = engine.run(result.tag, ["echo", "training"])
    assert code == 0 and out.strip() == "training"


@pytest.mark.slow
def test_an_immutable_tag_never_moves(real_build, engine, registry):
    result, _ = real_build
    passed = selftest_runner.SelfTestReport(result.tag, True, result.report)
    other = engine.image(ensure_base(inputs.compat_data().bases["3.11"], engine).reference)["Id"]
    tag = result.tag.rsplit(":", 1)[1]
    with pytest.raises(CheckFailed, match="already exists with other contents"):
        publish.publish(
            engine,
            RegistryClient(),
            image_id=other,
            repository=f"{registry.address}/{REPO}",
            immutable_tag=tag,
            alias_tag=REAL_CELL.id,
            report=passed,
        )
    remote = Remote.parse(f"{registry.address}/{REPO}")
    assert RegistryClient().oci_manifest(remote, tag).digest == result.tag_digest  # untouched


@pytest.mark.slow
def test_wrong_credentials_publish_nothing(real_build, engine, tmp_path):
    result, _ = real_build
    reg = Registry(tmp_path / "auth-registry", free_port(), auth=("ci", "right-password")).start()
    try:
        repo = f"{reg.address}/{REPO}"
        engine.api.tag(result.image_id, repo, "wrong-creds")
        passed = selftest_runner.SelfTestReport(result.tag, True, result.report)
        with pytest.raises(EnvironmentFailure) as exc:
            publish.publish(
                engine,
                RegistryClient("ci", "wrong"),
                image_id=result.image_id,
                repository=repo,
                immutable_tag="wrong-creds",
                alias_tag="wrong-creds-alias",
                report=passed,
            )
        assert "credentials" in exc.value.render() or "401" in exc.value.render()
        assert (
            RegistryClient("ci", "right-password", registries=[reg.address]).oci_manifest(
                Remote.parse(repo), "wrong-creds"
            )
            is None
        )
    finally:
        reg.stop()
        engine.remove(f"{reg.address}/{REPO}:wrong-creds")


def _upload_started(root) -> bool:
    """The registry has begun receiving a blob (an upload session exists under some repository)."""
    repos = root / "data" / "docker" / "registry" / "v2" / "repositories"
    return any(any(d.iterdir()) for d in repos.glob("**/_uploads") if d.is_dir())


def test_registry_stopped_mid_push_then_retry(engine, registry, tmp_path):
    """Kill the registry while a layer is being uploaded: clear error, release index unchanged; the retry succeeds
    with the manifest digest another registry got for the same image. (A small image of incompressible layers: what
    is tested is the push's failure and retry, not the torch cell's size.)"""
    import random

    ctx = tmp_path / "ctx"
    ctx.mkdir()
    rng = random.Random(22)
    for name in ("one", "two", "three"):
        (ctx / name).write_bytes(rng.randbytes(24 << 20))
    (ctx / "Dockerfile").write_text(
        "FROM scratch\nCOPY one /one\nCOPY two /two\nCOPY three /three\nLABEL imagekit.cell=killed-mid-push\n"
    )
    clamp_mtimes(ctx, 1_700_000_000)
    image_id = engine.build(ctx, ["imagekit-test/killed:built"], {})
    passed = selftest_runner.SelfTestReport("imagekit-test/killed:built", True, {})
    steady = f"{registry.address}/imagekit-test/killed"
    engine.api.tag(image_id, steady, "one")
    root = tmp_path / "flaky-registry"
    port = free_port()
    reg = Registry(root, port).start()
    repo = f"{reg.address}/imagekit-test/killed"
    engine.api.tag(image_id, repo, "one")
    index = tmp_path / "releases.json"
    index.write_text('{"images": {}, "schema": 1}\n')
    before = index.read_bytes()
    killed = threading.Event()

    def kill_once_uploading() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed.is_set():
            if _upload_started(root):
                reg.stop()
                killed.set()
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_once_uploading, daemon=True)
    killer.start()
    try:
        with pytest.raises(EnvironmentFailure) as exc:
            published = publish.publish(
                engine, RegistryClient(), image_id=image_id, repository=repo, immutable_tag="one",
                alias_tag="latest", report=passed,
            )  # fmt: skip
            release_index.record(index, published, lock_hash="x", manifest={}, report={}, size=0)
        assert killed.is_set()  # it failed because the registry died mid-upload, not before
        assert "push" in exc.value.message or "unreachable" in exc.value.message
        assert exc.value.hint  # says what to do
    finally:
        killed.set()
        killer.join()
    assert index.read_bytes() == before
    reg = Registry(root, port).start()
    try:
        published = publish.publish(
            engine, RegistryClient(), image_id=image_id, repository=repo, immutable_tag="one", alias_tag="latest",
            report=passed,
        )  # fmt: skip
        release_index.record(index, published, lock_hash="h", manifest={}, report={}, size=1)
        other = publish.publish(
            engine, RegistryClient(), image_id=image_id, repository=steady, immutable_tag="one", alias_tag="latest",
            report=passed,
        )  # fmt: skip
        assert published.digest == other.digest  # same content, same manifest digest as another registry
        assert json.loads(index.read_text())["images"][f"{repo}:one"]["digest"] == published.digest
    finally:
        reg.stop()
        shutil.rmtree(root, ignore_errors=True)
        for ref in (f"{repo}:one", f"{repo}:latest", f"{steady}:one", f"{steady}:latest", "imagekit-test/killed:built"):
            engine.remove(ref)


# ---- small cells from wheels the tests build (fast; the faults before publishing) ------------------------
def _fake_opts(tmp_path, index_url, repository, push=True):
    return BuildOptions(
        repository=repository,
        lock_dir=tmp_path / "locks",
        state_dir=tmp_path / "state",
        release_index=tmp_path / "releases.json",
        push=push,
        settings=resolution.LockSettings(index_url=index_url),
    )


def test_failing_selftest_pushes_nothing(engine, registry, fake_index, tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_PREPARE_BLOBS", "1")  # layers compressed during the build, then discarded with it
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11")
    repo = f"{registry.address}/imagekit-test/fake"
    res = build_cell(cell, _fake_opts(tmp_path, fake_index, repo), engine, inputs.compat_data(), _log)
    assert res.status == "failed" and res.step == "self-test", res.error and res.error.render()
    assert "torch-cuda-version" in res.report["failed"] and "tiny-model" in res.report["failed"]
    assert res.report["checks"][0]["id"] == "dists-match-lock" and res.report["checks"][0]["status"] == "pass"
    assert RegistryClient().oci_manifest(Remote.parse(repo), res.tag.rsplit(":", 1)[1]) is None
    assert RegistryClient().oci_manifest(Remote.parse(repo), cell.id) is None
    assert not (tmp_path / "releases.json").exists()


def test_tampered_cached_wheel_fails_the_build(engine, registry, fake_index, tmp_path):
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11")
    opts = _fake_opts(tmp_path, fake_index, f"{registry.address}/imagekit-test/fake", push=False)
    data = inputs.compat_data()
    lock = lock_service.lock_one(cell, opts.lock_dir, opts.settings, data).lock
    wheels = fetch.fetch_lock(lock, "3.11", "2.36")
    victim = next(w.path for w in wheels if w.name == "transformers")
    victim.write_bytes(victim.read_bytes() + b"tampered")
    res = build_cell(cell, opts, engine, data, _log)
    assert res.status == "failed" and res.step == "fetch"
    assert "does not match its hash" in res.error.message


# the Dockerfile's path (remote engines): `make test-images`; test_staged_build_docker refuses a swapped wheel on the
# staged path every run
@pytest.mark.images
def test_wheel_bytes_not_matching_the_lock_fail_docker_build(engine, fake_index, tmp_path):
    """Past the fetch check: pip's --require-hashes inside the Dockerfile refuses a swapped wheel."""
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11")
    data = inputs.compat_data()
    opts = _fake_opts(tmp_path, fake_index, "imagekit-test/fake", push=False)
    lock = lock_service.lock_one(cell, opts.lock_dir, opts.settings, data).lock
    wheels = fetch.fetch_for_build(lock, "3.11", "2.36")
    base = ensure_base(data.bases["3.11"], engine)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    plan = BuildPlan.make(cell, lock, base, "imagekit-test/fake", data, wheels_url=url)
    context = tmp_path / "ctx"
    files = render.render_plan(plan)
    for rel, (content, mode) in files.items():
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        (context / rel).write_bytes(content)
        (context / rel).chmod(mode)
    clamp_mtimes(context, plan.source_date_epoch)
    house = tmp_path / "house"
    house.mkdir()
    for w in wheels:
        if w.name == "numpy":
            swapped = build_wheel(tmp_path / "swap", "numpy", "1.26.4", payload="# not the locked bytes\n")
            shutil.copy(swapped, house / w.path.name)
        else:
            shutil.copy(w.path, house / w.path.name)
    wheel_folders.write_requirements(lock, house)
    (house / render.APP_TARBALL).write_bytes(render.app_tarball(files, plan.source_date_epoch))
    with wheelserver.serve(house, port, "127.0.0.1"), pytest.raises(CheckFailed) as exc:
        engine.build(context, ["imagekit-test/fake:swapped"], {}, nocache=True)
    assert "differ from the lock" in (exc.value.hint or "")
    assert engine.image("imagekit-test/fake:swapped") is None


def test_engine_capabilities_say_what_is_lost(engine):
    caps = engine.capabilities()
    assert caps.server_version
    if caps.builder == "legacy":
        assert any("rewrite-timestamp" in n for n in caps.notes)


def test_base_bootstrap_is_reproducible_and_cached(engine):
    spec = inputs.compat_data().bases["3.11"]
    first = ensure_base(spec, engine)
    start = time.time()
    again = ensure_base(spec, engine)
    assert again == first and time.time() - start < 5
    assert engine.layers(first.reference) == [first.digest]
    assert naming.split_reference(first.reference)[1].startswith("debian-bookworm-")


@pytest.mark.slow
def test_doctor_expect_image_ref_reads_the_manifest(real_build, registry, app, runner):
    from imagekit.services.builds import image_manifest

    result, _ = real_build
    ref = f"{registry.address}/{REPO}@{result.digest}"
    from_registry = image_manifest.from_registry(ref)
    assert from_registry == image_manifest.from_engine(result.tag)
    assert from_registry["cell"]["id"] == REAL_CELL.id and from_registry["lock"]["hash"] == result.report["lock_hash"]
    res = runner.invoke(app, ["doctor", "--tier", "quick", "--expect", ref, "--json"])
    report = json.loads(res.stdout)
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["manifest"]["evidence"]["cell"] == REAL_CELL.id
    assert res.exit_code == 1 and checks["lock-drift"]["status"] == "fail"  # this host is not the image


@pytest.mark.images  # two more builds (40 s): `make test-images`; bench/layers.py measures the sharing on real cells
def test_cells_with_the_same_cuda_pins_get_byte_identical_cuda_layers(engine, tmp_path, monkeypatch):
    """torch 2.5.1 and 2.6.0 pinning the same CUDA runtime: the second built with --no-cache still gives the CUDA
    layers the same digests (the bytes, not the build cache), and different torch layers above them."""
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    root = tmp_path / "pypi"
    torch26 = ("torch", "2.6.0", ["filelock", "nvidia-cuda-runtime-cu12==12.4.127"])
    write_simple_index(root, fake_pypi_wheels(tmp_path / "w", extra=[torch26]))
    data = inputs.compat_data()
    tags, ids = [], []
    with serve(root) as url:
        opts = _fake_opts(tmp_path, f"{url}/simple", "imagekit-test/cudalayers", push=False)
        for torch, nocache in (("2.5.1", False), ("2.6.0", True), ("2.5.1", True)):
            cell = Cell("12.4", torch, "4.48.2", "3.11")
            res = build_cell(cell, dataclasses.replace(opts, nocache=nocache), engine, data, _log)
            assert res.step == "self-test", res.error and res.error.render()  # fake torch: the self-test fails
            tags.append(res.tag)
            ids.append(res.image_id)
    try:
        assert tags[0] == tags[2] and ids[0] == ids[2]  # rebuilt from nothing: the same image id, config and all
        a, b = (engine.layers(t) for t in tags[:2])  # the base, the base stage's COPY and RUN, CUDA, torch, app
        assert len(a) == len(b) and a[:-2] == b[:-2]  # the base, the base stage, then the CUDA layer
        assert a[-2] != b[-2]  # torch differs above it
        files = _files_in(engine, tags[0], "/opt/cuda-libs")
        assert "nvidia_cuda_runtime_cu12/__init__.py" in files and not any("__pycache__" in f for f in files)
        assert not any(f.endswith("uv_cache.json") for f in files)
        # the torch layer links the CUDA folders into site-packages: RPATHs ($ORIGIN/../../<folder>/lib) resolve there
        link = containers.output(
            engine, tags[0], ["readlink", "/opt/venv/lib/python3.11/site-packages/nvidia_cuda_runtime_cu12"]
        )
        assert link.strip() == "/opt/cuda-libs/nvidia_cuda_runtime_cu12"
    finally:
        for t in tags:
            engine.remove(t)
            engine.remove(t.rsplit(":", 1)[0] + ":" + t.rsplit(":", 1)[1].split("-")[0])
        for torch in ("2.5.1", "2.6.0"):
            engine.remove(naming.build_cache_tag(Cell("12.4", torch, "4.48.2", "3.11")))


def _files_in(engine, image: str, folder: str) -> list[str]:
    return containers.output(engine, image, ["find", folder, "-type", "f", "-printf", "%P\\n"]).split()


def test_an_image_over_its_size_budget_is_refused_and_not_pushed(engine, registry, fake_index, tmp_path):
    cell = Cell("12.4", "2.5.1", "4.48.2", "3.11")
    repo = f"{registry.address}/imagekit-test/budget"
    opts = _fake_opts(tmp_path, fake_index, repo)
    opts = dataclasses.replace(opts, options=dataclasses.replace(opts.options, size_budget="100 MB"))
    res = build_cell(cell, opts, engine, inputs.compat_data(), _log)
    try:
        assert res.status == "failed" and res.step == "size-budget", res.error and res.error.render()
        assert "over 0.10 GB (the budget 100 MB)" in res.error.message and "nothing was pushed" in res.error.hint
        assert RegistryClient().oci_manifest(Remote.parse(repo), cell.id) is None
        assert engine.image(naming.alias_tag(repo, cell)) is None and res.tag == naming.refused_tag(cell)
        assert engine.image(naming.refused_tag(cell))["Id"] == res.image_id
    finally:
        engine.remove(naming.refused_tag(cell))


def test_runtime_config_is_set_without_a_commit_and_matches_a_commit(engine, tmp_path):
    """The legacy builder's last steps are a new config over the same layers (`docker load`, no container), dated
    SOURCE_DATE_EPOCH: the same image id every time; the container-commit fallback gives the same config."""
    from imagekit.image import imageconfig
    from imagekit.services.builds.build import set_runtime_config

    base = ensure_base(inputs.compat_data().bases["3.11"], engine)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {base.reference}\nRUN echo x > /x\nRUN true\nLABEL old=1\n")
    built = engine.build(ctx, ["imagekit-test/cfg:built"], {})
    runtime = imageconfig.runtime({"imagekit.cell": "c1", "org.opencontainers.image.title": "t"})
    epoch = BuildOptions(repository="imagekit-test/cfg").source_date_epoch
    said: list[str] = []
    tags = ["imagekit-test/cfg:one", "imagekit-test/cfg:alias"]
    try:
        first = set_runtime_config(engine, built, base.reference, runtime, epoch, tags, said.append)
        again = set_runtime_config(engine, built, base.reference, runtime, epoch, tags, said.append)
        assert first == again and not said  # the fast path, deterministic
        img, was = engine.image("imagekit-test/cfg:alias"), engine.image(built)
        assert img["Id"] == first and img["RootFS"] == was["RootFS"]
        cfg = img["Config"]
        assert cfg["Labels"] == {"old": "1", "imagekit.cell": "c1", "org.opencontainers.image.title": "t"}
        assert cfg["Entrypoint"] == ["/opt/imagekit/bin/entrypoint"] and cfg["WorkingDir"] == "/workspace"
        assert "HF_HOME=/workspace/.cache/huggingface" in cfg["Env"] and img["Created"].startswith("2025-01-01")
        history = engine.history(first)
        assert len(history) == len(engine.history(built)) + 1 and history[0]["CreatedBy"].startswith("imagekit ")
        code, out, _ = engine.run(first, ["pwd; echo $VIRTUAL_ENV; cat /x"], entrypoint=["sh", "-c"])
        assert (code, out.split()) == (0, ["/workspace", "/opt/venv", "x"])
        slow = engine.commit_changes(built, runtime.instructions(" "), ["imagekit-test/cfg:commit"])
        got = engine.image(slow)
        assert got["RootFS"] == img["RootFS"]
        for key in ("Env", "Labels", "Entrypoint", "Cmd", "WorkingDir"):
            assert got["Config"][key] == cfg[key], key
    finally:
        for tag in ("one", "alias", "commit", "built"):
            engine.remove(f"imagekit-test/cfg:{tag}")


# a pulled base's history (nvidia/cuda bases): `make test-images`; the config's history matching is tested without
# Docker (tests/image/test_imageconfig.py), the config over a local base every run (the test above)
@pytest.mark.images
def test_runtime_config_over_a_pulled_base_with_history_of_its_own(engine, registry, tmp_path):
    """A base pulled from a registry (as nvidia/cuda bases are) has history entries that name no image: their sizes
    say which made a layer. The config is still set without a commit, and the layers stay as built."""
    from imagekit.image import imageconfig
    from imagekit.services.builds.build import set_runtime_config

    root = ensure_base(inputs.compat_data().bases["3.11"], engine)
    base_repo = f"{registry.address}/imagekit-test/pulledbase"
    ctx = tmp_path / "base"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {root.reference}\nENV A=1\nRUN echo base > /base.txt\nLABEL b=2\n")
    built_base = engine.build(ctx, [f"{base_repo}:v1"], {})
    blob_push.push_image(engine, RegistryClient(), Remote.parse(base_repo), built_base, "v1")  # imagekit's gzip
    engine.remove(f"{base_repo}:v1")
    engine.remove(built_base)  # the builder's intermediate images go too: the pulled history names none of them
    pulled = engine.pull(f"{base_repo}:v1")
    history = engine.history(pulled)
    assert [h["Id"] for h in history[1:]] == ["<missing>"] * (len(history) - 1)
    app = tmp_path / "app"
    app.mkdir()
    (app / "Dockerfile").write_text(f"FROM {base_repo}:v1\nRUN echo app > /app.txt\n")
    built = engine.build(app, ["imagekit-test/cfg:pulled-built"], {})
    said: list[str] = []
    epoch = BuildOptions(repository="x").source_date_epoch
    try:
        image_id = set_runtime_config(
            engine, built, f"{base_repo}:v1", imageconfig.runtime({"c": "3"}), epoch, ["imagekit-test/cfg:pulled"],
            said.append,
        )  # fmt: skip
        assert not said  # the fast path: the pulled base's history was matched to its layers
        img = engine.image(image_id)
        assert img["RootFS"] == engine.image(built)["RootFS"] and img["Config"]["Labels"] == {"b": "2", "c": "3"}
        assert "A=1" in img["Config"]["Env"] and "VIRTUAL_ENV=/opt/venv" in img["Config"]["Env"]
        code, out, _ = engine.run(image_id, ["cat /base.txt /app.txt"], entrypoint=["sh", "-c"])
        assert (code, out.split()) == (0, ["base", "app"])
    finally:
        for ref in ("imagekit-test/cfg:pulled", "imagekit-test/cfg:pulled-built", f"{base_repo}:v1"):
            engine.remove(ref)
