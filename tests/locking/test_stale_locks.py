"""A lock made for other inputs: what `stale_reason` says, the settings a lock records, and requirement coverage."""

from __future__ import annotations

from dataclasses import replace

import pytest

from imagekit.errors import CheckFailed
from imagekit.locking import resolution
from imagekit.locking.lockfile import Lock, LockEntry, parse
from imagekit.model import Cell

H = ("sha256:" + "c" * 64,)
CU121 = Cell("12.1", "2.1.2", "4.48.2", "3.11")
CU118 = Cell("11.8", "2.5.1", "4.48.2", "3.11")  # routed: torch from the PyTorch index


def _lock_for(cell: Cell, data, settings: resolution.LockSettings | None = None) -> Lock:
    lines, meta = resolution.header(
        resolution.request(cell, settings or resolution.LockSettings(), data), None, data, "uv 0"
    )
    return parse(Lock((LockEntry("torch", cell.torch, H),), (), meta, lines).render())


def test_a_current_lock_is_not_stale_routed_or_not(data):
    for cell in (CU121, CU118):
        assert resolution.stale_reason(_lock_for(cell, data), cell, data) is None
    assert resolution.stale_reason(_lock_for(CU118, data), replace(CU118, packages=("peft==0.14.0",)), data)


def test_the_reason_names_what_changed(data):
    lock = _lock_for(CU121, data)
    newer = replace(data, data_version="2099-01-01")
    reason = resolution.stale_reason(lock, CU121, newer)
    want = resolution.request(CU121, resolution.LockSettings(), newer).input_hash
    assert reason == (
        "was locked for other inputs (compatibility data 2026-11-29 -> 2099-01-01): "
        f"its input hash is {lock.meta['input-hash']}, this cell's is {want}"
    )
    old_glibc = replace(data, bases={**data.bases, "3.11": replace(data.bases["3.11"], glibc="2.17")})
    reason = resolution.stale_reason(lock, CU121, old_glibc)
    assert reason.startswith("was locked for other inputs (platform x86_64-manylinux_2_28 -> x86_64-manylinux_2_17)")
    both = replace(old_glibc, data_version="2099-01-01")
    assert "(compatibility data 2026-11-29 -> 2099-01-01; platform x86_64-manylinux_2_28" in resolution.stale_reason(
        lock, CU121, both
    )
    grown = replace(CU121, packages=("peft==0.14.0",))
    assert resolution.stale_reason(lock, grown, data).startswith(
        "was locked for other inputs (the cell's requirements or packages changed): its input hash is sha256:"
    )


@pytest.mark.parametrize("raw", ["{", "[1, 2]", '"x"', '{"index_url": "x"}', "null"])
def test_an_unreadable_settings_line_is_refused(data, raw):
    lock = _lock_for(CU121, data)
    broken = Lock(lock.torch, lock.app, {**lock.meta, "settings": raw}, lock.header)
    with pytest.raises(CheckFailed) as info:
        resolution.recorded_settings(broken)
    assert info.value.message == f"unreadable imagekit-settings line: {raw[:80]!r}"
    assert info.value.hint == "run `imagekit lock` to rewrite it"


def test_recorded_settings_round_trip_and_default(data):
    pinned = resolution.LockSettings(exclude_newer="2025-01-01T00:00:00Z", resolver="pip-tools")
    assert resolution.recorded_settings(_lock_for(CU121, data, pinned)) == pinned.public()
    legacy = _lock_for(CU121, data)
    legacy = Lock(legacy.torch, legacy.app, {k: v for k, v in legacy.meta.items() if k != "settings"}, legacy.header)
    assert resolution.recorded_settings(legacy) == resolution.LockSettings().public()


def _unmet(cell: Cell, pins: dict[str, str], data) -> list[str]:
    req = resolution.request(cell, resolution.LockSettings(), data)
    return resolution.unmet_requirements(req, {n: LockEntry(n, v, H) for n, v in pins.items()})


