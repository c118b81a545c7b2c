#!/usr/bin/python
# Copyright: reconcile developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module reconcile.vllm.apply: runs `reconcile plan --json` (check mode) or `reconcile apply
--json` on the target host and maps reconcile's exit codes onto Ansible's changed / ok / failed."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apply
short_description: Converge a vLLM machine to its reconcile spec
version_added: "0.1.0"
description:
  - Runs C(reconcile) on the target host against a spec that is already there (check it out with
    M(ansible.builtin.git) first).
  - In check mode it runs C(reconcile plan --json), changes nothing, and reports C(changed) when the
    machine has drift that apply would fix. The preflight runs there too, so a check-mode pass over a
    fleet is the gate before a rollout.
  - Otherwise it runs C(reconcile apply --json). Exit 0 is ok, 2 is changed (and converged); 1 (a bad
    spec or a preflight error; nothing was changed) and 4 (a change failed, or the machine did not
    converge) fail the task with reconcile's first error, such as the C(FILE:LINE) line of a bad spec
    or the preflight rule and its fix.
  - With C(--diff), each resource that differs is shown as its own before/after.
  - Sets C(ansible_facts.reconcile) (GPUs, vLLM version, model commit, generation) for inventory grouping.
options:
  spec:
    description: Path of the spec on the target host.
    type: path
    required: true
  lock_timeout:
    description: Seconds to wait for the apply lock when another apply (the timer's) holds it.
    type: float
    default: 600
  scheduled:
    description:
      - Honour C(reconcile pause), as the host's own timer does. A paused host only plans, changes
        nothing, and the task reports who paused it, since when and why.
    type: bool
    default: true
  textfile:
    description: Also write node_exporter textfile metrics to this path on the target host.
    type: path
  executable:
    description: The C(reconcile) executable on the target host (a name on PATH, or a path).
    type: path
    default: reconcile
attributes:
  check_mode:
    support: full
    details: check mode runs C(reconcile plan), which never changes the machine.
  diff_mode:
    support: full
requirements:
  - reconcile on the target host
notes:
  - The spec cache and every state file live on the target host; the module keeps nothing of its own.
  - Run it with C(become=true): reconcile manages apt packages, /usr/local/cuda and a root-owned server.
author:
  - reconcile developers
"""

EXAMPLES = r"""
- name: Preview the drift (the preflight is the gate), changing nothing
  reconcile.vllm.apply:
    spec: /opt/fleet/specs/{{ ansible_facts['hostname'] }}.toml
  check_mode: true
  diff: true

- name: Converge, waiting up to 10 minutes for the timer's apply to finish
  reconcile.vllm.apply:
    spec: /opt/fleet/specs/{{ ansible_facts['hostname'] }}.toml
    lock_timeout: 600
    textfile: /var/lib/node_exporter/textfile_collector/reconcile.prom
    executable: /opt/reconcile/.venv/bin/reconcile
  register: converged

- name: Group hosts by the vLLM version they serve
  ansible.builtin.group_by:
    key: "vllm_{{ ansible_facts.reconcile.vllm_version | default('none') | replace('.', '_') }}"
"""

RETURN = r"""
exit_code:
  description:
    - reconcile's exit code; 0 converged or nothing to do, 2 changes made (or pending, in check mode),
      1 refused (bad spec, preflight error), 4 a change failed or not converged.
  returned: always
  type: int
  sample: 2
resources:
  description:
    - The plan's resources (after apply, the final plan's), each with its status, summary and diffs.
  returned: when reconcile produced a plan
  type: list
  elements: dict
  sample: [{"resource": "server", "status": "change", "kind": "+", "summary": "start demo"}]
findings:
  description: The preflight's findings (rule, severity, message, fix).
  returned: when reconcile produced a plan
  type: list
  elements: dict
results:
  description: What apply did per resource (result is changed, already-true, failed, blocked or cannot-fix).
  returned: when not in check mode and apply ran
  type: list
  elements: dict
generation:
  description: The generation apply recorded, when it changed something.
  returned: when not in check mode
  type: int
stdout:
  description: reconcile's JSON output, as printed.
  returned: always
  type: str
stderr:
  description: What reconcile printed on standard error (progress, the error line).
  returned: always
  type: str
ansible_facts:
  description: Facts about the deployment, for inventory grouping.
  returned: when reconcile produced a plan
  type: dict
  contains:
    reconcile:
      description: gpus (index, name, compute_capability, memory_total), vllm_version, model_commit,
        generation, converged, spec; for a spec with [deployments], also deployments (by name, each
        its vllm_version, model_commit, generation and converged).
      type: dict
"""

import json  # noqa: E402  (Ansible's module layout: documentation first)
from typing import Any  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def _data(stdout: str) -> dict[str, Any] | None:
    text = stdout.strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def each(data: dict[str, Any] | None) -> list[tuple[str | None, dict[str, Any] | None]]:
    """(deployment, its output) for a spec with [deployments]; (None, the output) otherwise."""
    deployments = (data or {}).get("deployments")
    if isinstance(deployments, dict) and deployments:
        return [(name, d if isinstance(d, dict) else None) for name, d in deployments.items()]
    return [(None, data)]


def _plan_of(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """The plan inside plan's output (itself) or apply's (its final plan, else its first)."""
    if data is None:
        return None
    if "resources" in data:
        return data
    plan = data.get("final_plan") or data.get("first_plan")
    return plan if isinstance(plan, dict) else None


def first_error(data: dict[str, Any] | None, stderr: str) -> str:
    """reconcile's first error in one line: a preflight error's rule and fix, a failed change, or the
    last line reconcile printed on stderr (a bad spec's `FILE:LINE: key: ...`)."""
    error = (data or {}).get("error")
    if isinstance(error, dict) and error.get("message"):  # apply --json names its first problem
        if error.get("rule"):
            fix = f" (fix: {error['fix']})" if error.get("fix") else ""
            return f"preflight {error['rule']}: {error['message']}{fix}"
        where = f"{error['resource']}: " if error.get("resource") else ""
        return f"{where}{error['message']}"
    plan = _plan_of(data) or {}
    for f in plan.get("findings") or []:
        if f.get("severity") == "error":
            fix = f" (fix: {f['fix']})" if f.get("fix") else ""
            return f"preflight {f.get('rule')}: {f.get('message')}{fix}"
    for r in (data or {}).get("results") or []:
        if r.get("result") in ("failed", "blocked", "cannot-fix"):
            return f"{r.get('resource')} {r.get('result')}: {r.get('message')}"
    if data is not None and data.get("refused"):
        return f"apply refused: {data['refused']}"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if lines:
        last = lines[-1]
        return last[len("reconcile: ") :] if last.startswith("reconcile: ") else last
    if data is not None and data.get("converged") is False:
        return "apply did not converge: the plan after it still has changes"
    return "reconcile failed without saying why (run it on the host to see)"


def facts(data: dict[str, Any] | None, spec: str) -> dict[str, Any]:
    parts = each(data)
    if parts[0][0] is None:
        return _facts(data, spec)
    out = _facts(parts[0][1], spec)
    out["deployments"] = {
        name: {k: v for k, v in _facts(d, spec).items() if k not in ("spec", "gpus")} for name, d in parts
    }
    out["converged"] = all(d["converged"] for d in out["deployments"].values())
    out["generation"] = None  # each deployment has its own
    return out


def _facts(data: dict[str, Any] | None, spec: str) -> dict[str, Any]:
    plan = _plan_of(data) or {}
    observed = plan.get("observed") or {}
    gpu = observed.get("gpu") or {}
    gpus = [
        {k: g.get(k) for k in ("index", "name", "compute_capability", "memory_total")}
        for g in (gpu.get("gpus") or [])
        if isinstance(g, dict)
    ]
    venv = observed.get("venv") or {}
    vllm = (venv.get("distributions") or {}).get("vllm") or {}
    health = observed.get("health") or {}
    record = (observed.get("model") or {}).get("record") or {}
    return {
        "spec": spec,
        "gpus": gpus,
        "vllm_version": vllm.get("version") or health.get("version"),
        "model_commit": record.get("commit") if isinstance(record, dict) else None,
        "generation": (data or {}).get("generation") or plan.get("generation"),
        "converged": plan.get("exit_code") == 0 if plan else None,
    }


def _diff(resource: str, kind: str, summary: str, fields: list[Any], when: str) -> dict[str, str]:
    def side(i: int) -> str:
        return "".join(f"{d[0]}: {json.dumps(d[i], default=str)}\n" for d in fields)

    return {
        "before_header": f"{resource} (before)",
        "after_header": f"{resource} ({when})",
        "before": side(1),
        "after": f"# {kind} {summary}".rstrip() + "\n" + side(2),
    }


def plan_diffs(plan: dict[str, Any] | None) -> list[dict[str, str]]:
    """Check mode: one before/after per resource apply would change, in Ansible's diff format."""
    return [
        _diff(
            str(r.get("resource")),
            str(r.get("kind") or ""),
            str(r.get("summary") or ""),
            [(d.get("field"), d.get("old"), d.get("new")) for d in r.get("diffs") or []],
            "after apply",
        )
        for r in (plan or {}).get("resources") or []
        if r.get("status") == "change"
    ]


def result_diffs(data: dict[str, Any] | None) -> list[dict[str, str]]:
    """After apply: one before/after per change it made (each result carries its Change's field diffs)."""
    return [
        _diff(
            str(r.get("resource")),
            str(r.get("kind") or ""),
            str(r.get("summary") or ""),
            r.get("diffs") or [],
            "applied",
        )
        for r in (data or {}).get("results") or []
        if r.get("result") == "changed"
    ]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "spec": {"type": "path", "required": True},
            "lock_timeout": {"type": "float", "default": 600},
            "scheduled": {"type": "bool", "default": True},
            "textfile": {"type": "path"},
            "executable": {"type": "path", "default": "reconcile"},
        },
        supports_check_mode=True,
    )
    p = module.params
    exe = module.get_bin_path(p["executable"], required=True)
    common = ["--json", "--spec", p["spec"]]
    if p["textfile"]:
        common += ["--textfile", p["textfile"]]
    if module.check_mode:
        argv = [exe, "plan", *common]
    else:
        argv = [exe, "apply", *common, "--lock-timeout", str(p["lock_timeout"])]
        if p["scheduled"]:
            argv.append("--scheduled")
    rc, stdout, stderr = module.run_command(argv, environ_update={"NO_COLOR": "1", "TERM": "dumb"})
    data = _data(stdout)
    parts = each(data)
    plan = _plan_of(parts[0][1])
    if parts[0][0] is not None:  # several deployments: their rows together, each naming its own
        plan = {
            key: [
                {"deployment": name, **row} for name, d in parts for row in (_plan_of(d) or {}).get(key) or []
            ]
            for key in ("resources", "findings")
        }
    result: dict[str, Any] = {
        "exit_code": rc,
        "stdout": stdout,
        "stderr": stderr,
        "changed": rc == 2,
        "cmd": argv,
    }
    if plan is not None:
        result["resources"] = plan.get("resources") or []
        result["findings"] = plan.get("findings") or []
        result["ansible_facts"] = {"reconcile": facts(data, p["spec"])}
    if data is not None and not module.check_mode and parts[0][0] is not None:
        result["results"] = [{"deployment": n, **r} for n, d in parts for r in (d or {}).get("results") or []]
        result["generation"] = {n: (d or {}).get("generation") for n, d in parts}
    elif data is not None and not module.check_mode:
        result["results"] = data.get("results") or []
        result["generation"] = data.get("generation")
        if data.get("paused"):
            result["paused"] = data["paused"]
    if module._diff:
        result["diff"] = plan_diffs(plan) if module.check_mode else result_diffs(result)
    if rc in (0, 2):
        module.exit_json(**result)
    failed = [
        (n, d) for n, d in parts if n is not None and d is not None and d.get("exit_code") not in (0, 2)
    ]
    msg = (
        f"deployment {failed[0][0]}: {first_error(failed[0][1], stderr)}"
        if failed
        else first_error(data, stderr)
    )
    module.fail_json(msg=msg, **result)


if __name__ == "__main__":
    main()
