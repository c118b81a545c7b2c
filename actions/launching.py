"""How a vLLM server is launched: its command line, its environment, its launch identity, and the
record of its starts (<state_dir>/server-<name>.json) that the crash-loop guard reads.

Used by actions.server and actions.systemd_unit to start it, and by the planner (desired_identity)
to know the identity a launch would have without starting anything.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType

from reconcile.errors import ActionError
from reconcile.host import atomic_write
from reconcile.identity import (
    IDENTITY,
    MARKER,
    Identity,
    crash_loop_hold,
    deployment_id,
    launch_identity,
    read_record,
    server_socket,
    state_file_path,
)
from reconcile.plan.records import ActionResult
from reconcile.record import Record
from reconcile.safety import statefiles
from reconcile.safety.display import shown
from reconcile.safety.filesafety import PRIVATE_DIR, ensure_dir
from reconcile.safety.sensitive import SENSITIVE, is_secret_name
from reconcile.safety.untrusted import JSON_LIMIT, KEY_LIMIT, read_regular
from reconcile.vllm.draining import Drain, drain

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from actions.supervising import ProgressFn
    from reconcile.spec.models import ArgValue, Server, Spec

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KEY_ENV = "VLLM_API_KEY"
# Flags declared with action="append" in vLLM: repeated per value; every other list is nargs="+".
_REPEATED = frozenset({"middleware"})
# Set from their own [server] fields; also in `args` they would be given twice.
_DEDICATED = {"host": "host", "port": "port", "served-model-name": "served_model_name", "model": "model"}


class LaunchInputs(Record):
    """What the identity covers besides argv and env, as the probes saw it before the launch."""

    packages: Mapping[str, str] = MappingProxyType({})  # distribution -> version in the venv
    model_revision: str | None = None  # the resolved commit
    config_json: bytes | None = None  # the model's config.json as it will be read at start


class LaunchCommand(Record):
    """A ready-to-run launch. `env` holds the API key: its repr never shows it."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    identity: Identity
    secret_keys: frozenset[str] = frozenset()

    def __repr__(self) -> str:  # env holds the API key: a traceback or log never shows it
        return f"LaunchCommand(argv={self.argv!r}, identity={self.identity!r}, env=(sensitive))"


def render_args(args: Mapping[str, ArgValue]) -> list[str]:
    """`args` as vLLM flags, sorted by name: true -> --x, false -> --no-x, dict -> JSON, list -> values."""
    out: list[str] = []
    for name in sorted(args):
        value = args[name]
        flag = f"--{name}"
        if value is True:
            out.append(flag)
        elif value is False:
            out.append(f"--no-{name}")
        elif isinstance(value, dict):
            out += [flag, json.dumps(value, sort_keys=True, separators=(",", ":"))]
        elif isinstance(value, list):
            values = [_scalar(v) for v in value]
            if name in _REPEATED:
                for v in values:
                    out += [flag, v]
            elif values:
                out += [flag, *values]
        else:
            out += [flag, _scalar(value)]
    return out


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def executable(spec: Spec) -> str:
    server = _server(spec)
    if server.executable:
        return server.executable
    assert spec.venv is not None  # the spec validator requires executable or [venv]
    return f"{spec.venv.path.rstrip('/')}/bin/vllm"


def build_argv(spec: Spec, packages: Mapping[str, str] | None = None) -> list[str]:
    """[vllm, serve, MODEL, --host H, --port P (a color: --uds PATH), (--served-model-name N), ...args,
    (--shutdown-timeout N)]; never --api-key. The drain flag is reconcile's default unless args sets it
    (`packages`: the venv's distributions, to leave it out for a vLLM that has no such flag)."""
    server = _server(spec)
    twice = sorted(a for a in server.args if a in _DEDICATED)
    if twice:
        raise ActionError(
            f"[server].args.{twice[0]} repeats a [server] field: set [server] {_DEDICATED[twice[0]]} instead"
        )
    model = server.model or (spec.model.dir if spec.model else None)
    assert model is not None  # the spec validator requires [server] model or [model]
    uds = server_socket(spec)  # a color behind [front]: vLLM ignores --host and --port with --uds
    where = ["--uds", uds] if uds is not None else ["--host", server.host, "--port", str(server.port)]
    argv = [executable(spec), "serve", model, *where]
    if server.served_model_name:
        argv += ["--served-model-name", server.served_model_name]
    return argv + render_args(server.args) + drain_of(server, packages).flag


