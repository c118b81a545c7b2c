"""The desired state of one machine, as frozen pydantic models.

Built by `reconcile.spec.loader` from a TOML file; read by the planner, the probes (to know what to
look at) and the actions. Every field's description is its documentation (`reconcile schema`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from reconcile.record import Record
from reconcile.safety.sensitive import secret_args
from reconcile.spec import roles
from reconcile.spec.values import (
    DURATION_PATTERN,
    DURATIONS,
    HOST_RULE,
    INSIDE,
    ONE_WORD,
    absolute,
    apt_keyring,
    apt_name,
    apt_uri,
    apt_word,
    env_name,
    flag_names,
    flag_values,
    haproxy_word_problem,
    host,
    locked_line,
    no_bool,
    own_dir,
    package_name,
    quoted,
    relative_name,
    spec_duration,
    specifier,
)


class Expect(Record):
    """What a value must be, in words; read by the loader's error messages and `reconcile schema`."""

    noun: str  # "a port": completes "X is not ..."
    allowed: str  # "an integer 1-65535": what to write instead


# Every path the spec names is typed with its role (reconcile.spec.roles: what root does with it);
# reconcile.spec.roles.PATHS lists the same fields for the warm path, held to these by a test.
_ABS = Expect("an absolute path", "a path starting with /")
ReadPath = Annotated[str, AfterValidator(absolute), roles.READ, _ABS]
WritePath = Annotated[str, AfterValidator(absolute), roles.WRITE, _ABS]
ExecPath = Annotated[str, AfterValidator(absolute), roles.EXEC, _ABS]
DeletePath = Annotated[str, AfterValidator(absolute), roles.DELETE, _ABS]
LinkPath = Annotated[str, AfterValidator(absolute), roles.LINK, _ABS]
DataPath = Annotated[str, AfterValidator(absolute), roles.DATA, _ABS]
ExecCommand = Annotated[str, roles.EXEC]  # a name on PATH or an absolute path
# For editors (`reconcile schema --json`): what a spec may hold, not the float it becomes.
_DURATION_SCHEMA = {
    "anyOf": [
        {"type": "number", "exclusiveMinimum": 0},
        {"type": "string", "pattern": DURATION_PATTERN},
    ]
}
Duration = Annotated[
    float, BeforeValidator(spec_duration), WithJsonSchema(_DURATION_SCHEMA), Expect("a duration", DURATIONS)
]
WriteDir = Annotated[str, AfterValidator(absolute), AfterValidator(own_dir), roles.WRITE_DIR, _ABS]
SharedDir = Annotated[str, AfterValidator(absolute), roles.WRITE_DIR, _ABS]  # a system dir we write into
EnvName = Annotated[
    str,
    AfterValidator(env_name),
    Expect("an environment variable name", "letters, digits and _, not starting with a digit"),
]
Int = Annotated[int, BeforeValidator(no_bool)]
VersionSpec = Annotated[
    str, AfterValidator(specifier), Expect("a version specifier", '"*", "==0.26.0", ">=0.26.0rc1", "~=1.11"')
]
PackageName = Annotated[
    str, AfterValidator(package_name), Expect("a package name", "letters, digits, '.', '_', '-'")
]
AptPackage = Annotated[
    str, AfterValidator(apt_name), Expect("an apt package", 'a lowercase name or "name=version"')
]
Port = Annotated[int, BeforeValidator(no_bool), Field(ge=1, le=65535), Expect("a port", "an integer 1-65535")]
Host = Annotated[str, AfterValidator(host), Expect("a host", HOST_RULE)]
Scalar = str | int | float | bool
ArgValue = Annotated[
    Scalar | list[Scalar] | dict[str, Any],
    Expect("a flag value", "a string, number, true/false, a list of those, or a table for a JSON flag"),
    roles.VALUE,  # a path in it (--chat-template, --download-dir) is held to the environment's rule
]
EnvValue = Annotated[str, roles.VALUE]  # a path in it (VLLM_CACHE_ROOT, HF_HOME) likewise
IndexUrl = Annotated[str, roles.INDEX]  # a file:// index (or a path) is a wheelhouse by another name
GpuArch = Annotated[
    str,
    Field(pattern=r"^(compute|sm|lto)_\d+[a-z]?$"),
    Expect("an nvcc arch", 'as `nvcc --list-gpu-arch` prints it, e.g. "compute_120"'),
]


