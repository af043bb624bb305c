"""A user's own project from `imagekit init` to a published image, the way its user works (tests/conftest.py,
`user_project`): a wheel by URL, a private index with basic auth, the project folder copied in, a registry that
takes `docker login`'s credentials. Then a code change: one small layer rebuilt and pushed."""

from __future__ import annotations

import json
import re

import pytest

from imagekit.effects.registry import RegistryClient, Remote
from imagekit.locking import lockfile
from tests.conftest import INDEX_PASSWORD, KERNELS, PROJECT_PASSWORD, PROJECT_USER, REAL_CELL
from tests.matrix.test_ci import actionlint

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _run(engine, tag: str, script: str) -> tuple[int, str]:
    code, out, err = engine.run(tag, [script], entrypoint=["sh", "-c"])
    return code, out + err


def test_the_project_locks_builds_and_publishes_with_everything_it_named(user_project, real_build, engine):
    p = user_project
    result = p["result"]
    transcript = "\n".join(p["transcript"])
    # the lock: the wheel by URL with its hash, the private package, the real cell's torch pins kept
    lock = lockfile.parse(p["lock"])
    assert lock.pins()["acme-kernels"] == KERNELS[1] and lock.pins()["acme-utils"] == "0.3.0"
    assert f"acme-kernels @ {p['kernels_url']}#sha256=" in p["lock"]
    # jq and what it needs over the base (libjq1, libonig5), each .deb with its version, size, sha256 and URL
    debs = {pin.name: pin for pin in lock.apt}
    assert {"jq", "libjq1", "libonig5"} <= set(debs) and "git" not in debs, p["lock"]
    assert all(pin.url.startswith("http://deb.debian.org/debian/pool/") and len(pin.sha256) == 64 for pin in lock.apt)
    committed = lockfile.parse((real_build[1].lock_dir / f"{REAL_CELL.id}.txt").read_text())
    assert [e.spec for e in lock.torch] == [e.spec for e in committed.torch]
    # no credential anywhere a user could commit or paste: the lock, the context, the output
    rendered = "".join(f.read_text(errors="replace") for f in (p["project"] / ".imagekit").rglob("*.txt"))
    for text in (p["lock"], transcript, rendered):
        assert INDEX_PASSWORD not in text and PROJECT_PASSWORD not in text
    assert f"push to {p['repo']}: credentials from docker login" in transcript  # the dry run said which it found
    assert f"{p['repo']}:{REAL_CELL.id} is not published yet" in transcript  # ... and what --push would add
    # the image: the default tools, the wheels, the code (and nothing the .dockerignore or the rules leave out)
    tag = result["tag"]
    code, out = _run(
        engine, tag,
        "dpkg -s git tmux curl >/dev/null && echo tools-ok; "
        "dpkg-query -W -f '${Package}=${Version}\\n' jq libjq1 libonig5; echo '{\"a\": 42}' | jq .a; "
        "/opt/imagekit/bin/imagekit-doctor --tier quick --json > /tmp/d.json; python -c \"import json; "
        "print([c['status'] + ' ' + c['message'] for c in json.load(open('/tmp/d.json'))['checks'] "
        "if c['id'] == 'apt-drift'])\"; "
        "python -c 'import acme_kernels, acme_utils; print(acme_kernels.fused(), acme_utils.NAME)'; "
        "cat /opt/app/acme/__init__.py; ls -a /opt/app; python /opt/app/train.py",
    )  # fmt: skip
    assert code == 0, out
    for name in ("jq", "libjq1", "libonig5"):  # exactly the locked versions
        assert f"{name}={debs[name].version}" in out, out
    assert re.search(r"^42$", out, re.M) and f"pass {len(debs)} Debian packages at their pinned" in out, out
    assert "tools-ok" in out and "42 acme" in out and "VERSION = 1" in out and "training with 42" in out
    listing = out.split("VERSION = 1", 1)[1]
    for gone in ("data", ".git", "wandb.env"):
        assert re.search(rf"^{re.escape(gone)}$", listing, re.M) is None, listing
    # the first push uploaded the project's own layers only: the real cell's were in the registry already
    first = re.search(r": (\d+) layers? pushed \(.*?\), (\d+) already there, in ", transcript)
    assert first and int(first[2]) >= 5 and int(first[1]) <= 4, transcript[-3000:]
    # the Debian packages, the app and the code are the last layers, above the real cell's, which the registry held
    mine, theirs = engine.layers(tag), engine.layers(real_build[0].tag)
    assert len(mine) == len(theirs) + 2 and mine[0] == theirs[0] and mine[2:-3] == theirs[2:-1]
    # the registry asks for credentials; with `docker login`'s it serves exactly what was published: the index of
    # the image and its SBOM
    remote = Remote.parse(p["repo"])
    host = p["registry"].address
    assert (
        RegistryClient(PROJECT_USER, PROJECT_PASSWORD, [host]).oci_manifest(remote, tag.rsplit(":", 1)[1]).digest
        == result["tag_digest"]
    )
    with pytest.raises(Exception, match="401"):
        RegistryClient().oci_manifest(remote, tag.rsplit(":", 1)[1])


def _blobs(registry) -> dict[str, int]:
    """Every blob the registry stores (its path and size): what a push adds."""
    root = registry.root / "data" / "docker" / "registry" / "v2" / "blobs"
    return {str(f.relative_to(root)): f.stat().st_size for f in root.rglob("data")}


