"""`reconcile status` and `reconcile check`: conditions per resource, the server's answers, GPU use.

Called by the CLI. A condition is ok / drift / failed with its reason and since when it holds;
the transition times are kept in `<state_dir>/conditions.json` (no secrets), like Kubernetes'
lastTransitionTime, so "drift since 03:12" survives between runs.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from reconcile.host import atomic_write
from reconcile.loaded import LoadedSpec
from reconcile.plan import Change, Plan


@dataclass(frozen=True)
class Condition:
    resource: str
    status: str  # ok | drift | failed
    reason: str
    since: float


@dataclass
class StatusReport:
    spec_path: str
    conditions: list[Condition]
    server: dict[str, Any] = field(default_factory=dict)
    gpu_processes: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, str]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 all ok, 2 drift, 1 something failed (a probe, a preflight error, an unhealthy server)."""
        if any(c.status == "failed" for c in self.conditions) or any(
            f["severity"] == "error" for f in self.findings
        ):
            return 1
        return 2 if any(c.status == "drift" for c in self.conditions) else 0


def _conditions_path(state_dir: str) -> str:
    return os.path.join(state_dir, "conditions.json")


def update_conditions(state_dir: str, plan: Plan, *, now: float | None = None) -> list[Condition]:
    """Conditions from a plan; `since` is kept from the previous record while the status holds."""
    now = time.time() if now is None else now
    path = _conditions_path(state_dir)
    try:
        with open(path, encoding="utf-8") as f:
            previous: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        previous = {}
    out: list[Condition] = []
    for item in plan.items:
        if isinstance(item, Change):
            status = "drift" if item.actionable else "failed"
            reason = item.summary
        else:
            status, reason = "ok", item.summary
        old = previous.get(item.resource, {})
        since = float(old.get("since", now)) if old.get("status") == status else now
        out.append(Condition(item.resource, status, reason, since))
    record = {c.resource: {"status": c.status, "since": c.since} for c in out}
    if record != {k: {"status": v.get("status"), "since": v.get("since")} for k, v in previous.items()}:
        try:
            os.makedirs(state_dir, exist_ok=True)
            atomic_write(path, (json.dumps(record, indent=2) + "\n").encode(), mode=0o644)
        except OSError:
            pass  # status must still answer on a read-only state dir
    return out


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
    if health.get("models_status") == 401:
        problems.append("/v1/models refused our key (401)")
    if server.served_model_name and models and all(m.get("id") != server.served_model_name for m in models):
        problems.append(f"served name {server.served_model_name!r} not in /v1/models")
    if want_len is not None and models:
        from reconcile.engine.limits import parse_max_model_len

        try:
            wanted = parse_max_model_len(want_len)
        except ValueError:
            wanted = None
        got = [m.get("max_model_len") for m in models]
        if wanted is not None and wanted not in got:
            problems.append(f"max_model_len {got} but the spec asks {wanted}")
    facts["problems"] = problems
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


def status_of(loaded: LoadedSpec) -> StatusReport:
    from reconcile.planning import make_plan

    plan = make_plan(loaded)
    conditions = update_conditions(loaded.spec.machine.state_dir, plan)
    return StatusReport(
        loaded.path,
        conditions,
        _server_facts(plan, loaded),
        _gpu_processes(plan),
        [
            {"rule": f.rule, "severity": f.severity, "message": f.message}
            for f in plan.findings
            if f.severity != "info"
        ],
    )


def _ago(since: float) -> str:
    seconds = max(0, int(time.time() - since))
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(since))
    if seconds < 120:
        return f"{when} ({seconds}s ago)"
    if seconds < 7200:
        return f"{when} ({seconds // 60}m ago)"
    return f"{when} ({seconds // 3600}h ago)"


def render_status(
    report: StatusReport, stream: TextIO, *, as_json: bool, notes: list[str] | None = None
) -> None:
    """`notes`: lines about the run itself (a held generation), above the conditions."""
    if as_json:
        data = {
            "spec": report.spec_path,
            "notes": notes or [],
            "exit_code": report.exit_code,
            "conditions": [c.__dict__ for c in report.conditions],
            "server": report.server,
            "gpu_processes": report.gpu_processes,
            "findings": report.findings,
        }
        json.dump(data, stream, indent=2, default=str)
        stream.write("\n")
        return
    stream.write(f"reconcile status · {report.spec_path}\n\n")
    for note in notes or []:
        stream.write(f"  note: {note}\n")
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
        for p in s.get("problems", []):
            stream.write(f"    ✗ {p}\n")
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
