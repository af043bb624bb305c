"""Release records and `imagekit release merge`: parallel publishers lose nothing, and the index only lists what a
real registry (Debian's docker-registry, no Docker needed) serves under the recorded digests."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from imagekit.errors import CheckFailed
from imagekit.oci.release_record import Published, record_name
from imagekit.services.publishing import release_index
from tests.fakes import PASSED
from tests.registry import Registry, free_port

ROOT = Path(__file__).resolve().parents[2]
CELL_A, CELL_B = "cu124-torch2.5.1-py3.11-tf4.48.2", "cu121-torch2.1.2-py3.11-tf4.48.2"


@pytest.fixture(scope="module")
def release_registry(tmp_path_factory):
    registry = Registry(tmp_path_factory.mktemp("reg"), free_port()).start()
    yield registry
    registry.stop()


def _blob(base: str, data: bytes, auth: tuple[str, str] | None = None) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    start = httpx.post(f"{base}/blobs/uploads/", auth=auth)
    assert start.status_code == 202, start.text
    location = httpx.URL(base).join(start.headers["Location"])
    done = httpx.put(location.copy_merge_params({"digest": digest}), content=data, auth=auth)
    assert done.status_code == 201, done.text
    return digest


def push_image(
    release_registry: Registry, repo: str, tag: str, payload: str, auth: tuple[str, str] | None = None
) -> tuple[str, str]:
    """A minimal image (one layer, a config) pushed over the registry API: (manifest digest, config digest)."""
    base = f"http://{release_registry.address}/v2/{repo}"
    layer = payload.encode()
    layer_digest = _blob(base, layer, auth)
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}
    ).encode()
    config_digest = _blob(base, config, auth)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": len(config),
                "digest": config_digest,
            },
            "layers": [
                {
                    "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "size": len(layer),
                    "digest": layer_digest,
                }
            ],
        }
    ).encode()
    answer = httpx.put(
        f"{base}/manifests/{tag}",
        content=manifest,
        headers={"Content-Type": "application/vnd.docker.distribution.manifest.v2+json"},
        auth=auth,
    )
    assert answer.status_code == 201, answer.text
    return answer.headers["Docker-Content-Digest"], config_digest


def _published(repo: str, cell: str, digest: str, config: str | None = None, build_hash: str = "0123456789ab"):
    return Published(f"{repo}:{cell}-{build_hash}", f"{repo}:{cell}", digest, False, config)


def _entry(published: Published) -> dict:
    manifest = {"cell": {"id": published.alias.rsplit(":", 1)[1]}}
    return release_index.release_entry(published, lock_hash="l" * 64, manifest=manifest, report=PASSED, size=1)


def _merge(app, runner, *args: str):
    return runner.invoke(app, ["release", "merge", *args])


@pytest.mark.programs
def test_two_processes_recording_at_once_lose_nothing(tmp_path):
    """record() is read-modify-write of one index: under its flock, 2 x 20 concurrent calls keep all 40."""
    script = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from imagekit.oci.release_record import Published
        from imagekit.services.publishing import release_index
        who, index, records = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
        (index.parent.parent / f"ready{who}").touch()
        while not (index.parent.parent / "go").exists():  # both start together
            time.sleep(0.001)
        for i in range(20):
            cell = f"cu124-torch2.5.1-py3.11-tf4.{who}{i}.0"
            p = Published(f"r.example/t:{cell}-0123456789ab", f"r.example/t:{cell}", f"sha256:{i:064x}", False)
            release_index.record(index, p, lock_hash="x", manifest={"cell": {"id": cell}}, report={}, size=1,
                           records_dir=records)
        """
    )
    index, records = tmp_path / "releases" / "index.json", tmp_path / "releases" / "records"
    index.parent.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", script, who, str(index), str(records)], cwd=ROOT) for who in "12"]
    while not all((tmp_path / f"ready{who}").exists() for who in "12"):
        assert all(p.poll() is None for p in procs)
        time.sleep(0.01)
    (tmp_path / "go").touch()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    images = json.loads(index.read_text())["images"]
    assert len(images) == 40
    assert sorted(p.name for p in records.iterdir()) == sorted(record_name(t) for t in images)
    assert not [p for p in index.parent.iterdir() if p.name.startswith(".")]  # no temp or lock file left


