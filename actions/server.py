"""Action for the `server` resource: start vLLM, restart it only when its launch identity changed, stop it.

Called by the executor (through the server row of reconcile.resources) with the server Change and
the launch inputs the probes saw (LaunchInputs). Strays of an earlier server are stopped before a
start; a crash-loop guard refuses to start again after repeated failed starts.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from actions import cgroups, server_records, supervising, systemd_unit
from actions.launching import (
    LaunchCommand,
    LaunchInputs,
    ReadinessFailure,
    cache_root,
    launch_command,
    prepare_socket,
    private_dir,
    refuse_crash_loop,
    serving_user,
    wait_ready,
    write_record,
)
from actions.supervising import ProgressFn
from reconcile.errors import ActionError
from reconcile.host import HttpUnreachable, checkpoint, http_request
from reconcile.identity import (
    COLORS,
    IDENTITY,
    color_spec,
    endpoint,
    explain_change,
    pidfile_path,
    read_record,
    redact_argv,
    server_socket,
    serving_spec,
    state_file_path,
)
from reconcile.ownership.membership import (
    proc_id,
    scope_of,
)
from reconcile.plan.records import ActionResult, Change
from reconcile.safety.filesafety import FIX, UnsafePath, ensure_dir, open_append, resolve_exec

if TYPE_CHECKING:
    from reconcile.spec.models import Server, Spec

_HISTORY = 20


class ServerStartError(ActionError):
    """The server did not become healthy; `failure` holds the log tail and the known causes."""

    def __init__(self, name: str, failure: ReadinessFailure) -> None:
        super().__init__(f"server {name} did not become healthy: {failure.render()}")
        self.failure = failure


HUNG_STOP_S = 5.0  # a hung engine's stop: SIGTERM, then SIGKILL after this (it has nothing to drain)


def apply(
    change: Change, spec: Spec, inputs: LaunchInputs, *, progress: ProgressFn | None = None
) -> ActionResult:
    """Make the server Change true. The spec's `running` decides, not the Change's kind: a `-` Change
    while running = true removes strays only, which ensure_running does without touching the server.
    The one thing a Change adds (re-planned by the executor right before): an engine the planner found
    hung (`engine_hung`, reconcile.liveness), which /health cannot show, is restarted."""
    before = ""
    if getattr(spec, "front", None) is not None:  # behind [front]: each color is a deployment
        # Its server from before [front] (its own name, on the public port the front binds) drains
        # and stops first, else it would hold the port and its GPU share beside the colors.
        base = spec.model_copy(update={"front": None})
        if supervising.marked_pids(scope_of(base)):
            before = f"{ensure_stopped(base).message} (its server from before [front]); "
        if not _server(spec).running:
            results = [ensure_stopped(color_spec(spec, c)) for c in COLORS]
            said = before + "; ".join(r.message for r in results)
            return ActionResult(any(r.changed for r in results) or bool(before), said)
        spec = serving_spec(spec)  # a drain-restart in place, on the active color
    elif _server(spec).running:
        # [front] taken out while our HAProxy (or a color of it) still serves: the colors drain and
        # stop, then HAProxy lets the public port go, and only then the server starts there (the
        # front row then finds nothing left to stop).
        from actions.front import take_away

        if said := take_away(spec):
            before = f"{said}; "
    if not _server(spec).running:
        return ensure_stopped(spec)
    hung = change.params.get("engine_hung")
    done = ensure_running(spec, inputs, progress=progress, hung=hung if isinstance(hung, str) else None)
    return done._replace(changed=True, message=before + done.message) if before else done


def ensure_running(
    spec: Spec,
    inputs: LaunchInputs,
    *,
    progress: ProgressFn | None = None,
    base_env: Mapping[str, str] | None = None,
    hung: str | None = None,
) -> ActionResult:
    """Leave a healthy server of the same identity alone (its strays aside); otherwise (re)start it.
    `hung` (why its engine counts as hung): restart it although /health answers 200, and record the
    hang, which the crash-loop guard counts."""
    server = _server(spec)
    command = launch_command(spec, inputs, base_env=base_env)
    record = read_record(spec)
    pid = server_records.current_pid(spec)
    reason = "not running"
    if pid is not None and hung is not None:
        reason = hung
    elif pid is not None and supervising.environ_value(pid, IDENTITY) == command.identity.digest:
        kept = _keep(spec, command, pid, record, progress)
        if kept is not None:
            if server_records.adopt(spec, command, pid, record):
                return ActionResult(True, f"{kept.message}; pidfile and record rewritten for pid {pid}")
            return kept
        reason = _unhealthy_reason(spec, pid)
    elif pid is not None:
        reason = explain_change(record.get("components") or {}, command.identity.components)
    refuse_crash_loop(spec, record)  # before the stop: a refused start must not leave the server down
    if pid is not None and hung is not None:  # (a held guard leaves a hung server as it is, and says so)
        _record_hang(spec, record, pid, hung)
    down = time.monotonic()  # from here the deployment refuses new connections until the new one is ready
    # A hung engine finishes no request: its drain (--shutdown-timeout) would only wait it out.
    timeout = min(server.stop_timeout, HUNG_STOP_S) if hung is not None else server.stop_timeout
    stopped = supervising.stop_marked(scope_of(spec), timeout=timeout, leader=pid)
    drained = time.monotonic() - down
    holder = None if server_socket(spec) is not None else _port_holder(server.host, server.port)
    if holder is not None:
        raise ActionError(
            f"port {server.port} is held by {holder}, which is not deployment "
            f"{server.name}: stop it or change [server] port (reconcile never signals other processes)"
        )
    started = time.monotonic()
    new_pid = _start(spec, command, record, reason, progress)
    note = f"; before it: {stopped.describe()}" if stopped.terminated else ""
    healthy = f"healthy after {time.monotonic() - started:.1f}s"
    if stopped.terminated:
        healthy += f"; down for {time.monotonic() - down:.1f}s (the old one stopped in {drained:.1f}s)"
    return ActionResult(
        True,
        f"started {server.name} (pid {new_pid}; why: {reason}); {healthy}{_kv_note(spec, record)}{note}",
    )


def _record_hang(spec: Spec, record: dict[str, Any], pid: int, why: str) -> None:
    """A hang in the start history (outcome "hung"), before the restart: the crash-loop guard counts
    hangs in its window as it counts failed starts, so an engine that keeps hanging is held."""
    entry: dict[str, Any] = {
        "at": time.time(),
        "pid": pid,
        "identity": str(record.get("identity") or ""),
        "outcome": "hung",
        "reason": why,
    }
    launch = proc_id(pid)
    if launch is not None:
        entry.update(start=launch.start, boot=launch.boot)
    record["history"] = [*record.get("history", []), entry][-_HISTORY:]
    write_record(spec, record)


def _kv_note(spec: Spec, record: Mapping[str, Any]) -> str:
    """What vLLM's log said about the KV cache during this start (the figure the memory rule predicts)."""
    from actions.launching import read_log
    from reconcile.vllm.startup import startup_phase

    _phase, kv = startup_phase(read_log(_server(spec).log, int(record.get("log_offset", 0))))
    return f"; vLLM's KV cache: {kv} tokens" if kv else ""


