"""`reconcile status` and `reconcile check`: conditions per resource, a pause or crash-loop hold, the
server's answers and load (its /metrics), GPU use.

Called by the CLI. Status writes nothing: the conditions' "since" times are read from
`<state_dir>/conditions.json`, which the runs that write last-run.json keep (reconcile.plan.conditions).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from reconcile.commands.common import load_spec, with_hold
from reconcile.plan.conditions import Condition, read_conditions
from reconcile.plan.jsondata import STATUS_FORMAT, head, jsonable
from reconcile.plan.records import Plan
from reconcile.spec.loaded import LoadedSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.commands.common import Args
    from reconcile.resources import Observed


@dataclass
class StatusReport:
    spec_path: str
    conditions: list[Condition]
    server: dict[str, Any] = field(default_factory=dict)
    gpu_processes: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, str]] = field(default_factory=list)
    host: str = ""
    git: str = ""
    spec_sha256: str = ""
    pause: dict[str, Any] | None = None  # reconcile pause: who, since, why
    hold: str | None = None  # the crash-loop guard refusing starts, and until when

    @property
    def exit_code(self) -> int:
        """0 all ok, 2 drift, 1 something failed (a probe, a preflight error, an unhealthy server)."""
        if any(c.status == "failed" for c in self.conditions) or any(
            f["severity"] == "error" for f in self.findings
        ):
            return 1
        return 2 if any(c.status == "drift" for c in self.conditions) else 0


def _server_facts(plan: Plan, loaded: LoadedSpec) -> dict[str, Any]:
    health = plan.observed.get("health") or {}
    server = loaded.spec.server
    facts: dict[str, Any] = {}
    if not isinstance(health, dict) or server is None:
        return facts
    facts["url"] = health.get("url")
    facts["state"] = health.get("state")
    facts["version"] = health.get("version")
    models = health.get("models") or []
    facts["models"] = models
    want_len = server.args.get("max-model-len")
    problems = []
    if health.get("foreign_listener"):
        problems.append(
            f"what answers on the port is not ours: {health['foreign_listener']}; the key was not sent"
        )
    if health.get("models_status") == 401:
        problems.append("/v1/models refused our key (401)")
    elif health.get("error") and not health.get("foreign_listener"):
        problems.append(str(health["error"]))  # refused, too slow, too large, not HTTP, an error answer
    if server.served_model_name and models and all(m.get("id") != server.served_model_name for m in models):
        problems.append(f"served name {server.served_model_name!r} not in /v1/models")
    if want_len is not None and models:
        from reconcile.vllm.limits import parse_max_model_len

        try:
            wanted = parse_max_model_len(want_len)
        except ValueError:
            wanted = None
        got = [m.get("max_model_len") for m in models]
        if wanted is not None and wanted not in got:
            problems.append(f"max_model_len {got} but the spec asks {wanted}")
    facts["problems"] = problems
    seen = plan.observed.get("server")
    owned = seen.get("ownership") if isinstance(seen, dict) else None
    if isinstance(owned, dict):
        facts["ownership"] = owned
    return facts


def _gpu_processes(plan: Plan) -> list[dict[str, Any]]:
    gpu = plan.observed.get("gpu") or {}
    server = plan.observed.get("server") or {}
    ours = {p.get("pid") for p in server.get("processes", [])} if isinstance(server, dict) else set()
    out = []
    for g in gpu.get("gpus", []) if isinstance(gpu, dict) else []:
        procs = g.get("processes")
        for p in procs if isinstance(procs, list) else []:
            out.append(
                {
                    "gpu": g.get("index"),
                    "pid": p.get("pid"),
                    "name": p.get("name"),
                    "used_gib": round((p.get("used_memory") or 0) / 2**30, 2),
                    "owner": "ours" if p.get("pid") in ours else "foreign",
                }
            )
    return out


def _metrics(loaded: LoadedSpec, facts: dict[str, Any]) -> dict[str, Any] | None:
    """The server's own load figures, read only when it answers /health with 200 and the port is ours."""
    if facts.get("state") != "healthy" or facts.get("foreign_listener") or loaded.spec.server is None:
        return None
    from probes.metrics import probe

    return dict(jsonable(probe(loaded.spec)))


def _engine(loaded: LoadedSpec, observed: Observed) -> dict[str, str] | None:
    """Whether the engine makes progress beyond /health (reconcile.liveness): alive, busy, stalled since
    when, or hung since when and why; None when it was not looked at (not running, check = false)."""
    from reconcile.resources.server import liveness_verdict

    verdict = liveness_verdict(loaded.spec, observed)
    return None if verdict is None else {"state": verdict.state, "message": verdict.message}


def _hold(loaded: LoadedSpec) -> str | None:
    if loaded.spec.server is None:
        return None
    from reconcile.identity import crash_loop_hold, read_record

    return crash_loop_hold(loaded.spec, read_record(loaded.spec))


def status_of(loaded: LoadedSpec) -> StatusReport:
    from reconcile.plan.planner import make_plan
    from reconcile.plan.prober import probe_all
    from reconcile.unattended.pause import read_pause

    observed = probe_all(loaded.spec)
    plan = make_plan(loaded, observed)
    state_dir = loaded.spec.machine.state_dir
    pause = read_pause(state_dir)
    server = _server_facts(plan, loaded)
    if server:
        server["metrics"] = _metrics(loaded, server)
        server["engine"] = _engine(loaded, observed)
    return StatusReport(
        loaded.path,
        read_conditions(state_dir, plan),
        server,
        _gpu_processes(plan),
        [
            {"rule": f.rule, "severity": f.severity, "message": f.message}
            for f in plan.findings
            if f.severity != "info"
        ],
        host=plan.host,
        git=plan.git,
        spec_sha256=plan.spec_sha256,
        pause=pause.as_data() | {"text": pause.describe()} if pause is not None else None,
        hold=_hold(loaded),
    )


