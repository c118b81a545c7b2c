"""This checkout against an earlier commit: the same plans, byte for byte, and the warm plan's time.

Run: python3 benchmarks/versus.py --base REF [--spec PATH ...] [--rounds 20]
 or: python3 benchmarks/versus.py --installed BASE_RECONCILE NEW_RECONCILE [...]   (two console
     scripts installed already: what tools/versus_gpu_lab.sh runs on the offline GPU lab)
REF is installed non-editable into benchmarks/.venvs/base (again when REF names another commit),
this checkout into benchmarks/.venvs/reconcile. For the bundled specs and every --spec: `reconcile
plan` as text, --json and --quiet, each with an empty cache (cold) and a primed one (warm), by both;
any difference in stdout, stderr or exit code is printed and the script exits 1. Then, with
--rounds N > 0, the warm plan of each spec by both and the floor (`python -c pass`), interleaved in one
loop: median ms, × floor and new / base (median over rounds of the same round's ratio).
A speed-up must leave every output as it was (issue 18); this is how to show both at once.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchenv import REPO, VENVS, _make_venv, _run, clean_env, machine, reconcile_venv
from interleave import loadavg, timed

FORMATS = ((), ("--json",), ("--quiet",))


def base_venv(ref: str) -> Path:
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=REPO, capture_output=True, text=True
    )
    if commit.returncode != 0:
        sys.exit(f"versus: {ref!r} is not a commit of {REPO}")
    sha = commit.stdout.strip()
    venv = VENVS / "base"
    _make_venv(venv, sys.executable)
    stamp = venv / ".installed-from"
    if not stamp.exists() or stamp.read_text() != sha:
        print(f"versus: pip install {sha[:12]} into {venv} (non-editable) ...", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="versus-") as tree:
            archive = subprocess.run(["git", "archive", sha], cwd=REPO, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
            _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--force-reinstall", tree])
        stamp.write_text(sha)
    return venv / "bin" / "reconcile"


def outputs(reconcile: Path, spec: Path, fmt: tuple[str, ...], cache: str) -> tuple[int, str, str]:
    argv = [str(reconcile), "plan", "--spec", str(spec), *fmt]
    proc = subprocess.run(argv, capture_output=True, text=True, env=clean_env(XDG_CACHE_HOME=cache), cwd=REPO)
    return proc.returncode, proc.stdout, proc.stderr


def same_outputs(base: Path, new: Path, specs: list[Path], homes: Path) -> int:
    differ = 0
    for spec in specs:
        for fmt in FORMATS:
            for kind in ("cold", "warm"):
                answers = []
                for who, reconcile in (("base", base), ("new", new)):
                    cache = tempfile.mkdtemp(prefix=f"{who}-{kind}-", dir=homes)
                    if kind == "warm":
                        outputs(reconcile, spec, fmt, cache)
                    answers.append(outputs(reconcile, spec, fmt, cache))
                label = f"{spec} {' '.join(fmt) or 'text'} {kind}"
                if answers[0] == answers[1]:
                    print(f"same  {label} (exit {answers[0][0]})")
                else:
                    differ += 1
                    print(f"DIFF  {label}\n  base: {answers[0]!r:.600}\n  new:  {answers[1]!r:.600}")
    return differ


def timing(base: Path, new: Path, specs: list[Path], rounds: int, homes: Path) -> None:
    floor = [str(new.parent / "python"), "-c", "pass"]
    caches = {
        (who, spec): str(homes / f"time-{who}-{i}") for i, spec in enumerate(specs) for who in ("b", "n")
    }
    for (who, spec), cache in caches.items():
        outputs(base if who == "b" else new, spec, (), cache)  # primes the warm cache
    walls: dict[tuple[str, Path], list[float]] = {key: [] for key in caches}
    floors: list[float] = []
    before = loadavg()
    for _ in range(rounds):
        floors.append(timed(floor, clean_env(), REPO)[0].wall)
        for (who, spec), cache in caches.items():
            argv = [str(base if who == "b" else new), "plan", "--spec", str(spec)]
            walls[(who, spec)].append(timed(argv, clean_env(XDG_CACHE_HOME=cache), REPO)[0].wall)
    print(f"\nmachine: {machine()}; load average before: {before}, after: {loadavg()}")
    print(f"warm `reconcile plan`, {rounds} rounds of the floor then each case once (ms)\n")
    print("| spec | floor | base | × floor | new | × floor | new / base |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for spec in specs:
        b, n = walls[("b", spec)], walls[("n", spec)]
        ratio_b = statistics.median(x / f for x, f in zip(b, floors, strict=True))
        ratio_n = statistics.median(x / f for x, f in zip(n, floors, strict=True))
        versus = statistics.median(y / x for x, y in zip(b, n, strict=True))
        ms = [statistics.median(v) * 1000 for v in (floors, b, n)]
        print(
            f"| {spec.parent.name}/{spec.name} | {ms[0]:.1f} | {ms[1]:.1f} | {ratio_b:.2f} | {ms[2]:.1f} "
            f"| {ratio_n:.2f} | {versus:.3f} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--base", help="the commit to compare with (any git revision)")
    which.add_argument(
        "--installed", nargs=2, type=Path, metavar=("BASE", "NEW"), help="two reconcile scripts"
    )
    parser.add_argument("--spec", type=Path, action="append", default=[], help="another spec (repeatable)")
    parser.add_argument("--rounds", type=int, default=20, help="timing rounds (0: outputs only)")
    args = parser.parse_args()
    base, new = args.installed if args.installed else (base_venv(args.base), reconcile_venv())
    bundled = sorted((REPO / "specs").glob("*.toml"))
    specs = list(dict.fromkeys([*bundled, *(p.resolve() for p in args.spec)]))
    with tempfile.TemporaryDirectory(prefix="versus-homes-") as tmp:
        homes = Path(tmp)
        differ = same_outputs(base, new, specs, homes)
        print(f"\n{differ} difference(s) in {len(specs) * len(FORMATS) * 2} comparisons")
        if args.rounds > 0:
            timed_specs = [p.resolve() for p in args.spec] or specs  # the given ones, else the bundled
            timing(base, new, timed_specs, args.rounds, homes)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
