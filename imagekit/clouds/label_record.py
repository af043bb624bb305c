"""A published image's release as its own config tells it: the entry the templates and `pod create` read, made from
the imagekit labels of an image in a registry when no release record of it is at hand (pure).

Every image imagekit builds carries its cell, versions and runtime contract as OCI labels (`image.naming.labels`):
``imagekit.cell``, ``imagekit.cuda``, ``imagekit.torch``, ``imagekit.transformers``, ``imagekit.python``,
``imagekit.driver.min``, ``imagekit.archs`` and ``imagekit.runtime``. A registry's answer is another party's data: a
config without them is not an imagekit image, and labels not as imagekit writes them are refused naming the label;
what passes is checked again by the release record's own check (`oci.release_record.entry_problems`), so a template
reads it as it reads a record. What the labels do not say and a record does: the self-test's report (left unsaid),
whether JupyterLab is in the image (left unsaid: the templates open 22/tcp only) and the unpacked size (estimated
from the compressed layers). The entry is ``pinned``: a template or pod made of it names the digest the labels
were read from, never a tag that may have moved since.
"""

from __future__ import annotations

from imagekit.compat import contract
from imagekit.errors import UsageError
from imagekit.image import naming
from imagekit.model import AMD64, variant_of
from imagekit.oci import image_index, release_record
from imagekit.trust import untrusted, validate

# The uncompressed bytes of an imagekit image over its compressed layers' (5.58 GB over 2.98 GB for the cu121 demo
# image's release record), rounded up: the container disk is sized from it as from a record's size.
SIZE_FACTOR = 2
REQUIRED = ("imagekit.cell", "imagekit.cuda", "imagekit.torch")
_LIMITS = {"imagekit.runtime": 1024, "imagekit.archs": 1024}  # every other label imagekit reads: 64 characters
NOT_IMAGEKIT_HINT = (
    "name an image `imagekit build --push` published (its config carries imagekit.* labels), or a cell or tag of "
    "the release index (--release-index)"
)
MALFORMED_HINT = "publish it again with this imagekit (`imagekit build --push`), or use its release record"


def labels_of(config: object, where: str) -> dict[str, str]:
    """The imagekit labels of an image config (``config.Labels``), each a short single-line text; an image with none
    of them is refused as not an imagekit image."""
    inner = config.get("config") if isinstance(config, dict) else None
    found = inner.get("Labels") if isinstance(inner, dict) else None
    if found is not None and not isinstance(found, dict):
        raise UsageError(f"{where} is not an imagekit image: its config's Labels is not an object", NOT_IMAGEKIT_HINT)
    ours = {k: v for k, v in (found or {}).items() if isinstance(k, str) and k.startswith("imagekit.")}
    if not ours:
        raise UsageError(f"{where} is not an imagekit image: its config has no imagekit.* labels", NOT_IMAGEKIT_HINT)
    missing = [key for key in REQUIRED if key not in ours]
    if missing:
        raise UsageError(f"{where}: its config has no {', '.join(missing)} label", MALFORMED_HINT)
    for key, value in ours.items():
        try:
            untrusted.bounded_text(value, f"label {untrusted.printable(key, 40)}", _LIMITS.get(key, 64))
        except untrusted.UntrustedData as exc:
            raise UsageError(f"{where}: {exc}", MALFORMED_HINT) from None
    return ours


def _refused(where: str, what: str) -> UsageError:
    return UsageError(f"{where}: its imagekit labels are not as imagekit writes them: {what}", MALFORMED_HINT)


