"""One function per CLI command: load the spec, call the core, render, return the exit code.

Called only by `reconcile.cli`; kept apart so that `reconcile --help` imports none of this.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from reconcile.errors import ReconcileError
from reconcile.spec import LoadedSpec


def _load(args: argparse.Namespace) -> LoadedSpec:
    from reconcile.loading import find_spec
    from reconcile.spec_cache import load

    return load(find_spec(getattr(args, "spec", None)))


def cmd_plan(args: argparse.Namespace) -> int:
    from reconcile.planning import make_plan
    from reconcile.rendering import render_json, render_text, summary_line

    loaded = _load(args)
    plan = make_plan(loaded)
    if args.out:
        from reconcile.executing import save_plan

        save_plan(plan, loaded, args.out)
    if args.json:
        render_json(plan, sys.stdout)
    elif args.quiet and plan.exit_code == 0:
        print(f"reconcile: {plan.spec_path}: {summary_line(plan)}")
    else:
        render_text(plan, sys.stdout)
    return plan.exit_code


def cmd_apply(args: argparse.Namespace) -> int:
    from reconcile.executing import apply_plan_file, apply_spec, render_report

    if args.planfile:
        report = apply_plan_file(args.planfile, lock_timeout=args.lock_timeout)
    else:
        report = apply_spec(_load(args), lock_timeout=args.lock_timeout)
    render_report(report, sys.stdout, as_json=args.json, quiet=args.quiet)
    return report.exit_code


def cmd_status(args: argparse.Namespace) -> int:
    from reconcile.status import render_status, status_of

    loaded = _load(args)
    report = status_of(loaded)
    render_status(report, sys.stdout, as_json=args.json)
    return report.exit_code


def cmd_check(args: argparse.Namespace) -> int:
    from reconcile.status import run_check

    return run_check(_load(args), sys.stdout)


def cmd_history(args: argparse.Namespace) -> int:
    from reconcile.state import list_generations, read_generation

    loaded = _load(args)
    state_dir = loaded.spec.machine.state_dir
    numbers = list_generations(state_dir)
    if not numbers:
        print(f"no generations under {state_dir}/generations (nothing applied yet)")
        return 0
    for n in numbers:
        g = read_generation(state_dir, n)
        changes = g.get("changes", [])
        failed = sum(1 for c in changes if c.get("result") == "failed")
        print(
            f"{n:>4}  {g.get('finished', '?')}  spec {str(g.get('spec_sha256', ''))[:12]}  "
            f"{g.get('git', '')}  {len(changes)} change(s){f', {failed} failed' if failed else ''}"
            f"{'  converged' if g.get('converged') else '  NOT converged'}"
        )
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    import difflib

    from reconcile.state import read_generation

    loaded = _load(args)
    state_dir = loaded.spec.machine.state_dir
    a, b = read_generation(state_dir, args.a), read_generation(state_dir, args.b)
    spec_diff = difflib.unified_diff(
        str(a.get("spec_text", "")).splitlines(),
        str(b.get("spec_text", "")).splitlines(),
        f"generation {args.a}: {a.get('spec_path')}",
        f"generation {args.b}: {b.get('spec_path')}",
        lineterm="",
    )
    out = list(spec_diff)
    print("\n".join(out) if out else "spec: identical")
    ra, rb = a.get("resolved", {}), b.get("resolved", {})
    for key in sorted(set(ra) | set(rb)):
        if ra.get(key) != rb.get(key):
            print(f"resolved {key}: {json.dumps(ra.get(key))} -> {json.dumps(rb.get(key))}")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from reconcile.executing import apply_spec, render_report
    from reconcile.loading import spec_from_resolved
    from reconcile.state import list_generations, read_generation

    loaded = _load(args)
    state_dir = loaded.spec.machine.state_dir
    numbers = list_generations(state_dir)
    target = args.generation if args.generation is not None else (numbers[-2] if len(numbers) > 1 else None)
    if target is None:
        raise ReconcileError(f"{state_dir}/generations: nothing to roll back to (have {numbers or 'none'})")
    gen: dict[str, Any] = read_generation(state_dir, target)
    old = spec_from_resolved(gen["spec_resolved"], gen.get("spec_text", ""), str(gen.get("spec_path", loaded.path)))
    print(f"rolling back to generation {target} (spec {str(gen.get('spec_sha256'))[:12]})")
    report = apply_spec(old, lock_timeout=args.lock_timeout, rollback_of=target)
    render_report(report, sys.stdout, as_json=False, quiet=False)
    return report.exit_code


def cmd_schema(args: argparse.Namespace) -> int:
    from reconcile.loading import schema_text

    print(schema_text())
    return 0
