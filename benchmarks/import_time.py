"""What the `reconcile` CLI imports, and what that costs; exit 1 when it imports what it must not.

Run: python3 benchmarks/import_time.py [--rounds 10] [--spec PATH] [--python PY] [--check]
Two checks, each from one run of the CLI's entry point (reconcile.cli:main, as the console script
calls it) from a directory outside the checkout, reading sys.modules when it exits:
  * `--help`, `plan --help` and `--version` import nothing of HEAVY;
  * a warm, converged `reconcile plan --spec PATH` (default: the CPU demo, applied) and the timer's
    no-op `reconcile apply --scheduled --spec PATH` import nothing that
    benchmarks/import_never_warm.txt names (nor a module below one), by name. A short list of what
    must never be on the warm path, not a list of everything that may: a new small module passes.
Without --check it also times each command, interleaved with the floor (`python -c pass`).
--python: the interpreter to run (default: the non-editable install in benchmarks/.venvs/reconcile).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchenv import DEMO_SPEC, HERE, clean_env, machine, reconcile_venv
from interleave import Case, floor_case, interleave, loadavg, table

NEVER_WARM = HERE / "import_never_warm.txt"
ENTRY = "import sys; from reconcile.cli import main; sys.exit(main(sys.argv[1:]))"  # the console script
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
    "reconcile.spec.loader",
    "reconcile.commands",
    "probes",
    "actions",
)


def imported(python: str, argv: list[str], env: dict[str, str], cwd: str) -> list[tuple[int, int, str]]:
    """(cumulative us, self us, name with its nesting indent) per module `-X importtime` lists, for
    the CLI with `argv` (empty: `python -c pass`, the floor)."""
    code = ["-c", ENTRY, *argv] if argv else ["-c", "pass"]
    proc = subprocess.run(
        [python, "-X", "importtime", *code], env=env, cwd=cwd, capture_output=True, text=True
    )
    out = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            self_us, cumulative, name = line[len("import time:") :].split("|")
            out.append((int(cumulative), int(self_us), name.rstrip()))
    if proc.returncode not in (0, 2):
        sys.exit(f"import_time: {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return out


def names(modules: list[tuple[int, int, str]]) -> set[str]:
    return {n.strip() for _, _, n in modules}


def loaded(python: str, argv: list[str], env: dict[str, str], cwd: str) -> set[str]:
    """sys.modules when the CLI with `argv` exits (empty: `python -c pass`). Not -X importtime's list:
    that misses a module imported by importlib.import_module (probes.server, probes.health)."""
    with tempfile.NamedTemporaryFile("r", prefix="modules-", dir=cwd) as out:
        write = f"open({out.name!r}, 'w').write(' '.join(sys.modules))"
        dump = f"import atexit, sys; atexit.register(lambda: {write})"
        code = f"{dump}; {ENTRY}" if argv else dump
        proc = subprocess.run([python, "-c", code, *argv], env=env, cwd=cwd, capture_output=True, text=True)
        if proc.returncode not in (0, 2):
            sys.exit(f"import_time: {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        return set(out.read().split()) - {"atexit"}


def read_list(path: Path) -> set[str]:
    return {ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()} - {""}


def named(module: str, never: set[str]) -> bool:
    """Whether `module` is one of `never` or below one."""
    return any(module == n or module.startswith(n + ".") for n in never)


def check(python: str, argv: list[str], what: str, never_list: Path, env: dict[str, str], cwd: str) -> int:
    """Priming runs, then one run of `argv` reading sys.modules: exit 1 on a module the list names."""
    for _ in range(2):  # the first runs fill the caches: the spec's, the preflight findings'
        subprocess.run([python, "-c", ENTRY, *argv], env=env, cwd=cwd, capture_output=True, check=False)
    run = loaded(python, argv, env, cwd) - loaded(python, [], env, cwd)
    bad = sorted(m for m in run if named(m, read_list(never_list)))
    if bad:
        print(
            f"import_time: {what} (`reconcile {' '.join(argv)}`) imports {len(bad)} module(s) that "
            f"{never_list.name} says it must never import: {', '.join(bad)}. Import them only where "
            f"they are needed (a cold run, a change), not on the warm path.",
            file=sys.stderr,
        )
        return 1
    print(f"import_time: {what} imports {len(run)} modules, none that {never_list.name} names")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", "--runs", type=int, default=10)
    parser.add_argument("--spec", type=Path, default=DEMO_SPEC, help="a converged spec (default: the demo)")
    parser.add_argument("--python", help="interpreter with reconcile installed (default: the benchmark venv)")
    parser.add_argument(
        "--never", type=Path, default=NEVER_WARM, help="the modules a warm run must not import"
    )
    parser.add_argument("--check", action="store_true", help="only the import checks: no timing")
    args = parser.parse_args()
    python = args.python or str(reconcile_venv().parent / "python")
    spec = args.spec.resolve()
    with tempfile.TemporaryDirectory(prefix="import-time-") as tmp:
        # The cache apart from the cwd: `-c` puts the cwd on sys.path, and the cache's reconcile/
        # directory would shadow an editable install as a namespace package.
        env = clean_env(XDG_CACHE_HOME=os.path.join(tmp, "cache"))
        cwd = os.path.join(tmp, "run")
        os.mkdir(cwd)
        heavy: set[str] = set()
        for argv in (["--help"], ["plan", "--help"], ["--version"]):
            heavy |= {n for n in loaded(python, argv, env, cwd) if n.split(".")[0] in HEAVY or n in HEAVY}
        if heavy:
            print(
                f"import_time: --help / --version import heavy modules: {', '.join(sorted(heavy))}",
                file=sys.stderr,
            )
        plan = ["plan", "--spec", str(spec)]
        code = check(python, plan, "a warm, converged plan", args.never, env, cwd)
        apply = ["apply", "--scheduled", "--spec", str(spec)]
        what = "the timer's no-op apply"
        planned = subprocess.run([python, "-c", ENTRY, *plan], env=env, cwd=cwd, capture_output=True)
        if planned.returncode != 0:  # an apply would change the machine: not what is measured here
            print(
                f"import_time: {spec} is not converged (plan exited {planned.returncode}): apply not checked"
            )
            code |= 1
        else:
            code |= check(python, apply, what, args.never, env, cwd)
        if not args.check:
            timing(python, spec, env, cwd, args.rounds)
    return 1 if heavy or code else 0


def timing(python: str, spec: Path, env: dict[str, str], home: str, rounds: int) -> None:
    print(f"\nmachine: {machine()}\ndate: {time.strftime('%Y-%m-%d %H:%M %Z')}; load average {loadavg()}\n")
    commands = {
        "reconcile --help": ["--help"],
        "reconcile plan --help": ["plan", "--help"],
        "reconcile --version": ["--version"],
        f"reconcile plan --spec {spec.name} (cache warm)": ["plan", "--spec", str(spec)],
    }
    cases = [
        Case(label, [python, "-c", ENTRY, *argv], lambda: env, Path(home)) for label, argv in commands.items()
    ]
    results = interleave(floor_case(python, env, Path(home)), cases, rounds)
    print(table(results))
    floor = names(imported(python, [], env, home))
    print("\n| command | modules beyond the floor | of them ours | heaviest (cumulative ms) |")
    print("| --- | ---: | ---: | --- |")
    for label, argv in commands.items():
        modules = [m for m in imported(python, argv, env, home) if m[2].strip() not in floor]
        ours = [n for n in names(modules) if n.split(".")[0] in ("reconcile", "probes", "actions")]
        heaviest = sorted(
            (
                (c, n.strip())
                for c, _, n in modules
                if n.strip().split(".")[0] not in ("reconcile", "probes", "actions")
            ),
            reverse=True,
        )[:4]
        shown = ", ".join(f"{n} {c / 1000:.0f}" for c, n in heaviest)
        print(f"| `{label}` | {len(names(modules))} | {len(ours)} | {shown} |")


if __name__ == "__main__":
    sys.exit(main())
