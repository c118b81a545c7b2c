"""The rollout gate (`[bench] gate = true`): after a switch passed its acceptance check, the bench
profile runs; a regression beyond `[bench] tolerance` against the previous serving generation's
figures is the switch's problem, so apply rolls back by itself (exit 4) with the numbers.

Called once, by reconcile.apply.switching.finish, under the apply lock.
"""

from __future__ import annotations

import sys

from reconcile.apply import bench_records, benchmark, generations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.spec.models import Spec


def after_switch(spec: Spec, state_dir: str, number: int, *, judged: bool, reason: str) -> str | None:
    """None: no gate, or the switch holds its figures; else why it fails (the numbers in it). Applies
    (`apply`, `apply FILE`) are gated; rollbacks, by hand or automatic, go back to what served."""
    if not judged or "rollback" in reason or spec.bench is None or not spec.bench.gate:
        return None
    previous = generations.last_good(state_dir, other_than=number)
    before = bench_records.runs(state_dir)

    def say(line: str) -> None:
        print(f"bench gate: {line}", file=sys.stderr, flush=True)

    try:
        run = benchmark.run(spec, progress=say)
    except benchmark.BenchError as exc:
        return f"bench gate: the profile could not be measured: {exc}"
    bench_records.keep(state_dir, run, number)
    # The previous serving generation's newest run of the same profile (a `reconcile bench` of
    # other rows in between is no baseline for these).
    same = [
        r
        for r in before
        if previous is not None
        and r.get("generation") == previous["generation"]
        and bench_records.shape(r) == bench_records.shape(run)
    ]
    baseline = same[-1] if same else None
    if baseline is None or previous is None:
        return None  # the first figures of this profile: the next switch is held to them
    worse = bench_records.regressions(baseline, run, spec.bench.tolerance)
    if not worse:
        return None
    return f"bench gate: slower than generation {previous['generation']}: " + "; ".join(worse)
