"""Image hygiene (imagekit/in_image/hygiene.py) on file trees laid out as an image's: what it finds, and what it
leaves alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from imagekit.in_image import hygiene
from imagekit.in_image.gpu_checks import check


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CLEAN = {
    "root/.bashrc": "",
    "root/.profile": "",
    "opt/venv/lib/python3.11/site-packages/torch/__init__.py": "",
    "home/imagekit/.docker/config.json": json.dumps({"auths": {}, "credsStore": "desktop"}),  # no secret in it
    "usr/share/doc/git/copyright": "",
    "etc/ssh/sshd_config": "",
    "workspace/.cache/huggingface/hub/models--x/config.json": "{}",
}


def test_a_clean_image_passes_and_says_how_many_paths_it_read(tmp_path):
    top = _tree(tmp_path, CLEAN)
    (top / "root" / ".ssh").mkdir()
    (top / "tmp").mkdir()
    result = hygiene.check_hygiene(hygiene.leftovers(str(top)), check, str(top))
    assert result["status"] == "pass", result
    assert result["evidence"]["files"] == sum(1 for _ in top.rglob("*"))


@pytest.mark.parametrize(
    ("rel", "text", "why"),
    [
        ("root/.netrc", "machine h login u password p", "netrc credentials"),
        ("home/imagekit/.git-credentials", "https://u:t@github.com", "git credentials"),
        ("home/imagekit/.pypirc", "[pypi]\npassword = x", ".pypirc"),
        ("home/imagekit/.aws/credentials", "[default]", "AWS credentials"),
        ("workspace/.cache/huggingface/token", "hf_x", "Hugging Face token"),
        ("home/imagekit/.huggingface/token", "hf_x", "Hugging Face token"),
        ("home/imagekit/.ssh/id_ed25519", "-----BEGIN OPENSSH PRIVATE KEY-----", "SSH private key"),
        ("etc/ssh/ssh_host_ed25519_key", "-----BEGIN OPENSSH PRIVATE KEY-----", "SSH host key"),
        ("home/imagekit/.docker/config.json", json.dumps({"auths": {"ghcr.io": {"auth": "dTpw"}}}), "docker config"),
    ],
)
def test_each_kind_of_credential_is_named_with_its_path(tmp_path, rel, text, why):
    top = _tree(tmp_path, {**CLEAN, rel: text})
    result = hygiene.check_hygiene([], check, str(top))
    assert result["status"] == "fail" and f"{top}/{rel}" in result["message"] and why in result["message"], result
    assert result["evidence"]["credentials_count"] == 1 and "never in a layer" in result["fix"]


def test_git_folders_and_what_a_build_left_in_scratch_folders_and_root_are_named(tmp_path):
    top = _tree(tmp_path, {**CLEAN, "opt/app/.git/HEAD": "ref", "tmp/pip-build/.git/HEAD": "", "root/.cache/pip/y": ""})
    (top / "var" / "tmp").mkdir(parents=True)
    (top / "var" / "tmp" / "core").write_text("")
    (top / "root" / ".ssh").mkdir()
    (top / "root" / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA")  # a build-time key: a back door
    left = hygiene.leftovers(str(top))
    assert left == ["/tmp/pip-build", "/var/tmp/core", "/root/.cache", "/root/.ssh/authorized_keys"]
    result = hygiene.check_hygiene(left, check, str(top))
    assert result["status"] == "fail" and f"1 .git folders: {top}/opt/app/.git" in result["message"]
    assert "4 left by the build" in result["message"] and result["evidence"]["leftovers_count"] == 4
    # the scratch folders are judged by what they held at the start, not by what the self-test wrote there since
    assert result["evidence"]["git"] == [f"{top}/opt/app/.git"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file another owner needs root")
def test_an_owner_above_65534_fails_the_pull_on_a_remapping_host_and_is_named(tmp_path):
    top = _tree(tmp_path, {**CLEAN, "opt/weird/file": "", "opt/fine/file": ""})
    os.lchown(top / "opt" / "weird" / "file", 70000, 0)
    os.lchown(top / "opt" / "fine" / "file", 65534, 65534)  # nobody:nogroup is the limit, allowed
    result = hygiene.check_hygiene([], check, str(top))
    assert result["status"] == "fail" and result["evidence"]["owners"] == [f"{top}/opt/weird/file (70000:0)"]


def test_findings_are_counted_whole_and_named_up_to_a_limit(tmp_path):
    top = _tree(tmp_path, {f"srv/r{i}/.git/HEAD": "" for i in range(hygiene.LIMIT + 5)})
    result = hygiene.check_hygiene([], check, str(top))
    assert result["evidence"]["git_count"] == hygiene.LIMIT + 5 and len(result["evidence"]["git"]) == hygiene.LIMIT
    assert "and 5 more" in result["message"]


def test_the_walk_does_not_follow_links_out_of_the_image(tmp_path):
    outside = _tree(tmp_path / "outside", {".netrc": "secret"})
    top = _tree(tmp_path / "image", CLEAN)
    (top / "opt" / "link").symlink_to(outside)
    assert hygiene.check_hygiene([], check, str(top))["status"] == "pass"


def test_the_code_layers_scope_falls_back_to_the_whole_image_where_it_cannot_be_trusted(tmp_path, monkeypatch):
    """The code layer's hygiene judges its folder alone only when that folder is its own: a link (its files lie
    where a layer below points), a missing folder, or a project whose files cannot be found is the whole image."""
    from imagekit.in_image import selftest

    scopes = []
    monkeypatch.setattr(hygiene, "check_hygiene", lambda left, check, top="/", only=None: scopes.append(only))
    code = tmp_path / "app"
    code.mkdir()
    (tmp_path / "link").symlink_to(code)
    selftest.code_layer_hygiene({}, [], str(code))
    selftest.code_layer_hygiene({}, [], str(tmp_path / "link"))
    selftest.code_layer_hygiene({}, [], str(tmp_path / "missing"))
    selftest.code_layer_hygiene({"project": {"name": "no-such-project-here"}}, [], str(code))
    selftest.code_layer_hygiene({}, [], None)
    assert scopes == [[str(code)], None, None, None, None]