def _at(key: str, message: str) -> PydanticCustomError:
    """A model-level error pinned to one of the model's keys (the loader reports that key's line)."""
    return PydanticCustomError("spec", message, {"at": tuple(key.split("."))})


def _at_parts(parts: tuple[str | int, ...], message: str) -> PydanticCustomError:
    """`_at` for a key whose parts may hold dots (a deployment's name)."""
    return PydanticCustomError("spec", message, {"at": parts})


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=False, validate_default=True, defer_build=True
    )


class Machine(_Model):
    hostname: str | None = Field(
        None, description="Host this spec is for; plan warns when it runs elsewhere."
    )
    state_dir: WriteDir = Field(
        "/var/lib/reconcile", description="Where the lock, generations and last-run report live."
    )
    description: str = Field("", description="Free text shown in the plan header.")


class Gpu(_Model):
    count: Int | None = Field(None, ge=0, description="How many GPUs must be visible (None: any).")
    name: str | None = Field(None, description='Expected GPU name as NVML reports it, e.g. "NVIDIA H200".')
    compute_capability: Annotated[str | None, Expect("a compute capability", 'major.minor, e.g. "12.0"')] = (
        Field(None, pattern=r"^\d+\.\d+$", description='Expected compute capability, e.g. "12.0" for sm_120.')
    )
    memory_gib: Annotated[float, BeforeValidator(no_bool)] | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Memory per GPU in GiB, used by the preflight when no GPU can be probed.",
    )
    min_driver: Annotated[str | None, Expect("a driver version", 'dotted numbers, e.g. "580.95"')] = Field(
        None, pattern=r"^\d+(\.\d+)*$", description='Lowest acceptable driver version, e.g. "580.95".'
    )


class Cuda(_Model):
    home: LinkPath = Field("/usr/local/cuda", description="CUDA_HOME: a symlink to the toolkit in use.")
    target: ReadPath | None = Field(
        None, description="Where `home` must point (None: leave the symlink alone, only check it)."
    )
    gpu_arch: list[GpuArch] = Field(
        default_factory=list,
        description='Entries that `nvcc --list-gpu-arch` must print, e.g. ["compute_120"].',
    )
    min_version: Annotated[str | None, Expect("a CUDA version", 'major.minor, e.g. "12.9"')] = Field(
        None, pattern=r"^\d+\.\d+$", description='Lowest nvcc release, e.g. "12.9" (sm_120 needs it).'
    )
    headers: list[str] = Field(
        default_factory=list,
        description="Headers FlashInfer's JIT compiles against; looked up in the toolkit's include dirs.",
    )


# A name that becomes a path component (<state_dir>/deployments/<name>/, <name>.pid,
# liveness-<name>.json, reconcile-<name>.list) and a unit name: bounded far below NAME_MAX (255), so that
# a long one is refused at load, not by ENAMETOOLONG halfway through an apply (issue 24, 4th round).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
NAME_RULE = "letters, digits, '.', '_', '-'; a letter or digit first; at most 64"


