"""Plans as text (Terraform-shaped, colour only on a TTY) and as JSON. Called by the CLI.

The JSON shape is documented in README.md ("plan --json"); keep the two in step.
"""

from __future__ import annotations

import json
import os

from reconcile.plan.jsondata import PLAN_FORMAT, head, jsonable, resource_entry
from reconcile.plan.records import Action, Change, Finding, Ok, Plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TextIO

_SYMBOL_COLOUR = {
    "✓": "32",
    Action.CREATE: "32",
    Action.CHANGE: "33",
    Action.REMOVE: "31",
    Action.RESTART: "35",
    "!": "31",
    "✗": "31",
    "⚠": "33",
}
_WIDTH = 16


def use_colour(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return hasattr(stream, "isatty") and stream.isatty()


class _Painter:
    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def sym(self, symbol: str) -> str:
        code = _SYMBOL_COLOUR.get(symbol)
        return f"\x1b[{code}m{symbol}\x1b[0m" if self.colour and code else symbol

    def dim(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[0m" if self.colour else text

    def bold(self, text: str) -> str:
        return f"\x1b[1m{text}\x1b[0m" if self.colour else text


_REPORT_SYMBOL = {**_SYMBOL_COLOUR, "·": "2", "⊘": "31"}
_VERDICT = {"NOT converged": "1;31", "converged": "1;32", "apply refused": "1;31"}


def paint_report(text: str) -> str:
    """The apply report's text in colour: each line's leading symbol, and the verdict."""
    out = []
    for line in text.splitlines(keepends=True):
        body = line.lstrip(" ")
        symbol = body[:1]
        code = _REPORT_SYMBOL.get(symbol) if body[1:2] == " " else None
        if code:
            line = line[: len(line) - len(body)] + f"\x1b[{code}m{symbol}\x1b[0m" + body[1:]
        for word, colour in _VERDICT.items():
            if line.startswith(("Apply ", "apply refused")) and word in line:
                line = line.replace(word, f"\x1b[{colour}m{word}\x1b[0m", 1)
                break
        out.append(line)
    return "".join(out)


def short(value: Any, limit: int = 80) -> str:
    """A one-line rendering of a diff side: JSON-ish, cut at `limit`."""
    if value is None:
        return "(absent)"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=False, default=str)
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _line(p: _Painter, symbol: str, resource: str, text: str) -> str:
    return f"  {p.sym(symbol)} {resource:<{_WIDTH}} {text}"


def _change_lines(p: _Painter, c: Change) -> list[str]:
    symbol = c.kind if c.will_change else "!"
    out = [_line(p, symbol, c.resource, c.summary)]
    pad = " " * (5 + _WIDTH)
    for d in c.diffs:
        out.append(f"{pad}{d.field}: {short(d.old)} -> {short(d.new)}")
    if c.reason and c.reason != c.summary:
        out.append(p.dim(f"{pad}why: {c.reason}"))
    if c.made_true_by is not None:
        out.append(p.dim(f"{pad}apply changes {c.made_true_by} first, which brings this"))
    elif not c.actionable:
        out.append(p.dim(f"{pad}apply cannot fix this; it only reports it"))
    return out


def _finding_lines(p: _Painter, f: Finding) -> list[str]:
    symbol = {"error": "✗", "warning": "⚠", "info": "✓"}[f.severity]
    text = f.message if f.severity == "info" else f"{f.message} [{f.rule}]"
    lines = [_line(p, symbol, "preflight", text)]
    pad = " " * (5 + _WIDTH)
    if f.fix and f.severity != "info":
        lines.extend(
            f"{pad}{'fix: ' if i == 0 else '     '}{part}" for i, part in enumerate(f.fix.splitlines())
        )
    # The memory table goes with its finding whatever the verdict: a failing fit is where it helps most.
    table = f.evidence.get("table")
    if isinstance(table, str):
        lines.extend(p.dim(f"{pad}{row}") for row in table.splitlines())
    return lines


def summary_line(plan: Plan) -> str:
    """Terraform's one line: only what apply will change; what it cannot fix is said apart."""
    counts = plan.counts()
    if plan.errors:
        return f"Plan blocked: {len(plan.errors)} preflight error(s); apply will not start until fixed."
    if not plan.changes:
        return "No changes. The machine matches the spec."
    parts = [f"{counts['add']} to add", f"{counts['change']} to change"]
    if counts["remove"]:
        parts.append(f"{counts['remove']} to remove")
    parts.append(f"{counts['restart']} to restart")
    stuck = plan.unfixable
    if len(stuck) == len(plan.changes):
        head = "Plan: nothing apply can change."
    else:
        head = "Plan: " + ", ".join(parts) + "."
    if not stuck:
        return head
    return f"{head} Apply cannot fix {len(stuck)}: {', '.join(c.resource for c in stuck)} (marked !)."


def render_text(plan: Plan, stream: TextIO, *, verbose_info: bool = True, title: str = "plan") -> None:
    p = _Painter(use_colour(stream))
    head = f"reconcile {title} · {plan.spec_path} · host {plan.host} · {plan.git}"
    lines = [p.bold(head), ""]
    lines.extend(p.dim(f"  note: {n}") for n in plan.notes)
    if plan.notes:
        lines.append("")
    for item in plan.items:
        if isinstance(item, Ok):
            lines.append(_line(p, "✓", item.resource, item.summary))
        else:
            lines.extend(_change_lines(p, item))
    order = {"error": 0, "warning": 1, "info": 2}
    passed: list[str] = []
    for f in sorted(plan.findings, key=lambda f: order[f.severity]):
        # Passing rules are one line together; the memory table is the one worth reading in full.
        if f.severity == "info" and not (verbose_info and f.rule.startswith("memory.")):
            if f.rule not in passed:
                passed.append(f.rule)
            continue
        lines.extend(_finding_lines(p, f))
    if passed:
        lines.append(_line(p, "✓", "preflight", f"{len(passed)} more checks passed: {', '.join(passed)}"))
    lines += ["", p.bold(summary_line(plan))]
    stream.write("\n".join(lines) + "\n")


_jsonable = jsonable  # reconcile.plan.planner imports it from here


def plan_as_data(plan: Plan) -> dict[str, Any]:
    """The plan as JSON (schemas/plan.schema.json): one entry shape per resource, tagged observations."""
    return {
        **head(PLAN_FORMAT, plan.spec_path, plan, plan.exit_code),
        "summary": {**plan.counts(), "text": summary_line(plan)},
        "notes": list(plan.notes),
        "resources": [resource_entry(item) for item in plan.items],
        "findings": [
            {
                "rule": f.rule,
                "severity": f.severity,
                "message": f.message,
                "fix": f.fix,
                "evidence": _jsonable(f.evidence),
            }
            for f in plan.findings
        ],
        "observed": _jsonable(plan.observed),
    }


def render_json(plan: Plan, stream: TextIO) -> None:
    json.dump(plan_as_data(plan), stream, indent=2, default=str)
    stream.write("\n")
