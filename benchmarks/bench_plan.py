"""End-to-end `reconcile plan` as a user runs it: a new process each time, interpreter start included.

Run: python3 benchmarks/bench_plan.py [--runs 10] [--profile]
Times `reconcile plan` (the console script of a non-editable install in benchmarks/.venvs/reconcile) on
the reference spec (specs/blackwell-2x5090.toml: plans drift on this CPU machine) and the CPU demo
(converged: apply it first), each with the spec cache warm and cold (XDG_CACHE_HOME points at a private
directory: warm = primed by one untimed run, cold = a new empty directory for every run). Then a no-op
`reconcile apply` of the demo, listing every file it wrote. Medians of wall time and of CPU time (user +
sys of the process and its children: robust when other work shares the 2 cores; the load is printed).
--profile adds where the time of a warm demo plan goes: the slowest imports (-X importtime) and the
functions with the most cumulative time (cProfile), in ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchenv import DEMO_SPEC, HERE, REFERENCE_SPEC, REPO, clean_env, machine, reconcile_venv

TARGET_S = 0.25


@dataclass(frozen=True)
class Sample:
    wall: float
    cpu: float
    code: int


def timed(argv: list[str], env: dict[str, str], cwd: Path = REPO) -> Sample:
    """One run: wall time from fork to exit, and the CPU time the process tree used (wait4's rusage)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode not in (0, 2):
        sys.exit(f"bench_plan: {' '.join(argv)} exited {proc.returncode}:\n{err}")
    return Sample(wall, usage.ru_utime + usage.ru_stime, proc.returncode)


@dataclass(frozen=True)
class Row:
    what: str
    samples: list[Sample]

    @property
    def wall(self) -> float:
        return statistics.median(s.wall for s in self.samples)

    @property
    def cpu(self) -> float:
        return statistics.median(s.cpu for s in self.samples)

    @property
    def best(self) -> float:
        return min(s.wall for s in self.samples)

    def line(self) -> str:
        codes = ",".join(sorted({str(s.code) for s in self.samples}))
        verdict = "ok" if self.wall < TARGET_S else f"MISSES {TARGET_S:g} s"
        return (
            f"| {self.what} | {self.wall * 1000:.0f} | {self.best * 1000:.0f} | {self.cpu * 1000:.0f} "
            f"| {codes} | {verdict} |"
        )


def plan_rows(reconcile: Path, runs: int) -> list[Row]:
    rows = []
    for label, spec in (("reference", REFERENCE_SPEC), ("cpu-demo", DEMO_SPEC)):
        argv = [str(reconcile), "plan", "--spec", str(spec.relative_to(REPO))]
        with tempfile.TemporaryDirectory(prefix="bench-cache-") as warm_home:
            env = clean_env(XDG_CACHE_HOME=warm_home)
            timed(argv, env)  # primes the cache
            rows.append(Row(f"plan {label}, cache warm", [timed(argv, env) for _ in range(runs)]))
        cold = []
        for _ in range(runs):
            with tempfile.TemporaryDirectory(prefix="bench-cache-") as cold_home:
                cold.append(timed(argv, clean_env(XDG_CACHE_HOME=cold_home)))
        rows.append(Row(f"plan {label}, cache cold", cold))
    return rows


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


def apply_row(reconcile: Path, runs: int) -> tuple[Row, list[str]]:
    """No-op applies of the converged demo, and the files one of them wrote (the server's own log aside)."""
    argv = [str(reconcile), "apply", "--spec", str(DEMO_SPEC.relative_to(REPO))]
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as home:
        env = clean_env(XDG_CACHE_HOME=home)
        timed(argv, env)
        roots = [Path("/tmp/reconcile-demo"), Path(home)]
        before = snapshot(roots)
        samples = [timed(argv, env)]
        after = snapshot(roots)
        samples += [timed(argv, env) for _ in range(runs - 1)]
    if any(s.code != 0 for s in samples):
        sys.exit("bench_plan: the demo is not converged (apply exited 2): apply it, then benchmark")
    written = sorted(
        p for p in set(before) | set(after) if before.get(p) != after.get(p) and not p.endswith("demo.log")
    )
    return Row("apply cpu-demo, no-op, cache warm", samples), [
        p.replace(home, "$XDG_CACHE_HOME") for p in written
    ]


def _phases(
    python: str, spec: str, env: dict[str, str], cwd: str, runs: int, *extra: str
) -> dict[str, float]:
    import json

    seen: dict[str, list[float]] = {}
    for _ in range(runs):
        proc = subprocess.run(
            [python, str(HERE / "plan_phases.py"), spec, *extra],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        )
        for name, seconds in json.loads(proc.stdout).items():
            seen.setdefault(name, []).append(seconds)
    return {name: statistics.median(values) for name, values in seen.items()}


def profile(reconcile: Path, runs: int) -> None:
    """Where a warm, converged demo plan spends its time: phases, probes, imports, functions."""
    python = str(reconcile.parent / "python")
    spec = str(DEMO_SPEC)
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as home:
        env = clean_env(XDG_CACHE_HOME=home)
        timed([str(reconcile), "plan", "--spec", spec], env)
        # cwd elsewhere: `-m` puts the cwd first on sys.path, and the checkout must not shadow the install.
        start = statistics.median(timed([python, "-c", "pass"], env).wall for _ in range(runs))
        phases = _phases(python, spec, env, home, runs)
        total = phases.pop("total in-process")
        print(f"\n### A warm demo plan, phase by phase (median of {runs} processes, ms)\n")
        print(
            f"interpreter start (`python -c pass`, site included): {start * 1000:.0f} ms; "
            f"then in-process: {total * 1000:.0f} ms\n"
        )
        print("| phase | ms |\n| --- | ---: |")
        for name, seconds in sorted(phases.items(), key=lambda kv: -kv[1]):
            print(f"| {name} | {seconds * 1000:.1f} |")
        probes = _phases(python, spec, env, home, runs, "--probes")
        print(f"\n### Each probe alone, first call (median of {runs}, ms; a real plan runs them at once)\n")
        print("| probe | ms |\n| --- | ---: |")
        for name, seconds in sorted(probes.items(), key=lambda kv: -kv[1]):
            if name.startswith("probe "):
                print(f"| {name.removeprefix('probe ')} | {seconds * 1000:.1f} |")
        proc = subprocess.run(
            [python, "-X", "importtime", "-m", "reconcile", "plan", "--spec", spec],
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
            " in all\n"
        )
        print("| top-level import | cumulative ms | self ms |\n| --- | ---: | ---: |")
        for c, s, n in sorted(top_level, reverse=True)[:12]:
            print(f"| {n.strip()} | {c / 1000:.1f} | {s / 1000:.1f} |")
        heavy = sorted(
            (
                (c, n.strip())
                for c, _, n in imports
                if n.strip().split(".")[0] not in ("reconcile", "probes", "actions")
            ),
            reverse=True,
        )
        print(
            "\nheaviest third-party/stdlib imports (cumulative ms): "
            + ", ".join(f"{n} {c / 1000:.0f}" for c, n in heavy[:10])
        )
        out = Path(home) / "plan.prof"
        subprocess.run(
            [python, "-m", "cProfile", "-o", str(out), "-m", "reconcile", "plan", "--spec", spec],
            env=env,
            cwd=home,
            capture_output=True,
            check=False,
        )
        import pstats

        stats = pstats.Stats(str(out))
        rows = []
        for (file, _, func), (_, _, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
            if any(f"site-packages/{p}/" in file for p in ("reconcile", "probes", "actions")):
                module = file.split("site-packages/", 1)[1].removesuffix(".py").replace("/", ".")
                rows.append((cumulative, f"{module}.{func}"))
        print("\n### Our functions by cumulative time (cProfile, one run, its overhead included; nested)\n")
        print("| function | cumulative ms |\n| --- | ---: |")
        for cumulative, name in sorted(rows, reverse=True)[:20]:
            print(f"| {name} | {cumulative * 1000:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="also show where a warm demo plan's time goes")
    args = parser.parse_args()
    reconcile = reconcile_venv()
    print(
        f"machine: {machine()}\ndate: {time.strftime('%Y-%m-%d %H:%M %Z')}; "
        f"load average before: {os.getloadavg()[0]:.2f}\n"
    )
    print(
        f"`reconcile plan`, new process per run, median of {args.runs} "
        f"(non-editable install, byte-compiled):\n"
    )
    print("| run | median wall ms | best wall ms | median CPU ms | exit | vs 0.25 s |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for row in plan_rows(reconcile, args.runs):
        print(row.line(), flush=True)
    row, written = apply_row(reconcile, args.runs)
    print(row.line())
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    print("files a no-op apply wrote: " + (", ".join(written) if written else "none"))
    if args.profile:
        profile(reconcile, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
