"""What a value a user typed looks like when an error or a note echoes it: credentials taken out, a VCS
requirement's `@<commit>` shown as it is (seen on tloen/alpaca-lora: `huggingface/***@<commit>`)."""

from __future__ import annotations

from imagekit.trust.redact import redact_value

COMMIT = "26577aba842faef3d3fc31c9e6fec1cd08f5e2c8"


def test_a_vcs_url_keeps_its_repository_and_commit():
    url = f"git+https://github.com/huggingface/peft.git@{COMMIT}"
    assert redact_value(url) == url
    assert redact_value(f"named from each commit's metadata: {url}, {url}#egg=peft") == (
        f"named from each commit's metadata: {url}, {url}#egg=peft"
    )


def test_credentials_are_still_taken_out_in_and_beside_urls():
    said = redact_value(
        f"git+https://bob:s3cret@github.com/org/repo.git@{COMMIT} ssh://git:t0ken@host/x user:pw@registry.io/repo"
    )
    assert "s3cret" not in said and "t0ken" not in said and "user:pw" not in said and "bob" not in said, said
    assert f"git+https://github.com/org/repo.git@{COMMIT}" in said and "***@registry.io/repo" in said, said
    assert redact_value("me:pw@ghcr.io/acme/train:tag") == "***@ghcr.io/acme/train:tag"
    assert redact_value("127.0.0.1:5000/a/b@sha256:" + "0" * 64).endswith("@sha256:" + "0" * 64)