def drain_of(server: Server, packages: Mapping[str, str] | None = None) -> Drain:
    """How this server stops: its drain (reconcile.vllm.draining), on the venv's vLLM if known."""
    from reconcile.vllm.flags import release

    version = (packages or {}).get("vllm")
    return drain(server.args, server.stop_timeout, release(version) if version else None)


def read_api_key(spec: Spec, *, required: bool = True) -> str | None:
    """The key from [api_key] file, stripped; None without [api_key] (or its file, when not required)."""
    if spec.api_key is None:
        return None
    try:  # as data: no link followed, a regular file (a FIFO would block the open), a key's size
        key = read_regular(spec.api_key.file, KEY_LIMIT).decode("utf-8").strip()
    except FileNotFoundError:
        if not required:
            return None
        raise ActionError(
            f"API key file {spec.api_key.file} does not exist: apply the api_key resource first"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        if not required:  # the planner's identity: the api_key resource reports the file itself
            return None
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ActionError(f"API key file {spec.api_key.file}: cannot read it ({why})") from None
    if not key and not required:
        return None
    if not key:
        raise ActionError(f"API key file {spec.api_key.file} is empty: remove it so apply generates a key")
    return key


def read_secret_files(server: Server, *, required: bool = True) -> dict[str, str]:
    """`[server] secret_files`: each variable's value read from its file (stripped) at this launch.

    A missing or unreadable file is an ActionError naming it (`required`), else left out (the
    planner's identity then differs, and the server Change says the file must exist)."""
    values: dict[str, str] = {}
    for name, path in sorted(server.secret_files.items()):
        try:  # as data, like the key: a FIFO, a device or a huge file there is named, never waited on
            values[name] = read_regular(path, KEY_LIMIT).decode("utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            if required:
                why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
                raise ActionError(
                    f"[server].secret_files.{name}: {path}: cannot read it ({why}); "
                    "put the secret in that file (a regular file, not a symlink)"
                ) from None
    return values


def read_config_json(spec: Spec) -> bytes | None:
    """The model's config.json as vLLM will read it (None when there is none)."""
    if spec.model is None:
        return None
    try:  # as data: the model dir's config.json (hub-written, or a source's) is bounded, regular only
        return read_regular(os.path.join(spec.model.dir, "config.json"), JSON_LIMIT, follow=True)
    except OSError:
        return None


# Where vLLM 0.26.0 and the libraries under it keep what they build at start-up, each redirected into
# the deployment's cache root (serving_caches) unless the spec's [server].env names it:
# VLLM_CACHE_ROOT (vllm/envs.py; default $XDG_CACHE_HOME/vllm or ~/.cache/vllm): torch.compile's
#   artifacts under torch_compile_cache/<config hash>/ (inductor and Triton caches beside them, set by
#   vllm/compilation/compiler_interface.py), the FlashInfer autotune results, the modelinfo cache;
# TRITON_CACHE_DIR (~/.triton/cache): Triton kernels compiled outside torch.compile (vLLM's own ops),
#   and their autotuning (vllm/env_override.py sets TRITON_CACHE_AUTOTUNING=1);
# TORCHINDUCTOR_CACHE_DIR (default /tmp/torchinductor_<user>: under the unit's PrivateTmp, lost at
#   each stop) until vLLM points it at the compile cache;
# FLASHINFER_WORKSPACE_BASE (~): FlashInfer's JIT-built kernels in <it>/.cache/flashinfer/;
# CUDA_CACHE_PATH (~/.nv/ComputeCache): the driver's PTX-to-SASS JIT cache.
CACHE_ENV_DIRS = {
    "VLLM_CACHE_ROOT": "vllm",
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "CUDA_CACHE_PATH": "nv-compute",
}


def serving_home(user: str | None) -> str:
    """The serving user's home (root's: /root) from the password database."""
    if user is None or user == "root":
        return "/root"
    import pwd

    try:
        return pwd.getpwnam(user).pw_dir
    except KeyError:
        raise ActionError(
            f"[server].user = {user!r}: no such user on this machine: create it or fix the name"
        ) from None


def serving_user(spec: Spec) -> str | None:
    """Who the server runs as: [server].user under systemd; root otherwise (None)."""
    server = _server(spec)
    return server.user if server.supervisor == "systemd" and server.user not in (None, "root") else None


def cache_root(spec: Spec) -> str:
    """Where the server's compile and JIT caches live, kept across generations and switches so that a
    start whose compile key did not change is warm. A server of our own session (root's):
    <state_dir>/vllm-cache, one per machine (vLLM keys each entry by its config hash; colors and
    deployments share it). A systemd unit: ~<its user>/.cache/reconcile-vllm (root's /root), inside
    the unit's writable ~/.cache (ReadWritePaths= cannot name every state dir path, and root's state
    dir is closed to another user). Never the applying shell's HOME: a timer and a login shell
    differ."""
    if _server(spec).supervisor == "systemd":
        return os.path.join(serving_home(serving_user(spec)), ".cache", "reconcile-vllm")
    return f"{spec.machine.state_dir.rstrip('/')}/vllm-cache"


def cache_env(spec: Spec) -> dict[str, str]:
    """The cache variables of a launch (CACHE_ENV_DIRS), those the spec's env sets left to it."""
    root, declared = cache_root(spec), _server(spec).env
    return {k: os.path.join(root, d) for k, d in CACHE_ENV_DIRS.items() if k not in declared}


def _prefixed_path(spec: Spec) -> str:
    prefix = []
    if spec.venv is not None:
        prefix.append(f"{spec.venv.path.rstrip('/')}/bin")
    if spec.cuda is not None:
        prefix.append(f"{spec.cuda.home.rstrip('/')}/bin")
    return ":".join([*prefix, "$PATH"])


def server_path(spec: Spec, base_env: Mapping[str, str] | None = None) -> str:
    """The PATH the server runs with: its venv's bin and the CUDA toolkit's first, then ours (`$PATH`),
    unless [server] env sets PATH (then that, its `$PATH` ours)."""
    base = os.environ if base_env is None else base_env
    declared = _server(spec).env.get("PATH", _prefixed_path(spec))
    return declared.replace("$PATH", base.get("PATH") or DEFAULT_PATH)


def launch_command(
    spec: Spec,
    inputs: LaunchInputs,
    *,
    base_env: Mapping[str, str] | None = None,
    key_required: bool = True,
) -> LaunchCommand:
    """argv, env and identity of a launch; the env is clean: PATH, HOME, LANG from ours, then the spec's.

    The identity's env writes our inherited PATH as `$PATH` and leaves HOME/LANG out: a timer and
    a root shell run apply with different ones, and that alone must not restart the server.
    """
    server = _server(spec)
    base = os.environ if base_env is None else base_env
    declared: dict[str, str] = {"PATH": _prefixed_path(spec)}
    if spec.cuda is not None:
        declared["CUDA_HOME"] = spec.cuda.home
    declared.update(server.env)
    declared.update(read_secret_files(server, required=key_required))
    key = read_api_key(spec, required=key_required)
    if key is not None:
        declared[KEY_ENV] = key
    for marker in (MARKER, IDENTITY):
        declared.pop(marker, None)
    marked = {KEY_ENV, *server.secret_env, *server.secret_files}
    secret = frozenset(k for k in declared if is_secret_name(k, marked))
    argv = build_argv(spec, inputs.packages)
    identity = launch_identity(
        argv, declared, secret, inputs.packages, inputs.model_revision, inputs.config_json
    )
    # HOME is the serving user's (systemd's User= sets it, but the EnvironmentFile would win); the
    # caches are outside the identity, as HOME is: where they live does not change what is served.
    home, caches = base.get("HOME") or "/root", {}
    try:
        home = serving_home(serving_user(spec)) if serving_user(spec) else home
        caches = cache_env(spec)
    except ActionError:  # an unknown [server].user: the unit's rendering says so (a plan goes on)
        pass
    env = {"HOME": home, "LANG": base.get("LANG") or "C.UTF-8", **caches, **declared}
    env["PATH"] = server_path(spec, base)
    env[MARKER] = deployment_id(spec)
    env[IDENTITY] = identity.digest
    return LaunchCommand(tuple(argv), env, identity, secret)


def desired_identity(spec: Spec, inputs: LaunchInputs) -> Identity:
    """The identity a launch would have now (for the planner; a missing key file is not an error)."""
    return launch_command(spec, inputs, key_required=False).identity


def prepare_socket(spec: Spec) -> None:
    """A color's socket directory (reconcile.identity.color_socket), before its server starts: made by
    root in root's /run/reconcile (0711: others may pass, not list or write), 0700 and the server's
    user's, so that only root and that user can bind there (the key guard's premise:
    ownership.sockets.socket_holder_check). Whatever is at the socket's name is removed, a link as a
    link: a socket left by the last run (vLLM binds the path and fails on one that exists), or what a
    former server user left while the directory was theirs (a link to a listener of theirs is what
    HAProxy's connect would follow: round 20). A directory there is refused, named. Nothing else in
    the directory is touched: nothing reaches it but by the socket's name."""
    import contextlib

    from reconcile.identity import SOCKETS_DIR
    from reconcile.ownership.sockets import serving_uid
    from reconcile.safety.filesafety import open_dir

    uds = server_socket(spec)
    if uds is None:
        return
    directory, name = os.path.split(uds)
    try:
        ensure_dir(SOCKETS_DIR, 0o711)
        parent = open_dir(SOCKETS_DIR)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(os.path.basename(directory), 0o700, dir_fd=parent)
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
            fd = os.open(os.path.basename(directory), flags, dir_fd=parent)
        finally:
            os.close(parent)
        try:  # only root can make a name in SOCKETS_DIR: whatever is there is ours to set
            os.fchown(fd, serving_uid(spec), -1)  # first: a former owner can write there no more
            os.fchmod(fd, 0o700)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)
    except IsADirectoryError:
        raise ActionError(
            f"{uds} is a directory, where the server binds its socket: remove it (rm -r {uds}) and re-run"
        ) from None
    except OSError as exc:  # a name relative to a descriptor: the whole path, and what the start needs
        raise ActionError(
            f"cannot prepare {directory}, the socket directory of {_server(spec).name}: {exc.strerror} "
            f"(reconcile makes it under {SOCKETS_DIR}: /run must be writable by root, as a tmpfs is)"
        ) from None


class ReadinessFailure(Record):
    """Why the server never became healthy: the reason, the log's last lines, the known causes found."""

    reason: str
    log_path: str
    log_tail: tuple[str, ...]
    diagnoses: tuple[str, ...]

    def render(self) -> str:
        lines = [self.reason]
        lines += [f"  known cause: {d}" for d in self.diagnoses]
        lines.append(f"  last {len(self.log_tail)} line(s) of {self.log_path}:")
        lines += [f"    {shown(line)}" for line in self.log_tail]  # whole in log_tail, for diagnoses
        return "\n".join(lines)


def read_log(path: str, offset: int, *, mask: Collection[str] = (), limit: int = 2_000_000) -> list[str]:
    """The log's lines written since `offset` (at most the last `limit` bytes), secrets masked, each
    fit for one line of output (control characters escaped: the server's log is data from outside)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - limit))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    for secret in mask:
        text = text.replace(secret, SENSITIVE)
    return [shown(line.rstrip("\r"), None) for line in text.split("\n") if line.strip()]


def diagnoses(lines: list[str]) -> tuple[str, ...]:
    """Known start-up failures among `lines`, each with its fix (reconcile.vllm.failures)."""
    try:
        from reconcile.vllm.failures import diagnose
    except ImportError:
        return ()
    return tuple(f"{d.explanation}; fix: {d.fix} (log: {d.line})" for d in diagnose(lines))


def wait_ready(
    host: str,
    port: int,
    *,
    timeout: float,
    exit_status: Callable[[], int | None],
    log_path: str,
    log_offset: int,
    mask: Collection[str] = (),
    progress: ProgressFn | None = None,
    poll: float = 0.25,
    guard: Callable[[], None] | None = None,
) -> ReadinessFailure | None:
    """Poll GET /health until 200 (None), the process exits, or `timeout` passes (a failure report).
    `guard` (the listener check: raises ForeignListener) runs on a 200: a listener that took the port
    while the server loaded answers /health too, and is not the server."""
    from reconcile.host import HttpUnreachable, http_request
    from reconcile.ownership.sockets import ForeignListener

    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        code = exit_status()
        if code is not None:
            reason = f"the server exited with status {code} after {elapsed:.1f}s"
            break
        try:
            if http_request("GET", host, port, "/health", timeout=min(2.0, poll * 8)).status == 200:
                if guard is not None:
                    guard()
                return None
        except HttpUnreachable:
            pass  # the port refuses until the model is loaded
        except ForeignListener as exc:
            taken = f"unix:{host}" if port == 0 else f"port {port}"
            reason = f"/health was answered by {exc.holder}, not by the server started ({taken} taken)"
            break
        if elapsed >= timeout:
            reason = f"/health did not answer 200 within {timeout:g}s"
            break
        if progress is not None:
            tail = read_log(log_path, log_offset, mask=mask, limit=16384)
            from actions.supervising import ReadinessProgress  # select, signal: only while a server starts

            progress(ReadinessProgress(elapsed, tail[-1] if tail else "", tuple(tail)))
        time.sleep(poll)
    lines = read_log(log_path, log_offset, mask=mask)
    return ReadinessFailure(reason, log_path, tuple(lines[-40:]), diagnoses(lines))


def write_record(spec: Spec, record: Mapping[str, Any]) -> None:
    """The record, 0600 in the 0700 state dir: it names our launches, which is what membership trusts."""
    path = state_file_path(spec)
    private_dir(os.path.dirname(path))
    statefiles.clear_non_file(path)  # rename() cannot replace a directory
    atomic_write(path, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(), mode=0o600)


def private_dir(path: str) -> None:
    """Make `path` (mode 0700 whatever the umask), or narrow an existing one of ours to 0700. A dir of
    another user's, or a shared sticky one such as /tmp, is refused (filesafety.ensure_dir)."""
    ensure_dir(path, PRIVATE_DIR)  # through the trust walk; never chmods a directory others may write


def reset_crash_loop(spec: Spec) -> ActionResult:
    """Forget failed starts and hung engines (`reconcile apply --reset-crash-loop`)."""
    record = read_record(spec)
    history = record.get("history", [])
    failed = [h for h in history if h.get("outcome") == "failed"]
    hung = [h for h in history if h.get("outcome") == "hung"]
    if not failed and not hung:
        return ActionResult(False, "no failed starts recorded")
    record["history"] = [h for h in history if h.get("outcome") not in ("failed", "hung")]
    write_record(spec, record)
    said = [f"{len(failed)} failed start(s)"] if failed else []
    said += [f"{len(hung)} hung engine(s)"] if hung else []
    return ActionResult(True, f"forgot {' and '.join(said)}")


def refuse_crash_loop(spec: Spec, record: Mapping[str, Any], now: float | None = None) -> None:
    hold = crash_loop_hold(spec, record, now)
    if hold is not None:
        raise ActionError(f"{hold}. Fix the cause, then run `reconcile apply --reset-crash-loop`")


def _server(spec: Spec) -> Server:
    if spec.server is None:
        raise ActionError("the spec has no [server] section")
    return spec.server