def _keep(
    spec: Spec, command: LaunchCommand, pid: int, record: dict[str, Any], progress: ProgressFn | None
) -> ActionResult | None:
    """The server already has the wanted identity: stop its strays, wait if it is still loading.
    None when it must be restarted after all (unhealthy, or not listening past startup_timeout)."""
    server = _server(spec)
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return None
    strays = supervising.stop_marked(scope_of(spec), timeout=server.stop_timeout, spare_pgid=pgid)
    note = f"; stray(s) {strays.describe()}" if strays.terminated else ""
    health = _health_status(spec)
    if health == 200:
        server_records.remember_members(spec, pid, record)
        return ActionResult(
            bool(strays.terminated), f"{server.name} runs as pid {pid} with the same launch identity{note}"
        )
    left = server.startup_timeout - supervising.process_age(pid)
    if health is not None or left <= 0:
        return None
    # Still loading (the port refuses until the model is in memory): wait for it rather than restart.
    failure = _wait(spec, command, pid, None, int(record.get("log_offset", 0)), progress, timeout=left)
    if failure is not None:
        raise ServerStartError(server.name, failure)
    return ActionResult(True, f"{server.name} (pid {pid}) finished starting{note}")


def _unhealthy_reason(spec: Spec, pid: int) -> str:
    health = _health_status(spec)
    if health is None:
        age = supervising.process_age(pid)
        limit = _server(spec).startup_timeout
        return f"no answer on /health {age:.0f}s after its start (startup_timeout {limit:g}s)"
    return f"unhealthy: /health answered {health}"


