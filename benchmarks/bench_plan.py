"""End-to-end `reconcile plan` as a user runs it, each case interleaved with `python -c pass`.

Run: python3 benchmarks/bench_plan.py [--rounds 10] [--demo-spec PATH] [--profile]
Times the console script of a non-editable install (benchmarks/.venvs/reconcile), a new process per
run: `reconcile plan` of the reference spec (specs/blackwell-2x5090.toml: drift on a CPU machine)
and of the CPU demo (converged: apply it first), each with the spec cache warm (primed by an untimed
warm-up round) and cold (a new empty XDG_CACHE_HOME for every run), and a no-op `reconcile apply`
of the demo (listing every file it wrote). Every round runs the floor and then each case once, so
the machine's drift cancels in the ratios (median over rounds of case / that round's floor). CPU
time is the process tree's (wait4). --profile adds where a warm demo plan's time goes: the
slowest imports (-X importtime) and our functions by cumulative time (cProfile), both of the CLI.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchenv import DEMO_SPEC, REFERENCE_SPEC, REPO, clean_env, machine, reconcile_venv
from interleave import Case, Result, floor_case, interleave, loadavg, table, timed

TARGETS = {"warm": 6.0, "cold": 12.0}  # × the floor, for a converged plan (issue 18)


def snapshot(roots: list[Path]) -> dict[str, tuple[int, int]]:
    out = {}
    for root in roots:
        for directory, _, files in os.walk(root):
            if "venv" in Path(directory).relative_to(root).parts[:1]:
                continue  # the venv is only read; walking its thousands of files would dominate
            for name in files:
                path = Path(directory) / name
                try:
                    st = path.lstat()
                except FileNotFoundError:
                    continue
                out[str(path)] = (st.st_mtime_ns, st.st_size)
    return out


def state_root(spec: Path) -> Path:
    """The demo's own directory (/tmp/reconcile-demo for specs/cpu-demo.toml), from its state_dir."""
    for line in spec.read_text().splitlines():
        if line.strip().startswith("state_dir"):
            return Path(line.split("=", 1)[1].strip().strip('"')).parent
    return Path("/tmp/reconcile-demo")


def files_a_noop_apply_writes(reconcile: Path, demo: Path) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as home:
        env = clean_env(XDG_CACHE_HOME=home)
        argv = [str(reconcile), "apply", "--spec", str(demo)]
        first, err = timed(argv, env, REPO)
        if first.code != 0:
            sys.exit(
                f"bench_plan: {demo} is not converged (apply exited {first.code}): apply it first\n{err}"
            )
        roots = [state_root(demo), Path(home)]
        before = snapshot(roots)
        timed(argv, env, REPO)
        after = snapshot(roots)
    written = sorted(
        p for p in set(before) | set(after) if before.get(p) != after.get(p) and not p.endswith(".log")
    )
    return [p.replace(home, "$XDG_CACHE_HOME") for p in written]


def cases(reconcile: Path, demo: Path, homes: Path) -> list[Case]:
    out = []
    for label, spec in (("reference", REFERENCE_SPEC), ("cpu-demo", demo)):
        argv = [str(reconcile), "plan", "--spec", str(spec)]
        warm = clean_env(XDG_CACHE_HOME=str(homes / f"warm-{label}"))
        out.append(Case(f"plan {label}, cache warm", argv, constant(warm), REPO))
        out.append(Case(f"plan {label}, cache cold", argv, lambda: fresh(homes), REPO))
    warm = clean_env(XDG_CACHE_HOME=str(homes / "warm-apply"))
    argv = [str(reconcile), "apply", "--spec", str(demo)]
    out.append(Case("apply cpu-demo, no-op, cache warm", argv, constant(warm), REPO, (0,)))
    return out


def constant(env: dict[str, str]) -> Callable[[], dict[str, str]]:
    return lambda: env


def fresh(homes: Path) -> dict[str, str]:
    return clean_env(XDG_CACHE_HOME=tempfile.mkdtemp(prefix="cold-", dir=homes))