def test_requirements_are_judged_for_the_images_python_and_platform(data):
    """Markers are evaluated for the image (Linux x86_64, the cell's Python), not for the machine running imagekit."""
    base = {"torch": "2.1.2", "transformers": "4.48.2"}
    old = replace(CU121, python="3.10", packages=("tomli==2.0.1; python_version < '3.11'",))
    assert _unmet(old, base, data) == ["tomli is not pinned"]
    assert _unmet(old, {**base, "tomli": "2.0.1"}, data) == []
    new = replace(CU121, python="3.12", packages=("x==1; python_full_version >= '3.12.0'",))
    assert _unmet(new, base, data) == ["x is not pinned"]
    win = replace(CU121, packages=("pywin32==306; sys_platform == 'win32'", "y==1; platform_machine == 'aarch64'"))
    assert _unmet(win, base, data) == []
    linux = replace(CU121, packages=("z==1; platform_system == 'Linux' and os_name == 'posix'",))
    assert _unmet(linux, base, data) == ["z is not pinned"]
    impl = replace(
        CU121, packages=("w==1; implementation_name == 'cpython'", "v==1; platform_python_implementation == 'PyPy'")
    )
    assert _unmet(impl, base, data) == ["w is not pinned"]


def test_requirement_coverage_details(data):
    base = {"torch": "2.1.2", "transformers": "4.48.2"}
    cell = replace(CU121, packages=("Foo_Bar>=1.0", "baz==2.0"))
    assert _unmet(cell, {**base, "foo-bar": "2.0.0rc1", "baz": "2.0"}, data) == []  # canonical names, pre-releases
    assert _unmet(cell, {**base, "foo-bar": "0.9", "baz": "2.1"}, data) == [
        "Foo_Bar 0.9 does not satisfy >=1.0",
        "baz 2.1 does not satisfy ==2.0",
    ]
    assert _unmet(CU121, {"torch": "2.1.2", "transformers": "4.49.0"}, data) == [
        "transformers 4.49.0 does not satisfy ==4.48.2"
    ]
    req = replace(resolution.request(CU121, resolution.LockSettings(), data), requirements=("not a requirement!",))
    assert resolution.unmet_requirements(req, {}) == ["'not a requirement!' is not a requirement"]


@pytest.mark.parametrize(
    ("cell", "base", "torch_index", "torch_pin"),
    [
        (CU118, "https://download.pytorch.org/whl", "https://download.pytorch.org/whl/cu118", "torch==2.5.1+cu118"),
        (CU118, "https://mirror.example/whl/", "https://mirror.example/whl/cu118", "torch==2.5.1+cu118"),
        (CU121, "https://download.pytorch.org/whl", None, "torch==2.1.2"),
    ],
)
def test_the_input_hash_is_this_document(data, cell, base, torch_index, torch_pin):
    """The input hash spelled out: a change to it makes every committed lock stale, so it is pinned here."""
    import hashlib
    import json

    settings = resolution.LockSettings(torch_index_base=base)
    doc = {
        "format": 1,
        "cell": cell.to_json(),
        "requirements": [torch_pin, "transformers==4.48.2"],
        "settings": settings.public(),
        "torch_index": torch_index,
        "platform": "x86_64-manylinux_2_28",
        "data_version": data.data_version,
    }
    want = "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    assert resolution.request(cell, settings, data).input_hash == want


@pytest.mark.parametrize(
    "marker",
    [
        "sys_platform == 'linux'",
        "platform_system == 'Linux'",
        "platform_machine == 'x86_64'",
        "os_name == 'posix'",
        "implementation_name == 'cpython'",
        "platform_python_implementation == 'CPython'",
        "python_version == '3.11'",
        "python_full_version == '3.11.0'",
    ],
)
def test_each_marker_variable_is_the_images(data, marker):
    cell = replace(CU121, packages=(f"needed==1; {marker}",))
    assert _unmet(cell, {"torch": "2.1.2", "transformers": "4.48.2"}, data) == ["needed is not pinned"]


