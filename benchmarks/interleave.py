"""Timing of whole processes, every case interleaved with the floor (`python -c pass`) in one loop.

Imported by bench_plan.py, scale.py and import_time.py. This shared machine's speed drifts by ±15%
within minutes; timing each case in a block of its own lets that drift into the ratios. Here every
round runs the floor and then each case once, and a case's ratio is the median, over rounds, of
(case / the floor of the same round), so the drift cancels. CPU time is the child's own (user + sys
of the process and everything it waited for, from wait4's rusage).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple


class Sample(NamedTuple):
    wall: float
    cpu: float
    code: int


class Case(NamedTuple):
    label: str
    argv: list[str]
    env: Callable[[], dict[str, str]]  # called before every run: a cold case returns a fresh cache dir
    cwd: Path
    codes: tuple[int, ...] = (0, 2)  # exit codes that are results, not failures


def timed(argv: Sequence[str], env: dict[str, str], cwd: Path) -> tuple[Sample, str]:
    """One run: wall time from fork to exit, the CPU time of the process tree (wait4), and its stderr."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        list(argv),
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    err = proc.stderr.read()  # a child that fills the pipe would otherwise block before exit
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    return Sample(wall, usage.ru_utime + usage.ru_stime, code), err.decode(errors="replace")


class Result(NamedTuple):
    label: str
    samples: list[Sample]
    floors: list[Sample]  # the floor run of the same rounds

    @property
    def wall(self) -> float:
        return statistics.median(s.wall for s in self.samples)

    @property
    def cpu(self) -> float:
        return statistics.median(s.cpu for s in self.samples)

    @property
    def best(self) -> float:
        return min(s.wall for s in self.samples)

    @property
    def ratio(self) -> float:
        """Median over rounds of wall / the same round's floor wall."""
        return statistics.median(s.wall / f.wall for s, f in zip(self.samples, self.floors, strict=True))

    @property
    def cpu_ratio(self) -> float:
        return statistics.median(
            s.cpu / max(f.cpu, 1e-6) for s, f in zip(self.samples, self.floors, strict=True)
        )

    def versus(self, other: Result) -> float:
        """Median over rounds of this wall / other's wall (both from the same loop)."""
        return statistics.median(a.wall / b.wall for a, b in zip(self.samples, other.samples, strict=True))

    def versus_cpu(self, other: Result) -> float:
        return statistics.median(
            a.cpu / max(b.cpu, 1e-6) for a, b in zip(self.samples, other.samples, strict=True)
        )

    def codes(self) -> str:
        return ",".join(sorted({str(s.code) for s in self.samples}))


def floor_case(python: str, env: dict[str, str], cwd: Path) -> Case:
    return Case("`python -c pass` (the floor)", [python, "-c", "pass"], lambda: env, cwd, (0,))


def interleave(floor: Case, cases: Sequence[Case], rounds: int, warmup: int = 1) -> list[Result]:
    """`rounds` rounds of: floor, case 1, case 2, ...; the first `warmup` rounds are not kept.

    Returns the floor's Result first, then one per case. Exits with the child's stderr when a case
    exits with a code it does not allow.
    """
    kept: dict[str, list[Sample]] = {c.label: [] for c in (floor, *cases)}
    for n in range(warmup + rounds):
        for case in (floor, *cases):
            sample, err = timed(case.argv, case.env(), case.cwd)
            if sample.code not in case.codes:
                sys.exit(f"benchmarks: {' '.join(case.argv)} exited {sample.code}:\n{err[-3000:]}")
            if n >= warmup:
                kept[case.label].append(sample)
    floors = kept[floor.label]
    return [Result(c.label, kept[c.label], floors) for c in (floor, *cases)]


def table(results: Sequence[Result]) -> str:
    """A markdown table: medians (ms), best, CPU, and the ratios to the floor."""
    lines = [
        "| run | median wall ms | best wall ms | median CPU ms | × floor (wall) | × floor (CPU) | exit |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r.label} | {r.wall * 1000:.0f} | {r.best * 1000:.0f} | {r.cpu * 1000:.0f} "
            f"| {r.ratio:.1f} | {r.cpu_ratio:.1f} | {r.codes()} |"
        )
    return "\n".join(lines)


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"
