"""Vast.ai: its row of the provider registry and its template for a published image (the body of Vast's `POST
/api/v0/template/`), with the options of `imagekit vast-template`. Pure.

Vast's launch modes decide what runs at start. SSH and Jupyter (``runtype`` ``ssh``/``jupyter``) replace the image's
entrypoint with Vast's own, so the start check and the image's sshd run from the template's ``onstart``
(``entrypoint --onstart``); the entrypoint mode (``runtype`` ``args``) keeps the image's entrypoint, as RunPod does.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from imagekit.clouds import guard_defaults, reap
from imagekit.clouds.provider_spec import Provider, TemplateCommand, TemplateOption
from imagekit.clouds.pull import registry_host
from imagekit.clouds.readme import shown_word, source_line, tested_line
from imagekit.errors import UsageError
from imagekit.in_image import facts
from imagekit.trust.untrusted import printable

if TYPE_CHECKING:
    from imagekit.compat.catalog import CompatData
    from imagekit.compat.contract import Contract

LAUNCH_MODES = {"ssh": "ssh", "jupyter": "jupyter", "entrypoint": "args"}
_CUDA = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}", re.ASCII)
ONSTART = "/opt/imagekit/bin/entrypoint --onstart"
# What each launch mode keeps of the image's guarantees (the README's table says the same).
GUARANTEES = {
    "ssh": "Vast's entrypoint replaces the image's: the start check runs from onstart after Vast's init; a blocker "
    "writes the login banner and `imagekit-doctor` exits 1, but nothing stops what you start yourself, so launch "
    "training with `imagekit-doctor && ...`.",
    "jupyter": "as SSH, with Vast's Jupyter (not the image's JupyterLab) on 8080; the start check runs from onstart.",
    "entrypoint": "the image's own entrypoint: pod mode (the start check, sshd when PUBLIC_KEY is set, JupyterLab "
    "when JUPYTER_PASSWORD is set) or, with arguments, job mode (a blocker exits 1 before your command runs). Add "
    "PUBLIC_KEY to the template's env for SSH.",
}


def template(
    entry: dict,
    *,
    launch: str = "ssh",
    require_gpu: bool = True,
    login: bool = False,
    runtime: Contract | None = None,
    data: CompatData | None = None,
    guard: dict[str, str] | None = None,
) -> dict:
    """From a release-index entry (checked by `services.release_index.read_index`, or made from the image's labels by
    `clouds.label_record`, then ``pinned``: the tag field is ``TAG@DIGEST``): the image by its immutable tag, the
    launch mode, the ports the image serves, the env, the onstart the launch mode needs, the disk sized from the
    image; ``login``: the image is private, so Vast asks for the registry's credentials (``docker_login_repo``). The
    offer filters come from the image's ``runtime`` contract (with ``data``: the GPUs its torch has kernels for);
    without one, from the cell's CUDA only. ``guard``: the lifetime guard's env (None: the defaults,
    `guard_defaults`), in the env and said in the readme."""
    if launch not in LAUNCH_MODES:
        raise ValueError(f"launch mode {launch!r}: one of {', '.join(LAUNCH_MODES)}")
    image, tag = entry["tag"].rsplit(":", 1)
    if entry.get("pinned") is True:  # made from the image's labels: by its digest (Docker's NAME:TAG@DIGEST)
        tag = f"{tag}@{entry['digest']}"
    cell = entry["manifest"]["cell"]
    features = entry["manifest"].get("image") or {}
    jupyter = features.get("jupyter") is True
    ports = ["-p 22:22"] + (["-p 8888:8888"] if jupyter and launch == "entrypoint" else [])
    env = [f"-e IMAGEKIT_REQUIRE_GPU={'1' if require_gpu else '0'}", "-e HF_HOME=/workspace/.cache/huggingface"]
    guard = guard_defaults.env(guard_defaults.GuardChoice()) if guard is None else guard
    env += [f"-e {k}={v}" for k, v in guard.items()]  # values of [A-Za-z0-9-]: checked by guard_defaults
    env.append(f"-e {guard_defaults.CREATED}=template")  # `pod reap --provider vast` knows the instance as imagekit's
    size_gb = entry.get("size_bytes", 0) / 1e9
    cuda = cell.get("cuda") if isinstance(cell.get("cuda"), str) and _CUDA.fullmatch(cell["cuda"]) else None
    return {
        "name": f"imagekit {cell['id']}",
        "image": image,
        "tag": tag,
        "env": " ".join([*env, *ports]),
        "runtype": LAUNCH_MODES[launch],
        "onstart": ONSTART if launch != "entrypoint" else "",
        "args_str": "",
        "use_ssh": launch != "entrypoint",
        "ssh_direct": launch == "ssh",
        "jup_direct": launch == "jupyter",
        "use_jupyter_lab": launch == "jupyter",
        "jupyter_dir": "/workspace",
        "docker_login_repo": registry_host(entry["tag"]) if login else "",
        "recommended_disk_space": max(20, math.ceil(size_gb * 1.5 + 10)),
        "extra_filters": _filters(runtime, data, cuda),
        "desc": f"imagekit {cell['id']}: pinned, self-tested{_emulated(entry)} ({entry['digest'][:19]})",
        "readme": readme(entry, launch, runtime, data, guard),
        "private": True,
    }


def _emulated(entry: dict) -> str:
    """The self-test's CPU checks ran emulated on another CPU architecture: said wherever "self-tested" is."""
    selftest = entry.get("selftest")
    ran = selftest.get("ran") if isinstance(selftest, dict) else None
    return " (emulated only)" if isinstance(ran, dict) and ran.get("emulated") is True else ""