def test_verify_names_every_unmet_requirement_and_how_to_fix_it(data):
    cell = replace(CU121, packages=("a==1", "b==2"))
    req = resolution.request(cell, resolution.LockSettings(), data)
    entries = [
        LockEntry("torch", "2.1.2", H),
        LockEntry("nvidia-cuda-runtime-cu12", "12.1.105", H, ("torch",)),
        LockEntry("transformers", "4.48.2", H),
    ]
    with pytest.raises(CheckFailed) as info:
        resolution.verify(req, entries, {}, data)
    assert info.value.message == (
        f"{cell.id}: the pins do not meet the cell's requirements: a is not pinned; b is not pinned"
    )
    assert info.value.hint == "the lock is another cell's or out of date: run `imagekit lock` for this cell"


def test_a_long_unreadable_settings_line_is_shown_cut_at_80(data):
    lock = _lock_for(CU121, data)
    raw = "{" + "x" * 200
    broken = Lock(lock.torch, lock.app, {**lock.meta, "settings": raw}, lock.header)
    with pytest.raises(CheckFailed) as info:
        resolution.recorded_settings(broken)
    assert info.value.message == f"unreadable imagekit-settings line: {raw[:80]!r}"


def test_skipped_and_unreadable_requirements_do_not_hide_the_ones_after_them(data):
    base = {"torch": "2.1.2", "transformers": "4.48.2"}
    skipped_first = replace(CU121, packages=("a==1; sys_platform == 'win32'", "b==1"))
    assert _unmet(skipped_first, base, data) == ["b is not pinned"]
    req = resolution.request(CU121, resolution.LockSettings(), data)
    req = replace(req, requirements=("bad req!", "b==1"))
    assert resolution.unmet_requirements(req, {}) == ["'bad req!' is not a requirement", "b is not pinned"]


def _text_and_lock(cell: Cell, data, **meta: str) -> tuple[str, Lock]:
    lock = _lock_for(cell, data)
    entries = (LockEntry("torch", cell.torch, H), LockEntry("nvidia-cuda-runtime-cu12", "12.1.105", H, ("torch",)))
    app = (
        LockEntry("transformers", cell.transformers, H),
        *(LockEntry(p.split("==")[0], p.split("==")[1], H) for p in cell.packages),
    )
    text = Lock(entries, app, {**lock.meta, **meta}, lock.header).render()
    return text, parse(text)


def test_verify_lock_refuses_a_lock_for_other_inputs_only_when_asked(data):
    text, lock = _text_and_lock(CU121, data)
    resolution.verify_lock(lock, text, CU121, data, "l.txt", current=True)  # intact and current
    newer = replace(data, data_version="2099-01-01")
    resolution.verify_lock(lock, text, CU121, newer, "l.txt")  # intact: `lock` re-resolves it, never refuses it
    with pytest.raises(CheckFailed) as info:
        resolution.verify_lock(lock, text, CU121, newer, "l.txt", current=True)
    assert info.value.message.startswith("l.txt: was locked for other inputs (compatibility data 2026-11-29 -> 2099")
    grown = replace(CU121, packages=("peft==0.14.0",))
    resolution.verify_lock(lock, text, grown, data, "l.txt")  # a package added to the matrix: stale, not invalid
    with pytest.raises(CheckFailed, match="peft is not pinned"):
        resolution.verify_lock(lock, text, grown, data, "l.txt", current=True)
    text, lock = _text_and_lock(CU121, data, settings="{broken")
    resolution.verify_lock(lock, text, CU121, data, "l.txt")
    with pytest.raises(CheckFailed) as info:
        resolution.verify_lock(lock, text, CU121, data, "l.txt", current=True)
    assert info.value.message == "l.txt: unreadable imagekit-settings line: '{broken'"
