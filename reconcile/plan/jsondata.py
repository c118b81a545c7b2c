"""The JSON outputs' shared parts: format names (with their version), stable type tags for probe
results, and one shape per plan resource. Used by rendering (plan), executing (apply), status;
the shapes are checked by schemas/*.schema.json in the tests. Bump a version when a shape changes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from reconcile.resources import TYPE_TAGS as PROBE_TAGS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PLAN_FORMAT = "reconcile-plan-json/1"
APPLY_FORMAT = "reconcile-apply-json/1"
STATUS_FORMAT = "reconcile-status-json/1"
TAG_KEY = "_type"  # not "type": probe results have fields of that name (an apt source's deb/deb-src)

# Class name -> the tag JSON readers see: the shared states here, each probe's own record types in its
# declaration (reconcile/resources/<kind>.py). Classes get renamed; tags do not
# (tests/test_json_schemas.py fails when a probe result has no tag).
TYPE_TAGS: Mapping[str, str] = {
    "Unavailable": "unavailable",
    "ProbeFailure": "probe-failure",
    "Absent": "absent",
    "Invalid": "invalid",
    **PROBE_TAGS,
}

# plan-json/1 has always written the probes' results (`observed`) in this order, which is format, not a
# list of resources: a probe not named here follows them, in declaration order.
_OBSERVED_ORDER = ("gpu", "cuda", "apt", "venv", "model", "api_key", "server", "health")


def observed_keys(names: tuple[str, ...]) -> list[str]:
    """`names` (the probes, in declaration order) in the order plan-json writes them."""
    last = len(_OBSERVED_ORDER)
    return sorted(names, key=lambda n: _OBSERVED_ORDER.index(n) if n in _OBSERVED_ORDER else last)


def head(fmt: str, spec: str, plan: Any, exit_code: int) -> dict[str, Any]:
    """The keys every JSON output starts with: format, spec, its hash, host, git, exit code."""
    return {
        "format": fmt,
        "spec": spec,
        "spec_sha256": plan.spec_sha256 if plan is not None else None,
        "host": plan.host if plan is not None else None,
        "git": plan.git if plan is not None else None,
        "exit_code": exit_code,
    }


def type_tag(cls: type) -> str:
    name = cls.__name__
    return TYPE_TAGS.get(name) or re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


def jsonable(value: Any) -> Any:
    """Records (NamedTuples) become objects tagged with TAG_KEY; mappings, sequences and pydantic models
    follow. A record is a tuple too, so it is told apart by its `_fields` before any sequence."""
    fields = getattr(value, "_fields", None)
    if isinstance(value, tuple) and fields is not None:
        out = {name: jsonable(v) for name, v in zip(fields, value, strict=True)}
        out[TAG_KEY] = type_tag(type(value))
        return out
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump())
    return value


def resource_entry(item: Any) -> dict[str, Any]:
    """A plan item (Ok or Change) as JSON: the same keys whatever its status."""
    from reconcile.plan.records import Change

    if not isinstance(item, Change):
        return {
            "resource": item.resource,
            "status": "ok",
            "kind": None,
            "summary": item.summary,
            "reason": "",
            "diffs": [],
            "depends_on": [],
            "actionable": False,
            "via": None,
        }
    return {
        "resource": item.resource,
        "status": "change" if item.will_change else "drift",
        "kind": item.kind,
        "summary": item.summary,
        "reason": item.reason,
        "diffs": [{"field": d.field, "old": d.old, "new": d.new} for d in item.diffs],
        "depends_on": list(item.depends_on),
        "actionable": item.actionable,
        "via": item.made_true_by,
    }


def _first_error(report: Any) -> dict[str, Any] | None:
    """What an Ansible task shows as `msg`: the preflight rule and its fix, a bad spec's FILE:LINE
    line, or the first change that failed."""
    from reconcile.plan.records import Result

    plan = report.final_plan
    if report.refused is not None:
        errors = plan.errors if plan is not None else ()
        if errors:
            e = errors[0]
            return {"message": e.message, "rule": e.rule, "fix": e.fix, "resource": None}
        return {"message": report.refused, "rule": None, "fix": None, "resource": None}
    for r in report.results:
        if r.result in Result.FAILURES:
            return {"message": r.message, "rule": None, "fix": None, "resource": r.resource}
    if report.paused is None and not report.converged:
        pending = ", ".join(c.resource for c in plan.changes) if plan is not None else "unknown"
        return {
            "message": f"not converged: still different: {pending}",
            "rule": None,
            "fix": None,
            "resource": None,
        }
    return None


def apply_as_data(report: Any) -> dict[str, Any]:
    """An ApplyReport as JSON (schemas/apply.schema.json)."""

    return {
        **head(APPLY_FORMAT, report.spec_path, report.final_plan or report.first_plan, report.exit_code),
        "changed": report.changed,
        "converged": report.converged,
        "refused": report.refused,
        "paused": report.paused.as_data() if report.paused is not None else None,
        "error": _first_error(report),
        "generation": report.generation,
        "notes": list(report.notes),
        "results": [r.as_json() for r in report.results],
        "final_plan": _plan_data(report.final_plan),
        "seconds": round(report.seconds, 3),
    }


def _plan_data(plan: Any) -> dict[str, Any] | None:
    from reconcile.plan.render import plan_as_data

    return plan_as_data(plan) if plan is not None else None


SPEC_SCHEMA_ID = "https://reconcile.invalid/schemas/spec-1.schema.json"


def spec_json_schema() -> dict[str, Any]:
    """The spec's JSON Schema (pydantic's, from the models' Field descriptions) for editors: Taplo and
    VS Code's Even Better TOML complete and check a spec with it. Its version is in `$id` ("format" is a
    JSON Schema keyword)."""
    from reconcile.spec.models import Spec

    schema = Spec.model_json_schema()
    props = dict(schema.get("properties") or {})
    props["extends"] = {"type": "string", "description": "A base spec to deep-merge under this one."}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SPEC_SCHEMA_ID,
        **schema,
        "title": "reconcile spec (TOML)",
        "properties": props,
    }
