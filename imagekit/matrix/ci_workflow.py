"""The GitHub Actions workflow `imagekit ci init` writes (pure: options in, YAML text out; never writes)."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from urllib.parse import urlsplit

import jinja2

from imagekit.errors import UsageError
from imagekit.image.render import sources
from imagekit.trust import validate
from imagekit.trust.redact import redact_text
from imagekit.trust.untrusted import printable

DEFAULT_OUT = ".github/workflows/images.yml"
WHEEL_DIR = ".github/imagekit"  # the wheel of the imagekit that wrote the workflow, committed with it
LOCK_MODES = ("fail", "commit")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", re.ASCII)
_HOSTED_AMD64 = re.compile(r"ubuntu-(latest|[0-9]{2}\.[0-9]{2})|windows-.*|macos-[0-9]{2}-large", re.ASCII)
# A pip requirement or path as one shell word: `imagekit==0.4.0`, `.`, `git+https://host/org/imagekit@v1`.
_INSTALL = re.compile(r"[A-Za-z0-9._@:/+=<>~!,\[\]-]{1,300}", re.ASCII)
# A requirement by name (what only an index can serve), as opposed to a path, a URL or a VCS reference.
_WHEEL_DIR = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]*(/[A-Za-z0-9._][A-Za-z0-9._-]*)*", re.ASCII)
_BY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]*\])?([=<>~!][=<>~!A-Za-z0-9.*+,]*)?", re.ASCII)
# A credential in --install's URLs (the workflow is committed: whoever reads the repository would read it): what
# trust.redact hides, but a user name for SSH (git+ssh://git@...) and a path segment of lowercase hex (a commit id,
# PyPI's content-addressed /packages/<hash>/ folders), which name content, not a secret.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")
_SECRET_PARAM = re.compile(r"token|key|secret|passw|auth|sig|credential", re.I)
_TOKENISH = re.compile(r"(?=[A-Za-z0-9_]*[0-9])(?=[A-Za-z0-9_]*[A-Za-z])[A-Za-z0-9_]{20,}", re.ASCII)
_HEX = re.compile(r"[0-9a-f]+", re.ASCII)
_SSH_SCHEMES = ("ssh", "git+ssh")
SECRET_HINT = (
    "keep it in a repository secret (Settings > Secrets and variables > Actions, e.g. INDEX_PASSWORD) and let the "
    "jobs hand it to pip: leave --install out (the committed wheel needs no credentials), or install by name "
    '(--install imagekit==X) and give the "Install imagekit" steps `env: PIP_INDEX_URL: '
    "https://USER:${{ secrets.INDEX_PASSWORD }}@HOST/simple`; for a private git repository, a step before them "
    'running `git config --global url."https://x-access-token:${{ secrets.GH_TOKEN }}@github.com/".insteadOf '
    "https://github.com/`"
)


@dataclass(frozen=True)
class Wheel:
    """The committed wheel the jobs install, checked against its sha256 first."""

    path: str  # relative to the repository's root: .github/imagekit/imagekit-0.1.0-py3-none-any.whl
    sha256: str


@dataclass(frozen=True)
class CiOptions:
    registry: str | None = None  # REG/REPO; None: ghcr.io/<owner>/<repo> of the repository the workflow runs in
    gpu_runner: tuple[str, ...] = ()  # runs-on labels of a GPU runner; empty: ubuntu-latest, GPU checks skipped
    install: str | None = None  # what `pip install` gets imagekit from; None: the committed wheel
    locks: str = "fail"  # stale or missing locks, resolved on the runner: fail the plan with the diff, or commit them
    wheel_dir: str = WHEEL_DIR  # where the committed wheel lies, relative to the repository's root
    arm64_runner: tuple[str, ...] = ()  # runs-on labels of a linux/arm64 runner; empty: arm64 cells emulated
    reap: bool = False  # also write .github/workflows/reap.yml: `imagekit pod reap` every half hour
    reap_older_than: str | None = None  # its --older-than (a duration), or None: deadlines only
    # (provider, its account key variable) a reaper's step each, as --reap-provider gave them; empty: `pod create`'s
    reap_providers: tuple[tuple[str, str], ...] = ()
    pages: bool = False  # a job after the release: `imagekit release page`, published with GitHub Pages


def requirement_name(install: str) -> str | None:
    """The project name when ``install`` asks an index for it by name (``imagekit``, ``imagekit==0.4``), else
    None (a path, a URL, a VCS reference: pip needs no index to find it)."""
    if not _BY_NAME.fullmatch(install) or install in (".", ".."):
        return None
    return re.split(r"[\[=<>~!]", install, maxsplit=1)[0]


def credential_in(install: str) -> str | None:
    """What in ``install`` is a credential (a password or token in a URL's user-info, a secret-looking query value, a
    token-like path segment), or None. A URL that cannot be parsed but has user-info counts as one."""
    for url in _URL_IN_TEXT.findall(install):
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - a port that is not a number raises here
        except ValueError:
            if "@" in url.split("://", 1)[1].split("/", 1)[0]:
                return "a URL with user-info that cannot be parsed"
            continue
        if parts.password is not None:
            return "a password in a URL's user-info"
        if parts.username is not None and parts.scheme.lower() not in _SSH_SCHEMES:
            return "a user name (a token?) in a URL's user-info"
        for pair in parts.query.split("&"):
            key, sep, value = pair.partition("=")
            if sep and value and _SECRET_PARAM.search(key):
                return "a secret-looking query parameter"
        if any(_TOKENISH.fullmatch(seg) and not _HEX.fullmatch(seg) for seg in parts.path.split("/")):
            return "a token-like path segment"
    return None


def shown(value: str, limit: int = 120) -> str:
    """A user's value as an error shows it: URLs redacted (user-info, secret queries, tokens), printable, cut."""
    return printable(redact_text(value), limit)