def ensure_stopped(spec: Spec) -> ActionResult:
    """Stop every process of the deployment (server, engine, workers, strays) and drop the pidfile."""
    server = _server(spec)
    if server.supervisor == "systemd":
        systemd_unit.stop_unit(spec)
    leader = server_records.current_pid(spec)
    outcome = supervising.stop_marked(scope_of(spec), timeout=server.stop_timeout, leader=leader)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pidfile_path(spec))
    if not outcome.terminated:
        return ActionResult(False, f"{server.name} is not running (no process of the deployment runs)")
    return ActionResult(True, f"{server.name}: {outcome.describe()}")


def _start(
    spec: Spec, command: LaunchCommand, record: dict[str, Any], reason: str, progress: ProgressFn | None
) -> int:
    server = _server(spec)
    try:
        # The program root is about to run, walked again now (the preflight's check was minutes ago):
        # a link on its way that another user could re-point is refused, and what runs is its real path.
        program = resolve_exec(command.argv[0], what="[server].executable", search=command.env.get("PATH"))
        for path in (server.log, pidfile_path(spec)):
            ensure_dir(os.path.dirname(path), 0o755)
        private_dir(os.path.dirname(state_file_path(spec)))
        prepare_socket(spec)
        if serving_user(spec) is None:  # root's caches, kept across generations (launching.cache_root)
            private_dir(cache_root(spec))  # another user's: vLLM makes it under its ~/.cache
        # Never through a symlink, never left writable by others (the preflight checked its parents).
        log = os.fdopen(open_append(server.log), "ab")  # closed below, once the child holds its own copy
    except UnsafePath as exc:
        raise ActionError(str(exc) if FIX in str(exc) else f"{exc}; {FIX}") from None
    except OSError as exc:
        raise ActionError(f"cannot prepare {exc.filename}: {exc.strerror}") from None
    with log:
        offset = log.tell()
        shown = " ".join(redact_argv(command.argv))
        log.write(
            f"--- reconcile {time.strftime('%Y-%m-%dT%H:%M:%S%z')}: starting {server.name} "
            f"(identity {command.identity.digest}; {reason}): {shown}\n".encode()
        )
        log.flush()
        proc: subprocess.Popen[bytes] | None = None
        group = cgroups.Prepared(None, "the systemd unit's own cgroup")
        if server.supervisor == "systemd":
            systemd_unit.install_unit(spec, command)
            pid = systemd_unit.start_unit(spec)
        else:
            group = cgroups.prepare(spec)
            try:
                proc = _spawn(command, program, log, group.path)
            except _NoEntry as exc:  # made but not enterable (a delegated or threaded subtree)
                if group.path is not None:
                    cgroups.empty_and_remove(group.path)
                group = cgroups.Prepared(None, str(exc))
                proc = _spawn(command, program, log, None)
            pid = proc.pid
    checkpoint("server.spawned")  # running, and no pidfile names it yet
    launch = proc_id(pid)
    server_records.write_pidfile(spec, pid)
    entry: dict[str, Any] = {
        "at": time.time(),
        "pid": pid,
        "identity": command.identity.digest,
        "outcome": "starting",
        "reason": reason,
    }
    if launch is not None:
        entry.update(start=launch.start, boot=launch.boot)
    if group.path is None and server.supervisor != "systemd":
        entry["fallback"] = group.why  # status says why no cgroup holds this launch
    history = [*record.get("history", []), entry][-_HISTORY:]
    record.update(
        name=server.name,
        identity=command.identity.digest,
        components=dict(command.identity.components),
        pid=pid,
        launch=launch.as_json() if launch else None,
        members=[],
        log_offset=offset,
        history=history,
    )
    write_record(spec, record)
    failure = _wait(spec, command, pid, proc, offset, progress)
    history[-1]["outcome"] = "failed" if failure else "ok"
    if failure:
        history[-1]["reason"] = failure.reason
        supervising.stop_marked(scope_of(spec), timeout=server.stop_timeout)
    write_record(spec, record)
    if not failure:
        server_records.remember_members(spec, pid, record)
    if failure:
        raise ServerStartError(server.name, failure)
    return pid


