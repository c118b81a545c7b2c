"""The server's part of the plan: start, restart (and why), stop strays, or leave it alone.

Declares the server kind (its planner, its after-plan restart, its action) and the server and health
probes; action: actions.server. The launch identity a start would have is computed here from the
same probes the plan used.
"""

from __future__ import annotations

from probes.common import ProbeFailure, Unavailable
from reconcile.plan.records import Action, ActionResult, Change, FieldDiff, Item, Ok
from reconcile.resources.common import Kind, Probe, change, needs, ok

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from actions.launching import LaunchInputs
    from reconcile.liveness import Verdict
    from reconcile.resources import Observed
    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Spec


def launch_inputs(spec: Spec, obs: Observed) -> LaunchInputs:
    """What the identity covers besides argv/env: installed packages, model commit, config.json."""
    from actions.launching import LaunchInputs, read_config_json
    from probes.model import DownloadRecord, ModelObservation
    from probes.venv import VenvObservation

    packages: dict[str, str] = {}
    if isinstance(obs.venv, VenvObservation):
        packages = {d.name: d.version for d in obs.venv.distributions.values()}
    revision = None
    if isinstance(obs.model, ModelObservation) and isinstance(obs.model.record, DownloadRecord):
        revision = obs.model.record.commit or obs.model.record.revision
    return LaunchInputs(packages=packages, model_revision=revision, config_json=read_config_json(spec))


def _describe(p: object) -> str:
    pid = getattr(p, "pid", "?")
    cmd = " ".join(getattr(p, "cmdline", ()) or ())[:60] or getattr(p, "name", "")
    return f"pid {pid} ({cmd})"


def stopping(cmdline: tuple[str, ...]) -> str:
    """How the running server will stop, from its own command line: its drain, or an abort."""
    flag = "--shutdown-timeout"
    value = next((a.split("=", 1)[1] for a in cmdline if a.startswith(flag + "=")), None)
    if value is None and flag in cmdline[:-1]:
        value = cmdline[cmdline.index(flag) + 1]
    if value is None or not value.isdigit() or int(value) == 0:
        return "in-flight requests are aborted (it runs without --shutdown-timeout)"
    return f"it drains in-flight requests first (up to {int(value)}s)"


def plan_server(spec: Spec, obs: Observed) -> Item | None:
    if spec.server is None:
        return None
    from actions.launching import desired_identity
    from probes.server import ServerObservation, ServerRecord
    from reconcile.identity import explain_change, server_socket, serving_spec

    fronted = getattr(spec, "front", None) is not None
    whole, spec = spec, serving_spec(spec)  # behind [front]: the active color
    assert spec.server is not None
    want = spec.server
    seen = obs.server
    if isinstance(seen, (ProbeFailure, Unavailable)):
        return change(
            Action.CHANGE, f"cannot be checked: {seen.reason}", "the server probe failed", actionable=False
        )
    assert isinstance(seen, ServerObservation)
    strays = seen.strays
    stray_diffs = tuple(FieldDiff(f"stray {p.pid}", _describe(p), "stopped") for p in strays)
    if not want.running:
        if seen.processes:
            pids = ", ".join(str(p.pid) for p in seen.processes)
            return change(
                Action.REMOVE, f"stop {want.name} (pids {pids})", "the spec says running = false", stray_diffs
            )
        return ok(f"{want.name} stopped, as the spec says")
    running = seen.server
    uds = server_socket(spec)  # behind [front], a color serves on its Unix socket
    where = f"unix:{uds}" if uds is not None else f"{want.host}:{want.port}"
    if running is None:
        extra = f"; first stop {len(strays)} stray process(es) of a dead server" if strays else ""
        if seen.pidfile.state == "corrupt":
            extra += f"; pidfile {seen.pidfile.path} {seen.pidfile.reason}: kept aside as .corrupt"
        return change(
            Action.CREATE,
            f"start {want.name} on {where}{extra}",
            "no process of this deployment is running"
            if not strays
            else "the server is gone but its children still run (they may hold GPU memory)",
            stray_diffs,
        )
    desired = desired_identity(spec, launch_inputs(spec, obs))
    if running.identity != desired.digest:
        old = seen.record.components if isinstance(seen.record, ServerRecord) else {}
        why = explain_change(old, desired.components)
        how: tuple[FieldDiff, ...] = ()
        if fronted:
            from reconcile.resources.bluegreen import mark

            how = (mark(whole, obs),)
        return change(
            Action.RESTART,
            f"restart {want.name}: {why}; {stopping(running.cmdline)}",
            why,
            (FieldDiff("identity", running.identity, desired.digest), *how, *stray_diffs),
        )
    health = obs.health
    state = getattr(health, "state", None)
    holder = getattr(health, "foreign_listener", None)
    if holder:  # its /health and /version are another process's answers, never the server's
        return change(
            Action.CHANGE,
            f"{want.name} (pid {running.pid}) cannot answer on {where}: the port is held by {holder}",
            "a process that is not the deployment's listens on its port",
            stray_diffs,
            actionable=False,
        )
    if state == "not_listening":
        return change(
            Action.CHANGE,
            f"wait for {want.name} (pid {running.pid}) to finish starting",
            "the process runs but its port does not answer yet",
            stray_diffs,
        )
    if state != "healthy":
        detail = getattr(health, "error", None) or f"/health answered {getattr(health, 'health_status', '?')}"
        return change(
            Action.RESTART,
            f"restart {want.name}: unhealthy ({detail})",
            "the server is unhealthy",
            stray_diffs,
        )
    verdict = liveness_verdict(spec, obs)
    if verdict is not None and verdict.hung:
        return change(
            Action.RESTART,
            f"restart {want.name}: {verdict.message}",
            "the engine makes no progress while /health answers 200",
            (FieldDiff("engine", "hung", "restarted"), *stray_diffs),
            params={"engine_hung": verdict.message},
        )
    if strays:
        return change(
            Action.REMOVE,
            f"stop {len(strays)} stray process(es) of {want.name}",
            "processes of this deployment (its cgroup, its recorded launches, its marker) outside the "
            "live server's group",
            stray_diffs,
        )
    if seen.pidfile.state != "ours":
        # Healthy and the right identity, but the pidfile does not name it (apply was killed
        # between the start and the pidfile write): adopt it, no restart.
        return change(
            Action.CHANGE,
            f"record {want.name}'s pid {running.pid} in {seen.pidfile.path}",
            f"the pidfile is {seen.pidfile.state}"
            + (f" ({seen.pidfile.reason}; kept aside as .corrupt)" if seen.pidfile.reason else ""),
            (FieldDiff("pidfile", seen.pidfile.pid, running.pid),),
        )
    version = getattr(health, "version", None)
    cards = getattr(health, "models", ()) or ()
    served = ", ".join(f"{c.id} (max_model_len {c.max_model_len})" for c in cards)
    return ok(
        f"{want.name} pid {running.pid} healthy on {where}"
        + (f", vLLM {version}" if version else "")
        + (f", serving {served}" if served else "")
        + (f"; {verdict.message}" if verdict is not None and verdict.state in ("stalled", "busy") else ""),
    )


