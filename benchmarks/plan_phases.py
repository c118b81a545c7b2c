"""Where one `reconcile plan` spends its time, phase by phase, in the order the CLI goes through them.

Run by bench_plan.py --profile with the benchmark venv's interpreter (never the checkout's modules):
    <venv>/bin/python benchmarks/plan_phases.py SPEC [--probes]
Prints one JSON object {phase: seconds}. Plain perf_counter stamps: cProfile's own overhead would
distort a run this short. --probes times each probe alone, one after the other, instead of the plan.
"""

from __future__ import annotations

import json
import sys
import time

_T0 = time.perf_counter()


def main() -> int:
    spec_path = sys.argv[1]
    out: dict[str, float] = {}
    last = _T0

    def stamp(name: str) -> None:
        nonlocal last
        now = time.perf_counter()
        out[name] = now - last
        last = now

    import reconcile.cli as cli

    stamp("import reconcile.cli (argparse)")
    args = cli.build_parser().parse_args(["plan", "--spec", spec_path])
    stamp("build the argument parser")
    import reconcile.commands as commands

    stamp("import reconcile.commands (reconcile.spec.models: pydantic)")
    loaded = commands._load(args)
    stamp("load the spec (cache, lock pins)")
    import reconcile.plan.planner as planning

    stamp("import reconcile.plan.planner (probes, planners)")
    if "--probes" in sys.argv:
        from reconcile.plan.prober import DEFAULT_PROBES, run_guarded, wanted

        for name, fn in DEFAULT_PROBES.items():
            if wanted(loaded.spec, name):
                run_guarded(name, fn, loaded.spec)
                stamp(f"probe {name} (alone, first call)")
        print(json.dumps(out))
        return 0
    from reconcile.spec.origin import git_info

    git_info(loaded.files)
    stamp("git rev-parse + status of the spec (a thread, beside the probes, in a real plan)")
    from reconcile.plan.prober import probe_all

    obs = probe_all(loaded.spec)
    stamp("probe_all (concurrent)")
    planning.plan_items(loaded.spec, obs)
    stamp("plan_items (planners)")
    from reconcile.preflight.gather import findings_for

    findings_for(loaded.spec, obs)
    stamp("preflight (findings_for, imports on first call)")
    plan = planning.make_plan(loaded, obs)
    stamp("make_plan again, probes given (notes, git, preflight warm)")
    import io

    from reconcile.plan.render import render_text

    render_text(plan, io.StringIO())
    stamp("import rendering + render_text")
    out["total in-process"] = time.perf_counter() - _T0
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