def validated(
    registry: str | None,
    gpu_runner: list[str] | None,
    install: str | None,
    locks: str = "fail",
    wheel_dir: str = WHEEL_DIR,
    arm64_runner: list[str] | None = None,
) -> CiOptions:
    if registry is not None:
        try:
            validate.repository(registry)
        except UsageError as exc:
            raise UsageError(exc.message, "pass REGISTRY/REPO, for example ghcr.io/acme/train") from None
    for flag, labels in (("--gpu-runner", gpu_runner), ("--arm64-runner", arm64_runner)):
        for label in labels or ():
            if not _LABEL.fullmatch(label):
                raise UsageError(
                    f"invalid {flag} {printable(label, 60)!r}",
                    "a runner label: a letter or digit, then letters, digits, '.', '_' and '-' (for example gpu, "
                    "self-hosted or ubuntu-24.04-arm)",
                )
    for label in arm64_runner or ():
        if _HOSTED_AMD64.fullmatch(label):
            raise UsageError(
                f"--arm64-runner {label}: GitHub's {label} runners are x86_64",
                "name an arm64 runner (GitHub's ubuntu-24.04-arm, or your Grace machine's label); without "
                "--arm64-runner, arm64 cells build emulated on amd64 runners",
            )
    gpu_runner = list(dict.fromkeys(gpu_runner or ()))
    arm64_runner = list(dict.fromkeys(arm64_runner or ()))
    found = credential_in(install) if install is not None else None
    if install is not None and found is not None:
        raise UsageError(
            f"--install {shown(install)!r} holds a credential ({found}): the workflow is committed, so everyone who "
            "can read the repository would read it; nothing was written",
            SECRET_HINT,
        )
    if install is not None and (not _INSTALL.fullmatch(install) or install.startswith("-")):
        raise UsageError(
            f"invalid --install {shown(install)!r}",
            "a pip requirement or path without spaces or quotes: ., ./imagekit-0.1.0-py3-none-any.whl, "
            "git+https://..., or imagekit==X from an index that serves it",
        )
    if locks not in LOCK_MODES:
        raise UsageError(f"invalid --locks {locks!r}", "fail (the plan fails with the diff) or commit")
    wheel_dir = wheel_dir.rstrip("/") or wheel_dir
    if not _WHEEL_DIR.fullmatch(wheel_dir) or ".." in wheel_dir.split("/") or len(wheel_dir) > 200:
        raise UsageError(
            f"invalid --wheel-dir {wheel_dir!r}",
            "a folder inside the repository, relative to its root: letters, digits, '.', '_', '-' and '/' "
            "(the default is .github/imagekit)",
        )
    return CiOptions(registry, tuple(gpu_runner or ()), install, locks, wheel_dir, tuple(arm64_runner or ()))


