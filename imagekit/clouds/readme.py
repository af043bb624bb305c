"""What every provider's template readme says the same way (pure): the image's words as a readme may print them, how
its self-test ran, where an entry without a release record got its facts. Each provider's module (`clouds/<name>.py`)
writes the rest of its readme from its own cloud's terms."""

from __future__ import annotations

import re

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}", re.ASCII)


def shown_word(value: object) -> str:
    """A version or a name a record or an image's labels gave, as a readme prints it: one word of what versions and
    names are made of, else ``?`` (``$(id)`` or a link's markup never reaches a template someone reads)."""
    return value if isinstance(value, str) and _WORD.fullmatch(value) else "?"


def tested_line(entry: dict) -> list[str]:
    """How the image's self-test ran (a record from before this was kept says nothing): never "on GPU" when it ran
    emulated on another CPU architecture."""
    selftest = entry.get("selftest")
    ran = selftest.get("ran") if isinstance(selftest, dict) else None
    if not isinstance(ran, dict):
        return []
    runtime = (entry.get("manifest") or {}).get("runtime")
    platform = runtime.get("platform") if isinstance(runtime, dict) else None
    platform = platform if isinstance(platform, str) and platform else "its platform"
    if ran.get("emulated") is True:
        return [
            f"Tested: emulated only (qemu on another CPU architecture): the CPU checks passed; nothing has run on a "
            f"{platform} GPU yet (run `imagekit-doctor` first on the pod)."
        ]
    if ran.get("gpu") is True:
        return ["Tested: the self-test passed on a GPU, before publishing."]
    return ["Tested: the self-test's CPU checks passed (the build host had no GPU); `imagekit-doctor` checks the GPU."]


def source_line(entry: dict) -> list[str]:
    """Where an entry made without a release record got its facts (`clouds.label_record`): said, with what it cannot
    say."""
    source = entry.get("source")
    if not isinstance(source, str):
        return []
    return [f"Read from {source} (no release record: how its self-test ran is not known here)."]
