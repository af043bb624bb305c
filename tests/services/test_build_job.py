"""`imagekit build`'s wiring as a service: flags refused before any work, the job's options decided once (the image's
options as one value), and the base the plan chose made present. No Docker, no index."""

from __future__ import annotations

from dataclasses import replace

import pytest

from imagekit.errors import UsageError
from imagekit.image.buildplan import BaseRef, base_for
from imagekit.image.image_options import ImageOptions
from imagekit.locking import resolution
from imagekit.matrix import matrix_file as matrix
from imagekit.services.builds import build_job
from imagekit.services.builds.base_images import present
from tests.fakes import RecordingEngine


@pytest.fixture(scope="module")
def config(data):
    return matrix.parse(matrix.default_document(), "<t>", data)


def test_flags_that_cannot_work_are_refused_before_any_work(tmp_path):
    with pytest.raises(UsageError, match="invalid --gpus 'sometimes'"):
        build_job.BuildRequest(gpus="sometimes")
    request = build_job.BuildRequest(release_index=tmp_path / "index.json")
    assert build_job.check(request) is None  # a missing index is an empty one; no key, no signer
    for bad, says in (
        ({"audit_fail_on": "severe"}, "invalid --audit-fail-on 'severe'"),
        ({"audit_osv": tmp_path / "nothing.zip"}, "does not exist"),
        ({"sign_key": tmp_path / "cosign.key"}, "--sign-key signs what --push publishes"),
    ):
        with pytest.raises(UsageError) as exc:
            build_job.check(replace(request, **bad))
        assert says in exc.value.message


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("IMAGEKIT_GZIP_LEVEL", "nan", "IMAGEKIT_GZIP_LEVEL='nan' is not a gzip level"),
        ("IMAGEKIT_GZIP_LEVEL", "13", "IMAGEKIT_GZIP_LEVEL='13' is not a gzip level"),
        ("IMAGEKIT_PREPARE_BLOBS", "maybe", "IMAGEKIT_PREPARE_BLOBS='maybe' is not on, off or auto"),
    ],
)
def test_the_publishs_settings_from_the_environment_are_refused_before_the_build(
    tmp_path, monkeypatch, variable, value, says
):
    """Before: IMAGEKIT_GZIP_LEVEL=nan was refused by the publish, after the build and the self-test had run."""
    monkeypatch.setenv(variable, value)
    request = build_job.BuildRequest(release_index=tmp_path / "index.json")
    assert build_job.check(request) is None  # without --push they are not read
    with pytest.raises(UsageError) as exc:
        build_job.check(replace(request, push=True))
    assert says in exc.value.message and exc.value.hint


def test_imagekit_build_push_with_a_bad_gzip_level_stops_before_any_cell(app, runner, in_tmp, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_GZIP_LEVEL", "nan")
    res = runner.invoke(app, ["build", "--push", "--state-dir", str(in_tmp / "state")])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert "error: IMAGEKIT_GZIP_LEVEL='nan' is not a gzip level" in res.stderr and "hint: " in res.stderr
    assert not (in_tmp / "state").exists() and list(in_tmp.iterdir()) == []  # nothing locked, fetched or built


def test_the_job_carries_the_image_options_as_one_value(config, tmp_path):
    asked = []

    def settings(cfg: matrix.MatrixConfig) -> resolution.LockSettings:
        asked.append(cfg)
        return resolution.LockSettings(index_url="https://mirror.example/simple")

    options = replace(config.options, variants=("zstd",))
    request = build_job.BuildRequest(lock_dir=tmp_path / "locks", gpus="off", no_cache=True)
    job = build_job.prepare(request, config, options, settings, None)
    opts = job.opts
    assert opts.options is options and opts.options.variants == ("zstd",) and opts.bases == config.bases
    assert (opts.repository, opts.lock_dir) == (config.repository, tmp_path / "locks")
    assert (opts.gpus, opts.nocache) == ("off", True)
    assert asked == [config] and opts.settings.index_url == "https://mirror.example/simple"
    assert not job.credential.found and opts.username is None  # credentials are looked up for --push only
    given = build_job.prepare(replace(request, registry="ghcr.io/acme/train"), config, options, settings, None)
    assert given.opts.repository == "ghcr.io/acme/train" and given.remote.registry == "ghcr.io"
    with pytest.raises(UsageError):
        build_job.prepare(replace(request, registry="Not A Repo"), config, options, settings, None)


class _PullingEngine(RecordingEngine):
    def pull(self, reference: str, auth: dict | None = None, platform: str | None = None) -> str:
        self._record("pull", reference, platform)
        return reference


def test_the_chosen_base_is_made_present_as_the_rule_chose_it(data):
    engine = _PullingEngine()
    digest = "sha256:" + "b" * 64
    registry = {"3.11": BaseRef("py", f"r.example.com/py@{digest}", digest, "3.11", "2.36", registry=True)}
    ref = base_for("3.11", data, registry, ImageOptions(), platform="linux/arm64")
    assert present(ref, engine, data.bases) == ref and engine.calls == [("pull", ref.reference, "linux/arm64")]
    own = base_for("3.11", data, {}, ImageOptions(compiler=False))
    made = present(own, engine, data.bases)  # the fake engine holds every bootstrapped base: reused
    assert made.reference == own.reference and made.compiler is False and made.digest is not None