class _NoEntry(Exception):
    """The child could not write itself into the cgroup: launch without one (the fallback path)."""


def _spawn(command: LaunchCommand, program: str, log: Any, cgroup: str | None) -> subprocess.Popen[bytes]:
    """The server (`program`, resolve_exec's real path of argv[0]) in a session of its own and, given
    `cgroup`, in that cgroup before it execs."""
    entry = cgroups.Entry(cgroup) if cgroup is not None else None
    try:
        return subprocess.Popen(
            list(command.argv),
            executable=program,
            env=dict(command.env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd="/",
            preexec_fn=entry.enter if entry is not None else None,
        )
    except OSError as exc:
        raise ActionError(f"cannot run {command.argv[0]}: {exc.strerror} (is vLLM installed?)") from None
    except subprocess.SubprocessError as exc:  # the child could not enter the cgroup
        raise _NoEntry(f"the server could not enter cgroup {cgroup} ({exc})") from None
    finally:
        if entry is not None:
            entry.close()


def _wait(
    spec: Spec,
    command: LaunchCommand,
    pid: int,
    proc: subprocess.Popen[bytes] | None,
    offset: int,
    progress: ProgressFn | None,
    *,
    timeout: float | None = None,
) -> ReadinessFailure | None:
    server = _server(spec)

    def exit_status() -> int | None:
        if proc is not None:
            return proc.poll()
        if server.supervisor == "systemd":
            return systemd_unit.unit_exit_status(spec)
        return None if supervising.is_alive(pid) else -1

    from reconcile.ownership.sockets import key_guard

    mask = [command.env[k] for k in command.secret_keys if command.env.get(k)]
    return wait_ready(
        *endpoint(spec),
        timeout=server.startup_timeout if timeout is None else timeout,
        exit_status=exit_status,
        log_path=server.log,
        log_offset=offset,
        mask=mask,
        progress=progress,
        guard=key_guard(spec),  # the answer to /health must come from this deployment's process
    )


def _port_holder(host: str, port: int) -> str | None:
    """Who listens on TCP `port` where a bind of `host` would clash ("pid N (user U: command)"), or None
    when nobody does."""
    from reconcile.ownership.sockets import listeners

    found = listeners(port, host=host)
    return found[0].describe() if found else None


def _health_status(spec: Spec) -> int | None:
    try:
        return http_request("GET", *endpoint(spec), "/health", timeout=5.0).status
    except HttpUnreachable:
        return None


def _server(spec: Spec) -> Server:
    if spec.server is None:
        raise ActionError("the spec has no [server] section")
    return spec.server
