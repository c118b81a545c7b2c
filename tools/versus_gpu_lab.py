"""The device half of tools/versus_gpu_lab.sh: both installs' plans of the GPU specs compared byte for
byte (text, --json, --quiet; an empty and a primed cache), then their warm plans timed against
`python -c pass`, interleaved in one loop (median ms, × floor, new / base)."""

import os
import statistics
import subprocess
import tempfile
import time

RECONCILE = {"base": "/tmp/v-base/bin/reconcile", "new": "/tmp/v-new/bin/reconcile"}
SPECS = ["specs/h200-lab.toml", "specs/blackwell-2x5090.toml"]
ENV = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}


def plan(who: str, spec: str, fmt: tuple[str, ...], cache: str) -> tuple[int, str, str]:
    argv = [RECONCILE[who], "plan", "--spec", spec, *fmt]
    done = subprocess.run(argv, capture_output=True, text=True, env={**ENV, "XDG_CACHE_HOME": cache})
    return done.returncode, done.stdout, done.stderr


def wall(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - started


def main() -> None:
    differ = total = 0
    for spec in SPECS:
        for fmt in ((), ("--json",), ("--quiet",)):
            for kind in ("cold", "warm"):
                answers = []
                for who in RECONCILE:
                    cache = tempfile.mkdtemp(prefix=f"{who}-")
                    if kind == "warm":
                        plan(who, spec, fmt, cache)
                    answers.append(plan(who, spec, fmt, cache))
                total += 1
                same = answers[0] == answers[1]
                differ += not same
                label = f"{spec} {' '.join(fmt) or 'text'} {kind} exit {answers[0][0]}"
                print(("same " if same else "DIFF ") + label)
                if not same:
                    print(f"  base: {answers[0]!r:.1500}\n  new:  {answers[1]!r:.1500}")
    print(f"{differ} differences in {total} comparisons")
    caches = {(who, spec): tempfile.mkdtemp(prefix="t-") for who in RECONCILE for spec in SPECS}
    for (who, spec), cache in caches.items():
        plan(who, spec, (), cache)
        plan(who, spec, (), cache)
    floors: list[float] = []
    walls: dict[tuple[str, str], list[float]] = {key: [] for key in caches}
    for _ in range(15):
        floors.append(wall(["/tmp/v-new/bin/python", "-c", "pass"], ENV))
        for (who, spec), cache in caches.items():
            argv = [RECONCILE[who], "plan", "--spec", spec]
            walls[(who, spec)].append(wall(argv, {**ENV, "XDG_CACHE_HOME": cache}))
    print(f"load {os.getloadavg()}; floor median {statistics.median(floors) * 1000:.1f} ms")
    for spec in SPECS:
        b, n = walls[("base", spec)], walls[("new", spec)]
        ratio = [statistics.median(x / f for x, f in zip(v, floors, strict=True)) for v in (b, n)]
        versus = statistics.median(y / x for x, y in zip(b, n, strict=True))
        print(
            f"{spec}: base {statistics.median(b) * 1000:.1f} ms ({ratio[0]:.2f}x the floor), "
            f"new {statistics.median(n) * 1000:.1f} ms ({ratio[1]:.2f}x), new/base {versus:.3f}"
        )


if __name__ == "__main__":
    main()
