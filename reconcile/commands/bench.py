"""`reconcile bench [--json] [--compare N M]`: the reference table measured against the running
deployment (reconcile.apply.benchmark), kept with the generation it measured; or two generations'
figures side by side."""

from __future__ import annotations

import json
import sys

from reconcile.commands.common import load_spec, with_hold

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TextIO

    from reconcile.commands.common import Args

FORMAT = "reconcile-bench/1"


def cmd_bench(args: Args) -> int:
    """One deployment's benchmark (the spec's, or `--deployment NAME`'s), or, for a spec with
    [deployments] and no name, every deployment's in turn (`--json`: one document, by name)."""
    from reconcile.commands.deployments import one_deployment, views
    from reconcile.spec.deployments import is_multi

    whole = load_spec(args)
    name = getattr(args, "deployment", None)
    if args.compare or not is_multi(whole) or name is not None:
        code, data = _bench(args, one_deployment(args, whole))
        if data is not None:
            print(json.dumps(data, indent=2, sort_keys=True))
        return code
    results: dict[str, Any] = {}
    codes = []
    for d in views(whole):
        if not args.json:
            print(f"── deployment {d.name}")
        code, data = _bench(args, d.loaded)
        codes.append(code)
        results[d.name] = data
    if args.json:
        print(json.dumps({"format": FORMAT, "deployments": results}, indent=2, sort_keys=True))
    return max(codes)


def _bench(args: Args, loaded: Any) -> tuple[int, dict[str, Any] | None]:
    """Measure one deployment and keep the run with its current generation; print the table, or
    return the `--json` document."""
    from reconcile.apply import bench_records, benchmark, generations
    from reconcile.apply.lock import apply_lock

    loaded, notes = with_hold(loaded)
    state_dir = loaded.spec.machine.state_dir
    if args.compare:
        return _compare(state_dir, *args.compare, as_json=args.json, stream=sys.stdout), None
    for note in notes:
        print(f"note: {note}", file=sys.stderr)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with apply_lock(state_dir, timeout=args.lock_timeout):  # no apply restarts the server meanwhile
        try:
            run = benchmark.run(loaded.spec, progress=say)
        except benchmark.BenchError as exc:
            if str(exc).startswith("[bench]"):  # the spec's own rows: name its file
                raise benchmark.BenchError(f"{loaded.path}: {exc}") from None
            raise
        entry = bench_records.keep(state_dir, run, generations.current(state_dir))
    directory = bench_records.bench_dir(state_dir)
    if args.json:
        return 0, {
            "format": FORMAT,
            **entry,
            "headline": bench_records.headline(entry),
            "records": f"{directory}/{bench_records.RESULTS}",
            "chart": f"{directory}/{bench_records.CHART}",
        }
    render_table(entry, sys.stdout)
    print(f"\nkept in {directory}/{bench_records.RESULTS}; chart: {directory}/{bench_records.CHART}")
    return 0, None


def render_table(entry: dict[str, Any], out: TextIO) -> None:
    """The reference's table: prompt, gen, TTFT, total, decode tok/s per single stream; the long
    generation; the concurrent rows' aggregate."""
    m = entry.get("machine") or {}
    gpu = f"{m.get('gpus')}x {m.get('gpu')}, driver {m.get('driver')}" if m.get("gpu") else "no GPU seen"
    gen = entry.get("generation")
    out.write(f"generation {gen if gen is not None else '(none recorded)'} · {gpu} · vLLM {m.get('vllm')}\n")
    rows = entry.get("rows") or []
    singles = [r for r in rows if r["concurrency"] == 1 and r["name"] == "single"]
    if singles:
        out.write(f"SINGLE-STREAM DECODE ({singles[0]['gen']} generation tokens, varying prompt size):\n")
        out.write(f"{'prompt':>8} {'gen':>6} {'TTFT':>8} {'total':>8} {'decode_tok/s':>13}\n")
        out.write(f"{'-' * 6:>8} {'-' * 4:>6} {'-' * 4:>8} {'-' * 5:>8} {'-' * 12:>13}\n")
        for r in singles:
            f = r["figures"]
            out.write(
                f"{f['prompt']:>8.0f} {f['gen']:>6.0f} {f['ttft_s']:>7.2f}s {f['total_s']:>7.2f}s "
                f"{f['decode_tok_s']:>13.1f}\n"
            )
    for r in rows:
        f = r["figures"]
        if r["name"] == "long":
            out.write(
                f"LONG GENERATION ({r['gen']} output, {r['prompt']}-token prompt): prompt={f['prompt']:.0f} "
                f"gen={f['gen']:.0f} total={f['total_s']:.2f}s decode_tok/s={f['decode_tok_s']:.1f}\n"
            )
        elif r["concurrency"] > 1:
            c = r["concurrency"]
            total = f["gen"] * r["requests"]
            wall = total / f["aggregate_tok_s"] if f.get("aggregate_tok_s") else 0.0
            out.write(
                f"CONCURRENT ({c} parallel streams, {r['gen']} gen each): total={total:.0f} tokens "
                f"wall={wall:.2f}s aggregate={f['aggregate_tok_s']:.0f} tok/s "
                f"(about {f['aggregate_tok_s'] / c:.0f} tok/s per stream under {c}-way concurrency)\n"
            )


def _compare(state_dir: str, a: int, b: int, *, as_json: bool, stream: TextIO) -> int:
    from reconcile.apply import bench_records as records
    from reconcile.errors import ReconcileError

    measured = records.latest_by_generation(records.runs(state_dir))
    for n in (a, b):
        if n not in measured:
            have = ", ".join(map(str, measured)) or "none"
            raise ReconcileError(
                f"{records.bench_dir(state_dir)}: generation {n} has no bench figures (measured: {have}); "
                "`reconcile bench` measures the one serving"
            )
    ra, rb = measured[a], measured[b]
    pairs = list(zip(ra["rows"], rb["rows"], strict=False))
    if as_json:
        data = {
            "format": FORMAT,
            "compare": [a, b],
            "runs": [ra, rb],
            "headline": [records.headline(ra), records.headline(rb)],
        }
        stream.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        return 0
    stream.write(f"generation {a} -> {b}\n")
    stream.write(
        f"{'row':<22} {'TTFT ' + str(a):>10} {'TTFT ' + str(b):>10} "
        f"{'tok/s ' + str(a):>11} {'tok/s ' + str(b):>11} {'change':>8}\n"
    )
    for x, y in pairs:
        label = f"{x['name']} {x['prompt']}+{x['gen']}"
        key = "aggregate_tok_s" if x["concurrency"] > 1 else "decode_tok_s"
        fx, fy = x["figures"], y["figures"]
        change = (fy[key] - fx[key]) / fx[key] if fx.get(key) else 0.0
        stream.write(
            f"{label:<22} {fx['ttft_s']:>9.3f}s {fy['ttft_s']:>9.3f}s {fx[key]:>11.1f} {fy[key]:>11.1f} "
            f"{change:>+8.0%}\n"
        )
    if len(ra["rows"]) != len(rb["rows"]):
        stream.write("(the profiles differ in length: rows compared in order)\n")
    return 0