class AptRepository(_Model):
    name: Annotated[str, Expect("a repository name", f"{NAME_RULE}; a file stem")] = Field(
        pattern=NAME_PATTERN,
        description="File stem under /etc/apt/sources.list.d/ (reconcile-<name>.list).",
    )
    uri: Annotated[
        str,
        roles.LOCATION,  # a URL on this machine: who listens there (its signature is the keyring's)
        AfterValidator(apt_uri),
        Expect("a repository URI", "scheme:address without spaces, quotes, brackets or #"),
    ] = Field(description="Repository URI (http(s):// or file:/).")
    suite: Annotated[
        str, AfterValidator(lambda v: apt_word("an apt suite", v)), Expect("an apt suite", ONE_WORD)
    ] = Field(description='Suite, e.g. "/" for a flat repository or "bookworm".')
    components: list[
        Annotated[
            str, AfterValidator(lambda v: apt_word("an apt component", v)), Expect("a component", ONE_WORD)
        ]
    ] = Field(default_factory=list, description="Components (empty for flat).")
    keyring: (
        Annotated[
            WritePath,
            AfterValidator(apt_keyring),
            Expect("a keyring path", "an absolute path without spaces, quotes, brackets, commas or #"),
        ]
        | None
    ) = Field(None, description="Keyring file used as signed-by (typically under /etc/apt/keyrings).")
    key_source: ReadPath | None = Field(
        None, description="A local key file that apply copies to `keyring` when that is missing."
    )
    trusted: StrictBool = Field(
        False, description="Mark the source [trusted=yes] (local test repositories only)."
    )

    @model_validator(mode="after")
    def _key_or_trusted(self) -> AptRepository:
        if not self.trusted and self.keyring is None:
            raise _at("keyring", "missing (a keyring path, or trusted = true for a local test repository)")
        return self


class Apt(_Model):
    packages: list[AptPackage] = Field(
        default_factory=list, description='Packages that must be installed; "name=version" pins.'
    )
    repositories: list[AptRepository] = Field(default_factory=list, description="Extra apt sources.")
    sources_dir: SharedDir = Field(
        "/etc/apt/sources.list.d", description="Where repository files are written."
    )


class Venv(_Model):
    path: WriteDir = Field(description="The virtual environment's directory.")
    python: ExecCommand = Field(
        "python3", description="Interpreter used to create it (a name on PATH or a path)."
    )
    index_url: IndexUrl | None = Field(None, description="pip --index-url.")
    extra_index_urls: list[IndexUrl] = Field(
        default_factory=list, description="pip --extra-index-url, in order."
    )
    packages: Annotated[
        dict[PackageName, VersionSpec],
        Expect("a table", 'name = "version specifier" pairs, e.g. { vllm = ">=0.26", ninja = "*" }'),
    ] = Field(default_factory=dict, description='Distribution -> version specifier ("*" for any).')
    closure: list[
        Annotated[
            str,
            AfterValidator(locked_line),
            Expect("a locked distribution", '"name==version --hash=sha256:<64 hex>"'),
        ]
    ] = Field(
        default_factory=list,
        description="Not written in a spec: plan and apply fill it in from the lock file (`reconcile lock`): "
        "every distribution of the dependency closure, installed with hash checking.",
    )
    wheelhouse: ReadPath | None = Field(
        None, description="Install offline from this directory (--no-index --find-links)."
    )
    no_deps: StrictBool = Field(False, description="pip --no-deps (an explicit, complete package list).")
    system_site_packages: StrictBool = Field(False, description="Create with --system-site-packages.")
    extra_site_packages: list[ReadPath] = Field(
        default_factory=list,
        description="Other environments' site-packages made visible through a .pth file.",
    )
    installer: Literal["auto", "pip", "uv"] = Field(
        "auto", description="auto: uv when it is on PATH, else pip."
    )
    store: Annotated[
        DeletePath | Literal[False] | None,
        Expect(
            "a store directory or false", 'an absolute path, e.g. "/var/lib/reconcile/store"; false: no store'
        ),
    ] = Field(
        None,
        description="Where realizations live (default <state_dir>/store): each venv built once at "
        "<store>/<hash>-venv, each model at <store>/<hash>-model over its blobs in <store>/hub, and `path` "
        "and [model].dir links to the current ones, so generations switch and roll back offline. false: "
        "no store (one venv and one model dir, changed in place: a rollback reinstalls and downloads).",
    )


