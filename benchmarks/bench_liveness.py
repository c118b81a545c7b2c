"""What the liveness look (docs/liveness.md) costs a converged `reconcile plan` of the CPU demo, and how
long a plan and a scheduled apply take once the fake vLLM's EngineCore is stopped (SIGSTOP).

Runs the checkout from `.venv` (it uses the tests' helpers): a demo with a running fake server, median
wall time of `--runs` converged plans with `[server.liveness] check` on and off, then one plan and one
`apply --scheduled` with the engine stopped (deadline 2 s, window 1 s: one look decides).

    .venv/bin/python benchmarks/bench_liveness.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.apply_support import demo_in, seed_venv  # noqa: E402
from tests.test_liveness import _liveness, engine_core, stop  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    base = Path(tempfile.mkdtemp(prefix="bench-liveness-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    demos = demo_in(base / "demo", seed_venv(base, {"ninja": "*"}))
    demo = next(demos)
    try:
        demo.write_spec(_liveness(deadline="2s", window="1s"))
        assert demo.cli("apply").returncode == 2

        def timed(*args: str) -> tuple[float, int]:
            started = time.monotonic()
            code = demo.cli(*args).returncode
            return time.monotonic() - started, code

        on = [timed("plan") for _ in range(runs)]
        demo.write_spec(_liveness(check=False))
        off = [timed("plan") for _ in range(runs)]
        print(f"load average {os.getloadavg()[0]:.2f}")
        for label, seen in (("on ", on), ("off", off)):
            median = statistics.median(t for t, _ in seen)
            print(f"converged plan, liveness {label}: median {median:.3f}s of {runs} (exit {seen[0][1]})")
        demo.write_spec(_liveness(deadline="2s", window="1s"))
        stop(engine_core(demo))
        print("plan, EngineCore stopped: {:.2f}s, exit {}".format(*timed("plan")))
        print(
            "apply --scheduled, detects and restarts: {:.2f}s, exit {}".format(*timed("apply", "--scheduled"))
        )
    finally:
        for _ in demos:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