def offer_filters(runtime: Contract, data: CompatData) -> dict:
    """Vast's offer filters (``extra_filters``) for the hosts that can run the image: `cuda_max_good` (the newest CUDA
    the host's driver takes) at least the image's, `compute_cap` (compute capability x 100) one of the known GPUs its
    torch has kernels for, and the host's `cpu_arch` (Vast names CPU architectures as Docker does: vast-python's
    `search offers` help)."""
    from imagekit.compat import contract

    caps = sorted({contract.capability(data.gpus[name]) for name in contract.gpus(runtime, data)[0]})
    return {
        "cuda_max_good": {"gte": float(runtime.cuda)},
        "compute_cap": {"in": caps},
        "cpu_arch": {"eq": runtime.cpu_arch},
    }


def _filters(runtime: Contract | None, data: CompatData | None, cuda: str | None) -> dict:
    if runtime is not None and data is not None:
        return offer_filters(runtime, data)
    # offers whose driver runs this CUDA only (Vast's `cuda_max_good`: the newest CUDA the host's driver takes)
    return {"cuda_max_good": {"gte": float(cuda)}} if cuda else {}


def readme(
    entry: dict,
    launch: str,
    runtime: Contract | None = None,
    data: CompatData | None = None,
    guard: dict[str, str] | None = None,
) -> str:
    m = entry["manifest"]
    cell = m["cell"]
    driver = shown_word((m.get("driver") or {}).get("minimum"))
    cuda = cell["cuda"] if isinstance(cell.get("cuda"), str) and _CUDA.fullmatch(cell["cuda"]) else "?"
    needs = [f"Needs an NVIDIA driver >= {driver}: filter offers with `cuda_max_good` at least CUDA {cuda}."]
    if runtime is not None:
        needs = [
            f"Needs an NVIDIA driver >= {runtime.driver_min} (`cuda_max_good` >= {runtime.cuda}), {runtime.cpu_arch} "
            f"hosts (`cpu_arch`), and a GPU torch has kernels for ({runtime.archs_text()}); the template's "
            "extra_filters select only such offers."
        ]
        if data is not None:
            from imagekit.compat import contract

            needs.append(contract.gpu_line(runtime, data))
    return "\n".join(
        [
            f"# imagekit {shown_word(cell.get('id'))}",
            f"Image {entry['tag']} (digest {entry['digest']}); every package pinned by hash.",
            *needs,
            *tested_line(entry),
            *source_line(entry),
            f"Launch mode {launch}: {GUARANTEES[launch]}",
            "Volume: /workspace; HF_HOME=/workspace/.cache/huggingface keeps model downloads there. Stopping the "
            "instance keeps its disk (storage is still billed); destroying it deletes the disk.",
            guard_defaults.readme_line(
                guard_defaults.env(guard_defaults.GuardChoice()) if guard is None else guard,
                "imagekit vast-template",
                " It ends the instance with Vast's in-instance key (CONTAINER_API_KEY); from outside, `imagekit pod "
                f"reap --provider vast` stops the instances it missed ({guard_defaults.CREATED} marks them) once past "
                "their deadline, and with --older-than 1d those a day old that Vast reports no GPU work on.",
            ),
        ]
    )