def unreachable_refusal(registry: str, why: str, given: bool) -> UsageError:
    """The error for a workflow that would push to ``registry``, which no hosted runner reaches (``why``: a loopback,
    private or single-label registry, as `clouds.pull.unreachable_registry` says). No flag overrides it: the plan and
    release jobs run on GitHub's hosted runners whatever --gpu-runner says, and the release job asks the registry for
    every record (`release merge`), so even a self-hosted build runner that reaches its own registry leaves a release
    job that cannot; such a setup edits the written workflow's runs-on and registry by hand."""
    where = "--registry" if given else "the matrix file's [image] repository"
    return UsageError(
        f"{where} {printable(registry, 120)}: {why}: the workflow's jobs run on GitHub's hosted runners (plan and "
        "release always), which cannot reach it, so every build would push nowhere; nothing was written",
        "pass --registry for a registry the runners reach, e.g. --registry ghcr.io/OWNER/REPO (GITHUB_TOKEN pushes "
        "there; leaving --registry out with no [image] repository picks it)",
    )


def command_line(opts: CiOptions) -> str:
    words = ["imagekit", "ci", "init"]
    if opts.install is not None:
        words += ["--install", opts.install]
    if opts.locks != "fail":
        words += ["--locks", opts.locks]
    if opts.wheel_dir != WHEEL_DIR:
        words += ["--wheel-dir", opts.wheel_dir]
    if opts.registry:
        words += ["--registry", opts.registry]
    for label in opts.gpu_runner:
        words += ["--gpu-runner", label]
    for label in opts.arm64_runner:
        words += ["--arm64-runner", label]
    if opts.pages:
        words += ["--pages"]
    if opts.reap:
        words += ["--reap"] + (["--reap-older-than", opts.reap_older_than] if opts.reap_older_than else [])
        words += [w for name, _ in opts.reap_providers for w in ("--reap-provider", name)]
    return shlex.join(words)


REAP_OUT = ".github/workflows/reap.yml"


def reap_workflow(opts: CiOptions, reaped: tuple[tuple[str, str], ...], wheel: Wheel | None = None) -> str:
    """.github/workflows/reap.yml: `imagekit pod reap` on a schedule, a step per provider of ``reaped`` ((name,
    account key variable); named with --provider when --reap-provider named them), each with its account key from a
    repository secret named as the variable."""
    return (
        _environment()
        .get_template("reap.yml.j2")
        .render(
            command=command_line(opts),
            install_run=install_run(opts, wheel),
            older_than=opts.reap_older_than,
            providers=reaped,
            named=bool(opts.reap_providers),
        )
    )


def reap_option(reap: bool, older_than: str | None) -> str | None:
    """--reap-older-than, checked as `pod reap --older-than` reads it (it needs --reap)."""
    from imagekit.in_image import facts

    if older_than is None:
        return None
    if not reap:
        raise UsageError("--reap-older-than needs --reap", "pass --reap too")
    try:
        facts.parse_duration(older_than, "--reap-older-than")
    except facts.SettingError as exc:
        raise UsageError(str(exc), "for example --reap-older-than 12h") from None
    return older_than