def verdicts(results: list[Result]) -> list[str]:
    out = []
    for r in results:
        if r.label.startswith("plan cpu-demo"):
            kind = "warm" if "warm" in r.label else "cold"
            met = "met" if r.ratio <= TARGETS[kind] else "MISSED"
            out.append(f"{r.label}: {r.ratio:.1f}x the floor (target <= {TARGETS[kind]:g}x: {met})")
    return out


def profile(reconcile: Path, demo: Path) -> None:
    """Where a warm, converged demo plan spends its time: imports and functions, of the CLI itself."""
    import pstats
    import subprocess

    python = str(reconcile.parent / "python")
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as home:
        env = clean_env(XDG_CACHE_HOME=home)
        timed([str(reconcile), "plan", "--spec", str(demo)], env, REPO)
        # cwd elsewhere: `-m` puts the cwd first on sys.path, and the checkout must not shadow the install.
        proc = subprocess.run(
            [python, "-X", "importtime", "-m", "reconcile", "plan", "--spec", str(demo)],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
        )
        imports = []
        for line in proc.stderr.splitlines():
            if line.startswith("import time:") and "self [us]" not in line:
                self_us, cumulative, name = line[len("import time:") :].split("|")
                imports.append((int(cumulative), int(self_us), name.rstrip()))
        top_level = [(c, s, n) for c, s, n in imports if not n.startswith("  ")]  # nested ones indent more
        print(
            f"\n### Imports (-X importtime, one run): {sum(c for c, _, _ in top_level) / 1000:.0f} ms"
            f" in all, {len(imports)} modules\n"
        )
        print("| top-level import | cumulative ms | self ms |\n| --- | ---: | ---: |")
        for c, s, n in sorted(top_level, reverse=True)[:12]:
            print(f"| {n.strip()} | {c / 1000:.1f} | {s / 1000:.1f} |")
        out = Path(home) / "plan.prof"
        subprocess.run(
            [python, "-m", "cProfile", "-o", str(out), "-m", "reconcile", "plan", "--spec", str(demo)],
            env=env,
            cwd=home,
            capture_output=True,
            check=False,
        )
        stats = pstats.Stats(str(out))
        rows = []
        for (file, _, func), (_, _, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
            if "site-packages/" in file and file.split("site-packages/", 1)[1].split("/")[0] in (
                "reconcile",
                "probes",
                "actions",
            ):
                module = file.split("site-packages/", 1)[1].removesuffix(".py").replace("/", ".")
                rows.append((cumulative, f"{module}.{func}"))
        print("\n### Our functions by cumulative time (cProfile, one run, its overhead included; nested)\n")
        print("| function | cumulative ms |\n| --- | ---: |")
        for cumulative, name in sorted(rows, reverse=True)[:20]:
            print(f"| {name} | {cumulative * 1000:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", "--runs", type=int, default=10)
    parser.add_argument("--demo-spec", type=Path, default=DEMO_SPEC, help="a converged CPU demo spec")
    parser.add_argument("--profile", action="store_true", help="also show where a warm demo plan's time goes")
    args = parser.parse_args()
    reconcile = reconcile_venv()
    demo = args.demo_spec.resolve()
    written = files_a_noop_apply_writes(reconcile, demo)
    print(
        f"machine: {machine()}\ndate: {time.strftime('%Y-%m-%d %H:%M %Z')}; "
        f"load average before: {loadavg()}\n"
    )
    print(f"{args.rounds} rounds (after one warm-up round), each: the floor, then every case once; ms\n")
    with tempfile.TemporaryDirectory(prefix="bench-homes-") as homes:
        floor = floor_case(str(reconcile.parent / "python"), clean_env(), Path(homes))
        results = interleave(floor, cases(reconcile, demo, Path(homes)), args.rounds)
    print(table(results))
    print(f"\nload average after: {loadavg()}")
    print("\n".join(verdicts(results)))
    print("files a no-op apply wrote: " + (", ".join(written) if written else "none"))
    if args.profile:
        profile(reconcile, demo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
