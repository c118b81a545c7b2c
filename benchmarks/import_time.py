"""What the `reconcile` CLI imports, and what that costs: `--help` must import nothing heavy.

Run: python3 benchmarks/import_time.py [--runs 10]
Uses the non-editable install in benchmarks/.venvs/reconcile, from a directory outside the checkout (so
`-m reconcile` cannot pick up the source tree). For `--help`, `plan --help` and a warm `plan` of the CPU
demo: the median wall time of the console script, the modules `-X importtime` lists (their sum of
top-level cumulative times) and the heaviest of them. Exit 1 when `--help` imports a module of HEAVY.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_plan import timed
from benchenv import DEMO_SPEC, clean_env, machine, reconcile_venv

# Never for --help: the spec models, the TOML parser, the probes' and actions' third-party libraries.
HEAVY = (
    "pydantic",
    "pydantic_core",
    "tomlkit",
    "huggingface_hub",
    "deepdiff",
    "tenacity",
    "pynvml",
    "psutil",
    "packaging",
    "http.client",
    "ssl",
    "requests",
    "reconcile.spec.models",
    "reconcile.commands",
    "probes",
    "actions",
)


def importtime(python: str, args: list[str], env: dict[str, str], cwd: str) -> list[tuple[int, int, str]]:
    """(cumulative us, self us, name with its nesting indent) per imported module."""
    proc = subprocess.run(
        [python, "-X", "importtime", "-m", "reconcile", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    out = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            self_us, cumulative, name = line[len("import time:") :].split("|")
            out.append((int(cumulative), int(self_us), name.rstrip()))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    reconcile = reconcile_venv()
    python = str(reconcile.parent / "python")
    print(f"machine: {machine()}\ndate: {time.strftime('%Y-%m-%d %H:%M %Z')}\n")
    print(
        "| command | median wall ms | modules imported | of them ours | top-level import ms (sum) "
        "| heaviest |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    heavy_for_help: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="import-time-") as home:
        env = clean_env(XDG_CACHE_HOME=home)
        baseline = statistics.median(timed([python, "-c", "pass"], env).wall for _ in range(args.runs))
        print(f"| `python -c pass` (the floor) | {baseline * 1000:.0f} | | | | |")
        for label, argv in (
            ("--help", ["--help"]),
            ("plan --help", ["plan", "--help"]),
            ("--version", ["--version"]),
            ("plan (cpu demo, cache warm)", ["plan", "--spec", str(DEMO_SPEC)]),
        ):
            timed([str(reconcile), *argv], env)
            wall = statistics.median(
                timed([str(reconcile), *argv], env, cwd=Path(home)).wall for _ in range(args.runs)
            )
            modules = importtime(python, argv, env, home)
            names = [n.strip() for _, _, n in modules]
            ours = [n for n in names if n.split(".")[0] in ("reconcile", "probes", "actions")]
            top = sum(c for c, _, n in modules if not n.startswith("  "))
            heaviest = sorted(
                (
                    (c, n.strip())
                    for c, _, n in modules
                    if n.strip().split(".")[0] not in ("reconcile", "probes", "actions")
                ),
                reverse=True,
            )[:4]
            shown = ", ".join(f"{n} {c / 1000:.0f} ms" for c, n in heaviest)
            print(
                f"| `reconcile {label}` | {wall * 1000:.0f} | {len(names)} | {len(ours)} | {top / 1000:.0f} "
                f"| {shown} |"
            )
            if "help" in label or "version" in label:
                heavy_for_help |= {n for n in names if n in HEAVY or n.split(".")[0] in HEAVY}
    print("\nheavy modules imported for --help / --version: " + (", ".join(sorted(heavy_for_help)) or "none"))
    return 1 if heavy_for_help else 0


if __name__ == "__main__":
    sys.exit(main())