def _environment() -> jinja2.Environment:
    # [[ ]] and [% %]: the workflow is full of GitHub's own ${{ }} expressions, which stay as written.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(sources().root / "templates" / "ci")),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        variable_start_string="[[",
        variable_end_string="]]",
        block_start_string="[%",
        block_end_string="%]",
        comment_start_string="[#",
        comment_end_string="#]",
    )


def install_run(opts: CiOptions, wheel: Wheel | None) -> str:
    """The `run:` of every "Install imagekit" step (a YAML block under a step at six spaces)."""
    if opts.install is not None:
        return f"python -m pip install '{opts.install}'"
    if wheel is None:
        raise ValueError("the committed wheel is needed when --install is not given")
    return (
        "|\n"
        f'          echo "{wheel.sha256}  {wheel.path}" | sha256sum --check --strict -\n'
        f'          python -m pip install "{wheel.path}"'
    )


def secrets_note(opts: CiOptions) -> str:
    """What the user adds to the repository before the first run."""
    host = registry_host(opts.registry)
    if host == "ghcr.io":
        return (
            "no secret to add: GITHUB_TOKEN pushes to ghcr.io (Settings > Actions > General > Workflow permissions: "
            "the workflow asks for packages: write)"
        )
    return f"add the repository secrets REGISTRY_USERNAME and REGISTRY_PASSWORD for {host} (Settings > Secrets)"


def registry_host(registry: str | None) -> str:
    host = registry.split("/", 1)[0] if registry else "ghcr.io"
    if registry and not ("." in host or ":" in host or host == "localhost"):
        host = "docker.io"
    return host


def workflow(opts: CiOptions, wheel: Wheel | None = None) -> str:
    """.github/workflows/images.yml: plan -> build (one runner per cell) -> release; compat on the schedule."""
    host = registry_host(opts.registry)
    ghcr = host == "ghcr.io"
    if len(opts.gpu_runner) > 1:
        runs_on = "[" + ", ".join(opts.gpu_runner) + "]"
    else:
        runs_on = opts.gpu_runner[0] if opts.gpu_runner else "ubuntu-latest"
    gpu_flags = "--gpus on --require-gpu" if opts.gpu_runner else "--gpus off"
    if opts.arm64_runner:  # linux/arm64 cells on their own runner (its GPU used when it has one)
        amd = json.dumps(list(opts.gpu_runner) or ["ubuntu-latest"], separators=(",", ":"))
        arm = json.dumps(list(opts.arm64_runner), separators=(",", ":"))
        runs_on = f"${{{{ fromJSON(matrix.platform == 'linux/arm64' && '{arm}' || '{amd}') }}}}"
        gpu_flags = f"${{{{ matrix.platform == 'linux/arm64' && '--gpus auto' || '{gpu_flags}' }}}}"
    elif opts.gpu_runner:  # emulated arm64 has no GPU to require
        gpu_flags = f"${{{{ matrix.platform == 'linux/arm64' && '--gpus off' || '{gpu_flags}' }}}}"
    return (
        _environment()
        .get_template("images.yml.j2")
        .render(
            command=command_line(opts),
            install_run=install_run(opts, wheel),
            wheel_dir=opts.wheel_dir if opts.install is None else None,
            commit_locks=opts.locks == "commit",
            registry=opts.registry,
            registry_host=host,
            user="github.actor" if ghcr else "secrets.REGISTRY_USERNAME",
            password="secrets.GITHUB_TOKEN" if ghcr else "secrets.REGISTRY_PASSWORD",
            runs_on=runs_on,
            gpu_runner=bool(opts.gpu_runner),
            gpu_flags=gpu_flags,
            arm64_runner=bool(opts.arm64_runner),
            pages=opts.pages,
        )
    )