def runtime_of(labels: dict[str, str], cell: dict, platform: str, where: str) -> dict | None:
    """The runtime contract of label ``imagekit.runtime`` as a record carries it (None for an image built before
    the contract: its cell's facts give it, as for such a record), checked as a record's is."""
    text = labels.get("imagekit.runtime")
    if text is None:
        return None
    runtime: dict = dict(naming.parse_runtime_label(text))
    major = runtime.get("cuda_major")
    runtime["cuda_major"] = int(major) if isinstance(major, str) and major.isdigit() and len(major) < 3 else major
    problems = contract.problems(runtime, cell)
    if problems:
        raise _refused(where, "imagekit.runtime " + "; ".join(problems[:3]))
    if runtime["platform"] != platform:
        raise _refused(where, f"imagekit.runtime names {runtime['platform']}, the image is {platform}")
    return runtime


def _cell(labels: dict[str, str], platform: str, where: str) -> dict:
    try:
        cuda = validate.cuda(labels["imagekit.cuda"])
    except UsageError as exc:
        raise _refused(where, f"imagekit.cuda: {exc.message}") from None
    if cuda != labels["imagekit.cuda"]:
        raise _refused(where, f"imagekit.cuda {labels['imagekit.cuda']!r} is not major.minor")
    checks = {
        "imagekit.torch": validate.version,
        "imagekit.transformers": validate.version,
        "imagekit.python": validate.python,
        "imagekit.driver.min": validate.driver,
    }
    for key, check in checks.items():
        if key in labels:
            try:  # a label is printed into a template's readme and a pod's filters: a version, or refused
                check(labels[key])
            except UsageError:
                raise _refused(where, f"{key} {untrusted.printable(labels[key], 64)!r}") from None
    cell = {
        "id": labels["imagekit.cell"],
        "cuda": cuda,
        "torch": labels["imagekit.torch"],
        "variant": variant_of(cuda),
        "transformers": labels.get("imagekit.transformers"),
        "python": labels.get("imagekit.python"),
    }
    return cell | ({"platform": platform} if platform != AMD64 else {})


def _archs(labels: dict[str, str], where: str) -> list[str]:
    """``imagekit.archs`` (``sm_80,sm_90,sm_90+PTX``): the architectures torch has cubins for."""
    text = labels.get("imagekit.archs")
    if not text:
        return []
    archs = [a for a in text.split(",") if not a.endswith("+PTX")]
    bad = next((a for a in archs if not contract.SM.fullmatch(a)), None)
    if bad is not None or len(archs) > 64:
        raise _refused(where, f"imagekit.archs {untrusted.printable(text, 60)!r}")
    return archs


def entry(repository: str, tag: str | None, digest: str, config: object, compressed: int) -> dict:
    """The release entry of the image ``repository@digest`` (found by ``tag``, or by the digest alone) whose config
    is ``config`` (another party's JSON) and whose layers are ``compressed`` bytes: refused (a usage error naming
    what is wrong) unless its imagekit labels are all there and as imagekit writes them."""
    where = f"{repository}@{digest}"
    labels = labels_of(config, where)
    try:
        platform = image_index.platform_of_config(config if isinstance(config, dict) else {})
    except untrusted.UntrustedData as exc:
        raise _refused(where, str(exc)) from None
    cell = _cell(labels, platform, where)
    manifest: dict = {"cell": cell, "torch": {"archs": _archs(labels, where)}}
    if "imagekit.driver.min" in labels:
        manifest["driver"] = {"minimum": labels["imagekit.driver.min"]}
    runtime = runtime_of(labels, cell, platform, where)
    if runtime is not None:
        manifest["runtime"] = runtime
    made = {
        "tag": f"{repository}:{tag or cell['id']}",  # by digest alone: the cell's alias, pinned (the digest wins)
        "alias": f"{repository}:{cell['id']}",
        "digest": digest,
        "reference": where,
        "size_bytes": min(compressed * SIZE_FACTOR, release_record.MAX_IMAGE_BYTES),
        "compressed_bytes": compressed,
        "manifest": manifest,
        "pinned": True,
        "source": f"the image's labels at {where}",
    }
    problems = release_record.entry_problems(made)
    if problems:
        raise _refused(where, "; ".join(problems[:3]))
    return made
