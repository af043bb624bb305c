"""A local file the user names and a command reads whole is a regular file, or it is refused at once, before anything
connects (as scp refuses): a FIFO would block the command for ever, /dev/zero would never end (issue 49). And what a
command echoes of its argument, a template's readme of an image's labels, is printable and shows no password."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from imagekit.clouds import label_record, runpod
from imagekit.effects.ssh import ssh_connection
from imagekit.errors import UsageError
from imagekit.services.pods import pod
from tests.effects.test_foreign_files import _within


@pytest.fixture(params=["fifo", "/dev/zero", "socket"])
def special(request, tmp_path) -> Path:
    if request.param == "fifo":
        os.mkfifo(tmp_path / "fifo")
        return tmp_path / "fifo"
    if request.param == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(tmp_path / "sock"))
        request.addfinalizer(sock.close)
        return tmp_path / "sock"
    link = tmp_path / "zero"
    link.symlink_to("/dev/zero")  # a link the user made to a device: followed, then refused
    return link


def test_pod_cp_refuses_a_local_file_that_is_not_regular_before_connecting(special):
    # Before: the copy connected, then read the FIFO (blocked for ever) or /dev/zero (without end).
    dialled: list[str] = []

    def dial(*args):  # type: ignore[no-untyped-def]
        dialled.append("connected")
        raise AssertionError("connected before refusing the local file")

    with pytest.raises(UsageError, match="is not a regular file") as caught:
        _within(10, lambda: pod.copy(str(special), "root@pod.example:/workspace/x", None, None, print, dial))
    assert dialled == [] and "nothing was sent" in str(caught.value.hint)


def test_a_private_key_that_is_not_a_regular_file_is_refused_at_once(special):
    with pytest.raises(UsageError, match=r"--key .*: it (is not a regular file|cannot be read)"):
        _within(10, lambda: ssh_connection.load_key(special))


def test_a_known_hosts_file_that_is_a_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "known_hosts")
    import paramiko

    with pytest.raises(UsageError, match="it is not a regular file"):
        _within(10, lambda: ssh_connection._load_known_hosts(paramiko.HostKeys(), tmp_path / "known_hosts", print))


@pytest.mark.parametrize("command", ["runpod-template", "vast-template"])
@pytest.mark.parametrize("ref", ["user:hunter2@ghcr.io/acme/train:cu124", "https://user:hunter2@ghcr.io/acme/train"])
def test_a_template_command_never_echoes_a_password_in_its_argument(app, runner, in_tmp, command, ref):
    # Before: "error: user:hunter2@ghcr.io/acme/train:cu124 is not in releases/index.json".
    res = runner.invoke(app, [command, ref])
    assert res.exit_code == 2 and "is not in releases/index.json" in res.stderr
    assert "hunter2" not in res.output and "user" not in res.output


CONFIG = {
    "architecture": "amd64",
    "os": "linux",
    "config": {"Labels": {"imagekit.cell": "cu124-torch2.5.1-py3.11-tf4.48.2", "imagekit.cuda": "12.4"}},
}


@pytest.mark.parametrize(
    ("label", "value"),
    [
        ("imagekit.torch", "$(id)"),
        ("imagekit.transformers", "`id`"),
        ("imagekit.python", "3.11; rm -rf /"),
        ("imagekit.driver.min", "$(reboot)"),
        ("imagekit.torch", "[x](http://evil)"),
    ],
)
def test_label_values_that_are_no_version_never_reach_a_template(label, value):
    # Before: `torch $(id)+cu124, transformers `id`` and "driver >= $(reboot)" were printed into the readme.
    labels = {**CONFIG["config"]["Labels"], "imagekit.torch": "2.5.1", label: value}
    config = {**CONFIG, "config": {"Labels": labels}}
    with pytest.raises(UsageError, match="not as imagekit writes them"):
        label_record.entry("ghcr.io/acme/x", "v1", "sha256:" + "a" * 64, config, 100)


def test_a_records_values_are_printed_into_a_readme_as_words_or_not_at_all():
    cell = {"id": "cu124-torch2.5.1-py3.11-tf4.48.2", "torch": "$(id)", "variant": "cu124", "python": "3.11"}
    entry = {"tag": "r/x:t", "digest": "sha256:" + "a" * 64, "manifest": {"cell": cell, "driver": {"minimum": "`x`"}}}
    text = runpod.readme(entry, False)
    assert "$(id)" not in text and "`x`" not in text and "torch ?+cu124" in text and "driver >= ?" in text
