"""`imagekit prune` (services/builds/prune.py): only what imagekit made is found and removed (refused images, recorded
step images no tag names, with --cache the build-cache anchors); a published tag, another program's image and a
step image a tag names stay. Over the recording engine (the Docker engine is the outer boundary)."""

from __future__ import annotations

import pytest

from imagekit.image import naming
from imagekit.model import Cell
from imagekit.services.builds import prune, staged_build
from tests.fakes import RecordingEngine

CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11")
STEP, TAGGED_STEP, FOREIGN = ("sha256:" + c * 64 for c in "abc")


@pytest.fixture
def engine(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEKIT_CACHE", str(tmp_path / "cache"))
    engine = RecordingEngine()
    for image, tags in ((STEP, []), (TAGGED_STEP, ["someone/else:v1"]), (FOREIGN, []), ("sha256:" + "d" * 64,
                        [naming.refused_tag(CELL)]), ("sha256:" + "e" * 64, ["reg/team/train:cu124-abc"]),
                        ("sha256:" + "f" * 64, [naming.build_cache_tag(CELL)])):  # fmt: skip
        engine._add(image, ["sha256:l"], 0, tags)
        engine.images[image] = {**engine.images[image], "RepoTags": tags}
    for image in (STEP, TAGGED_STEP, "not an id\x1b[2J", STEP):  # as staged builds record them (and a planted line)
        (tmp_path / "cache" / "steps").mkdir(parents=True, exist_ok=True)
        with open(tmp_path / "cache" / "steps" / staged_build.STEP_IMAGES, "a") as fh:
            fh.write(image + "\n")
    return engine


def test_prune_finds_only_imagekits_leftovers(engine):
    found = [(i.kind, i.ref) for i in prune.leftovers(engine)]
    assert found == [("refused", naming.refused_tag(CELL)), ("step", STEP)]  # not the tagged step, not FOREIGN
    with_cache = [(i.kind, i.ref) for i in prune.leftovers(engine, cache=True)]
    assert with_cache == [*found, ("cache", naming.build_cache_tag(CELL))]


def test_a_dry_run_removes_nothing_and_prune_removes_them(engine):
    before = dict(engine.images)
    assert [i.removed for i in prune.prune(engine, dry_run=True)] == [False, False] and engine.images == before
    done = prune.prune(engine)
    assert [(i.ref, i.removed) for i in done] == [(naming.refused_tag(CELL), True), (STEP, True)]
    assert STEP not in engine.images and naming.refused_tag(CELL) not in engine.images
    for kept in (TAGGED_STEP, FOREIGN, "reg/team/train:cu124-abc", naming.build_cache_tag(CELL)):
        assert kept in engine.images, kept
    assert prune.leftovers(engine) == []


def test_prune_removes_the_blobs_a_killed_build_prepared_and_nothing_a_build_under_way_uses(engine, tmp_path):
    """A `build --push` killed before its push leaves prepared blobs (blob_prepare): prune removes those older than a
    build under way could be; a young one, a link and the cache's digest memos stay."""
    import os

    folder = tmp_path / "cache" / "blobs" / "gzip-libdeflate0.9.0-level4-member16m"
    folder.mkdir(parents=True)
    old, young, partial, memo = (folder / n for n in ("a" * 64 + ".blob", "b" * 64 + ".blob", ".prepare-x-1", "c" * 64))
    for path in (old, young, partial, memo):
        path.write_bytes(b"x" * 10)
    (folder / ("d" * 64 + ".blob")).symlink_to(old)
    stale = 1_000_000_000
    for path in (old, partial, memo):
        os.utime(path, (stale, stale))
    found = [(i.kind, i.ref, i.size) for i in prune.leftovers(engine) if i.kind == "blob"]
    assert found == [("blob", str(old), 10), ("blob", str(partial), 10)]
    removed = [i for i in prune.prune(engine) if i.kind == "blob"]
    assert all(i.removed for i in removed) and len(removed) == 2
    assert not old.exists() and not partial.exists() and young.exists() and memo.exists()
    assert (folder / ("d" * 64 + ".blob")).is_symlink()