class Model(_Model):
    repo: str | None = Field(None, description='Hugging Face repo id, e.g. "nvidia/NVIDIA-Nemotron-...".')
    revision: str = Field("main", description="Branch, tag or commit; resolved to a commit and recorded.")
    source: DataPath | None = Field(None, description="A local directory to copy from instead of the hub.")
    dir: WriteDir = Field(description="Where the model's files live.")
    allow_patterns: list[str] = Field(default_factory=list, description="Only these files (globs).")
    max_workers: Int = Field(8, ge=1, le=64, description="Parallel downloads.")
    offline: StrictBool = Field(
        False, description="Never contact the hub: use what is there, name what is missing."
    )
    required_files: list[Annotated[str, AfterValidator(relative_name)]] = Field(
        default_factory=list,
        description="Files that must exist in `dir` (e.g. the reasoning-parser plugin, the chat template).",
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="Deep-merged into config.json (original kept as config.json.bak)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> Model:
        if self.repo and self.source:
            raise _at("source", "set with repo too (one of them: repo for the hub, source for a directory)")
        if self.repo is not None and not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", self.repo):
            raise _at("repo", f"{quoted(self.repo)} is not a hub repo id (owner/name)")
        for n, name in enumerate(self.required_files):
            if name.startswith("/") and not name.startswith(self.dir.rstrip("/") + "/"):
                where = {"at": ("required_files", n)}
                raise PydanticCustomError("spec", f"{quoted(name)} is outside the model dir {INSIDE}", where)
        return self


class ApiKey(_Model):
    file: WritePath = Field(description="Key file: generated once, mode 0600, passed as VLLM_API_KEY.")
    owner: str = Field("root", description="Owner of the key file.")
    group: str | None = Field(None, description="Group of the key file (None: the owner's group).")
    mode: Annotated[str, Expect("a file mode", 'octal digits, e.g. "0600"')] = Field(
        "0600", pattern=r"^0?[0-7]{3}$", description="File mode in octal."
    )


class BenchRow(_Model):
    prompt: Int = Field(ge=1, description="Prompt tokens of each request (vLLM's random dataset).")
    gen: Int = Field(ge=1, description="Tokens generated by each request (EOS ignored).")
    concurrency: Int = Field(1, ge=1, description="Requests in flight at once (--max-concurrency).")
    requests: Int | None = Field(None, ge=1, description="How many requests (default: concurrency).")


class Bench(_Model):
    gate: StrictBool = Field(
        False,
        description="After a switch passed its acceptance check, run the profile; a regression beyond "
        "`tolerance` against the previous serving generation's figures rolls back (exit 4).",
    )
    tolerance: float = Field(
        0.2, gt=0, lt=1, description="How much worse a gated figure may be, as a fraction (0.2: 20%)."
    )
    backend: Literal["openai-chat", "vllm"] = Field(
        "openai-chat", description="`vllm bench serve --backend`: the chat endpoint, or completions."
    )
    rows: list[BenchRow] = Field(
        default_factory=list,
        description="The profile; empty: the reference table scaled to max-model-len (prompts from 243 to "
        "116,524 tokens of 1M, 512 generated; 24 + 1,024; 8 concurrent x 512).",
    )
    timeout: Duration = Field(600.0, description="How long one row may run.")


class CrashLoop(_Model):
    max_starts: Int = Field(3, ge=1, description="Failed starts allowed within `window`.")
    window: Duration = Field(600.0, description='The window, e.g. "10m".')


LIVENESS_DEADLINE_MAX = 120.0


class Liveness(_Model):
    check: StrictBool = Field(
        True,
        description="Whether plan and apply check that the engine makes progress, beyond /health (which "
        "vLLM's API server answers 200 while its EngineCore is hung).",
    )
    deadline: Duration = Field(
        15.0,
        description="How long a 1-token keyed completion may take before the engine counts as stalled, if "
        'its generated-token counter did not move meanwhile, e.g. "15s"; at most 2m (a plan waits for it).',
    )
    window: Duration = Field(
        60.0,
        description="How long the engine must stay stalled (no tokens, no answer) before apply restarts it, "
        'counted across scheduled applies, e.g. "1m"; at most `deadline`: the first stalled check '
        "restarts it.",
    )

    @model_validator(mode="after")
    def _short_deadline(self) -> Liveness:
        if self.deadline > LIVENESS_DEADLINE_MAX:
            raise _at(
                "deadline",
                f"is {self.deadline:g}s; at most {LIVENESS_DEADLINE_MAX:g}s (plan and apply wait for it: "
                'a stall longer than that is what `window` is for, e.g. deadline = "15s", window = "5m")',
            )
        return self


class Server(_Model):
    name: Annotated[str, Expect("a deployment name", NAME_RULE)] = Field(
        pattern=NAME_PATTERN, description="Deployment name (marker, unit)."
    )
    supervisor: Literal["process", "systemd"] = Field(
        "process", description="process: a detached session of our own; systemd: a generated unit."
    )
    running: StrictBool = Field(
        True, description="Whether the server must be running (false: apply stops it and keeps it stopped)."
    )
    user: str | None = Field(
        None,
        pattern=r"^[a-z_][a-z0-9_-]*[$]?$",
        description='supervisor = "systemd": the unit\'s User= (default root). The account needs read access '
        "to the model dir and the GPU devices; its caches (~/.cache, ~/.triton, ~/.nv) stay writable.",
    )
    executable: ExecPath | None = Field(None, description="The vllm executable (default: <venv>/bin/vllm).")
    model: str | None = Field(None, description="What `vllm serve` is given (default: model.dir).")
    host: Host = Field("127.0.0.1", description="--host (behind [front]: the address HAProxy binds).")
    port: Port = Field(8000, description="--port.")
    served_model_name: str | None = Field(None, description="--served-model-name.")
    log: WritePath = Field(description="Log file the server appends to.")
    pidfile: WritePath | None = Field(None, description="Pidfile (default: <state_dir>/<name>.pid).")
    startup_timeout: Duration = Field(900.0, description="How long to wait for /health = 200.")
    stop_timeout: Duration = Field(30.0, description="Grace period between SIGTERM and SIGKILL.")
    args: Annotated[dict[str, ArgValue], AfterValidator(flag_names), AfterValidator(flag_values)] = Field(
        default_factory=dict,
        description="vLLM flags without the leading --; true renders a bare flag, false --no-<flag>.",
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        description="Extra environment for the server. A value whose name has a word TOKEN, KEY, SECRET, "
        "PASSWORD or CREDENTIAL (HF_TOKEN, DB_PASSWORD) is sensitive: kept only as a hash in generations "
        "and launch records, shown (sensitive). Better: keep it out of the spec with secret_files.",
    )
    secret_env: list[str] = Field(
        default_factory=list,
        description="Names in env whose values are sensitive although their names do not say so.",
    )
    secret_files: dict[EnvName, ReadPath] = Field(
        default_factory=dict,
        description="Environment variables read from a file at each launch, e.g. "
        '{ HF_TOKEN = "/root/hf.token" }: the value never enters the spec, a record or a command line; '
        "always sensitive.",
    )
    crash_loop: CrashLoop = Field(default_factory=CrashLoop, description="Crash-loop guard.")
    liveness: Liveness = Field(
        default_factory=Liveness,
        description="Liveness beyond /health: an engine making no progress is restarted (docs/liveness.md).",
    )
    auto_rollback: StrictBool = Field(
        True,
        description="After a switch that does not become ready or fails the acceptance check, switch back "
        "to the last good generation (and exit 4).",
    )

    @model_validator(mode="after")
    def _no_key_flag(self) -> Server:
        if "api-key" in self.args:
            raise _at("args.api-key", "puts the key on the command line (use [api_key] file = ... instead)")
        for flag in self.args:  # as vLLM's argparse reads it: `_` as `-`, a prefix as the flag (`ud`)
            if flag and "uds".startswith(flag.replace("_", "-")):  # vLLM would serve there (round 20)
                raise _at(
                    f"args.{flag}",
                    "is vLLM's --uds, which moves the server off the address reconcile reaches, guards and "
                    "routes to: set [server] host and port (behind [front], each color serves on its own "
                    "socket under /run/reconcile)",
                )
        for path in secret_args(self.args):
            raise _at_parts(
                ("args", *path),
                "puts a secret on the server's command line, which every local user can read "
                "(/proc/PID/cmdline): give it in the environment variable vLLM reads it from, through "
                '[server] secret_files (e.g. { HF_TOKEN = "/root/hf.token" })',
            )
        for name in self.secret_env:
            if name not in self.env:
                raise _at("secret_env", f"names {quoted(name)}, which is not in env (list names of env)")
        for name in self.secret_files:
            if name in self.env:
                raise _at(f"secret_files.{name}", "is also in env (give its value in one place: the file)")
        # The server looks programs up on its PATH from its working directory ("/"), reconcile's exec role
        # from its own: a relative or empty entry would have them judge different files (twelfth round).
        for entry in self.env["PATH"].split(":") if "PATH" in self.env else ():
            if not entry.startswith("/") and entry != "$PATH":
                raise _at(
                    "env.PATH",
                    f"has the entry {quoted(entry)}, not an absolute directory: the server would look "
                    "programs up in it from its working directory (write each entry as /..., or $PATH)",
                )
        return self


class Front(_Model):
    """HAProxy (from apt) in front of the server: it owns the public [server] host:port, vLLM listens
    on one of two colors' Unix sockets, and a switch can start the new server beside the old one."""

    haproxy: ExecPath = Field("/usr/sbin/haproxy", description="The haproxy executable (apt's haproxy).")
    ports: list[Port] = Field(
        default_factory=list,
        description="Unused: the server's two colors now serve on Unix sockets of their own (under "
        "/run/reconcile, that only root and the server's user may enter), which no other local user can "
        "take as they could a loopback port. Still loaded, so that older specs load.",
    )
    blue_green: Literal["auto", "never"] = Field(
        "auto",
        description="auto: a switch starts the new server beside the old one when the GPUs hold both "
        "(the plan says which), moves traffic once it passed readiness and acceptance, then drains the "
        "old one; never: always drain-restart in place.",
    )


class DeploymentFront(_Model):
    """[deployments.<name>.front]: the deployment behind the machine's one HAProxy ([front] haproxy): its
    [server] host:port is the public one HAProxy binds, vLLM takes turns on two colors' Unix sockets."""

    ports: list[Port] = Field(
        default_factory=list,
        description="Unused: its server's two colors now serve on Unix sockets of their own (under "
        "/run/reconcile). Still loaded, so that older specs load.",
    )
    blue_green: Literal["auto", "never"] | None = Field(
        None,
        description="auto: a switch of this deployment starts the new server beside the old one when the "
        "GPUs hold both beside the other deployments; never: drain-restart in place (default: [front] "
        "blue_green, else auto).",
    )


class Health(_Model):
    timeout: Duration = Field(5.0, description="Per-request timeout for health probes.")
    check_models: StrictBool = Field(True, description="/v1/models must list the served name.")
    smoke_prompt: str = Field(
        "In one sentence, what is the capital of France?", description="`reconcile check` prompt."
    )


DeploymentName = Annotated[
    str,
    Field(pattern=NAME_PATTERN),
    Expect("a deployment name", NAME_RULE),
]
GpuIndex = Annotated[int, BeforeValidator(no_bool), Field(ge=0), Expect("a GPU index", "an integer from 0")]


class DeploymentServer(Server):
    # Filled in with the deployment's name before validation (Spec._deployment_names): editors
    # (`reconcile schema --json`) must not ask for it.
    name: Annotated[str, Expect("a deployment name", NAME_RULE)] = Field(
        "default",
        pattern=NAME_PATTERN,
        description="Server name (marker, unit); default: the deployment's name.",
    )


class Deployment(_Model):
    venv: Venv | None = Field(None, description="Its Python environment (None: the machine's [venv]).")
    model: Model | None = Field(None, description="Its model's files and config.json patch.")
    api_key: ApiKey | None = Field(None, description="Its API key file (None: the machine's [api_key]).")
    server: DeploymentServer = Field(
        description="Its `vllm serve` process (name: the deployment's by default)."
    )
    gpus: list[GpuIndex] | None = Field(
        None,
        description="The GPUs it may use, by index (CUDA_VISIBLE_DEVICES); None: every GPU. The preflight "
        "sums the gpu-memory-utilization of every deployment placed on a GPU.",
    )
    front: DeploymentFront | None = Field(
        None, description="Behind the machine's HAProxy (blue/green switches of this deployment alone)."
    )

    @model_validator(mode="after")
    def _gpus(self) -> Deployment:
        if self.front is not None:
            ports = self.front.ports  # unused (the colors serve on Unix sockets), still held as written
            if ports and (len(ports) != 2 or len(set(ports)) != 2 or self.server.port in ports):
                raise _at(
                    "front.ports", "two different ports, neither of them its [server] port: [8001, 8002]"
                )
        if self.gpus is not None and len(set(self.gpus)) != len(self.gpus):
            raise _at("gpus", f"{self.gpus} names a GPU twice (each index once)")
        if self.gpus is not None and "CUDA_VISIBLE_DEVICES" in self.server.env:
            raise _at(
                "server.env.CUDA_VISIBLE_DEVICES", "is set with gpus too (give the GPUs once: gpus = [...])"
            )
        return self


class Spec(_Model):
    machine: Machine = Field(default_factory=Machine, description="Which machine, and where state lives.")
    gpu: Gpu | None = Field(None, description="GPUs and driver.")
    cuda: Cuda | None = Field(None, description="The CUDA toolkit FlashInfer's JIT uses.")
    apt: Apt | None = Field(None, description="apt packages and repositories.")
    bench: Bench | None = Field(None, description="`reconcile bench`'s profile and the rollout gate.")
    venv: Venv | None = Field(None, description="The Python environment holding vLLM.")
    model: Model | None = Field(None, description="The model's files and config.json patch.")
    api_key: ApiKey | None = Field(None, description="The server's API key file.")
    server: Server | None = Field(None, description="The `vllm serve` process.")
    front: Front | None = Field(
        None,
        description="HAProxy in front of the server (blue/green switches). Beside [deployments.*]: the "
        "machine's one HAProxy (haproxy, blue_green), in front of each deployment with a "
        "[deployments.<name>.front] table.",
    )
    health: Health = Field(default_factory=Health, description="Health checks.")
    deployments: dict[DeploymentName, Deployment] = Field(
        default_factory=dict,
        description="Several deployments on this machine, by name: each its own [venv] (or the machine's), "
        "[model], [api_key] (or the machine's), [server] and gpus. Without it, [model] and [server] are "
        'the one deployment, "default".',
    )

    @model_validator(mode="before")
    @classmethod
    def _deployment_names(cls, data: Any) -> Any:
        """A deployment's server is named after the deployment unless it says otherwise."""
        deployments = data.get("deployments") if isinstance(data, dict) else None
        if not isinstance(deployments, dict):
            return data
        named = {}
        for key, table in deployments.items():
            server = table.get("server") if isinstance(table, dict) else None
            if isinstance(server, dict) and "name" not in server:
                table = {**table, "server": {"name": key, **server}}
            named[key] = table
        return {**data, "deployments": named}

    @model_validator(mode="after")
    def _server_needs(self) -> Spec:
        if self.deployments:
            return self._deployments_need()
        if self.server is not None and self.server.executable is None and self.venv is None:
            raise _at("server", "nothing to run (set executable, or add a [venv] holding vllm)")
        if self.server is not None and self.server.model is None and self.model is None:
            raise _at("server", "nothing to serve (set model, or add a [model] section)")
        if self.front is not None:
            if self.server is None:
                raise _at("front", "needs a [server] to stand in front of")
            self._front_socket_dir()
            ports = self.front.ports  # unused (the colors serve on Unix sockets), still held as written
            if ports and (len(ports) != 2 or len(set(ports)) != 2 or self.server.port in ports):
                raise _at("front.ports", "two different ports, neither of them [server] port: [8001, 8002]")
        return self

    def _front_socket_dir(self) -> None:
        """HAProxy's config names its runtime socket under the state dir: one word there, else the rest
        of the path is read as options of the socket (`uid`, `level`, `mode`)."""
        problem = haproxy_word_problem("the front's runtime socket's directory", self.machine.state_dir)
        if problem is not None:
            raise _at("machine.state_dir", problem)

    def _one_key_file_one_setting(self) -> None:
        """Deployments that share a key file say the same of it (owner, group, mode): else each apply's
        key step undoes the other's, and between them the key one deployment serves with is the other
        owner's to read."""
        first: dict[str, tuple[str, ApiKey]] = {}
        for key, d in self.deployments.items():
            table = d.api_key or self.api_key
            if table is None:
                continue
            name, said = first.setdefault(table.file, (key, table))
            if said != table:
                raise _at_parts(
                    ("deployments", key, "api_key", "file"),
                    f"{quoted(table.file)} is deployment {name}'s key file too, with another owner, group "
                    "or mode (give both the same settings, or each its own file)",
                )

    def _deployments_need(self) -> Spec:
        for section in ("model", "server"):
            if getattr(self, section) is not None:
                raise _at(
                    section, "is set beside [deployments.*] (move it into a [deployments.<name>] table)"
                )
        if self.front is not None and self.front.ports:
            raise _at(
                "front.ports",
                "is per deployment beside [deployments.*] (set [deployments.<name>.front] ports)",
            )
        if self.front is not None and not any(d.front is not None for d in self.deployments.values()):
            raise _at(
                "front",
                "no deployment stands behind it (add a [deployments.<name>.front] table to each deployment "
                "HAProxy fronts)",
            )
        if self.front is not None:
            self._front_socket_dir()
        self._one_key_file_one_setting()
        names: dict[str, str] = {}
        for key, d in self.deployments.items():
            if d.server.executable is None and d.venv is None and self.venv is None:
                raise _at_parts(
                    ("deployments", key, "server"),
                    "nothing to run (set executable, or add a [venv] holding vllm)",
                )
            if d.server.model is None and d.model is None:
                raise _at_parts(
                    ("deployments", key, "server"), "nothing to serve (set model, or add its [model] table)"
                )
            # Behind the front its server runs as <name>-blue and <name>-green (their own pidfiles, records
            # and systemd units, a unit named by the name alone): those are taken too.
            colors = [f"{d.server.name}-{c}" for c in ("blue", "green")] if d.front is not None else []
            for name in (d.server.name, *colors):
                if name in names:
                    raise _at_parts(
                        ("deployments", key, "server", "name"),
                        f"{quoted(name)} is deployment {names[name]}'s server name too (one name each; "
                        "behind [front] a deployment's server also runs as <name>-blue and <name>-green)",
                    )
                names[name] = key
            count = self.gpu.count if self.gpu is not None else None
            for n, index in enumerate(d.gpus or ()):
                if count is not None and index >= count:
                    raise _at_parts(
                        ("deployments", key, "gpus", n),
                        f"GPU {index} is not on this machine ([gpu] count = {count}: 0-{count - 1})",
                    )
        return self
