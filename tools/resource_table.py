"""Writes the resource table of docs/architecture.md from the declarations (reconcile/resources/).

Usage: python tools/resource_table.py [--check]
Without --check it rewrites the table between its markers; with --check it exits 1 when the doc's
table is not the one the declarations make (tests/test_resource_table.py runs that).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- resource table: written by tools/resource_table.py from reconcile/resources/ -->"
END = "<!-- end of the resource table -->"


def _depends(kind: object) -> str:
    depends_on = kind.depends_on  # type: ignore[attr-defined]
    if depends_on.__doc__:  # a depends_on that reads the spec says when, in its docstring
        return " ".join(depends_on.__doc__.split())
    return ", ".join(f"`{n}`" for n in depends_on(None))


def _action(kind: object) -> str:
    perform = kind.perform  # type: ignore[attr-defined]
    if perform is None:
        shown = "none: apply reports the drift, it never acts"
    else:
        shown = f"`{perform.__module__.rpartition('.')[2]}.{perform.__name__}`"
    if kind.restarts_server:  # type: ignore[attr-defined]
        shown += "; a pending change restarts the server"
    if kind.after_plan is not None:  # type: ignore[attr-defined]
        shown += f"; after the whole plan, `{kind.after_plan.__name__}`"  # type: ignore[attr-defined]
    if kind.serves:  # type: ignore[attr-defined]
        shown += "; switches what serves"
    return shown


def table() -> str:
    sys.path.insert(0, str(ROOT))
    from reconcile.resources import BY_PROBE, TABLE

    rows = [
        "| kind | spec section | probes its planner reads (threaded: *) | depends on | action |",
        "| --- | --- | --- | --- | --- |",
    ]
    for k in TABLE:
        probes = ", ".join(f"{p}{'*' if BY_PROBE[p].threaded else ''}" for p in k.probes)
        rows.append(f"| `{k.name}` | `[{k.section}]` | {probes} | {_depends(k)} | {_action(k)} |")
    return "\n".join(rows)


def main() -> int:
    text = DOC.read_text()
    before, begin, rest = text.partition(BEGIN)
    _, end, after = rest.partition(END)
    if not begin or not end:
        print(f"{DOC}: the markers {BEGIN!r} and {END!r} are missing", file=sys.stderr)
        return 1
    new = f"{before}{BEGIN}\n{table()}\n{END}{after}"
    if "--check" in sys.argv[1:]:
        if new != text:
            print(f"{DOC}: the resource table differs from the declarations: run tools/resource_table.py")
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