def test_merge_builds_the_index_from_records_verified_against_the_registry(app, runner, release_registry, in_tmp):
    repo = f"{release_registry.address}/imagekit-test/merge"
    records = in_tmp / "records"
    for n, cell in enumerate((CELL_A, CELL_B)):
        digest, config = push_image(release_registry, "imagekit-test/merge", f"{cell}-0123456789ab", f"layer {n}")
        release_index.write_record(records / f"runner-{n}", _entry(_published(repo, cell, digest, config)))
    res = _merge(app, runner, "records", "--index", "out/index.json", "--json", "--registry", repo)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["added"] == sorted(f"{repo}:{c}-0123456789ab" for c in (CELL_A, CELL_B))
    images = json.loads((in_tmp / "out" / "index.json").read_text())["images"]
    assert {e["manifest"]["cell"]["id"] for e in images.values()} == {CELL_A, CELL_B}
    first = (in_tmp / "out" / "index.json").read_text()
    again = _merge(app, runner, "records", "--index", "out/index.json", "--json")  # idempotent; the index names it
    assert again.exit_code == 0 and len(json.loads(again.stdout)["unchanged"]) == 2
    assert (in_tmp / "out" / "index.json").read_text() == first


def test_merge_refuses_a_digest_the_registry_lacks_and_writes_nothing(app, runner, release_registry, in_tmp):
    repo = f"{release_registry.address}/imagekit-test/missing"
    digest, config = push_image(release_registry, "imagekit-test/missing", f"{CELL_A}-0123456789ab", "real")
    release_index.write_record(in_tmp / "records", _entry(_published(repo, CELL_A, digest, config)))
    ghost = "sha256:" + "f" * 64
    release_index.write_record(in_tmp / "records", _entry(_published(repo, CELL_B, ghost)))
    res = _merge(app, runner, "records", "--index", "index.json", "--registry", release_registry.address)
    assert res.exit_code == 1, res.output
    assert f"has no manifest {ghost}" in res.output and "hint:" in res.output
    assert not (in_tmp / "index.json").exists()


def test_merge_refuses_a_moved_tag_and_a_wrong_config(app, runner, release_registry, in_tmp):
    repo = f"{release_registry.address}/imagekit-test/moved"
    old, config = push_image(release_registry, "imagekit-test/moved", f"{CELL_A}-0123456789ab", "first")
    push_image(release_registry, "imagekit-test/moved", f"{CELL_A}-0123456789ab", "second: the tag moved")
    release_index.write_record(in_tmp / "a", _entry(_published(repo, CELL_A, old, config)))
    res = _merge(app, runner, "a", "--index", "index.json", "--registry", repo)
    assert res.exit_code == 1 and "points at sha256:" in res.output, res.output
    digest, _ = push_image(release_registry, "imagekit-test/moved", f"{CELL_B}-0123456789ab", "b")
    release_index.write_record(in_tmp / "b", _entry(_published(repo, CELL_B, digest, "sha256:" + "0" * 64)))
    res = _merge(app, runner, "b", "--index", "index.json", "--registry", repo)
    assert res.exit_code == 1 and "has config" in res.output, res.output
    assert not (in_tmp / "index.json").exists()


def test_an_immutable_tag_never_gets_a_second_digest(app, runner, release_registry, in_tmp):
    repo = f"{release_registry.address}/imagekit-test/immutable"
    digest, config = push_image(release_registry, "imagekit-test/immutable", f"{CELL_A}-0123456789ab", "one")
    other = "sha256:" + "e" * 64
    release_index.write_record(in_tmp / "r1", _entry(_published(repo, CELL_A, digest, config)))
    release_index.write_record(in_tmp / "r2", _entry(_published(repo, CELL_A, other)))
    res = _merge(app, runner, "r1", "r2", "--index", "index.json")
    assert res.exit_code == 1 and "recorded with two digests" in res.output, res.output
    with pytest.raises(CheckFailed, match=f"as {digest}, not {other}"):
        release_index.write_record(in_tmp / "r1", _entry(_published(repo, CELL_A, other)))
    index = {"schema": 1, "images": {f"{repo}:{CELL_A}-0123456789ab": _entry(_published(repo, CELL_A, other))}}
    (in_tmp / "index.json").write_text(json.dumps(index))
    res = _merge(app, runner, "r1", "--index", "index.json")
    assert res.exit_code == 1 and "in index.json, but" in res.output, res.output
    assert json.loads((in_tmp / "index.json").read_text()) == index


@pytest.mark.seconds
def test_merge_usage_errors(app, runner, in_tmp):
    (in_tmp / "recs").mkdir()
    (in_tmp / "recs" / "x.json").write_text("{}")
    res = _merge(app, runner, "recs")
    assert res.exit_code == 2 and "is not a release record" in res.output and "hint:" in res.output
    (in_tmp / "empty").mkdir()
    res = _merge(app, runner, "empty", "--index", "i.json")
    assert res.exit_code == 0 and "no release records" in res.output and not (in_tmp / "i.json").exists()
    assert _merge(app, runner, "nowhere").exit_code == 2