def _ago(since: float) -> str:
    seconds = max(0, int(time.time() - since))
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(since))
    if seconds < 120:
        return f"{when} ({seconds}s ago)"
    if seconds < 7200:
        return f"{when} ({seconds // 60}m ago)"
    return f"{when} ({seconds // 3600}h ago)"


def status_as_data(report: StatusReport) -> dict[str, Any]:
    """schemas/status.schema.json."""
    return {
        **head(STATUS_FORMAT, report.spec_path, report, report.exit_code),
        "pause": report.pause,
        "hold": report.hold,
        "conditions": [c._asdict() for c in report.conditions],
        "server": report.server or None,
        "gpu_processes": report.gpu_processes,
        "findings": report.findings,
    }


def _metric_lines(m: dict[str, Any] | None) -> list[str]:
    if not m:
        return []
    if m.get("_type") == "unavailable":
        return [f"    load: {m.get('reason')}"]

    def num(key: str) -> str:
        value = m.get(key)
        return "?" if value is None else f"{value:g}"

    usage = m.get("kv_cache_usage")
    rate = m.get("generation_tokens_per_s")
    return [
        f"    load: {num('requests_running')} running, {num('requests_waiting')} waiting; KV cache "
        + ("?" if usage is None else f"{usage * 100:.1f}%")
        + " used; generating "
        + ("?" if rate is None else f"{rate:.1f} tokens/s")
    ]


def render_status(
    report: StatusReport, stream: TextIO, *, as_json: bool, notes: list[str] | None = None
) -> None:
    """`notes`: lines about the run itself (a held generation), above the conditions."""
    if as_json:
        json.dump(status_as_data(report), stream, indent=2, default=str)
        stream.write("\n")
        return
    stream.write(f"reconcile status · {report.spec_path} · host {report.host} · {report.git}\n\n")
    if report.pause is not None:
        stream.write(f"  ‖ {report.pause['text']} (`reconcile resume` ends it)\n")
    if report.hold is not None:
        stream.write(f"  ‖ {report.hold}\n")
    for note in notes or []:
        stream.write(f"  ‖ {note}\n")
    if report.pause is not None or report.hold is not None or notes:
        stream.write("\n")
    for c in report.conditions:
        mark = {"ok": "✓", "drift": "~", "failed": "✗"}[c.status]
        stream.write(f"  {mark} {c.resource:<16} {c.status:<6} since {_ago(c.since)}: {c.reason}\n")
    s = report.server
    if s:
        stream.write(f"\n  server {s.get('url')}: {s.get('state')}, vLLM {s.get('version') or '?'}\n")
        for m in s.get("models", []):
            stream.write(
                f"    model {m.get('id')}: max_model_len {m.get('max_model_len')}, root {m.get('root')}\n"
            )
        for line in _metric_lines(s.get("metrics")):
            stream.write(line + "\n")
        engine = s.get("engine")
        if engine:
            mark = "✗ " if engine.get("state") == "hung" else ""
            stream.write(f"    {mark}engine: {str(engine.get('message')).removeprefix('engine ')}\n")
        for p in s.get("problems", []):
            stream.write(f"    ✗ {p}\n")
        owned = s.get("ownership")
        if owned:
            where = f" {owned.get('where')}" if owned.get("where") else ""
            label = "cgroup" if owned.get("path") == "cgroup" else "fallback (pid + start time + boot id)"
            stream.write(f"    ownership: {label}{where}: {owned.get('why')}\n")
    if report.gpu_processes:
        stream.write("\n  GPU memory by process:\n")
        for p in report.gpu_processes:
            stream.write(
                f"    GPU {p['gpu']}  pid {p['pid']:<8} {p['used_gib']:>7.2f} GiB  "
                f"{p['owner']:<8} {p['name']}\n"
            )
    for f in report.findings:
        stream.write(f"  {'✗' if f['severity'] == 'error' else '⚠'} preflight {f['message']} [{f['rule']}]\n")


def run_check(loaded: LoadedSpec, stream: TextIO) -> int:
    """The article's Appendix A: a chat completion through the key; reasoning and a forced tool call."""
    from probes.health import chat_check

    if loaded.spec.server is None:
        stream.write(f"{loaded.path}: no [server] section: nothing to check\n")
        return 1
    result = chat_check(loaded.spec)
    stream.write(f"reconcile check · {loaded.path}\n\n")
    for step in result.steps:
        stream.write(f"  {'✓' if step.ok else '✗'} {step.name:<10} {step.message}\n")
    stream.write(f"\n{'passed' if result.ok else 'FAILED'} in {result.seconds:.1f}s\n")
    return 0 if result.ok else 1


def cmd_status(args: Args) -> int:
    loaded = load_spec(args)
    if getattr(loaded.spec, "deployments", None) or getattr(args, "deployment", None):
        from reconcile.commands.deployments import status_all

        return status_all(args, loaded, sys.stdout)
    loaded, held = with_hold(loaded)
    report = status_of(loaded)
    render_status(report, sys.stdout, as_json=args.json, notes=held)
    return report.exit_code


def cmd_check(args: Args) -> int:
    loaded = load_spec(args)
    if getattr(loaded.spec, "deployments", None) or getattr(args, "deployment", None):
        from reconcile.commands.deployments import check_all

        return check_all(args, loaded, sys.stdout)
    return run_check(with_hold(loaded)[0], sys.stdout)