def liveness_verdict(spec: Spec, obs: Observed) -> Verdict | None:
    """What the liveness probe's look means for the live server (None: no look, or no live server)."""
    from probes.server import ServerObservation
    from reconcile.liveness import EngineSample, judge

    sample, seen = obs.liveness, obs.server
    if spec.server is None or not isinstance(sample, EngineSample) or not isinstance(seen, ServerObservation):
        return None
    running = seen.server
    if running is None:
        return None
    return judge(sample, running.pid, running.create_time, spec.server.liveness.window)


def remember_stall(spec: Spec, obs: Observed) -> None:
    """Apply's first plan: keep the engine's stall (or its end) so the window spans scheduled applies."""
    from reconcile.liveness import EngineSample, keep_stall

    sample = obs.liveness
    if spec.server is None or not isinstance(sample, EngineSample):
        return
    verdict = liveness_verdict(spec, obs)
    keep_stall(spec, verdict.stall if verdict is not None else None, sample.prior)


def restart_after(item: Item, spec: Spec, obs: Observed, pending: list[str]) -> Item:
    """A server that is fine now will restart once a pending Change to its identity's inputs is made
    (`pending`: the resources the table marks as launch-identity inputs, e.g. new packages, model files
    or config.json): the plan says so, rather than apply surprising."""
    if not isinstance(item, Ok) or not pending or spec.server is None or not spec.server.running:
        return item
    running = getattr(obs.server, "running_identity", None)
    why = f"{', '.join(pending)} will change and its launch identity covers them"
    return change(
        Action.RESTART,
        f"restart {spec.server.name} after {', '.join(pending)}",
        why,
        (FieldDiff("identity", running, f"(new, after {', '.join(pending)})"),),
    )


def perform(loaded: LoadedSpec, change: Change, progress: Callable[[str], None]) -> ActionResult:
    import sys

    from actions import server
    from actions.supervising import line_progress, tty_progress
    from reconcile.resources import observe_here

    spec = loaded.spec
    obs = observe_here(spec, ("venv", "model"))
    inputs = launch_inputs(spec, obs)
    if hasattr(progress, "update"):  # the CLI's reconcile.apply.progress.Terminal: phases, live or as lines
        from reconcile.apply.progress import readiness_progress

        shown = readiness_progress(progress)  # type: ignore[arg-type]
    else:
        shown = tty_progress(sys.stderr) or line_progress(progress)
    if getattr(spec, "front", None) is not None and spec.server is not None and spec.server.running:
        from reconcile.resources import bluegreen

        if bluegreen.wanted(change):
            return bluegreen.switch(spec, inputs, shown)
    return server.apply(change, spec, inputs, progress=shown)


# A start waits for everything the server reads at launch.
_SERVER_DEPENDS = ("apt", "cuda.home", "venv", "venv.packages", "model.files", "model.config", "api_key")

PROBES = (
    Probe(
        "server",
        "probes.server",
        "server",
        tags={
            "ServerObservation": "server",
            "DeploymentProcess": "server.process",
            "Pidfile": "server.pidfile",
            "PortListener": "server.listener",
            "ServerRecord": "server.record",
            "ServingMetrics": "server.metrics",  # probes.metrics: status's
            "Ownership": "ownership",  # the tag it had before it was listed (tests/test_json_schemas.py)
        },
    ),
    Probe(  # HTTP to the server's endpoint
        "health",
        "probes.health",
        "server",
        threaded=True,
        tags={
            "HealthObservation": "health",
            "ModelCard": "health.model",
            "CheckStep": "check.step",  # the check command's (probes.health.chat_check)
            "CheckResult": "check",
        },
    ),
    Probe(  # a 1-token completion under a deadline, and /metrics: HTTP to the server's endpoint
        "liveness",
        "probes.liveness",
        "server",
        threaded=True,
        tags={"EngineSample": "liveness", "Stall": "liveness.stall"},
    ),
)
KINDS = (
    Kind(
        "server",
        "server",
        ("server", "health", "liveness", "venv", "model", "gpu", "front"),
        plan_server,
        perform,
        needs(*_SERVER_DEPENDS),
        after_plan=restart_after,
        serves=True,
        remember=remember_stall,
    ),
)