def check_launch(value: str) -> None:
    """--launch: one of Vast's launch modes, or a usage error."""
    if value not in LAUNCH_MODES:
        raise UsageError(f"invalid --launch {value[:40]!r}", f"pass one of {', '.join(LAUNCH_MODES)}")


def no_filter_warning(entry: dict, body: dict) -> list[str]:
    """A template without an offer filter: instances may land on hosts whose driver cannot run the image."""
    if body["extra_filters"]:
        return []
    return [
        f"warning: the release entry of {entry['tag']} names no CUDA version: the template has no offer filter, so "
        "instances may land on hosts whose driver cannot run the image\n"
        "hint: publish it again with this imagekit (its manifest records the cell's CUDA)"
    ]


_ID = re.compile(r"[0-9]{1,12}", re.ASCII)
_STATUS = {"running": "RUNNING", "frozen": "RUNNING", "stopped": "EXITED"}  # intended_status: GPU billed or not


def reap_pod(doc: dict, records: list[reap.Record]) -> reap.Pod | None:
    """An instance of Vast's ``GET /instances/`` as `pod reap` reads it (Vast's answer is another party's, like
    RunPod's): its numeric ``id``; the mark in ``extra_env`` (``[[NAME, VALUE], ...]``, which also holds port
    options); its ``intended_status`` (running or frozen: the GPU bills; stopped: the disk only); ``start_date``
    (seconds since the epoch), ``dph_total`` ($/h), ``gpu_util`` (0-100, as Vast's own CLI shows it), ``label``.
    `pod create` rents on RunPod only, so no record names a Vast instance."""
    import datetime as dt

    ident = doc.get("id")
    if isinstance(ident, bool) or not isinstance(ident, int) or not _ID.fullmatch(str(ident)):
        return None
    pairs = doc.get("extra_env") if isinstance(doc.get("extra_env"), list) else []
    env = {p[0]: p[1] for p in pairs if isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)}
    label = doc.get("label")
    name = printable(label, 80) if isinstance(label, str) and label else "?"
    status = _STATUS.get(doc.get("intended_status"), "?") if isinstance(doc.get("intended_status"), str) else "?"
    start = doc.get("start_date")
    started = None
    if isinstance(start, (int, float)) and not isinstance(start, bool) and math.isfinite(start) and 0 < start < 1e11:
        started = dt.datetime.fromtimestamp(start, dt.UTC)
    ours, created, deadline = reap.whose(str(ident), env, records, started)
    util = reap.percent(doc.get("gpu_util"))
    work = None if util is None else (util,)
    return reap.Pod(str(ident), name, status, ours, created, started, deadline, reap.price(doc, ("dph_total",)), work)


PROVIDER = Provider(
    facts.provider_named("vast"),
    account_key="VAST_API_KEY",
    template_api="/template/",
    template=template,
    command=TemplateCommand(
        display="Vast",
        summary="Print the Vast.ai template for a published image; --create makes it on Vast (its hash_id is printed).",
        api_url_help="Vast's template endpoint.",
        examples=("cu121-torch2.1.2-py3.11-tf4.48.2", "CELL --launch entrypoint", "CELL --login --create"),
        options=(
            TemplateOption(
                "launch",
                str,
                "ssh",
                "Vast's launch mode: ssh and jupyter replace the image's entrypoint (the start check runs from "
                "onstart); entrypoint keeps it.",
                "|".join(LAUNCH_MODES),
                check=check_launch,
                check_first=True,
            ),
            TemplateOption("login", bool, False, "The image is private: Vast asks for the registry's credentials."),
        ),
        warnings=no_filter_warning,
        unit="instance",
        made_id="hash_id",
        created_note=" (launch mode {launch})",
    ),
    reap_pod=reap_pod,
)
