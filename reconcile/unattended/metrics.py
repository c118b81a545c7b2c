"""The Prometheus textfile of a run, for node_exporter's textfile collector: names and labels in
Prometheus conventions (`_seconds`, `_total` counters, 0/1 gauges), written atomically.

Called by `reconcile.unattended.report` with the run's last-run record.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence

from reconcile.host import atomic_write
from reconcile.plan.records import Result
from reconcile.safety import statefiles
from reconcile.safety.filesafety import ensure_dir
from reconcile.safety.shapes import TIME

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

RESULTS = Result.ALL
OUTCOMES = ("converged", "changed", "drift", "paused", "refused", "failed", "error", "interrupted")


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return repr(float(value)) if isinstance(value, float) else str(value)


class _Text:
    def __init__(self, base: Mapping[str, object] | None = None) -> None:
        self.lines: list[str] = []
        self.base = base or {}  # labels every sample carries (a deployment's name)

    def metric(
        self,
        name: str,
        kind: str,
        help_text: str,
        samples: list[tuple[Mapping[str, object], float | int | bool]],
    ) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            labels = {**self.base, **labels}
            shown = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{shown}}} {_num(value)}" if shown else f"{name} {_num(value)}")


def render_textfile(record: Mapping[str, Any]) -> str:
    """The metrics of one run, in the Prometheus text exposition format (0.0.4)."""
    t = _Text({"deployment": record["deployment"]} if record.get("deployment") is not None else None)
    g = "gauge"
    t.metric(
        "reconcile_last_run_timestamp_seconds",
        g,
        "When the last plan or apply finished (unix time).",
        [({}, float(record["timestamp"]))],
    )
    t.metric(
        "reconcile_last_run_duration_seconds",
        g,
        "How long the last run took.",
        [({}, float(record["duration_seconds"]))],
    )
    t.metric(
        "reconcile_last_run_exit_code",
        g,
        "Exit code of the last run (0 ok, 2 changed/drift, 1 error, 4 failed, 130 interrupted).",
        [({}, int(record["exit_code"]))],
    )
    t.metric(
        "reconcile_last_run_success",
        g,
        "1 when the last run exited 0 or 2.",
        [({}, record["outcome"] != "error" and int(record["exit_code"]) in (0, 2))],
    )
    if record.get("last_success_timestamp") is not None:
        t.metric(
            "reconcile_last_success_timestamp_seconds",
            g,
            "When a run last succeeded (unix time).",
            [({}, float(record["last_success_timestamp"]))],
        )
    counts = record.get("result_counts") or {}
    t.metric(
        "reconcile_last_run_changes",
        g,
        "Changes of the last run, by result.",
        [({"result": r}, int(counts.get(r, 0))) for r in RESULTS],
    )
    t.metric(
        "reconcile_last_run_failures",
        g,
        "Failed, blocked or unfixable changes, preflight errors and errors of the last run.",
        [({}, int(record.get("failures", 0)))],
    )
    t.metric(
        "reconcile_pending_changes",
        g,
        "Changes still between the machine and the spec after the last run.",
        [({}, len(record.get("pending") or []))],
    )
    t.metric(
        "reconcile_converged",
        g,
        "1 when the machine matched the spec at the end of the last run.",
        [({}, bool(record.get("converged")))],
    )
    if record.get("server_healthy") is not None:
        t.metric(
            "reconcile_server_healthy",
            g,
            "1 when the vLLM server answered /health with 200.",
            [({}, bool(record["server_healthy"]))],
        )
    t.metric(
        "reconcile_paused",
        g,
        "1 while scheduled applies are paused (`reconcile pause`).",
        [({}, record.get("paused") is not None)],
    )
    counters = record.get("counters") or {}
    t.metric(
        "reconcile_changes_total",
        "counter",
        "Changes made or attempted by applies, by result.",
        [({"result": r}, int(counters.get("changes_total", {}).get(r, 0))) for r in RESULTS],
    )
    t.metric(
        "reconcile_runs_total",
        "counter",
        "Runs, by outcome.",
        [({"outcome": o}, int(counters.get("runs_total", {}).get(o, 0))) for o in OUTCOMES],
    )
    info = {
        "spec": record.get("spec") or "",
        "command": record.get("command") or "",
        "git": record.get("git") or "unknown",
    }
    t.metric(
        "reconcile_last_run_info", g, "The last run's spec, command and git commit (always 1).", [(info, 1)]
    )
    return "\n".join(t.lines) + "\n"


_COUNTER_LINE = re.compile(r'^reconcile_(changes|runs)_total\{(result|outcome)="([^"]*)"\} (\S+)\Z')
_SUCCESS_LINE = re.compile(r"^reconcile_last_success_timestamp_seconds (\S+)\Z")


def previous_from_textfile(path: str) -> dict[str, Any]:
    """Counters and the last success of a textfile this module wrote (when no last-run.json is known)."""
    counters: dict[str, dict[str, int]] = {"changes_total": {}, "runs_total": {}}
    out: dict[str, Any] = {"counters": counters, "last_success_timestamp": None}
    try:
        text = statefiles.read_textfile(path) or ""  # not a regular file: moved aside
    except OSError:
        return out
    try:
        for line in text.splitlines():
            if m := _COUNTER_LINE.match(line.strip()):
                value = float(m.group(4))
                if math.isfinite(value) and value >= 0:  # a damaged count starts afresh
                    counters[f"{m.group(1)}_total"][m.group(3)] = int(value)
            elif (m := _SUCCESS_LINE.match(line.strip())) and TIME.problem(float(m.group(1)), "") is None:
                out["last_success_timestamp"] = float(m.group(1))  # a damaged moment: none kept
    except ValueError:
        pass
    return out


def render_textfiles(records: Sequence[Mapping[str, Any]]) -> str:
    """Several deployments' runs in one file: each metric's HELP and TYPE once, then every deployment's
    samples (labelled by deployment), as the exposition format wants a family together."""
    families: dict[str, list[str]] = {}
    for record in records:
        name = ""
        for line in render_textfile(record).splitlines():
            if line.startswith("# HELP "):
                name = line.split(" ", 3)[2]
                if name in families:
                    continue
                families[name] = [line]
            elif line.startswith("# TYPE "):
                if len(families[name]) == 1:
                    families[name].append(line)
            else:
                families[name].append(line)
    return "".join(line + "\n" for lines in families.values() for line in lines)


def write_textfile(path: str, record: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
    """Atomically: node_exporter reads only *.prom, and the temp file is `.NAME.reconcile-PID-XXXX.tmp`.
    A list: every deployment's run in the one file."""
    directory = os.path.dirname(os.path.abspath(path))
    ensure_dir(directory, 0o755)  # node_exporter (often nobody) must reach it under our 077 umask
    statefiles.clear_non_file(path)  # rename() cannot replace a directory
    text = render_textfile(record) if isinstance(record, Mapping) else render_textfiles(record)
    atomic_write(path, text.encode(), mode=0o644)