def test_a_rebuild_with_no_change_is_the_same_image_and_pushes_nothing(user_project, engine):
    """After a publish (which wrote the release index and record into the project's folder) and `ci init` (its wheel
    under .github/), the same build again: the same tag and digest, no blob added to the registry, and the self-test
    reuses the published run's results for every check but the code layer's; --full-self-test runs them all."""
    p = user_project
    first = p["result"]
    assert (p["project"] / "releases" / "index.json").is_file()  # imagekit's own output, inside `copy = "."`
    p["imagekit"]("ci", "init", "--registry", "ghcr.io/acme/train")
    workflow = p["project"] / ".github" / "workflows" / "images.yml"
    assert workflow.is_file() and list((p["project"] / ".github" / "imagekit").glob("imagekit-*.whl"))
    blobs = _blobs(p["registry"])
    again = p["imagekit"]("build", "--push", "--json")
    (second,) = json.loads(again.stdout)
    log = again.stderr
    assert second["status"] == "published", log
    assert (second["tag"], second["digest"]) == (first["tag"], first["digest"]), log
    assert f"{first['tag']} already published as " in log and " layers pushed" not in log, log
    assert _blobs(p["registry"]) == blobs  # 0 bytes: not one blob more
    reused = second["selftest_reused"]
    assert reused["record"] == first["tag"] and {"torch-compile", "tiny-model", "dists-match-lock"} <= set(
        reused["checks"]
    ), reused
    assert "image-hygiene" not in reused["checks"] and "labels-match-contents" not in reused["checks"]  # run again
    assert reused["layers"] == engine.layers(first["tag"])[:-1]  # keyed by the layers below the code layer
    full = p["imagekit"]("build", "--push", "--json", "--full-self-test")
    (third,) = json.loads(full.stdout)
    assert third["tag"] == first["tag"] and "selftest_reused" not in third, full.stderr
    assert "self-test: every check (--full-self-test)" in full.stderr and _blobs(p["registry"]) == blobs
    workflow.unlink()  # the project as it was: test_ci_init_... starts where `ci init` never ran


def test_a_code_change_rebuilds_and_pushes_only_the_code_layer(user_project, engine):
    p = user_project
    first = p["result"]
    train = p["project"] / "train.py"
    before = train.read_text()
    train.write_text(before + "print('epoch 2')\n")
    try:
        again = p["imagekit"]("build", "--push", "--json")
    finally:
        train.write_text(before)
    (second,) = json.loads(again.stdout)
    assert second["status"] == "published" and second["tag"] != first["tag"], again.stderr
    log = again.stderr
    pushed = re.search(
        r": (\d+) layers? pushed \(([0-9.]+ [kMG]?B) read, [^)]* gzip(?:, \d+ compressed during the build)?\), "
        r"(\d+) already there",
        log,
    )
    assert pushed, log
    assert pushed[1] == "1" and int(pushed[3]) >= 5, log  # the code layer; every other one was in the registry
    assert pushed[2].endswith(" kB") or pushed[2].endswith(" B"), pushed[2]  # kilobytes read, not the image
    a, b = engine.layers(first["tag"]), engine.layers(second["tag"])
    assert a[:-1] == b[:-1] and a[-1] != b[-1]
    # the self-test ran the code layer's checks; the rest are the first release's, keyed by the layers below
    reused = second["selftest_reused"]
    assert reused["record"] == first["tag"] and "torch-compile" in reused["checks"], reused
    record = p["project"] / "releases" / "records" / f"{second['tag'].rsplit(':', 1)[1]}.json"
    ran = json.loads(record.read_text())["selftest"]
    checks = {c["id"]: c for c in ran["checks"]}
    assert len(checks) == len(ran["checks"]) and checks["labels-match-contents"]["status"] == "pass"  # once, run now
    assert "reused" not in checks["labels-match-contents"]
    assert checks["tiny-model"]["reused"]["layers"] == ran["ran"]["layers"][:-1] == reused["layers"]
    assert "reused" not in checks["image-hygiene"] and ran["ran"]["layers"][:-1] == engine.layers(first["tag"])[:-1]
    code, out = _run(engine, second["tag"], "python /opt/app/train.py")
    assert code == 0 and "epoch 2" in out, out
    engine.remove(second["tag"])


def test_ci_init_for_the_project_writes_a_workflow_that_installs_this_imagekit(user_project):
    p = user_project
    refused = p["imagekit"]("ci", "init", ok=False)  # a loopback registry: no runner reaches it
    assert refused.returncode == 2 and "hint:" in refused.stderr, refused.stderr
    assert not (p["project"] / ".github" / "workflows" / "images.yml").exists()
    p["imagekit"]("ci", "init", "--registry", "ghcr.io/acme/train")
    written = p["project"] / ".github" / "workflows" / "images.yml"
    workflow = written.read_text()
    assert "--source pypi" not in workflow and "ghcr.io/acme/train" in workflow
    wheel = next((p["project"] / ".github" / "imagekit").glob("imagekit-*.whl"))
    assert wheel.name in workflow  # every job installs the committed wheel of this imagekit
    lint = actionlint(written)
    assert lint.returncode == 0 and lint.stdout == "", lint.stdout + lint.stderr
